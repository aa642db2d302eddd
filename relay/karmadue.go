package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/dojo-relay/dojo/adapters/karmadue"
	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/tool"
)

// admit decides who makes a call and which arguments its tool sees. A call
// signed kd-mcp-v1 acts as the signing agent's account, through the same
// registry as a Bearer key; its agent_id and _kd_auth are gone before the
// tool's schema is checked. A Bearer caller may name its own agent_id,
// which is dropped the same way. who and authErr are what the
// Authorization header said.
// signed and names are what inspect said of the call. spend, set for a
// signed call, spends its nonce: the transport calls it once nothing else
// can refuse the request, just before the tool runs.
func (s *Server) admit(r *http.Request, who kungfu.Caller, authErr error, t *tool.Tool, args []byte, signed, names bool) (kungfu.Caller, []byte, func(context.Context) error, error) {
	// A tool that takes an agent_id of its own (verify_agent,
	// get_signing_payload) keeps it: it is that tool's argument.
	keep := s.agentArg[t.Name]
	if signed {
		if r.Header.Get("Authorization") != "" {
			const both = "send either Authorization: Bearer <Agent key> or a kd-mcp-v1 signature, not both"
			return who, nil, nil, kungfu.Invalid(kungfu.FieldError{Field: "Authorization", Message: both},
				kungfu.FieldError{Field: "x-kd-signature", Message: both})
		}
		v, err := s.door.Check(r.Context(), karmadue.Call{Header: r.Header, Tool: t.Name, Args: args, KeepAgentID: keep})
		if err != nil {
			return who, nil, nil, err
		}
		spend := func(ctx context.Context) error {
			if err := s.door.Spend(ctx, v); errors.Is(err, karmadue.ErrNonceStore) {
				return fmt.Errorf("%w: %w", errRedis, err)
			} else if err != nil {
				return err
			}
			return nil
		}
		return kungfu.Caller{AccountID: v.Agent.AccountID, Name: v.Agent.Name, IP: who.IP, Agent: v.Agent.ID, AgentKey: v.KeyID}, v.Args, spend, nil
	}
	if authErr != nil && (!t.Public || keyBound[t.Name]) {
		return who, nil, nil, authErr
	}
	if names && !keep {
		stripped, err := s.door.Claimed(r.Context(), r.Header, who.AccountID, args)
		if err != nil {
			return who, nil, nil, err
		}
		return who, stripped, nil, nil
	}
	return who, args, nil, nil
}

// keyBound lists the public tools whose outcome depends on the Bearer key
// sent: register_agent attaches the agent to the key's account, and
// without one creates a key-only account. A key that fails there is
// refused rather than ignored, or a mistyped or revoked key would create a
// second account and spend the challenge. account_register keeps ignoring
// a bad key: it never uses one.
var keyBound = map[string]bool{"register_agent": true}

// inspect reports whether a call is signed and whether it names an
// agent_id; with no door, neither counts.
func (s *Server) inspect(h http.Header, args []byte) (signed, names bool) {
	if s.door == nil {
		return false, false
	}
	return karmadue.Inspect(h, args)
}

// takesAgentID lists the tools whose schema declares an agent_id argument.
func takesAgentID(reg *tool.Registry) map[string]bool {
	m := map[string]bool{}
	if reg == nil {
		return m
	}
	for _, t := range reg.Tools() {
		var schema struct {
			Properties map[string]json.RawMessage `json:"properties"`
		}
		if json.Unmarshal([]byte(t.Schema), &schema) == nil && schema.Properties[karmadue.AgentArg] != nil {
			m[t.Name] = true
		}
	}
	return m
}

// verdict is what admit decided for the one tools/call of an MCP request,
// read again by the tool handler the SDK calls: the SDK only routes, the
// arguments that run are the ones admit checked.
type verdict struct {
	name string
	who  kungfu.Caller
	args []byte
	// refused, when set, is answered instead (isError, HTTP 200).
	refused *envelope
	// spend spends a signed call's nonce once the SDK has accepted the
	// request.
	spend func(context.Context) error
	// pre finishes the call from the read authenticateFor sent with the
	// key lookup; nil when none was sent.
	pre tool.Handler
}

type verdictKey struct{}

func withVerdict(ctx context.Context, v *verdict) context.Context {
	return context.WithValue(ctx, verdictKey{}, v)
}

func verdictFrom(ctx context.Context) *verdict {
	v, _ := ctx.Value(verdictKey{}).(*verdict)
	return v
}

// rpcCall is one tools/call of a JSON-RPC body.
type rpcCall struct {
	name string
	args []byte
}

// toolCalls reads the tools/call messages of an MCP body. Keys match
// exactly, as the SDK matches them; absent arguments are the empty object.
// ok is false for a body that is not JSON-RPC, which is left to the SDK.
func toolCalls(body []byte) (calls []rpcCall, batch, ok bool) {
	var raws []json.RawMessage
	if err := json.Unmarshal(body, &raws); err == nil {
		batch = true
	} else {
		raws = []json.RawMessage{body}
	}
	for _, raw := range raws {
		var msg map[string]json.RawMessage
		if json.Unmarshal(raw, &msg) != nil {
			return nil, batch, false
		}
		var method string
		if json.Unmarshal(msg["method"], &method) != nil || method != "tools/call" {
			continue
		}
		var params map[string]json.RawMessage
		_ = json.Unmarshal(msg["params"], &params)
		var c rpcCall
		_ = json.Unmarshal(params["name"], &c.name)
		c.args = params["arguments"]
		if len(c.args) == 0 || string(c.args) == "null" {
			c.args = []byte(`{}`)
		}
		calls = append(calls, c)
	}
	return calls, batch, true
}
