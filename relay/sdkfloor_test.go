package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkSDKFloor is what the go-sdk's stateless Streamable HTTP
// transport costs per tools/call with nothing else in the way: one tool
// that answers a fixed memory_get-sized envelope, served over loopback
// HTTP, against a plain net/http handler that reads the same arguments and
// answers the same envelope. No database, no key, no Dojo code. The
// difference between the two is the SDK's own cost per call, which no
// change in Dojo can take away without bypassing the SDK (see
// docs/performance.md, "Why MCP stays below its twin").
//
//	go test -run '^$' -bench SDKFloor -cpu 2 ./relay/
//
// Both sides run in this one process, clients included, so with 2 CPUs
// busy ns/op is about half of the CPU time one call takes, client and
// server together; the difference between the rows is the SDK's share.
func BenchmarkSDKFloor(b *testing.B) {
	env := []byte(`{"ok":true,"code":"0123456789ab","revision":1,"title":"Field notes","tags":["bench"],"description":"",` +
		`"content":"` + strings.Repeat("lorem ipsum ", 7) + `","checksum":"` + strings.Repeat("ab", 32) + `",` +
		`"visibility":"private","status":"active","origin":"standalone","owner":"bench_0001",` +
		`"created_at":"2026-12-01T04:39:00Z","updated_at":"2026-12-01T04:39:00Z","next_action":"read it"}`)
	type getArgs struct {
		Code string `json:"code"`
	}

	plain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, err := io.ReadAll(r.Body)
		var in getArgs
		if err != nil || json.Unmarshal(raw, &in) != nil || in.Code == "" {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(env)
	})

	// viaSDK serves the tool through the SDK. With text false it answers
	// structuredContent alone: the part of the floor that is the choice to
	// repeat the envelope as text.
	viaSDK := func(text bool) http.Handler {
		srv := mcp.NewServer(&mcp.Implementation{Name: "floor", Version: "1"}, nil)
		srv.AddTool(&mcp.Tool{Name: "memory_get", InputSchema: json.RawMessage(`{"type":"object","properties":{"code":{"type":"string"}}}`)},
			func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				var in getArgs
				if err := json.Unmarshal(req.Params.Arguments, &in); err != nil || in.Code == "" {
					return nil, err
				}
				res := &mcp.CallToolResult{StructuredContent: json.RawMessage(env), Content: []mcp.Content{}}
				if text {
					res.Content = []mcp.Content{&mcp.TextContent{Text: string(env)}}
				}
				return res, nil
			})
		return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
			&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, DisableLocalhostProtection: true})
	}
	call := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"memory_get","arguments":{"code":"0123456789ab"}}}`)

	for _, bc := range []struct {
		name string
		h    http.Handler
		body []byte
		want string
	}{
		{"HTTP", plain, []byte(`{"code":"0123456789ab"}`), `"ok":true`},
		{"MCP", viaSDK(true), call, `"structuredContent":{"ok":true`},
		{"MCP_structured_only", viaSDK(false), call, `"structuredContent":{"ok":true`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ts := httptest.NewServer(bc.h)
			defer ts.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
			defer client.CloseIdleConnections()
			b.ReportAllocs()
			// 16 clients on 2 CPUs, as the load command runs them.
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest(http.MethodPost, ts.URL, bytes.NewReader(bc.body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Accept", "application/json, text/event-stream")
					req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					raw, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != http.StatusOK || !bytes.Contains(raw, []byte(bc.want)) {
						b.Errorf("status %d: %s", resp.StatusCode, raw)
						return
					}
				}
			})
		})
	}
}
