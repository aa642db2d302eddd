package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/dojo-relay/dojo/kungfu"
)

// Protocol versions Dojo speaks on /mcp. 2026-07-28 has no initialize; the
// SDK serves it through server/discover in stateless mode.
var protocolVersions = []string{"2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"}

const instructions = "Dojo serves the Kungfu 3.0 tools. Start every session with todo_list; " +
	"account_register (no key) creates an account and returns its Agent key once; every other tool " +
	"needs Authorization: Bearer <Agent key>."

// mcpHandler is POST /mcp: the go-sdk's stateless Streamable HTTP transport
// with plain JSON responses, behind Dojo's key check.
func (s *Server) mcpHandler() http.Handler {
	srv := mcp.NewServer(&mcp.Implementation{Name: "dojo", Title: "Dojo", Version: kungfu.Version},
		&mcp.ServerOptions{Instructions: instructions, SupportedProtocolVersions: protocolVersions})
	for _, t := range s.tools.Tools() {
		name := t.Name
		srv.AddTool(&mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: json.RawMessage(t.Schema)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				env := s.call(ctx, kungfu.CallerFrom(ctx), name, req.Params.Arguments)
				return &mcp.CallToolResult{
					IsError:           !env.ok,
					StructuredContent: json.RawMessage(env.body),
					Content:           []mcp.Content{&mcp.TextContent{Text: string(env.body)}},
				}, nil
			})
	}
	// The SDK's own Host check is off: s.guard applies the same rule, plus
	// Origin, to every door, and knows the public name behind a proxy.
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, Logger: s.log, MaxRequestBodyBytes: maxMCPBody,
			DisableLocalhostProtection: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e := s.guard.check(r); e != nil {
			writeEnvelope(w, refusal(e))
			return
		}
		if r.Method != http.MethodPost {
			h.ServeHTTP(w, r)
			return
		}
		body, bodyErr := readBody(w, r, maxMCPBody)
		if bodyErr != nil {
			writeEnvelope(w, refusal(bodyErr))
			return
		}
		who, authErr := s.authenticate(r)
		if s.needsAccount(body) && (authErr != nil || who.Anonymous()) {
			writeEnvelope(w, refusal(kungfu.Errorf(kungfu.CodeUnauthorized, "this call needs Authorization: Bearer <Agent key>; account_register creates one")))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r.WithContext(kungfu.WithCaller(r.Context(), who)))
	})
}

type rpcMessage struct {
	Method string `json:"method"`
	Params struct {
		Name string `json:"name"`
	} `json:"params"`
}

// needsAccount reports whether the JSON-RPC body calls a tool that is not
// public. The handshake, ping, tools/list and server/discover are open to
// anyone; a body Dojo cannot read is left to the SDK to refuse.
func (s *Server) needsAccount(body []byte) bool {
	var msgs []rpcMessage
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		if json.Unmarshal(body, &msgs) != nil {
			return false
		}
	} else {
		var m rpcMessage
		if json.Unmarshal(body, &m) != nil {
			return false
		}
		msgs = []rpcMessage{m}
	}
	for _, m := range msgs {
		if m.Method != "tools/call" {
			continue
		}
		if t, ok := s.tools.Lookup(m.Params.Name); !ok || !t.Public {
			return true
		}
	}
	return false
}
