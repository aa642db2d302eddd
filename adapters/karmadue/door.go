package karmadue

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/signing"
)

// Window is how far a signed timestamp may be from the server clock, either
// way.
const Window = 300 * time.Second

// NonceTTL is how long a spent nonce is remembered. A timestamp ts is
// accepted while the whole-second clock lies in [ts-Window, ts+Window], that
// is until just before ts+Window+1 s; a nonce first spent at ts-Window must
// outlive that, and the margin also covers processes whose clocks differ
// by a few seconds.
const NonceTTL = 2*Window + 10*time.Second

const (
	// AgentArg is the argument naming the signing agent.
	AgentArg = "agent_id"
	// AuthArg carries the signature for clients that cannot set headers.
	AuthArg = "_kd_auth"
)

// Directory finds agents and their live keys; *Service is one.
type Directory interface {
	// Agent returns an active agent with its live keys, or ErrUnknownAgent.
	Agent(ctx context.Context, agentID string) (Agent, error)
	// AgentOf returns the agent id of an account: "" (or ErrUnknownAgent)
	// when it has none.
	AgentOf(ctx context.Context, accountID int64) (string, error)
}

// Door verifies kd-mcp-v1 signed tool calls. It knows nothing of the tools
// behind it: a transport hands it the request headers, the tool name and
// the raw arguments, and gets back the agent to act as and the arguments
// the registry should see.
type Door struct {
	Agents Directory
	Redis  redis.UniversalClient
	// Prefix namespaces the spent nonces: the deployment's Redis prefix,
	// so every process of one deployment shares them.
	Prefix string
	Now    kungfu.Clock
}

// ErrNonceStore marks a call that could not be judged because Redis,
// which remembers spent nonces, failed: nothing was done.
var ErrNonceStore = errors.New("karmadue: nonce store unavailable")

// Call is one tool call as it arrived.
type Call struct {
	Header http.Header
	Tool   string
	// Args are the raw bytes of the arguments object, as sent.
	Args []byte
	// KeepAgentID leaves agent_id in the arguments handed on: the tool
	// takes an agent_id argument of its own.
	KeepAgentID bool
}

// Verified is a call whose signature verified.
type Verified struct {
	Agent Agent
	// KeyID is the credential id of the key that verified.
	KeyID int64
	// Args are the arguments without _kd_auth and (unless kept) agent_id,
	// every other member byte for byte as sent.
	Args  []byte
	nonce string
}

// The one message for every signature that does not verify, whatever the
// reason: a caller must not learn whether an agent exists, was revoked or
// rotated its key.
const badSignature = "the signature does not verify"

// Inspect reports, reading the arguments at most once, whether a call is
// signed (any x-kd-* header, or an _kd_auth member) and whether its
// arguments name an agent_id.
func Inspect(h http.Header, args []byte) (signed, namesAgent bool) {
	signed = kdHeaders(h)
	// Only a \u escape can spell a key's letters otherwise, so most calls
	// are answered without a parse.
	if !bytes.Contains(args, []byte(`\u`)) && !bytes.Contains(args, []byte(AuthArg)) && !bytes.Contains(args, []byte(AgentArg)) {
		return signed, false
	}
	ms, err := members(args)
	if err != nil {
		return signed, false
	}
	for _, m := range ms {
		switch m.key {
		case AuthArg:
			signed = true
		case AgentArg:
			namesAgent = true
		}
	}
	return signed, namesAgent
}

func kdHeaders(h http.Header) bool {
	for k := range h {
		if len(k) > 5 && strings.EqualFold(k[:5], "x-kd-") {
			return true
		}
	}
	return false
}

// auth is the signature material of one call, as sent.
type auth struct{ signature, timestamp, nonce string }

// Verify checks a signed call and spends its nonce: Check, then Spend.
func (d *Door) Verify(ctx context.Context, c Call) (Verified, error) {
	v, err := d.Check(ctx, c)
	if err != nil {
		return Verified{}, err
	}
	if err := d.Spend(ctx, v); err != nil {
		return Verified{}, err
	}
	return v, nil
}

// Check verifies a signed call without spending its nonce, in the order a
// caller can fix things: the material is present, agent_id is named, the
// timestamp is fresh, the nonce well formed, the signature verifies
// against a live key of the agent. A transport that still has checks of
// its own to make (the MCP library's) spends the nonce after them, so a
// request it refuses can be sent again as is.
func (d *Door) Check(ctx context.Context, c Call) (Verified, error) {
	ms, err := members(c.Args)
	if err != nil {
		return Verified{}, kungfu.Invalid(kungfu.FieldError{Field: "arguments", Message: err.Error()})
	}
	a, err := readAuth(c.Header, ms)
	if err != nil {
		return Verified{}, err
	}
	agentID, err := agentArg(ms)
	if err != nil {
		return Verified{}, err
	}
	if err := sameAgent(c.Header, agentID); err != nil {
		return Verified{}, err
	}
	if err := d.fresh(a.timestamp); err != nil {
		return Verified{}, err
	}
	if !goodNonce(a.nonce) {
		return Verified{}, kungfu.Errorf(kungfu.CodeBadNonce, "the nonce must be 16 to 128 characters of A-Z a-z 0-9 _ -")
	}
	sig, err := signing.DecodeKDSignature(a.signature)
	if err != nil {
		return Verified{}, kungfu.Errorf(kungfu.CodeBadSignature, badSignature)
	}
	signed := without(c.Args, ms, func(k string) bool { return k == AuthArg })
	canonical, err := signing.Canonical(signed)
	if err != nil {
		return Verified{}, kungfu.Invalid(kungfu.FieldError{Field: "arguments", Message: err.Error()})
	}
	if !isAgentID(agentID) {
		return Verified{}, kungfu.Errorf(kungfu.CodeBadSignature, badSignature)
	}
	agent, err := d.Agents.Agent(ctx, agentID)
	if errors.Is(err, ErrUnknownAgent) {
		return Verified{}, kungfu.Errorf(kungfu.CodeBadSignature, badSignature)
	}
	if err != nil {
		return Verified{}, fmt.Errorf("karmadue: agent %s: %w", agentID, err)
	}
	text := []byte(signing.KDText(c.Tool, agentID, a.timestamp, a.nonce, signing.ArgsHash(canonical)))
	i := verifies(agent.Keys, text, sig)
	if i < 0 {
		return Verified{}, kungfu.Errorf(kungfu.CodeBadSignature, badSignature)
	}
	v := Verified{Agent: agent, nonce: a.nonce}
	if i < len(agent.KeyIDs) {
		v.KeyID = agent.KeyIDs[i]
	}
	v.Args = without(c.Args, ms, func(k string) bool { return k == AuthArg || (k == AgentArg && !c.KeepAgentID) })
	return v, nil
}

// Spend marks the nonce of a checked call used by its agent, atomically
// across every process of the deployment: replay when it already was.
func (d *Door) Spend(ctx context.Context, v Verified) error {
	ok, err := d.Redis.SetNX(ctx, d.Prefix+"kdnonce:"+v.Agent.ID+":"+v.nonce, 1, NonceTTL).Result()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNonceStore, err)
	}
	if !ok {
		return kungfu.Errorf(kungfu.CodeReplay, "this nonce was already used by this agent: sign again with a fresh nonce")
	}
	return nil
}

// Claimed handles an unsigned call whose arguments name an agent_id: the
// account acting (by a Bearer key) may name its own agent, which is then
// removed from the arguments; naming another is forbidden, and an
// anonymous caller must sign. An x-karmadue-agent header, when sent, must
// name the same agent, as on a signed call.
func (d *Door) Claimed(ctx context.Context, h http.Header, accountID int64, args []byte) ([]byte, error) {
	ms, err := members(args)
	if err != nil {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "arguments", Message: err.Error()})
	}
	agentID, err := agentArg(ms)
	if err != nil {
		return nil, err
	}
	if err := sameAgent(h, agentID); err != nil {
		return nil, err
	}
	if accountID == 0 {
		return nil, kungfu.Errorf(kungfu.CodeSignatureRequired,
			"agent_id names a KarmaDue agent: sign the call (x-kd-signature, x-kd-timestamp, x-kd-nonce) or send its account's Bearer key")
	}
	own, err := d.Agents.AgentOf(ctx, accountID)
	if err != nil && !errors.Is(err, ErrUnknownAgent) {
		return nil, fmt.Errorf("karmadue: agent of account %d: %w", accountID, err)
	}
	if err != nil || own != agentID {
		return nil, kungfu.Errorf(kungfu.CodeForbidden, "agent_id is not the agent of the account whose key you sent")
	}
	return without(args, ms, func(k string) bool { return k == AgentArg }), nil
}

// sameAgent checks the optional x-karmadue-agent header against agent_id.
func sameAgent(h http.Header, agentID string) error {
	if hv := h.Values("X-Karmadue-Agent"); len(hv) > 0 && (len(hv) > 1 || hv[0] != agentID) {
		return kungfu.Errorf(kungfu.CodeAgentMismatch, "the x-karmadue-agent header is not the agent_id in the arguments")
	}
	return nil
}

// readAuth takes the signature material from the x-kd-* headers or from
// _kd_auth. Both at once is ambiguous (which one was meant to count?) and
// refused.
func readAuth(h http.Header, ms []member) (auth, error) {
	var inArgs *member
	for i := range ms {
		if ms[i].key == AuthArg {
			inArgs = &ms[i]
		}
	}
	headers := kdHeaders(h)
	switch {
	case headers && inArgs != nil:
		return auth{}, kungfu.Invalid(
			kungfu.FieldError{Field: "x-kd-signature", Message: "send the signature in the x-kd-* headers or in _kd_auth, not both"},
			kungfu.FieldError{Field: AuthArg, Message: "send the signature in the x-kd-* headers or in _kd_auth, not both"})
	case headers:
		return headerAuth(h)
	case inArgs != nil:
		return argAuth(inArgs.value)
	default:
		return auth{}, missing()
	}
}

func headerAuth(h http.Header) (auth, error) {
	var a auth
	for _, f := range []struct {
		name string
		dst  *string
		code string
	}{{"X-Kd-Signature", &a.signature, kungfu.CodeBadSignature}, {"X-Kd-Timestamp", &a.timestamp, kungfu.CodeStaleSignature}, {"X-Kd-Nonce", &a.nonce, kungfu.CodeBadNonce}} {
		v := h.Values(f.name)
		switch {
		case len(v) == 0 || v[0] == "":
			return auth{}, missing()
		case len(v) > 1:
			return auth{}, kungfu.Errorf(f.code, "send %s once", strings.ToLower(f.name))
		}
		*f.dst = v[0]
	}
	return a, nil
}

// argAuth reads _kd_auth: {signature, timestamp, nonce}, the timestamp an
// integer or a decimal string. The timestamp's text is the literal sent:
// that is what the client put on line 4 of the text it signed.
func argAuth(raw []byte) (auth, error) {
	ms, err := members(raw)
	if err != nil {
		return auth{}, kungfu.Errorf(kungfu.CodeSignatureRequired, "_kd_auth must be an object {signature, timestamp, nonce}")
	}
	var a auth
	for _, m := range ms {
		switch m.key {
		case "signature", "nonce":
			var s string
			if json.Unmarshal(m.value, &s) != nil {
				if m.key == "nonce" {
					return auth{}, kungfu.Errorf(kungfu.CodeBadNonce, "_kd_auth.nonce must be a string")
				}
				return auth{}, kungfu.Errorf(kungfu.CodeBadSignature, badSignature)
			}
			if m.key == "nonce" {
				a.nonce = s
			} else {
				a.signature = s
			}
		case "timestamp":
			var s string
			if m.value[0] == '"' {
				if json.Unmarshal(m.value, &s) != nil {
					return auth{}, stale("_kd_auth.timestamp must be whole Unix seconds")
				}
			} else {
				s = string(m.value)
			}
			if s == "" {
				s = "-" // present but empty: malformed, not missing
			}
			a.timestamp = s
		}
	}
	if a.signature == "" || a.timestamp == "" || a.nonce == "" {
		return auth{}, missing()
	}
	return a, nil
}

func missing() *kungfu.Error {
	return kungfu.Errorf(kungfu.CodeSignatureRequired,
		"a signed call needs a signature, a timestamp and a nonce (x-kd-signature, x-kd-timestamp, x-kd-nonce, or _kd_auth {signature, timestamp, nonce})")
}

func stale(msg string) *kungfu.Error { return kungfu.Errorf(kungfu.CodeStaleSignature, "%s", msg) }

// agentArg is the agent_id the arguments name; the last one when repeated,
// as PostgreSQL's jsonb (and so the canonical text) keeps the last.
func agentArg(ms []member) (string, error) {
	var raw []byte
	for _, m := range ms {
		if m.key == AgentArg {
			raw = m.value
		}
	}
	var id string
	if raw == nil || json.Unmarshal(raw, &id) != nil || id == "" {
		return "", kungfu.Invalid(kungfu.FieldError{Field: AgentArg, Message: "must be the agent id (a string); a signed call names its agent in the arguments"})
	}
	return id, nil
}

// fresh checks the timestamp is whole seconds within Window of the clock.
func (d *Door) fresh(ts string) error {
	if ts == "" || len(ts) > 19 || strings.Trim(ts, "0123456789") != "" {
		return stale("the timestamp must be whole Unix seconds")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return stale("the timestamp must be whole Unix seconds")
	}
	now := d.Now().Unix()
	if sec < now-int64(Window/time.Second) || sec > now+int64(Window/time.Second) {
		return kungfu.Errorf(kungfu.CodeStaleSignature, "the timestamp is more than %d seconds from the server clock", int64(Window/time.Second)).
			WithDetails(map[string]any{"server_time": now})
	}
	return nil
}

func goodNonce(n string) bool {
	if len(n) < 16 || len(n) > 128 {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// isAgentID reports whether id is a lowercase UUID with dashes, the only
// form an agent id takes; anything else cannot name an agent.
func isAgentID(id string) bool {
	if len(id) != 36 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
		}
	}
	return true
}

// verifies is the index of the key the signature verifies with, or -1.
func verifies(keys []ed25519.PublicKey, text, sig []byte) int {
	for i, k := range keys {
		if len(k) == ed25519.PublicKeySize && ed25519.Verify(k, text, sig) {
			return i
		}
	}
	return -1
}

// member is one top-level member of a raw JSON object: its decoded key,
// the raw bytes of `"key": value` as sent, and the value's raw bytes.
type member struct {
	key   string
	raw   []byte
	value []byte
}

// members splits a raw JSON object into its members, keeping each one's
// bytes as sent, repeated keys included.
func members(obj []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("the arguments must be a JSON object")
	}
	var ms []member
	for dec.More() {
		from := int(dec.InputOffset())
		tok, err := dec.Token()
		if err != nil {
			return nil, errors.New("the arguments are not valid JSON")
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, errors.New("the arguments are not valid JSON")
		}
		end := int(dec.InputOffset())
		// Between the previous value and the key lie only whitespace and
		// the separating comma.
		start := from + bytes.IndexByte(obj[from:end], '"')
		ms = append(ms, member{key: key, raw: obj[start:end], value: obj[end-len(v) : end]})
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, errors.New("the arguments are not valid JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("the arguments must be one JSON object")
	}
	return ms, nil
}

// without re-emits obj without the members drop selects: the others keep
// their bytes as sent, so numbers such as 2.50 reach the tool unchanged.
func without(obj []byte, ms []member, drop func(key string) bool) []byte {
	n := 0
	for _, m := range ms {
		if drop(m.key) {
			n++
		}
	}
	if n == 0 {
		return obj
	}
	var b bytes.Buffer
	b.Grow(len(obj))
	b.WriteByte('{')
	first := true
	for _, m := range ms {
		if drop(m.key) {
			continue
		}
		if !first {
			b.WriteByte(',')
		}
		first = false
		b.Write(m.raw)
	}
	b.WriteByte('}')
	return b.Bytes()
}
