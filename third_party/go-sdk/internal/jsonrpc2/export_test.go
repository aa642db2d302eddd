// Copyright 2025 The Go MCP SDK Authors. All rights reserved.
// Use of this source code is governed by an MIT-style
// license that can be found in the LICENSE file.

package jsonrpc2

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// The encoding before jsonMarshal and EncodeMessage skipped re-scanning
// compact JSON, kept verbatim so that encode_test.go can hold the new code
// to the same bytes and errors.

func oldJSONMarshal(obj any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(obj); err != nil {
		return nil, err
	}
	// json.Encoder.Encode adds a trailing newline. Trim it to be consistent with json.Marshal.
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

func oldMarshalToRaw(obj any) (json.RawMessage, error) {
	if obj == nil {
		return nil, nil
	}
	data, err := oldJSONMarshal(obj)
	if err != nil {
		return nil, err
	}
	return json.RawMessage(data), nil
}

func oldEncodeMessage(msg Message) ([]byte, error) {
	wire := wireCombined{VersionTag: wireVersion}
	msg.marshal(&wire)
	data, err := oldJSONMarshal(&wire)
	if err != nil {
		return nil, fmt.Errorf("marshaling jsonrpc message: %w", err)
	}
	return data, nil
}

var (
	JSONMarshal      = jsonMarshal
	OldJSONMarshal   = oldJSONMarshal
	MarshalToRaw     = marshalToRaw
	OldMarshalToRaw  = oldMarshalToRaw
	OldEncodeMessage = oldEncodeMessage
	IsCompact        = isCompact
)
