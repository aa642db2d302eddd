package relay_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/dojo-relay/dojo/relay"
)

type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.key != "" {
		r.Header.Set("Authorization", "Bearer "+b.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func connect(t *testing.T, d *dojo, key, version string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "dojo-test", Version: "1"}, nil)
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: d.URL + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{key}}}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect %s: %v", version, err)
	}
	t.Cleanup(func() { s.Close() })
	if got := s.InitializeResult().ProtocolVersion; got != version {
		t.Fatalf("negotiated %s, want %s", got, version)
	}
	return s
}

func callTool(t *testing.T, s *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, map[string]any) {
	t.Helper()
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var env map[string]any
	if err := json.Unmarshal(raw, &env); err != nil {
		t.Fatalf("%s: structuredContent %s", name, raw)
	}
	// The same JSON is also the text content.
	if len(res.Content) != 1 {
		t.Fatalf("%s: %d content blocks", name, len(res.Content))
	}
	var text map[string]any
	if err := json.Unmarshal([]byte(res.Content[0].(*mcp.TextContent).Text), &text); err != nil || text["ok"] != env["ok"] {
		t.Fatalf("%s: text content differs from structuredContent", name)
	}
	return res, env
}

func TestMCPAllVersions(t *testing.T) {
	t.Parallel()
	d := start(t)
	for i, version := range []string{"2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"} {
		t.Run(version, func(t *testing.T) {
			anon := connect(t, d, "", version)
			tools, err := anon.ListTools(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			byName := map[string]*mcp.Tool{}
			for _, tl := range tools.Tools {
				byName[tl.Name] = tl
			}
			put := byName["memory_put"]
			if put == nil || len(byName) < 8 {
				t.Fatalf("tools/list: %d tools", len(byName))
			}
			schema, _ := json.Marshal(put.InputSchema)
			if !strings.Contains(string(schema), `"required":["title","tags","content"]`) || !strings.Contains(string(schema), `"additionalProperties":false`) {
				t.Fatalf("memory_put schema: %s", schema)
			}

			name := "mcp_user_" + string(rune('a'+i))
			res, reg := callTool(t, anon, "account_register", map[string]any{"name": name, "password": "secret-pw"})
			if res.IsError || reg["ok"] != true {
				t.Fatalf("account_register: %v", reg)
			}
			key := reg["api_key"].(string)

			// Without a key a protected tool is refused before it runs.
			if _, err := anon.CallTool(context.Background(), &mcp.CallToolParams{Name: "account_status", Arguments: map[string]any{}}); err == nil {
				t.Fatal("account_status without a key succeeded")
			}

			s := connect(t, d, key, version)
			_, st := callTool(t, s, "account_status", map[string]any{})
			if st["bot_name"] != name || st["balance"] != float64(66) {
				t.Fatalf("account_status: %v", st)
			}
			_, put2 := callTool(t, s, "memory_put", map[string]any{"title": "MCP note", "tags": []string{"mcp"}, "content": content(70)})
			code, _ := put2["code"].(string)
			if put2["ok"] != true || len(code) != 12 {
				t.Fatalf("memory_put: %v", put2)
			}
			_, got := callTool(t, s, "memory_get", map[string]any{"code": code})
			if got["content"] != content(70) || got["revision"] != float64(1) {
				t.Fatalf("memory_get: %v", got)
			}

			// A refused call: isError with the structured envelope.
			res, bad := callTool(t, s, "memory_get", map[string]any{"code": "000000000000"})
			errObj, _ := bad["error"].(map[string]any)
			if !res.IsError || bad["ok"] != false || errObj["code"] != "NOT_FOUND" {
				t.Fatalf("refusal: isError=%v %v", res.IsError, bad)
			}
			res, bad = callTool(t, s, "memory_put", map[string]any{"title": "x", "tags": []string{"a"}, "content": content(60), "extra": 1})
			errObj, _ = bad["error"].(map[string]any)
			if !res.IsError || errObj["code"] != "VALIDATION_FAILED" || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, `"field":"extra"`) {
				t.Fatalf("unknown argument: %v", bad)
			}
		})
	}
}

func TestMCPRawHTTP(t *testing.T) {
	t.Parallel()
	d := start(t)
	key, _ := d.register(t)
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"account_status","arguments":{}}}`)
	accept := []string{"Accept", "application/json, text/event-stream", "Mcp-Protocol-Version", "2025-11-25"}
	r := post(t, d.URL+"/mcp", "", body, accept...)
	expect(t, r, 401, "UNAUTHORIZED")
	if !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("WWW-Authenticate missing")
	}
	expect(t, post(t, d.URL+"/mcp", "kf_live_"+strings.Repeat("f", 64), body, accept...), 401, "UNAUTHORIZED")
	ok := post(t, d.URL+"/mcp", key, body, accept...)
	if ok.Status != 200 || !strings.Contains(ok.Raw, `"structuredContent":{"ok":true`) {
		t.Fatalf("authorized call: %d %s", ok.Status, ok.Raw)
	}
	// The handshake and tools/list need no key.
	init := post(t, d.URL+"/mcp", "", []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}`), accept...)
	if init.Status != 200 || !strings.Contains(init.Raw, `"protocolVersion":"2025-06-18"`) {
		t.Fatalf("initialize: %d %s", init.Status, init.Raw)
	}
	big := append([]byte(`{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"`), []byte(strings.Repeat("a", 1<<20))...)
	expect(t, post(t, d.URL+"/mcp", key, append(big, []byte(`"}}`)...), accept...), 413, "PAYLOAD_TOO_LARGE")
}

// Behind a reverse proxy on the same machine, /mcp answers requests whose
// Host is the public name; a local-only Dojo still refuses them.
func TestMCPBehindProxy(t *testing.T) {
	t.Parallel()
	init := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"proxy","version":"1"}}}`)
	send := func(d *dojo) int {
		req, _ := http.NewRequest(http.MethodPost, d.URL+"/mcp", strings.NewReader(string(init)))
		req.Host = "dojo.example.org"
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := send(start(t)); code != http.StatusForbidden {
		t.Fatalf("local-only Dojo answered a foreign Host with %d, want 403", code)
	}
	public := start(t, func(o *relay.Options) { o.PublicURL = "https://dojo.example.org" })
	if code := send(public); code != http.StatusOK {
		t.Fatalf("Dojo behind a proxy answered %d, want 200", code)
	}
}
