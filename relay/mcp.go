package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/tool"
)

// Protocol versions Dojo speaks on /mcp. 2026-07-28 has no initialize; the
// SDK serves it through server/discover in stateless mode.
var protocolVersions = []string{"2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"}

const instructions = "Dojo serves the Kungfu 3.0 tools. Start every session with todo_list; " +
	"account_register (no key) creates an account and returns its Agent key once; every other tool " +
	"needs Authorization: Bearer <Agent key>. A KarmaDue agent with its own Ed25519 key registers with " +
	"register_challenge and register_agent, then signs every call kd-mcp-v1 (x-kd-signature, x-kd-timestamp, " +
	"x-kd-nonce) with agent_id in the arguments instead of sending a Bearer key."

// mcpHandler is POST /mcp: the go-sdk's stateless Streamable HTTP transport
// with plain JSON responses, behind Dojo's key check.
func (s *Server) mcpHandler() http.Handler {
	srv := mcp.NewServer(&mcp.Implementation{Name: "dojo", Title: "Dojo", Version: kungfu.Version},
		&mcp.ServerOptions{Instructions: instructions, SupportedProtocolVersions: protocolVersions})
	for _, t := range s.tools.Tools() {
		name := t.Name
		srv.AddTool(&mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: json.RawMessage(t.Schema)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				var env envelope
				switch v := verdictFrom(ctx); {
				case v == nil:
					// admitMCP saw no lone tools/call here, so it judged no
					// signature: one that reaches this far anyway is refused,
					// never run as the Bearer (or anonymous) caller.
					var h http.Header
					if req.Extra != nil {
						h = req.Extra.Header
					}
					if signed, names := s.inspect(h, req.Params.Arguments); signed || names {
						env = refusal(kungfu.Errorf(kungfu.CodeInvalidRequest, "a signed tools/call, or one naming agent_id, must be sent alone as one JSON-RPC message"))
						break
					}
					env = s.call(ctx, kungfu.CallerFrom(ctx), name, req.Params.Arguments)
				case v.name != name:
					// The SDK read another tool than admit did: the body
					// is ambiguous (repeated keys), so nothing runs.
					env = refusal(kungfu.Errorf(kungfu.CodeInvalidRequest, "the tools/call message is ambiguous: send each key once"))
				case v.refused != nil:
					env = *v.refused
				default:
					if v.spend != nil {
						// Only now has the SDK accepted the request: a refusal
						// of its own leaves the nonce unspent for a resend.
						if err := v.spend(ctx); err != nil {
							env = s.fail(ctx, name, err)
							break
						}
					}
					if kungfu.CallerFrom(ctx) != v.who {
						// A signed call: admit found another caller
						// than the Bearer one ctx carries.
						ctx = kungfu.WithCaller(ctx, v.who)
					}
					env = s.callWith(ctx, v.who, name, v.args, v.pre)
				}
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
		if e := jsonBody(r); e != nil {
			writeEnvelope(w, refusal(e))
			return
		}
		body, bodyErr := readBody(w, r, maxMCPBody)
		if bodyErr != nil {
			writeEnvelope(w, refusal(bodyErr))
			return
		}
		ctx, env := s.admitMCP(r, body)
		if env != nil {
			writeEnvelope(w, *env)
			return
		}
		r.Body = newBodyReader(body)
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// bodyReader gives the SDK the body Dojo has read, in one allocation
// where io.NopCloser around a bytes.Reader takes two.
type bodyReader struct{ bytes.Reader }

func newBodyReader(b []byte) *bodyReader {
	r := new(bodyReader)
	r.Reset(b)
	return r
}

func (*bodyReader) Close() error { return nil }

func needKey() *kungfu.Error {
	return kungfu.Errorf(kungfu.CodeUnauthorized, "this call needs Authorization: Bearer <Agent key> or a kd-mcp-v1 signature; account_register creates a key")
}

// admitMCP decides who makes an MCP request. The handshake, ping,
// tools/list and server/discover are open to anyone; a body Dojo cannot
// read is left to the SDK to refuse. A tools/call that has no credential
// (or a bad Bearer key) for a tool that needs one is refused here, at the
// HTTP level, as before; a refused signature is the tool's result
// (isError, HTTP 200), which KarmaDue clients expect.
func (s *Server) admitMCP(r *http.Request, body []byte) (context.Context, *envelope) {
	calls, batch, ok := readCalls(body)
	lone := ok && !batch && len(calls) == 1
	var (
		signed, names bool
		t             *tool.Tool
		known         bool
		who           kungfu.Caller
		pre           tool.Handler
		authErr       error
	)
	if lone {
		signed, names = s.inspect(r.Header, calls[0].args)
		t, known = s.tools.Lookup(calls[0].name)
	}
	if lone && known && !signed && !names {
		// Runs as the key's account with these very arguments: its first
		// read may travel with the key lookup.
		who, pre, authErr = s.authenticateFor(r, t, calls[0].args)
	} else {
		who, authErr = s.authenticate(r)
	}
	ctx := kungfu.WithCaller(r.Context(), who)
	if !ok {
		return ctx, nil
	}
	if batch {
		for _, c := range calls {
			if signed, names := s.inspect(r.Header, c.args); signed || names {
				env := refusal(kungfu.Errorf(kungfu.CodeInvalidRequest, "a signed tools/call, or one naming agent_id, must be sent alone, not in a JSON-RPC batch"))
				return ctx, &env
			}
			if t, ok := s.tools.Lookup(c.name); (!ok || !t.Public) && (authErr != nil || who.Anonymous()) {
				env := refusal(needKey())
				return ctx, &env
			}
		}
		return ctx, nil
	}
	if len(calls) != 1 {
		return ctx, nil
	}
	c := calls[0]
	if !known {
		// The SDK names the unknown tool; only a caller who sent no
		// credential at all is told to get one first.
		if (authErr != nil || who.Anonymous()) && !signed {
			env := refusal(needKey())
			return ctx, &env
		}
		return ctx, nil
	}
	v := &verdict{name: c.name}
	caller, args, spend, err := s.admit(r, who, authErr, t, c.args, signed, names)
	switch {
	case err != nil && err == authErr && t.Public:
		// A public tool that refuses a bad key (register_agent) says why.
		env := s.fail(r.Context(), c.name, err)
		return ctx, &env
	case err != nil && err == authErr:
		env := refusal(needKey())
		return ctx, &env
	case err != nil:
		env := s.fail(r.Context(), c.name, err)
		v.refused = &env
	case !t.Public && caller.Anonymous():
		env := refusal(needKey())
		return ctx, &env
	default:
		v.who, v.args, v.spend, v.pre = caller, args, spend, pre
	}
	return withVerdict(ctx, v), nil
}

// readCalls is toolCalls for the body nearly every MCP request sends: one
// JSON-RPC object whose keys are plain ASCII. It finds the same method,
// name and arguments by slicing the body instead of decoding it into maps,
// which cost more allocations than the rest of admitMCP together. Any other
// body (a batch, escaped or non-ASCII keys or names, params that are not an
// object) goes to toolCalls, so the two never disagree.
func readCalls(body []byte) (calls []rpcCall, batch, ok bool) {
	if c, simple, isCall := plainCall(body); simple {
		if !isCall {
			return nil, false, true
		}
		return []rpcCall{c}, false, true
	}
	return toolCalls(body)
}

// plainCall reads a body holding one JSON object. simple is false when the
// body is anything else, or when a key or the tool name would need
// unescaping to compare.
func plainCall(body []byte) (c rpcCall, simple, isCall bool) {
	if !json.Valid(body) {
		return c, false, false
	}
	method, params, ok := members(body, "method", "params")
	if !ok {
		return c, false, false
	}
	if bytes.IndexByte(method, '\\') >= 0 {
		return c, false, false
	}
	if string(method) != `"tools/call"` {
		// A string with no escape spells tools/call only literally; a
		// missing or non-string method is no tools/call either.
		return c, true, false
	}
	name, args, ok := members(params, "name", "arguments")
	if !ok || !plain(name) {
		return c, false, false
	}
	c.name = string(name[1 : len(name)-1])
	if len(args) > 0 && string(args) != "null" {
		// A copy, as decoding gives: the SDK reads the body again.
		c.args = bytes.Clone(args)
	} else {
		c.args = []byte(`{}`)
	}
	return c, true, true
}

// members finds the values of two keys in a valid JSON object, the last of
// a repeated key winning as in encoding/json; ok is false for a value that
// is not an object or a key that is not plain.
func members(obj []byte, key1, key2 string) (val1, val2 []byte, ok bool) {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return nil, nil, false
	}
	for i = skipSpace(obj, i+1); i < len(obj) && obj[i] != '}'; {
		end := skipValue(obj, i)
		if !plain(obj[i:end]) {
			return nil, nil, false
		}
		key := obj[i+1 : end-1]
		i = skipSpace(obj, skipSpace(obj, end)+1) // past the colon
		end = skipValue(obj, i)
		switch string(key) {
		case key1:
			val1 = obj[i:end]
		case key2:
			val2 = obj[i:end]
		}
		if i = skipSpace(obj, end); i < len(obj) && obj[i] == ',' {
			i = skipSpace(obj, i+1)
		}
	}
	return val1, val2, true
}

// plain reports whether raw is a JSON string of printable ASCII without
// escapes, whose text is raw without its quotes.
func plain(raw []byte) bool {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return false
	}
	for _, b := range raw[1 : len(raw)-1] {
		if b < 0x20 || b > 0x7e || b == '\\' || b == '"' {
			return false
		}
	}
	return true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the JSON value starting at b[i], which the
// caller has checked is valid JSON.
func skipValue(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r', ':':
			if depth == 0 {
				return i
			}
		}
	}
	return i
}
