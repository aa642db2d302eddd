package karmadue

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/bcrypt"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/account"
	"github.com/dojo-relay/dojo/kungfu/credits"
	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/kungfu/tool"
)

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type world struct {
	t     *testing.T
	svc   *Service
	reg   *tool.Registry
	clock *clock
}

func setup(t *testing.T) *world {
	t.Helper()
	db, _ := kungfutest.Pool(t)
	c := &clock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	svc := &Service{DB: db, Now: c.Now}
	reg, err := tool.NewRegistry(Tools(svc)...)
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, svc: svc, reg: reg, clock: c}
}

// call runs a tool the way a transport does: schema first, then handler.
func (f *world) call(who kungfu.Caller, name string, args any) (map[string]any, error) {
	f.t.Helper()
	tl, ok := f.reg.Lookup(name)
	if !ok {
		f.t.Fatalf("no tool %s", name)
	}
	var raw []byte
	switch a := args.(type) {
	case string:
		raw = []byte(a)
	default:
		var err error
		if raw, err = json.Marshal(a); err != nil {
			f.t.Fatal(err)
		}
	}
	if err := tl.Validate(raw); err != nil {
		return nil, err
	}
	out, err := tl.Handler(context.Background(), who, raw)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(out)
	if err != nil {
		f.t.Fatal(err)
	}
	if strings.Contains(string(b), account.KeyPrefix) {
		f.t.Fatalf("%s result holds an Agent key: %s", name, b)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		f.t.Fatal(err)
	}
	return m, nil
}

func (f *world) must(who kungfu.Caller, name string, args any) map[string]any {
	f.t.Helper()
	m, err := f.call(who, name, args)
	if err != nil {
		f.t.Fatalf("%s: %v", name, err)
	}
	return m
}

type key struct {
	pub  ed25519.PublicKey
	priv ed25519.PrivateKey
}

func newKey(t testing.TB) key {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key{pub, priv}
}

func (k key) enc() string { return base64.RawURLEncoding.EncodeToString(k.pub) }

// proof fetches a challenge and signs it with k.
func (f *world) proof(k key) map[string]any {
	f.t.Helper()
	c := f.must(kungfu.Caller{}, "register_challenge", map[string]any{})
	sig := ed25519.Sign(k.priv, []byte(c["payload"].(string)))
	return map[string]any{"public_key": k.enc(), "challenge_id": c["challenge_id"],
		"signature": base64.RawURLEncoding.EncodeToString(sig)}
}

func (f *world) register(who kungfu.Caller, k key, label string) (map[string]any, error) {
	f.t.Helper()
	args := f.proof(k)
	args["name"] = label
	args["platform"] = "claude"
	return f.call(who, "register_agent", args)
}

func codeOf(err error) string {
	if e := kungfu.AsError(err); e != nil {
		return e.Code
	}
	return fmt.Sprintf("not a protocol error: %v", err)
}

// fieldOf returns the first field VALIDATION_FAILED names.
func fieldOf(err error) string {
	e := kungfu.AsError(err)
	if e == nil {
		return ""
	}
	d, _ := e.Details.(map[string]any)
	if errs, ok := d["errors"].([]kungfu.FieldError); ok && len(errs) > 0 {
		return errs[0].Field
	}
	if m, ok := d["missing"].([]string); ok && len(m) > 0 {
		return m[0]
	}
	return ""
}

func (f *world) count(table string) int {
	f.t.Helper()
	var n int
	if err := f.svc.DB.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func TestRegisterAndVerify(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	k := newKey(t)
	c := f.must(kungfu.Caller{}, "register_challenge", "{}")
	payload := c["payload"].(string)
	if !strings.HasPrefix(payload, "kd-register-v1\n"+c["challenge_id"].(string)+"\n") {
		t.Fatalf("payload %q", payload)
	}
	if exp, _ := time.Parse(time.RFC3339, c["expires_at"].(string)); !exp.Equal(f.clock.Now().Add(5 * time.Minute)) {
		t.Fatalf("expires_at %v", c["expires_at"])
	}
	got := f.must(kungfu.Caller{}, "register_agent", map[string]any{
		"label": "Scout", "client_name": "claude", "public_key": k.enc(), "challenge_id": c["challenge_id"],
		"signature": base64.RawURLEncoding.EncodeToString(ed25519.Sign(k.priv, []byte(payload)))})
	id, handle := got["agent_id"].(string), got["handle"].(string)
	if !agentIDRE.MatchString(id) || !handleRE.MatchString(handle) || got["name"] != handle ||
		got["label"] != "Scout" || got["platform"] != "claude" || got["public_key"] != k.enc() || got["attached"] != false {
		t.Fatalf("register_agent = %v", got)
	}
	// The account is named after the handle, holds no password and got the
	// signup grant like a native one.
	var (
		name, hash, status string
		balance            int64
	)
	if err := f.svc.DB.QueryRow(ctx, `SELECT name, password_hash, status, balance FROM accounts`).Scan(&name, &hash, &status, &balance); err != nil {
		t.Fatal(err)
	}
	if name != handle || hash != "" || status != "active" || balance != credits.SignupGrant {
		t.Fatalf("account %q %q %q %d", name, hash, status, balance)
	}
	ag, err := f.svc.Agent(ctx, id)
	if err != nil || len(ag.Keys) != 1 || !ag.Keys[0].Equal(k.pub) || ag.Name != handle {
		t.Fatalf("Agent = %+v %v", ag, err)
	}
	if of, err := f.svc.AgentOf(ctx, ag.AccountID); err != nil || of != id {
		t.Fatalf("AgentOf = %q %v", of, err)
	}
	if of, err := f.svc.AgentOf(ctx, ag.AccountID+1); err != nil || of != "" {
		t.Fatalf("AgentOf(other) = %q %v", of, err)
	}
	for _, args := range []map[string]any{{"agent_id": id}, {"agent_id": handle}, {"handle": strings.ToUpper(handle)}} {
		v := f.must(kungfu.Caller{}, "verify_agent", args)
		keys, _ := v["public_keys"].([]any)
		if v["agent_id"] != id || v["handle"] != handle || v["label"] != "Scout" || v["status"] != "active" ||
			len(keys) != 1 || keys[0] != k.enc() || v["created_at"] == nil {
			t.Fatalf("verify_agent(%v) = %v", args, v)
		}
	}
	for _, bad := range []string{"", "nope", "00000000-0000-4000-8000-00000000000G"} {
		if _, err := f.svc.Agent(ctx, bad); !errors.Is(err, ErrUnknownAgent) {
			t.Errorf("Agent(%q) = %v", bad, err)
		}
	}
}

// Every refusal of register_agent names what to fix and changes nothing:
// no account, no agent, and the challenge still unspent.
func TestRegisterRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t)
	k, other := newKey(t), newKey(t)
	good := f.proof(k)
	with := func(over map[string]any, drop ...string) map[string]any {
		m := map[string]any{"name": "Scout", "platform": "claude"}
		for k, v := range good {
			m[k] = v
		}
		for k, v := range over {
			m[k] = v
		}
		for _, d := range drop {
			delete(m, d)
		}
		return m
	}
	otherSig := base64.RawURLEncoding.EncodeToString(ed25519.Sign(other.priv, []byte("kd-register-v1")))
	cases := []struct {
		name        string
		args        map[string]any
		code, field string
	}{
		{"no public_key", with(nil, "public_key"), kungfu.CodeMissingField, "public_key"},
		{"short key", with(map[string]any{"public_key": k.enc()[:40]}), kungfu.CodeValidationFailed, "public_key"},
		{"key with newline", with(map[string]any{"public_key": k.enc()[:20] + "\n" + k.enc()[20:]}), kungfu.CodeValidationFailed, "public_key"},
		{"no name", with(nil, "name"), kungfu.CodeMissingField, "name"},
		{"no platform", with(nil, "platform"), kungfu.CodeMissingField, "platform"},
		{"name and label differ", with(map[string]any{"label": "Other"}), kungfu.CodeValidationFailed, "label"},
		{"one character", with(map[string]any{"name": "S"}), kungfu.CodeValidationFailed, "name"},
		{"41 characters", with(map[string]any{"name": strings.Repeat("é", 41)}), kungfu.CodeValidationFailed, "name"},
		{"zero-width joiner", with(map[string]any{"name": "Sc\u200dout"}), kungfu.CodeValidationFailed, "name"},
		// Invisible characters that passed printable before (review of issue 8).
		{"variation selector", with(map[string]any{"name": "S\uFE0Fc\uFE0Fout"}), kungfu.CodeValidationFailed, "name"},
		{"supplementary variation selector", with(map[string]any{"name": "Scout\U000E0100"}), kungfu.CodeValidationFailed, "name"},
		{"grapheme joiner", with(map[string]any{"name": "S\u034Fcout"}), kungfu.CodeValidationFailed, "name"},
		{"Hangul filler", with(map[string]any{"name": "Scout\u3164\u3164"}), kungfu.CodeValidationFailed, "name"},
		{"Hangul choseong filler", with(map[string]any{"name": "Sc\u115Fout"}), kungfu.CodeValidationFailed, "name"},
		{"Hangul jungseong filler", with(map[string]any{"name": "Sc\u1160out"}), kungfu.CodeValidationFailed, "name"},
		{"halfwidth Hangul filler", with(map[string]any{"name": "Scout\uFFA0"}), kungfu.CodeValidationFailed, "name"},
		{"braille blank", with(map[string]any{"name": "Scout\u2800"}), kungfu.CodeValidationFailed, "name"},
		{"Khmer inherent vowel", with(map[string]any{"name": "Sc\u17B4out"}), kungfu.CodeValidationFailed, "name"},
		{"private use", with(map[string]any{"name": "Scout\uE000"}), kungfu.CodeValidationFailed, "name"},
		{"variation selector in platform", with(map[string]any{"platform": "clau\uFE0Fde"}), kungfu.CodeValidationFailed, "platform"},
		// 40 x U+FDFA is 120 bytes that fold to 720 characters, 1 441
		// reservation rows under the label lock (review of issue 8).
		{"expanding label", with(map[string]any{"name": strings.Repeat("\uFDFA", 40)}), kungfu.CodeValidationFailed, "name"},
		{"expanding label, few characters", with(map[string]any{"name": strings.Repeat("\uFDFA", 4)}), kungfu.CodeValidationFailed, "name"},
		{"handle-like label", with(map[string]any{"name": "kd_0123456789ab"}), kungfu.CodeValidationFailed, "name"},
		{"empty platform", with(map[string]any{"platform": ""}), kungfu.CodeValidationFailed, "platform"},
		{"invisible platform", with(map[string]any{"platform": "cla\u200bude"}), kungfu.CodeValidationFailed, "platform"},
		{"malformed signature", with(map[string]any{"signature": "abc"}), kungfu.CodeValidationFailed, "signature"},
		{"unknown argument", with(map[string]any{"referral": "x"}), kungfu.CodeValidationFailed, "referral"},
		{"unknown challenge", with(map[string]any{"challenge_id": "00000000-0000-4000-8000-000000000000"}), kungfu.CodeValidationFailed, "challenge_id"},
		{"not a challenge id", with(map[string]any{"challenge_id": "x'; --"}), kungfu.CodeValidationFailed, "challenge_id"},
		{"signed by another key", with(map[string]any{"signature": otherSig}), kungfu.CodeBadSignature, ""},
	}
	for _, c := range cases {
		_, err := f.call(kungfu.Caller{}, "register_agent", c.args)
		if codeOf(err) != c.code || (c.field != "" && fieldOf(err) != c.field) {
			t.Errorf("%s: %v (field %q), want %s naming %q", c.name, err, fieldOf(err), c.code, c.field)
		}
	}
	if n := f.count("accounts") + f.count("kd_agents") + f.count("credentials") + f.count("kd_label_keys"); n != 0 {
		t.Fatalf("refusals left %d rows", n)
	}
	// The challenge survived every refusal: the good request still works.
	if _, err := f.call(kungfu.Caller{}, "register_agent", with(nil)); err != nil {
		t.Fatalf("after refusals: %v", err)
	}
}

func TestChallengeSingleUseAndExpiry(t *testing.T) {
	t.Parallel()
	f := setup(t)
	k := newKey(t)
	args := f.proof(k)
	args["name"], args["platform"] = "Once", "claude"
	if _, err := f.call(kungfu.Caller{}, "register_agent", args); err != nil {
		t.Fatal(err)
	}
	args["name"] = "Twice"
	if _, err := f.call(kungfu.Caller{}, "register_agent", args); codeOf(err) != kungfu.CodeValidationFailed || fieldOf(err) != "challenge_id" {
		t.Fatalf("second use: %v", err)
	}
	late := f.proof(newKey(t))
	late["name"], late["platform"] = "Late", "claude"
	f.clock.advance(ChallengeTTL)
	if _, err := f.call(kungfu.Caller{}, "register_agent", late); codeOf(err) != kungfu.CodeValidationFailed || fieldOf(err) != "challenge_id" {
		t.Fatalf("expired challenge: %v", err)
	}
	if n := f.count("kd_agents"); n != 1 {
		t.Fatalf("%d agents", n)
	}
	// Expired challenges are swept once they are an hour old.
	f.clock.advance(2 * time.Hour)
	f.must(kungfu.Caller{}, "register_challenge", "{}")
	if n := f.count("kd_challenges"); n != 1 {
		t.Fatalf("%d challenges after the sweep", n)
	}
}

func TestLabelReserved(t *testing.T) {
	t.Parallel()
	f := setup(t)
	holder, err := f.register(kungfu.Caller{}, newKey(t), "Alice")
	if err != nil {
		t.Fatal(err)
	}
	for _, label := range []string{
		"Alice", "alice", "ALICE", // exact, any case
		"Alise", "Alicee", "Alic", "lice", "Aalice", // one edit
		"A1ice", "AIice", "Al1ce", "Аlice", // confusables (the last starts with a Cyrillic А)
		"AlIce!", "A_lice", // a confusable plus one edit
	} {
		_, err := f.register(kungfu.Caller{}, newKey(t), label)
		e := kungfu.AsError(err)
		if e == nil || e.Code != kungfu.CodeLabelReserved {
			t.Errorf("%q: %v, want label_reserved", label, err)
			continue
		}
		if e.Message != "label taken: exact or lookalike of an existing agent name" || e.Details != nil {
			t.Errorf("%q: %+v", label, e)
		}
		sug := e.Suggestion
		if sug == "" || !strings.HasPrefix(sug, label) || strings.Contains(sug, holder["handle"].(string)) ||
			strings.Contains(sug, holder["agent_id"].(string)) || strings.EqualFold(sug, "Alice") {
			t.Errorf("%q: suggestion %q", label, sug)
		}
	}
	if n := f.count("kd_agents"); n != 1 {
		t.Fatalf("%d agents after refusals", n)
	}
	// The suggestion is free: taking it succeeds.
	_, err = f.register(kungfu.Caller{}, newKey(t), "alice")
	sug := kungfu.AsError(err).Suggestion
	if sug != "alice-claude" {
		t.Fatalf("suggestion %q, want the platform appended", sug)
	}
	if _, err := f.register(kungfu.Caller{}, newKey(t), sug); err != nil {
		t.Fatalf("registering the suggestion %q: %v", sug, err)
	}
	// With alice-claude taken, the next suggestion differs and is free too.
	_, err = f.register(kungfu.Caller{}, newKey(t), "alice")
	next := kungfu.AsError(err).Suggestion
	if next == sug || !strings.HasPrefix(next, "alice-claude-") {
		t.Fatalf("second suggestion %q", next)
	}
	if _, err := f.register(kungfu.Caller{}, newKey(t), next); err != nil {
		t.Fatalf("registering %q: %v", next, err)
	}
	// Two edits away is a different name; one insertion is not.
	for _, label := range []string{"Alicia", "Bob"} {
		if _, err := f.register(kungfu.Caller{}, newKey(t), label); err != nil {
			t.Errorf("%q: %v", label, err)
		}
	}
	if _, err := f.register(kungfu.Caller{}, newKey(t), "Malice"); codeOf(err) != kungfu.CodeLabelReserved {
		t.Errorf("Malice: %v", err)
	}
	// A long label keeps its suggestion within 40 characters.
	long := strings.Repeat("x", 40)
	if _, err := f.register(kungfu.Caller{}, newKey(t), long); err != nil {
		t.Fatal(err)
	}
	_, err = f.register(kungfu.Caller{}, newKey(t), long)
	if s := kungfu.AsError(err).Suggestion; len([]rune(s)) > 40 || checkLabel("name", s) != nil {
		t.Fatalf("long suggestion %q", s)
	}
}

// The same key asking again for its own label learns its agent_id; so does
// the Bearer owner of the agent.
func TestLabelYours(t *testing.T) {
	t.Parallel()
	f := setup(t)
	k := newKey(t)
	got, err := f.register(kungfu.Caller{}, k, "Scout")
	if err != nil {
		t.Fatal(err)
	}
	for _, label := range []string{"Scout", "scout", "Sc0ut"} {
		_, err = f.register(kungfu.Caller{}, k, label)
		e := kungfu.AsError(err)
		if e == nil || e.Code != kungfu.CodeLabelYours || e.Message != "You already have an agent with this name." {
			t.Fatalf("%q: %v", label, err)
		}
		if d, _ := e.Details.(map[string]any); d["agent_id"] != got["agent_id"] {
			t.Fatalf("%q: details %v", label, e.Details)
		}
	}
	// The same key under another label: the key is taken, and it is named
	// (the caller just proved it holds the key).
	_, err = f.register(kungfu.Caller{}, k, "Ranger")
	if codeOf(err) != kungfu.CodeValidationFailed || fieldOf(err) != "public_key" ||
		kungfu.AsError(err).Details.(map[string]any)["agent_id"] != got["agent_id"] {
		t.Fatalf("same key, new label: %v", err)
	}
	if n := f.count("kd_agents"); n != 1 {
		t.Fatalf("%d agents", n)
	}
}

func nativeAccount(t *testing.T, f *world, name string) (kungfu.Caller, string) {
	t.Helper()
	acc := &account.Service{DB: f.svc.DB, Now: f.clock.Now, BcryptCost: bcrypt.MinCost}
	got, err := acc.Register(context.Background(), name, "password1")
	if err != nil {
		t.Fatal(err)
	}
	return kungfu.Caller{AccountID: got.AccountID, Name: got.Name}, got.APIKey
}

// A native account attaches a key to itself: one account, two doors.
func TestBearerAttach(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	who, apiKey := nativeAccount(t, f, "native_one")
	k := newKey(t)
	got, err := f.register(who, k, "Native One")
	if err != nil {
		t.Fatal(err)
	}
	if got["name"] != "native_one" || got["attached"] != true || !handleRE.MatchString(got["handle"].(string)) {
		t.Fatalf("attach = %v", got)
	}
	if strings.Contains(fmt.Sprint(got), apiKey) {
		t.Fatal("the Agent key leaked")
	}
	ag, err := f.svc.Agent(ctx, got["agent_id"].(string))
	if err != nil || ag.AccountID != who.AccountID || ag.Name != "native_one" {
		t.Fatalf("Agent = %+v %v", ag, err)
	}
	if of, _ := f.svc.AgentOf(ctx, who.AccountID); of != got["agent_id"] {
		t.Fatalf("AgentOf = %q", of)
	}
	if n := f.count("accounts"); n != 1 {
		t.Fatalf("attach made %d accounts", n)
	}
	// One live agent per account: another key, another label is refused;
	// the same label is the caller's own.
	if _, err := f.register(who, newKey(t), "Other Name"); codeOf(err) != kungfu.CodeInvalidState {
		t.Fatalf("second attach: %v", err)
	}
	_, err = f.register(who, newKey(t), "native one")
	if codeOf(err) != kungfu.CodeLabelYours || kungfu.AsError(err).Details.(map[string]any)["agent_id"] != got["agent_id"] {
		t.Fatalf("own label by Bearer: %v", err)
	}
	// Revoking the attached agent leaves the account and its Agent key.
	if _, err := f.call(kungfu.Caller{AccountID: who.AccountID, Agent: ag.ID, AgentKey: ag.KeyIDs[0]}, "revoke_agent", map[string]any{"agent_id": ag.ID}); err != nil {
		t.Fatal(err)
	}
	var status string
	if err := f.svc.DB.QueryRow(ctx, `SELECT status FROM accounts WHERE id = $1`, who.AccountID).Scan(&status); err != nil || status != "active" {
		t.Fatalf("native account after revoke: %q %v", status, err)
	}
	// And it may attach a new key afterwards.
	if _, err := f.register(who, newKey(t), "Native Again"); err != nil {
		t.Fatalf("attach after revoke: %v", err)
	}
}

func TestRotate(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	old := newKey(t)
	got, err := f.register(kungfu.Caller{}, old, "Rotor")
	if err != nil {
		t.Fatal(err)
	}
	id := got["agent_id"].(string)
	ag, _ := f.svc.Agent(ctx, id)
	signed := kungfu.Caller{AccountID: ag.AccountID, Name: ag.Name, Agent: id, AgentKey: ag.KeyIDs[0]}
	fresh := newKey(t)

	// Refusals first; none changes the keys.
	if _, err := f.call(kungfu.Caller{AccountID: ag.AccountID, Name: ag.Name}, "rotate_agent_key", f.proof(fresh)); codeOf(err) != kungfu.CodeSignatureRequired {
		t.Fatalf("unsigned rotate: %v", err)
	}
	mismatch := f.proof(fresh)
	mismatch["agent_id"] = "00000000-0000-4000-8000-000000000001"
	if _, err := f.call(signed, "rotate_agent_key", mismatch); codeOf(err) != kungfu.CodeAgentMismatch {
		t.Fatalf("rotate naming another agent: %v", err)
	}
	wrong := f.proof(fresh)
	wrong["public_key"] = newKey(t).enc() // the challenge was signed by fresh, not this key
	if _, err := f.call(signed, "rotate_agent_key", wrong); codeOf(err) != kungfu.CodeBadSignature {
		t.Fatalf("new key did not sign: %v", err)
	}
	if _, err := f.call(signed, "rotate_agent_key", f.proof(old)); codeOf(err) != kungfu.CodeValidationFailed || fieldOf(err) != "public_key" {
		t.Fatalf("rotate to the current key: %v", err)
	}
	if ag, _ := f.svc.Agent(ctx, id); len(ag.Keys) != 1 || !ag.Keys[0].Equal(old.pub) {
		t.Fatalf("keys changed by refusals: %+v", ag)
	}

	args := f.proof(fresh)
	args["agent_id"] = id
	out := f.must(signed, "rotate_agent_key", args)
	if out["agent_id"] != id || out["public_key"] != fresh.enc() || out["handle"] != got["handle"] {
		t.Fatalf("rotate = %v", out)
	}
	ag, err = f.svc.Agent(ctx, id)
	if err != nil || len(ag.Keys) != 1 || !ag.Keys[0].Equal(fresh.pub) {
		t.Fatalf("after rotate: %+v %v", ag, err)
	}
	// The rotated-away key is retired for good: it cannot register again.
	if _, err := f.register(kungfu.Caller{}, old, "Old Key"); codeOf(err) != kungfu.CodeValidationFailed || fieldOf(err) != "public_key" {
		t.Fatalf("retired key registers: %v", err)
	}
	v := f.must(kungfu.Caller{}, "verify_agent", map[string]any{"agent_id": id})
	if keys := v["public_keys"].([]any); len(keys) != 1 || keys[0] != fresh.enc() {
		t.Fatalf("verify after rotate: %v", v)
	}
}

// A rotation or revocation signed with a key that another rotation retired
// after the door checked it (the second call waited on the agent's lock)
// changes nothing: it used to replace the new key.
func TestRotateRevokeStaleSigningKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	a := newKey(t)
	got, err := f.register(kungfu.Caller{}, a, "Racer")
	if err != nil {
		t.Fatal(err)
	}
	id := got["agent_id"].(string)
	ag, _ := f.svc.Agent(ctx, id)
	withA := kungfu.Caller{AccountID: ag.AccountID, Name: ag.Name, Agent: id, AgentKey: ag.KeyIDs[0]}
	b := newKey(t)
	f.must(withA, "rotate_agent_key", f.proof(b))
	// The door verified this one with A just before the rotation committed.
	_, err = f.call(withA, "rotate_agent_key", f.proof(newKey(t)))
	if codeOf(err) != kungfu.CodeBadSignature || kungfu.AsError(err).Message != badSignature {
		t.Fatalf("rotate with the retired key: %v", err)
	}
	if _, err := f.call(withA, "revoke_agent", "{}"); codeOf(err) != kungfu.CodeBadSignature {
		t.Fatalf("revoke with the retired key: %v", err)
	}
	if ag, err := f.svc.Agent(ctx, id); err != nil || len(ag.Keys) != 1 || !ag.Keys[0].Equal(b.pub) {
		t.Fatalf("keys after stale calls: %+v %v", ag, err)
	}
	// A Bearer caller carries no key id at all.
	if _, err := f.call(kungfu.Caller{AccountID: ag.AccountID, Name: ag.Name, Agent: id}, "revoke_agent", "{}"); codeOf(err) != kungfu.CodeBadSignature {
		t.Fatalf("revoke without a key id: %v", err)
	}
	ag, _ = f.svc.Agent(ctx, id)
	withB := kungfu.Caller{AccountID: ag.AccountID, Name: ag.Name, Agent: id, AgentKey: ag.KeyIDs[0]}
	if out := f.must(withB, "revoke_agent", "{}"); out["status"] != "revoked" {
		t.Fatalf("revoke with the live key = %v", out)
	}
}

func TestRevoke(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	k := newKey(t)
	got, err := f.register(kungfu.Caller{}, k, "Leaver")
	if err != nil {
		t.Fatal(err)
	}
	id := got["agent_id"].(string)
	ag, _ := f.svc.Agent(ctx, id)
	if _, err := f.call(kungfu.Caller{AccountID: ag.AccountID}, "revoke_agent", "{}"); codeOf(err) != kungfu.CodeSignatureRequired {
		t.Fatalf("unsigned revoke: %v", err)
	}
	signed := kungfu.Caller{AccountID: ag.AccountID, Name: ag.Name, Agent: id, AgentKey: ag.KeyIDs[0]}
	out := f.must(signed, "revoke_agent", map[string]any{"agent_id": id})
	if out["status"] != "revoked" || out["account_status"] != "deactivated" || out["handle"] != got["handle"] {
		t.Fatalf("revoke = %v", out)
	}
	if _, err := f.svc.Agent(ctx, id); !errors.Is(err, ErrUnknownAgent) {
		t.Fatalf("revoked agent: %v", err)
	}
	var status string
	if err := f.svc.DB.QueryRow(ctx, `SELECT status FROM accounts WHERE id = $1`, ag.AccountID).Scan(&status); err != nil || status != "deactivated" {
		t.Fatalf("key-only account after revoke: %q %v", status, err)
	}
	// Revoking again answers like any failed signature.
	if _, err := f.call(signed, "revoke_agent", "{}"); codeOf(err) != kungfu.CodeBadSignature {
		t.Fatalf("second revoke: %v", err)
	}
	// The label is free at once, even for a lookalike.
	if _, err := f.register(kungfu.Caller{}, newKey(t), "leaver"); err != nil {
		t.Fatalf("label after revoke: %v", err)
	}
	v := f.must(kungfu.Caller{}, "verify_agent", map[string]any{"agent_id": got["handle"]})
	if v["status"] != "revoked" || len(v["public_keys"].([]any)) != 0 || v["revoked_at"] == nil {
		t.Fatalf("verify revoked = %v", v)
	}
	// Nothing was deleted.
	if n := f.count("credentials WHERE revoked_at IS NOT NULL"); n != 1 {
		t.Fatalf("%d revoked credentials", n)
	}
}

func TestVerifyAgentRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t)
	if _, err := f.call(kungfu.Caller{}, "verify_agent", "{}"); codeOf(err) != kungfu.CodeMissingField || fieldOf(err) != "agent_id" {
		t.Fatalf("no id: %v", err)
	}
	for _, bad := range []string{"", "kd_xyz", "00000000-0000-4000-8000-00000000000", "' OR 1=1 --"} {
		if _, err := f.call(kungfu.Caller{}, "verify_agent", map[string]any{"agent_id": bad}); codeOf(err) != kungfu.CodeValidationFailed || fieldOf(err) != "agent_id" {
			t.Errorf("%q: %v", bad, err)
		}
	}
	_, err := f.call(kungfu.Caller{}, "verify_agent", map[string]any{"handle": "kd_000000000000"})
	if codeOf(err) != kungfu.CodeNotFound || kungfu.AsError(err).Details.(map[string]any)["field"] != "handle" {
		t.Fatalf("unknown handle: %v", err)
	}
	_, err = f.call(kungfu.Caller{}, "verify_agent", map[string]any{"agent_id": "00000000-0000-4000-8000-000000000000"})
	if codeOf(err) != kungfu.CodeNotFound || kungfu.AsError(err).Details.(map[string]any)["field"] != "agent_id" {
		t.Fatalf("unknown id: %v", err)
	}
}

// A registration and a rotation of one key, each past keyFree, both insert
// it: the second hit credentials_public_key and answered 500 (review of
// issue 8). The loser's insert is replayed here, after the winner's commit.
func TestKeyStoredConcurrently(t *testing.T) {
	t.Parallel()
	f := setup(t)
	k := newKey(t)
	a, err := f.register(kungfu.Caller{}, k, "Winner")
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.register(kungfu.Caller{}, newKey(t), "Loser")
	if err != nil {
		t.Fatal(err)
	}
	ag, err := f.svc.Agent(context.Background(), b["agent_id"].(string))
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(context.Background(), f.svc.DB, func(tx pgx.Tx) error {
		return insertKey(context.Background(), tx, ag.AccountID, ag.ID, k.pub, f.clock.Now())
	})
	if codeOf(err) != kungfu.CodeValidationFailed || fieldOf(err) != "public_key" {
		t.Fatalf("second insert of %s's key: %v", a["agent_id"], err)
	}
	if n := f.count("credentials"); n != 2 {
		t.Fatalf("%d credentials", n)
	}
}

// 20 registrations racing for one label make exactly one agent; the rest
// are refused with label_reserved.
func TestParallelRegisterOneLabel(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const n = 20
	args := make([]map[string]any, n)
	for i := range args {
		args[i] = f.proof(newKey(t))
		args[i]["name"], args[i]["platform"] = "Racer", "claude"
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = f.call(kungfu.Caller{}, "register_agent", args[i])
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case codeOf(err) != kungfu.CodeLabelReserved:
			t.Errorf("loser: %v", err)
		}
	}
	if won != 1 || f.count("kd_agents") != 1 || f.count("accounts") != 1 {
		t.Fatalf("%d winners, %d agents, %d accounts", won, f.count("kd_agents"), f.count("accounts"))
	}
}

// The seed's worked example, through the tool.
func TestSigningPayloadSeedExample(t *testing.T) {
	t.Parallel()
	f := setup(t)
	args := `{"tool":"withdraw_finding","agent_id":"00000000-0000-4000-8000-000000000001","timestamp":1791700000,"nonce":"n-3f9a1c2e7b5d4f60",
		"arguments":{"agent_id": "00000000-0000-4000-8000-000000000001", "finding_id": "11111111-2222-4333-8444-555555555555", "reason": "test, café"}}`
	got := f.must(kungfu.Caller{}, "get_signing_payload", args)
	const (
		canonical = `{"reason": "test, café", "agent_id": "00000000-0000-4000-8000-000000000001", "finding_id": "11111111-2222-4333-8444-555555555555"}`
		hash      = "d4c5d794a6ebcfd92cbc37b0ac8119475e5ab7ed85bbe522d9aebf730eb96498"
		text      = "kd-mcp-v1\nwithdraw_finding\n00000000-0000-4000-8000-000000000001\n1791700000\nn-3f9a1c2e7b5d4f60\n" + hash
	)
	if got["canonical"] != canonical || got["arguments_hash"] != hash || got["text"] != text {
		t.Fatalf("get_signing_payload = %q", got)
	}
	var seed [32]byte
	for i := range seed {
		seed[i] = byte(i)
	}
	sig := base64.RawURLEncoding.EncodeToString(ed25519.Sign(ed25519.NewKeyFromSeed(seed[:]), []byte(got["text"].(string))))
	if sig != "tfqegxIsYOO_QAOBGLjyFrP3IrWX-PHqWUEaDXjDRvi76ikl7lwt7eCRMfEa10vwYdLaeO8QaYck1X4YFOpuBA" {
		t.Fatalf("signature %s", sig)
	}
}

func TestSigningPayload(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const id = "00000000-0000-4000-8000-000000000001"
	base := func(arguments string, ts string) string {
		return `{"tool":"memory_push","agent_id":"` + id + `","nonce":"abcdefghijklmnop","timestamp":` + ts + `,"arguments":` + arguments + `}`
	}
	// Raw bytes are hashed: 2.50 stays 2.50, _kd_auth is left out, a
	// string timestamp is the same digits, absent arguments are {}.
	got := f.must(kungfu.Caller{}, "get_signing_payload",
		base(`{"price": 2.50, "_kd_auth": {"nonce": "x"}, "big": 1e2, "a": [1, {"z": null, "y": true}]}`, `"1791700000"`))
	if got["canonical"] != `{"a": [1, {"y": true, "z": null}], "big": 100, "price": 2.50}` ||
		!strings.HasSuffix(got["text"].(string), "\n1791700000\nabcdefghijklmnop\n"+got["arguments_hash"].(string)) {
		t.Fatalf("payload = %q", got)
	}
	empty := f.must(kungfu.Caller{}, "get_signing_payload", `{"tool":"memory_list","agent_id":"`+id+`","nonce":"abcdefghijklmnop","timestamp":1}`)
	if empty["canonical"] != "{}" {
		t.Fatalf("no arguments: %q", empty)
	}
	for _, c := range []struct{ args, field string }{
		{base(`{"a": "\u0000"}`, "1"), "arguments"}, // named arguments.a by the strict read
		{base(`{}`, "1.5"), "timestamp"},
		{base(`{}`, `"12a"`), "timestamp"},
		{base(`{}`, `-1`), "timestamp"},
		{strings.Replace(base(`{}`, "1"), "abcdefghijklmnop", "short", 1), "nonce"},
		{strings.Replace(base(`{}`, "1"), "abcdefghijklmnop", "abcdefghijklmnop!", 1), "nonce"},
		{strings.Replace(base(`{}`, "1"), id, "kd_000000000000", 1), "agent_id"},
		{strings.Replace(base(`{}`, "1"), "memory_push", "a b", 1), "tool"},
		{base(`[1]`, "1"), "arguments"},
		// The door takes the signer from arguments.agent_id: a text built
		// for another agent would never verify (review of issue 8).
		{base(`{"agent_id": "00000000-0000-4000-8000-000000000002"}`, "1"), "arguments.agent_id"},
		{base(`{"agent_id": 1}`, "1"), "arguments.agent_id"},
	} {
		if _, err := f.call(kungfu.Caller{}, "get_signing_payload", c.args); codeOf(err) != kungfu.CodeValidationFailed || !strings.HasPrefix(fieldOf(err), c.field) {
			t.Errorf("%s: %v (field %q), want %s", c.args, err, fieldOf(err), c.field)
		}
	}
}
