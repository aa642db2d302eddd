// Copyright 2025 The Go MCP SDK Authors. All rights reserved.
// Use of this source code is governed by an MIT-style
// license that can be found in the LICENSE file.

package jsonrpc2_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/internal/jsonrpc2"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// jsonMarshal and EncodeMessage skip encoding/json's re-scan of JSON that
// is compact already. These tests hold them to the bytes and errors of the
// old code (export_test.go) for every kind of value the SDK encodes.

// Marshalers and TextMarshalers that return whatever they are given,
// valid or not, compact or not.
type (
	valM  struct{ B []byte }
	ptrM  struct{ B []byte }
	errM  struct{ S string }
	textM struct{ S string }
	textK struct{ S string }
	strM  string
)

func (m valM) MarshalJSON() ([]byte, error)   { return m.B, nil }
func (m *ptrM) MarshalJSON() ([]byte, error)  { return m.B, nil }
func (m errM) MarshalJSON() ([]byte, error)   { return nil, errors.New(m.S) }
func (m textM) MarshalText() ([]byte, error)  { return []byte(m.S), nil }
func (k textK) MarshalText() ([]byte, error)  { return []byte("k" + k.S), nil }
func (m strM) MarshalJSON() ([]byte, error)   { return json.Marshal(string(m)) }
func (m *textK) UnmarshalText(b []byte) error { m.S = string(b); return nil }

type Inner struct {
	A string
	B int64 `json:",string"`
	X string
}

type Deep struct {
	D float64 `json:"d"`
	X string  `json:"X"` // conflicts with Inner.X at the same depth: both dropped
}

type Outer struct {
	Inner
	*Deep
	C  float64         `json:"c,omitempty"`
	S  string          `json:"s,string"`
	F  float32         `json:"f"`
	N  json.Number     `json:"n,omitempty"`
	R  json.RawMessage `json:"r,omitempty"`
	RA json.RawMessage `json:"ra"`
	M  json.Marshaler  `json:"m,omitempty"`
	T  time.Time       `json:"t"`
	TP *time.Time      `json:"tp,omitempty"`
	Tx textM           `json:"tx"`
	By []byte          `json:"by"`
	L  []any           `json:"l"`
	E  []int           `json:"e"`
	EM map[string]int  `json:"em"`
	P  *ptrM           `json:"p"`
	PV ptrM            `json:"pv"` // addressable here, so its MarshalJSON runs
	V  valM            `json:"v"`
	u  string
	Om string `json:"-"`
	Da string `json:"-,"`
}

// values builds the inputs from fuzzed parts: s a string, raw some bytes
// that may or may not be JSON, f a float, n an integer.
func values(s string, raw []byte, f float64, n int64) []any {
	rawMsg := json.RawMessage(raw)
	t := time.Unix(n%(1<<40), n%1e9).UTC()
	outer := &Outer{
		Inner: Inner{A: s, B: n, X: s},
		Deep:  &Deep{D: f, X: s},
		C:     f, S: s, F: float32(f),
		R: rawMsg, RA: rawMsg, M: valM{raw},
		T: t, TP: &t, Tx: textM{s}, By: raw,
		L: []any{s, f, n, nil, true, rawMsg, map[string]any{s: s}},
		E: []int{}, P: &ptrM{raw}, PV: ptrM{raw}, V: valM{raw},
		u: s, Om: s, Da: s,
	}
	vals := []any{
		s, []byte(s), raw, rawMsg, &rawMsg, f, float32(f), -f, n, uint64(n), int8(n), n%2 == 0,
		json.Number(s), strM(s), textM{s}, &textM{s},
		valM{raw}, &valM{raw}, ptrM{raw}, &ptrM{raw}, (*ptrM)(nil), (*valM)(nil), errM{s}, &errM{s},
		[]any{s, raw, f}, []string{s}, []json.RawMessage{rawMsg},
		map[string]any{s: s, "b": f, "a": rawMsg, "<&>": n, "": nil},
		map[string]json.RawMessage{s: rawMsg},
		map[int]string{int(n): s, 10: "ten", 9: "nine", -1: "m"},
		map[uint8]bool{uint8(n): true, 200: false},
		map[textK]int{{s}: 1, {"a"}: 2},
		map[textM]int{{s}: 1, {"<"}: 2},
		map[string]int(nil), map[string]int{}, []int(nil), []int{}, [2]byte{1, 2},
		outer, *outer, Inner{A: s}, &Deep{},
		struct {
			A string `json:"a"`
			B string `json:"b,omitempty"`
			I int64  `json:"i,string"`
			F float64
		}{A: s, I: n, F: f},
		t, time.Duration(n), math.Float64frombits(uint64(n)),
		&jsonrpc2.WireError{Code: n, Message: s, Data: rawMsg},
	}
	// What the MCP server returns for tools/call, and content it carries.
	meta := mcp.Meta{s: s, "n": f}
	vals = append(vals,
		&mcp.CallToolResult{StructuredContent: rawMsg, Content: []mcp.Content{&mcp.TextContent{Text: s}}},
		&mcp.CallToolResult{StructuredContent: rawMsg, Content: []mcp.Content{&mcp.TextContent{Text: string(raw)}}, IsError: true},
		&mcp.CallToolResult{Content: []mcp.Content{}},
		&mcp.CallToolResult{},
		&mcp.CallToolResult{Meta: meta, StructuredContent: map[string]any{s: f, "n": n},
			Content: []mcp.Content{&mcp.ImageContent{Data: raw, MIMEType: s}, &mcp.AudioContent{Data: raw}}},
		&mcp.CallToolResult{StructuredContent: valM{raw}},
		&mcp.TextContent{Text: s, Meta: meta},
		mcp.AudioContent{Data: raw, MIMEType: s},
		&mcp.ListToolsResult{Tools: []*mcp.Tool{{Name: s, Description: s, InputSchema: rawMsg}}},
		&mcp.ProgressNotificationParams{ProgressToken: s, Progress: f, Message: s},
	)
	return vals
}

// check compares the new encoding of v, as a value, a result and params,
// with the old one.
func check(t *testing.T, v any, id jsonrpc2.ID) {
	t.Helper()
	got, gerr := jsonrpc2.JSONMarshal(v)
	want, werr := jsonrpc2.OldJSONMarshal(v)
	same(t, func() string { return fmt.Sprintf("jsonMarshal(%T %#v)", v, v) }, got, gerr, want, werr)

	gr, gerr := jsonrpc2.NewResponse(id, v, nil)
	wr, werr := jsonrpc2.OldMarshalToRaw(v)
	var gres json.RawMessage
	if gr != nil {
		gres = gr.Result
	}
	same(t, func() string { return fmt.Sprintf("NewResponse(%T %#v)", v, v) }, gres, gerr, wr, werr)
	if gerr == nil {
		checkMessage(t, gr)
		checkMessage(t, &jsonrpc2.Response{ID: id, Result: gr.Result, Error: errors.New("e")})
	}
	if req, err := jsonrpc2.NewCall(id, "tools/call", v); err == nil {
		checkMessage(t, req)
	}
	if req, err := jsonrpc2.NewNotification("notifications/progress", v); err == nil {
		checkMessage(t, req)
	}
}

// checkMessage compares EncodeMessage with the old one.
func checkMessage(t *testing.T, msg jsonrpc2.Message) {
	t.Helper()
	got, gerr := jsonrpc2.EncodeMessage(msg)
	want, werr := jsonrpc2.OldEncodeMessage(msg)
	same(t, func() string { return fmt.Sprintf("EncodeMessage(%#v)", msg) }, got, gerr, want, werr)
}

// checkRaw puts raw where no marshaling checked it: the Result and Params
// of messages built by hand, and the Data of an error.
func checkRaw(t *testing.T, raw []byte, s string, n int64) {
	t.Helper()
	for _, id := range []jsonrpc2.ID{{}, jsonrpc2.Int64ID(n), jsonrpc2.StringID(s)} {
		for _, msg := range []jsonrpc2.Message{
			&jsonrpc2.Response{ID: id, Result: raw},
			&jsonrpc2.Response{ID: id, Result: raw, Error: jsonrpc2.NewError(n, s)},
			&jsonrpc2.Response{ID: id, Error: &jsonrpc2.WireError{Code: n, Message: s, Data: raw}},
			&jsonrpc2.Response{ID: id, Error: fmt.Errorf("%s: %w", s, jsonrpc2.ErrInvalidParams)},
			&jsonrpc2.Request{ID: id, Method: s, Params: raw},
			&jsonrpc2.Request{ID: id, Params: raw},
			&jsonrpc2.Request{ID: id, Method: s},
		} {
			checkMessage(t, msg)
		}
	}
	// isCompact is the fast path's only guard: whenever it says yes,
	// encoding/json's compaction must give back the same bytes.
	if jsonrpc2.IsCompact(raw) {
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil || !bytes.Equal(buf.Bytes(), raw) {
			t.Errorf("isCompact(%q) but json.Compact gives %q, %v", raw, buf.Bytes(), err)
		}
	}
}

func same(t *testing.T, what func() string, got []byte, gerr error, want []byte, werr error) {
	t.Helper()
	if (gerr == nil) != (werr == nil) {
		t.Errorf("%s:\nerror %v\nwant  %v", what(), gerr, werr)
		return
	}
	if gerr != nil {
		// The error is built as encoding/json builds it, except for the
		// MarshalerError's unexported name of the method, which only
		// makes a difference when Error prints it empty and it is.
		if gerr.Error() != werr.Error() || reflect.TypeOf(gerr) != reflect.TypeOf(werr) ||
			!reflect.DeepEqual(errors.Unwrap(gerr), errors.Unwrap(werr)) {
			t.Errorf("%s:\nerror %T %v\nwant  %T %v", what(), gerr, gerr, werr, werr)
		}
		return
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s:\ngot  %q\nwant %q", what(), got, want)
	}
}

func deep(open, close string, n int) string {
	return strings.Repeat(open, n) + strings.Repeat(close, n)
}

var rawSeeds = []string{
	``, ` `, `null`, `{}`, `[]`, `""`, `0`, `-0`, `1e21`, `1E+2`, `-1.5e-7`, `01`, `1.`, `.5`, `-`, `1e`, `+1`,
	`true`, `tru`, `nul`, `nullx`, `[1,]`, `{"a":1,}`, `{,}`, `[,1]`, `{"a"}`, `{"a":}`, `{1:2}`, `[1 2]`, `1 2`,
	`{"a":1}`, ` {"a":1}`, `{"a":1} `, "{\n\t\"a\" : [ 1 , 2 ]\r\n}", `{"a":"x y"}`, `{"a": "x y"}`,
	`"\u2028\u2029"`, "\"\u2028\u2029\"", `"<&>"`, `"\u003c"`, `"\/"`, `"\x"`, `"\u12"`, `"\uD800"`, `"\ud83d\ude00"`,
	"\"\xff\xfe\"", "\"\xe2\x80\"", "\"\x00\"", "\"\x1f\"", "\"\x7f\"", "\"a\tb\"", `"\\"`, `"\\\""`, `"\"`, `"`,
	`{"a":"\\","b":[{"c":"]"}]}`, `[{"}":"{"}]`, `"\\" `, `["\\", 1 ]`, `{"a":{"b":{"c":[null,true,false]}}}`,
	deep("[", "]", 10000), deep("[", "]", 10001), deep(`{"a":`, "}", 10000), deep(`{"a":`, "}", 10001),
	"\xef\xbb\xbf{}", `{"a":1}{"b":2}`, `[]]`, `]`, `{"a":1}}`,
}

var stringSeeds = []string{
	"", "plain", "<script>&amp;</script>", "\u2028\u2029", "\xff\xfe invalid", "\x00\x01\x1f\x7f", "tab\tnl\ncr\r",
	`quote" backslash\ slash/`, "émoji 😀", "\xed\xa0\x80 surrogate", strings.Repeat("lorem ipsum ", 50), "1e21", "-0", "null",
}

func TestJSONMarshalMatchesEncodingJSON(t *testing.T) {
	floats := []float64{0, math.Copysign(0, -1), 1e21, 1e20, 1e-7, 1e-6, 123456789.125, math.MaxFloat64,
		math.SmallestNonzeroFloat64, float64(math.MaxFloat32) * 2, math.NaN(), math.Inf(1), math.Inf(-1)}
	ints := []int64{0, 1, -1, math.MaxInt64, math.MinInt64, 1 << 53, 1<<53 + 1, 253402300800}
	for i, s := range stringSeeds {
		for j, raw := range rawSeeds {
			f, n := floats[(i+j)%len(floats)], ints[(i*3+j)%len(ints)]
			run(t, s, []byte(raw), f, n)
		}
	}
	for _, f := range floats {
		for _, n := range ints {
			run(t, "x", []byte(`{"a":1}`), f, n)
		}
	}
}

// TestFastPathTaken: the bytes a tools/call result usually is pass
// isCompact, or the change buys nothing.
func TestFastPathTaken(t *testing.T) {
	env := json.RawMessage(`{"ok":true,"content":"<b> & \u2028","n":1e-7}`)
	res := &mcp.CallToolResult{StructuredContent: env, Content: []mcp.Content{&mcp.TextContent{Text: string(env)}}}
	data, err := jsonrpc2.OldJSONMarshal(res)
	if err != nil || !jsonrpc2.IsCompact(data) {
		t.Fatalf("isCompact(%s) = false, %v", data, err)
	}
	for _, raw := range []string{`{"a":"x y"}`, `"\\"`, deep("[", "]", 10000), `{"a":"\"}"}`} {
		if !jsonrpc2.IsCompact([]byte(raw)) {
			t.Errorf("isCompact(%.40s) = false", raw)
		}
	}
	for _, raw := range []string{`{"a": 1}`, deep("[", "]", 10001), `[1,]`, ``, `1 `, `"\x"`, "\"\x00\""} {
		if jsonrpc2.IsCompact([]byte(raw)) {
			t.Errorf("isCompact(%.40s) = true", raw)
		}
	}
}

func run(t *testing.T, s string, raw []byte, f float64, n int64) {
	t.Helper()
	ids := []jsonrpc2.ID{jsonrpc2.Int64ID(n), jsonrpc2.StringID(s)}
	for i, v := range values(s, raw, f, n) {
		check(t, v, ids[i%2])
	}
	checkRaw(t, raw, s, n)
	if t.Failed() {
		t.FailNow()
	}
}

func FuzzJSONMarshalMatchesEncodingJSON(f *testing.F) {
	for i, raw := range rawSeeds {
		f.Add(stringSeeds[i%len(stringSeeds)], []byte(raw), 1e-7*float64(i), int64(i)-3)
	}
	f.Fuzz(func(t *testing.T, s string, raw []byte, fl float64, n int64) {
		run(t, s, raw, fl, n)
	})
}

// BenchmarkEncodeToolResult is what the SDK spends encoding a tools/call
// response like Dojo's: the result, then the message around it.
func BenchmarkEncodeToolResult(b *testing.B) {
	env := []byte(`{"ok":true,"code":"0123456789ab","revision":1,"title":"Field notes","tags":["bench"],"description":"",` +
		`"content":"` + strings.Repeat("lorem ipsum ", 7) + `","checksum":"` + strings.Repeat("ab", 32) + `",` +
		`"visibility":"private","status":"active","origin":"standalone","owner":"bench_0001",` +
		`"created_at":"2026-12-01T04:39:00Z","updated_at":"2026-12-01T04:39:00Z","next_action":"read it"}`)
	res := &mcp.CallToolResult{StructuredContent: json.RawMessage(env), Content: []mcp.Content{&mcp.TextContent{Text: string(env)}}}
	id := jsonrpc2.Int64ID(7)
	b.Run("old", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r, err := jsonrpc2.OldMarshalToRaw(res)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := jsonrpc2.OldEncodeMessage(&jsonrpc2.Response{ID: id, Result: r}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("new", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			resp, err := jsonrpc2.NewResponse(id, res, nil)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := jsonrpc2.EncodeMessage(resp); err != nil {
				b.Fatal(err)
			}
		}
	})
}
