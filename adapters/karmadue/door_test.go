package karmadue

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/signing"
)

// The seed's worked example (section "Signing a write (kd-mcp-v1)").
const (
	exampleAgent = "00000000-0000-4000-8000-000000000001"
	exampleArgs  = `{"agent_id": "00000000-0000-4000-8000-000000000001", "finding_id": "11111111-2222-4333-8444-555555555555", "reason": "test, café"}`
	exampleTS    = "1791700000"
	exampleNonce = "n-3f9a1c2e7b5d4f60"
	exampleSig   = "tfqegxIsYOO_QAOBGLjyFrP3IrWX-PHqWUEaDXjDRvi76ikl7lwt7eCRMfEa10vwYdLaeO8QaYck1X4YFOpuBA"
)

func exampleKey() ed25519.PrivateKey {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = byte(i)
	}
	return ed25519.NewKeyFromSeed(seed)
}

// directory is a fixed set of agents, standing in for the database the
// Service reads (the door's own logic is what these tests exercise).
type directory struct {
	agents map[string]Agent
	of     map[int64]string
}

func (d directory) Agent(_ context.Context, id string) (Agent, error) {
	a, ok := d.agents[id]
	if !ok || len(a.Keys) == 0 {
		return Agent{}, ErrUnknownAgent
	}
	return a, nil
}

func (d directory) AgentOf(_ context.Context, accountID int64) (string, error) {
	return d.of[accountID], nil
}

func redisClient(t *testing.T) redis.UniversalClient {
	t.Helper()
	return kungfutest.Redis(t)
}

// fixture is a door over one agent holding the example key, at the
// example's time.
type fixture struct {
	door *Door
	key  ed25519.PrivateKey
	now  time.Time
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{key: exampleKey(), now: time.Unix(1791700000, 0).UTC()}
	dir := directory{
		agents: map[string]Agent{exampleAgent: {ID: exampleAgent, AccountID: 7, Name: "kd_000000000001", Keys: []ed25519.PublicKey{f.key.Public().(ed25519.PublicKey)}}},
		of:     map[int64]string{7: exampleAgent},
	}
	f.door = &Door{Agents: dir, Redis: redisClient(t), Prefix: kungfutest.RedisPrefix(t), Now: func() time.Time { return f.now }}
	return f
}

// sign returns the x-kd-* headers for args signed with key.
func sign(t *testing.T, key ed25519.PrivateKey, tool, agentID, ts, nonce string, args []byte) http.Header {
	t.Helper()
	canonical, err := signing.Canonical(args)
	if err != nil {
		t.Fatal(err)
	}
	text := signing.KDText(tool, agentID, ts, nonce, signing.ArgsHash(canonical))
	h := http.Header{}
	h.Set("X-Kd-Signature", base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, []byte(text))))
	h.Set("X-Kd-Timestamp", ts)
	h.Set("X-Kd-Nonce", nonce)
	return h
}

func code(err error) string {
	if e := kungfu.AsError(err); e != nil {
		return e.Code
	}
	return ""
}

func TestDoorWorkedExample(t *testing.T) {
	f := newFixture(t)
	h := http.Header{}
	h.Set("x-kd-signature", exampleSig)
	h.Set("x-kd-timestamp", exampleTS)
	h.Set("x-kd-nonce", exampleNonce)
	h.Set("x-karmadue-agent", exampleAgent)
	v, err := f.door.Verify(context.Background(), Call{Header: h, Tool: "withdraw_finding", Args: []byte(exampleArgs)})
	if err != nil {
		t.Fatalf("the seed's worked example does not verify: %v", err)
	}
	if v.Agent.ID != exampleAgent || v.Agent.AccountID != 7 {
		t.Fatalf("agent %+v", v.Agent)
	}
	// agent_id is gone; the other members keep their bytes, spacing included.
	if want := `{"finding_id": "11111111-2222-4333-8444-555555555555","reason": "test, café"}`; string(v.Args) != want {
		t.Fatalf("args %s, want %s", v.Args, want)
	}
	// The same signature in standard base64 with padding decodes to the
	// same bytes and verifies; the nonce is spent by then, so: replay.
	std := strings.NewReplacer("-", "+", "_", "/").Replace(exampleSig) + "=="
	h.Set("x-kd-signature", std)
	if _, err := f.door.Verify(context.Background(), Call{Header: h, Tool: "withdraw_finding", Args: []byte(exampleArgs)}); code(err) != kungfu.CodeReplay {
		t.Fatalf("standard base64 spelling: %v", err)
	}
}

// _kd_auth carries the signature in the arguments and is removed before
// hashing; the timestamp may be an integer or a decimal string, and its
// literal is what was signed.
func TestDoorKDAuth(t *testing.T) {
	f := newFixture(t)
	args := `{"agent_id":"` + exampleAgent + `", "price": 2.50, "tags":["a" , "b"]}`
	for i, ts := range []string{`1791700000`, `"1791700001"`} {
		nonce := "kdauth-nonce-000" + string(rune('a'+i))
		tsText := strings.Trim(ts, `"`)
		h := sign(t, f.key, "memory_put", exampleAgent, tsText, nonce, []byte(args))
		withAuth := `{"_kd_auth": {"signature": "` + h.Get("X-Kd-Signature") + `", "timestamp": ` + ts + `, "nonce": "` + nonce + `"},` + args[1:]
		v, err := f.door.Verify(context.Background(), Call{Header: http.Header{}, Tool: "memory_put", Args: []byte(withAuth)})
		if err != nil {
			t.Fatalf("timestamp %s: %v", ts, err)
		}
		if want := `{"price": 2.50,"tags":["a" , "b"]}`; string(v.Args) != want {
			t.Fatalf("args %s, want %s", v.Args, want)
		}
		v, err = f.door.Verify(context.Background(), Call{Header: http.Header{}, Tool: "memory_put", Args: []byte(withAuth), KeepAgentID: true})
		if code(err) != kungfu.CodeReplay || v.Args != nil {
			t.Fatalf("the same _kd_auth again: %v", err)
		}
	}
}

func TestDoorKeepAgentID(t *testing.T) {
	f := newFixture(t)
	args := []byte(`{"agent_id":"` + exampleAgent + `"}`)
	h := sign(t, f.key, "verify_agent", exampleAgent, exampleTS, "keep-agent-id-0001", args)
	v, err := f.door.Verify(context.Background(), Call{Header: h, Tool: "verify_agent", Args: args, KeepAgentID: true})
	if err != nil || !bytes.Equal(v.Args, args) {
		t.Fatalf("%s %v", v.Args, err)
	}
}

// Every refusal, with the code the seed gives it; none spends the nonce.
func TestDoorRefusals(t *testing.T) {
	f := newFixture(t)
	_, stranger, _ := ed25519.GenerateKey(nil)
	args := []byte(`{"agent_id":"` + exampleAgent + `","content":"hello"}`)
	good := func() http.Header {
		return sign(t, f.key, "thread_post", exampleAgent, exampleTS, "refusal-nonce-0001", args)
	}
	without := func(name string) http.Header { h := good(); h.Del(name); return h }
	with := func(name, value string) http.Header { h := good(); h.Set(name, value); return h }
	cases := []struct {
		name   string
		header http.Header
		args   string
		code   string
	}{
		{"no signature", without("X-Kd-Signature"), "", kungfu.CodeSignatureRequired},
		{"no timestamp", without("X-Kd-Timestamp"), "", kungfu.CodeSignatureRequired},
		{"no nonce", without("X-Kd-Nonce"), "", kungfu.CodeSignatureRequired},
		{"an unknown x-kd header only", http.Header{"X-Kd-Other": {"1"}}, "", kungfu.CodeSignatureRequired},
		{"_kd_auth without nonce", http.Header{}, `{"_kd_auth":{"signature":"x","timestamp":1791700000},"agent_id":"` + exampleAgent + `"}`, kungfu.CodeSignatureRequired},
		{"_kd_auth not an object", http.Header{}, `{"_kd_auth":"sig","agent_id":"` + exampleAgent + `"}`, kungfu.CodeSignatureRequired},
		{"301 s late", with("X-Kd-Timestamp", "1791699699"), "", kungfu.CodeStaleSignature},
		{"301 s early", with("X-Kd-Timestamp", "1791700301"), "", kungfu.CodeStaleSignature},
		{"not whole seconds", with("X-Kd-Timestamp", "1791700000.0"), "", kungfu.CodeStaleSignature},
		{"milliseconds", with("X-Kd-Timestamp", "1791700000000"), "", kungfu.CodeStaleSignature},
		{"negative", with("X-Kd-Timestamp", "-1791700000"), "", kungfu.CodeStaleSignature},
		{"_kd_auth float timestamp", http.Header{}, `{"_kd_auth":{"signature":"x","timestamp":1.7917e9,"nonce":"refusal-nonce-0001"},"agent_id":"` + exampleAgent + `"}`, kungfu.CodeStaleSignature},
		{"nonce 15", with("X-Kd-Nonce", strings.Repeat("a", 15)), "", kungfu.CodeBadNonce},
		{"nonce 129", with("X-Kd-Nonce", strings.Repeat("a", 129)), "", kungfu.CodeBadNonce},
		{"nonce with a dot", with("X-Kd-Nonce", "refusal.nonce.0001"), "", kungfu.CodeBadNonce},
		{"nonce twice", func() http.Header { h := good(); h.Add("X-Kd-Nonce", "refusal-nonce-0002"); return h }(), "", kungfu.CodeBadNonce},
		{"signature not base64", with("X-Kd-Signature", "!!!"), "", kungfu.CodeBadSignature},
		{"signature 63 bytes", with("X-Kd-Signature", base64.RawURLEncoding.EncodeToString(make([]byte, 63))), "", kungfu.CodeBadSignature},
		{"signature by another key", sign(t, stranger, "thread_post", exampleAgent, exampleTS, "refusal-nonce-0001", args), "", kungfu.CodeBadSignature},
		{"another tool", sign(t, f.key, "memory_put", exampleAgent, exampleTS, "refusal-nonce-0001", args), "", kungfu.CodeBadSignature},
		{"tampered arguments", good(), `{"agent_id":"` + exampleAgent + `","content":"hellO"}`, kungfu.CodeBadSignature},
		{"unknown agent", good(), `{"agent_id":"00000000-0000-4000-8000-000000000002","content":"hello"}`, kungfu.CodeBadSignature},
		{"agent id not a uuid", good(), `{"agent_id":"kd_000000000001","content":"hello"}`, kungfu.CodeBadSignature},
		{"header names another agent", with("X-Karmadue-Agent", "00000000-0000-4000-8000-000000000002"), "", kungfu.CodeAgentMismatch},
		{"no agent_id", good(), `{"content":"hello"}`, kungfu.CodeValidationFailed},
		{"agent_id a number", good(), `{"agent_id":1,"content":"hello"}`, kungfu.CodeValidationFailed},
		{"headers and _kd_auth", good(), `{"_kd_auth":{},"agent_id":"` + exampleAgent + `"}`, kungfu.CodeValidationFailed},
		{"NUL in arguments", good(), `{"agent_id":"` + exampleAgent + `","content":"a\u0000"}`, kungfu.CodeValidationFailed},
		{"arguments an array", good(), `[1]`, kungfu.CodeValidationFailed},
	}
	var badMessage string
	for _, c := range cases {
		a := args
		if c.args != "" {
			a = []byte(c.args)
		}
		_, err := f.door.Verify(context.Background(), Call{Header: c.header, Tool: "thread_post", Args: a})
		if code(err) != c.code {
			t.Errorf("%s: got %v, want %s", c.name, err, c.code)
			continue
		}
		// One message for every bad signature, whatever the reason.
		if c.code == kungfu.CodeBadSignature {
			if badMessage == "" {
				badMessage = kungfu.AsError(err).Message
			} else if m := kungfu.AsError(err).Message; m != badMessage {
				t.Errorf("%s: message %q differs from %q", c.name, m, badMessage)
			}
		}
	}
	// None of them spent the nonce: the good call goes through now, once.
	if _, err := f.door.Verify(context.Background(), Call{Header: good(), Tool: "thread_post", Args: args}); err != nil {
		t.Fatalf("after the refusals: %v", err)
	}
	if _, err := f.door.Verify(context.Background(), Call{Header: good(), Tool: "thread_post", Args: args}); code(err) != kungfu.CodeReplay {
		t.Fatalf("reuse: %v", err)
	}
}

// The timestamp may be exactly Window away either way.
func TestDoorWindowEdges(t *testing.T) {
	f := newFixture(t)
	args := []byte(`{"agent_id":"` + exampleAgent + `"}`)
	for i, ts := range []string{"1791699700", "1791700300"} {
		h := sign(t, f.key, "todo_list", exampleAgent, ts, "window-edge-nonce-"+string(rune('a'+i)), args)
		if _, err := f.door.Verify(context.Background(), Call{Header: h, Tool: "todo_list", Args: args}); err != nil {
			t.Fatalf("timestamp %s: %v", ts, err)
		}
	}
}

// A rotated-away key no longer verifies; the new one does; a revoked
// agent (no live key) answers exactly like an unknown one.
func TestDoorRotatedAndRevoked(t *testing.T) {
	f := newFixture(t)
	pub, next, _ := ed25519.GenerateKey(nil)
	dir := f.door.Agents.(directory)
	args := []byte(`{"agent_id":"` + exampleAgent + `"}`)
	old := sign(t, f.key, "todo_list", exampleAgent, exampleTS, "rotated-nonce-0001", args)
	a := dir.agents[exampleAgent]
	a.Keys = []ed25519.PublicKey{pub}
	dir.agents[exampleAgent] = a
	_, err := f.door.Verify(context.Background(), Call{Header: old, Tool: "todo_list", Args: args})
	if code(err) != kungfu.CodeBadSignature {
		t.Fatalf("rotated-away key: %v", err)
	}
	rotated := kungfu.AsError(err).Message
	if _, err := f.door.Verify(context.Background(), Call{Header: sign(t, next, "todo_list", exampleAgent, exampleTS, "rotated-nonce-0001", args), Tool: "todo_list", Args: args}); err != nil {
		t.Fatalf("new key: %v", err)
	}
	a.Keys = nil
	dir.agents[exampleAgent] = a
	_, err = f.door.Verify(context.Background(), Call{Header: sign(t, next, "todo_list", exampleAgent, exampleTS, "revoked-nonce-0001", args), Tool: "todo_list", Args: args})
	if code(err) != kungfu.CodeBadSignature || kungfu.AsError(err).Message != rotated {
		t.Fatalf("revoked: %v", err)
	}
}

// A nonce is single use per agent: another agent may use the same string,
// and the key lives for twice the window under the deployment's prefix.
func TestDoorNoncePerAgent(t *testing.T) {
	f := newFixture(t)
	second := "00000000-0000-4000-8000-000000000002"
	_, key2, _ := ed25519.GenerateKey(nil)
	dir := f.door.Agents.(directory)
	dir.agents[second] = Agent{ID: second, AccountID: 8, Name: "kd_000000000002", Keys: []ed25519.PublicKey{key2.Public().(ed25519.PublicKey)}}
	for _, a := range []struct {
		id  string
		key ed25519.PrivateKey
	}{{exampleAgent, f.key}, {second, key2}} {
		args := []byte(`{"agent_id":"` + a.id + `"}`)
		h := sign(t, a.key, "todo_list", a.id, exampleTS, "shared-nonce-00001", args)
		if _, err := f.door.Verify(context.Background(), Call{Header: h, Tool: "todo_list", Args: args}); err != nil {
			t.Fatalf("%s: %v", a.id, err)
		}
	}
	ttl, err := f.door.Redis.TTL(context.Background(), f.door.Prefix+"kdnonce:"+exampleAgent+":shared-nonce-00001").Result()
	// A timestamp is accepted from ts-Window until just before
	// ts+Window+1 s (whole seconds): a nonce spent at the first moment must
	// outlive the last one. It used to expire after exactly 2×Window.
	if err != nil || ttl <= 2*Window+time.Second || ttl > NonceTTL {
		t.Fatalf("nonce ttl %v, err %v", ttl, err)
	}
}

// Check spends nothing: a request a later check refuses can be sent again
// as is. Spend then spends once, and the verdict names the key that
// verified.
func TestDoorCheckThenSpend(t *testing.T) {
	f := newFixture(t)
	dir := f.door.Agents.(directory)
	other, _, _ := ed25519.GenerateKey(nil)
	a := dir.agents[exampleAgent]
	a.Keys = []ed25519.PublicKey{other, f.key.Public().(ed25519.PublicKey)}
	a.KeyIDs = []int64{41, 42}
	dir.agents[exampleAgent] = a
	args := []byte(`{"agent_id":"` + exampleAgent + `"}`)
	h := sign(t, f.key, "todo_list", exampleAgent, exampleTS, "check-spend-nonce-1", args)
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		v, err := f.door.Check(ctx, Call{Header: h, Tool: "todo_list", Args: args})
		if err != nil || v.KeyID != 42 {
			t.Fatalf("check %d: key %d, %v", i, v.KeyID, err)
		}
	}
	v, _ := f.door.Check(ctx, Call{Header: h, Tool: "todo_list", Args: args})
	if err := f.door.Spend(ctx, v); err != nil {
		t.Fatalf("spend: %v", err)
	}
	if err := f.door.Spend(ctx, v); code(err) != kungfu.CodeReplay {
		t.Fatalf("second spend: %v", err)
	}
}

// Redis down while checking a nonce: the call is not judged (ErrNonceStore),
// and nothing says the signature was bad.
func TestDoorRedisDown(t *testing.T) {
	f := newFixture(t)
	f.door.Redis = redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	args := []byte(`{"agent_id":"` + exampleAgent + `"}`)
	h := sign(t, f.key, "todo_list", exampleAgent, exampleTS, "redis-down-nonce-1", args)
	_, err := f.door.Verify(context.Background(), Call{Header: h, Tool: "todo_list", Args: args})
	if !errors.Is(err, ErrNonceStore) || kungfu.AsError(err) != nil {
		t.Fatalf("got %v", err)
	}
}

func TestDoorClaimed(t *testing.T) {
	f := newFixture(t)
	args := []byte(`{"agent_id":"` + exampleAgent + `", "n": 1.0}`)
	got, err := f.door.Claimed(context.Background(), nil, 7, args)
	if err != nil || string(got) != `{"n": 1.0}` {
		t.Fatalf("own agent: %s %v", got, err)
	}
	if _, err := f.door.Claimed(context.Background(), nil, 8, args); code(err) != kungfu.CodeForbidden {
		t.Fatalf("another account's agent: %v", err)
	}
	if _, err := f.door.Claimed(context.Background(), nil, 0, args); code(err) != kungfu.CodeSignatureRequired {
		t.Fatalf("anonymous: %v", err)
	}
	// x-karmadue-agent must name the same agent on a Bearer call too (it
	// was ignored there before).
	h := http.Header{"X-Karmadue-Agent": {"00000000-0000-4000-8000-000000000009"}}
	if _, err := f.door.Claimed(context.Background(), h, 7, args); code(err) != kungfu.CodeAgentMismatch {
		t.Fatalf("x-karmadue-agent naming another agent: %v", err)
	}
	h.Set("X-Karmadue-Agent", exampleAgent)
	if _, err := f.door.Claimed(context.Background(), h, 7, args); err != nil {
		t.Fatalf("x-karmadue-agent naming the same agent: %v", err)
	}
}

func TestInspect(t *testing.T) {
	for _, c := range []struct {
		header        http.Header
		args          string
		signed, names bool
	}{
		{http.Header{}, `{"a":1}`, false, false},
		{http.Header{"X-Kd-Nonce": {"x"}}, `{}`, true, false},
		{http.Header{"X-Karmadue-Agent": {"x"}}, `{"agent_id":"x"}`, false, true},
		{http.Header{}, `{"_kd_auth":{},"agent_id":1}`, true, true},
		// Escaped keys are the same keys, as PostgreSQL and the tools read them.
		{http.Header{}, `{"\u005fkd_auth":{}}`, true, false},
		{http.Header{}, `{"\u0061\u0067\u0065\u006e\u0074\u005f\u0069\u0064":"x"}`, false, true},
		{http.Header{}, `{"a":{"_kd_auth":{},"agent_id":1}}`, false, false},
		{http.Header{}, `{"a":"_kd_auth agent_id"}`, false, false},
		{http.Header{}, `not json _kd_auth`, false, false},
	} {
		if signed, names := Inspect(c.header, []byte(c.args)); signed != c.signed || names != c.names {
			t.Errorf("Inspect(%v, %s) = %v, %v", c.header, c.args, signed, names)
		}
	}
}

// FuzzWithout: removing members keeps the rest byte for byte, leaves valid
// JSON, and the same document minus those keys.
func FuzzWithout(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `{ "agent_id" : "x" , "b" : [1, 2.50] }`, `{"_kd_auth":{"n":1},"_kd_auth":2,"z":null}`,
		`{"\u0061gent_id":1,"k":"\"}"}`, "{\n\"a\":{\"agent_id\":1}\n}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ms, err := members([]byte(s))
		if err != nil {
			return
		}
		out := without([]byte(s), ms, func(k string) bool { return k == AgentArg || k == AuthArg })
		if !json.Valid(out) {
			t.Fatalf("%q → invalid %q", s, out)
		}
		rest, err := members(out)
		if err != nil {
			t.Fatal(err)
		}
		var kept []member
		for _, m := range ms {
			if m.key != AgentArg && m.key != AuthArg {
				kept = append(kept, m)
			}
		}
		if len(rest) != len(kept) {
			t.Fatalf("%q → %q: %d members, want %d", s, out, len(rest), len(kept))
		}
		for i := range rest {
			if rest[i].key != kept[i].key || !bytes.Equal(rest[i].raw, kept[i].raw) {
				t.Fatalf("%q → %q: member %d changed", s, out, i)
			}
		}
	})
}

// BenchmarkVerify is the door's own cost per signed call: parsing, the
// canonical text, Ed25519 verification and the nonce in Redis (the agent
// comes from memory here; in Dojo it is one PostgreSQL query).
func BenchmarkVerify(b *testing.B) {
	key := exampleKey()
	dir := directory{agents: map[string]Agent{exampleAgent: {ID: exampleAgent, AccountID: 7, Keys: []ed25519.PublicKey{key.Public().(ed25519.PublicKey)}}}}
	rdb := kungfutest.Redis(b)
	now := time.Unix(1791700000, 0)
	d := &Door{Agents: dir, Redis: rdb, Prefix: kungfutest.RedisPrefix(b), Now: func() time.Time { return now }}
	args := []byte(`{"agent_id":"` + exampleAgent + `","code":"abcdefabcdef"}`)
	canonical, _ := signing.Canonical(args)
	calls := make([]Call, b.N)
	for i := range calls {
		nonce := "bench-nonce-" + strings.Repeat("0", 8) + string(rune('a'+i%26)) + strconv.Itoa(i)
		text := signing.KDText("memory_get", exampleAgent, exampleTS, nonce, signing.ArgsHash(canonical))
		h := http.Header{}
		h.Set("X-Kd-Signature", base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, []byte(text))))
		h.Set("X-Kd-Timestamp", exampleTS)
		h.Set("X-Kd-Nonce", nonce)
		calls[i] = Call{Header: h, Tool: "memory_get", Args: args}
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := d.Verify(context.Background(), calls[i]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEd25519Verify(b *testing.B) {
	key := exampleKey()
	msg := []byte("kd-mcp-v1\nmemory_get\n" + exampleAgent)
	sig := ed25519.Sign(key, msg)
	pub := key.Public().(ed25519.PublicKey)
	for range b.N {
		ed25519.Verify(pub, msg, sig)
	}
}
