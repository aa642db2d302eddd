package relay_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCPResultBytes: a tools/call answer through the real handler is,
// byte for byte, what go-sdk v1.8.0 unpatched would send for the envelope
// the HTTP door gives, also with characters that each JSON encoder
// escapes its own way. It guards the second go-sdk patch
// (third_party/go-sdk/PATCH.md), which skips re-encoding compact JSON.
func TestMCPResultBytes(t *testing.T) {
	d := start(t, withSweep(5*time.Second))
	tw := newTwin(t, d)
	tricky := "<b>&amp;</b> \u2028\u2029 \"q\" \\ \t\n\r \x7f é 😀 </script>"
	r := d.call(t, tw.key, "memory_put", putArgs("title", "t<&>\u2028", "content", strings.Repeat(tricky, 3)))
	if !r.ok() {
		t.Fatalf("memory_put: %s", r.Raw)
	}
	code := r.str("code")
	w, err := tw.serve("/api/v1/memory_get", []byte(`{"code":"`+code+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	env := bytes.TrimRight(w.Body.Bytes(), "\n")
	w, err = tw.serve("/mcp", []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"memory_get","arguments":{"code":"`+code+`"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	got := w.Body.Bytes()
	if i := bytes.Index(got, []byte("data: ")); i >= 0 { // an event stream
		got = got[i+len("data: "):]
		got = got[:bytes.IndexByte(got, '\n')]
	}
	got = bytes.TrimRight(got, "\n")

	// The unpatched encoding: encoding/json without HTML escaping, once for
	// the result and once for the message around it.
	encode := func(v any) []byte {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		return bytes.TrimRight(buf.Bytes(), "\n")
	}
	result := encode(&mcp.CallToolResult{StructuredContent: json.RawMessage(env), Content: []mcp.Content{&mcp.TextContent{Text: string(env)}}})
	want := encode(struct {
		V  string          `json:"jsonrpc"`
		ID int             `json:"id"`
		R  json.RawMessage `json:"result"`
	}{"2.0", 1, result})
	if !bytes.Equal(got, want) {
		t.Errorf("MCP answer changed:\ngot  %s\nwant %s", got, want)
	}
	// The escapes a client sees: the SDK's inner json.Marshal escapes
	// HTML, the outer encoding must keep that and add nothing.
	for _, s := range []string{`\u003cb\u003e\u0026amp;`, `\u2028\u2029`, `\\\"q\\\"`} {
		if !bytes.Contains(got, []byte(s)) {
			t.Errorf("MCP answer lacks %s:\n%s", s, got)
		}
	}
}
