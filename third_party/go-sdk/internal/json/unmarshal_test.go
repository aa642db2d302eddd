// Copyright 2025 The Go MCP SDK Authors. All rights reserved.
// Use of this source code is governed by the license
// that can be found in the LICENSE file.

package json

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// decoderUnmarshal is Unmarshal as it was before it used Parse: the
// reference the new implementation must agree with.
func decoderUnmarshal(data []byte, v any) error {
	if err := checkMaxDepth(data, defaultMaxDepth); err != nil {
		return err
	}
	return NewDecoder(bytes.NewReader(data)).Decode(v)
}

type wireMsg struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      any             `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
	Count int `json:"count,omitempty"`
}

func unmarshalInputs() []string {
	big := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"s":"` +
		strings.Repeat("a\\\"b", 20000) + `"}}}`
	return []string{
		``,
		`   `,
		"\n\t ",
		`{`,
		`{"jsonrpc":"2.0"`,
		`{"jsonrpc":"2.0",}`,
		`{"jsonrpc":"2.0","id":1,"method":"ping"}`,
		`  {"jsonrpc":"2.0","id":"a","method":"ping"}  `,
		`{"jsonrpc":"2.0","id":1,"method":"ping"}{"jsonrpc":"2.0","id":2}`,
		`{"jsonrpc":"2.0","id":1,"method":"ping"} trailing garbage`,
		`{"jsonrpc":"2.0","id":1,"method":"ping"}]`,
		`{"JSONRPC":"2.0","Method":"ping"}`,
		`{"jsonrpc":2}`,
		`{"count":"seven"}`,
		"  {\"count\":\"seven\"}\n",
		`{"count":"seven"} {}`,
		`{"count":1.5,"method":"after"}`,
		`{"error":{"code":"x","message":"m"}}`,
		`{"params":{"a":[1,2,{"b":null}]},"result":[true,false]}`,
		`{"params":{"a":[1,2,{"b":nul}]}}`,
		`{"method":"bad \x01 control"}`,
		`{"method":"bad escape \q"}`,
		`{"method":"bad utf8 ` + "\xff\xfe" + `"}`,
		`{"method":"\u00e9t\u00e9 \ud83d\ude00"}`,
		`{"fi\u0000eld":1}`,
		`[1,2,3]`,
		`null`,
		`"just a string"`,
		`12`,
		`12 13`,
		`tru`,
		`true false`,
		strings.Repeat("[", defaultMaxDepth+1) + strings.Repeat("]", defaultMaxDepth+1),
		big,
		big[:len(big)-3],
		big + ` {}`,
	}
}

// TestUnmarshalMatchesDecoder checks that Unmarshal leaves the same value
// and returns the same error as the Decoder-based version it replaced, for
// valid, truncated, malformed, mistyped and trailing input.
func TestUnmarshalMatchesDecoder(t *testing.T) {
	targets := []func() any{
		func() any { return new(wireMsg) },
		func() any { return new(any) },
		func() any { return new(map[string]json.RawMessage) },
		func() any { return new([]json.RawMessage) },
		func() any { return new(json.RawMessage) },
		func() any { return new(string) },
		func() any { return new(int) },
	}
	for i, in := range unmarshalInputs() {
		for j, newTarget := range targets {
			got, want := newTarget(), newTarget()
			gotErr := Unmarshal([]byte(in), got)
			wantErr := decoderUnmarshal([]byte(in), want)
			name := fmt.Sprintf("input %d, target %d (%T)", i, j, got)
			if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || reflect.TypeOf(gotErr) != reflect.TypeOf(wantErr) {
				t.Errorf("%s: error %T %v, want %T %v", name, gotErr, gotErr, wantErr, wantErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: value %#v, want %#v", name, got, want)
			}
		}
	}
}

// TestUnmarshalDoesNotAlias checks that decoded raw messages and strings do
// not point into the input, which callers may reuse.
func TestUnmarshalDoesNotAlias(t *testing.T) {
	data := []byte(`{"method":"ping","params":{"a":1}}`)
	var m wireMsg
	if err := Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for i := range data {
		data[i] = 'x'
	}
	if m.Method != "ping" || string(m.Params) != `{"a":1}` {
		t.Fatalf("decoded value changed with its input: %+v", m)
	}
}

// TestUnmarshalAllocatesLittle guards the point of the patch: a small
// message must not pay for a Decoder's 32 KiB read buffer.
func TestUnmarshalAllocatesLittle(t *testing.T) {
	data := []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"memory_get","arguments":{"code":"abcdefabcdef"}}}`)
	measure := func(f func([]byte, any) error) uint64 {
		const n = 200
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range n {
			var m wireMsg
			if err := f(data, &m); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / n
	}
	got, old := measure(Unmarshal), measure(decoderUnmarshal)
	t.Logf("bytes per Unmarshal: %d (Decoder: %d)", got, old)
	if got > 2048 {
		t.Errorf("Unmarshal of %d bytes allocates %d bytes per call, want at most 2048", len(data), got)
	}
}

func FuzzUnmarshalMatchesDecoder(f *testing.F) {
	for _, in := range unmarshalInputs() {
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var got, want wireMsg
		gotErr := Unmarshal([]byte(in), &got)
		wantErr := decoderUnmarshal([]byte(in), &want)
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Fatalf("error %v, want %v", gotErr, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("value %#v, want %#v", got, want)
		}
	})
}

func BenchmarkUnmarshal(b *testing.B) {
	data := []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"memory_get","arguments":{"code":"abcdefabcdef"}}}`)
	for _, bc := range []struct {
		name string
		f    func([]byte, any) error
	}{{"Parse", Unmarshal}, {"Decoder", decoderUnmarshal}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var m wireMsg
				if err := bc.f(data, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
