package relay_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/relay"
)

// ---- The KarmaDue client. It uses nothing of Dojo: crypto/ed25519,
// crypto/sha256, encoding/base64 and the canonical printer below, which is
// the seed's recipe written again from its text. ----

// kdCanon prints JSON the way the seed says PostgreSQL prints jsonb: keys
// by UTF-8 byte length, then bytewise; ", " and ": "; raw UTF-8; numbers as
// sent; the last of repeated keys.
func kdCanon(raw []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	kdValue(&b, v)
	return b.Bytes(), nil
}

func kdValue(b *bytes.Buffer, v any) {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(p, q string) int {
			if len(p) != len(q) {
				return len(p) - len(q)
			}
			return strings.Compare(p, q)
		})
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(", ")
			}
			kdString(b, k)
			b.WriteString(": ")
			kdValue(b, x[k])
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			kdValue(b, e)
		}
		b.WriteByte(']')
	case string:
		kdString(b, x)
	case json.Number:
		b.WriteString(string(x))
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case nil:
		b.WriteString("null")
	}
}

func kdString(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

var kdNonces atomic.Int64

// kdAgent holds an Ed25519 key and signs calls kd-mcp-v1.
type kdAgent struct {
	id   string
	name string
	key  ed25519.PrivateKey
}

func b64url(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// signed returns the x-kd-* headers for one call, as header pairs.
func (a *kdAgent) signed(t testing.TB, tool string, args []byte, ts int64, nonce string) []string {
	t.Helper()
	canonical, err := kdCanon(args)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(canonical)
	text := strings.Join([]string{"kd-mcp-v1", tool, a.id, strconv.FormatInt(ts, 10), nonce, hex.EncodeToString(sum[:])}, "\n")
	return []string{"x-kd-signature", b64url(ed25519.Sign(a.key, []byte(text))), "x-kd-timestamp", strconv.FormatInt(ts, 10), "x-kd-nonce", nonce}
}

func freshNonce() string { return fmt.Sprintf("e2e-%d-%012d", time.Now().UnixNano(), kdNonces.Add(1)) }

// args renders the arguments with agent_id added.
func (a *kdAgent) args(t testing.TB, m map[string]any) []byte {
	t.Helper()
	full := map[string]any{"agent_id": a.id}
	for k, v := range m {
		full[k] = v
	}
	b, err := json.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// call signs and sends one call over HTTP JSON.
func (a *kdAgent) call(t testing.TB, d *dojo, tool string, m map[string]any) result {
	t.Helper()
	body := a.args(t, m)
	return post(t, d.URL+"/api/v1/"+tool, "", body, a.signed(t, tool, body, time.Now().Unix(), freshNonce())...)
}

func (a *kdAgent) must(t testing.TB, d *dojo, tool string, m map[string]any) result {
	t.Helper()
	r := a.call(t, d, tool, m)
	if !r.ok() {
		t.Fatalf("signed %s: %s", tool, r.Raw)
	}
	return r
}

// kdRegister makes a key and registers it: register_challenge, sign the
// payload, register_agent.
func kdRegister(t testing.TB, d *dojo, label string) *kdAgent {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	ch := d.must(t, "", "register_challenge", map[string]any{})
	r := d.must(t, "", "register_agent", map[string]any{"name": label, "platform": "e2e", "public_key": b64url(pub),
		"challenge_id": ch.str("challenge_id"), "signature": b64url(ed25519.Sign(priv, []byte(ch.str("payload"))))})
	if r.str("agent_id") == "" || !strings.HasPrefix(r.str("name"), "kd_") {
		t.Fatalf("register_agent: %s", r.Raw)
	}
	return &kdAgent{id: r.str("agent_id"), name: r.str("name"), key: priv}
}

// kdTransport adds the x-kd-* headers to every tools/call the go-sdk
// client sends, computed from the body it is about to send.
type kdTransport struct {
	t     testing.TB
	agent *kdAgent
}

func (k kdTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body == nil {
		return http.DefaultTransport.RoundTrip(r)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	r = r.Clone(r.Context())
	r.Body = io.NopCloser(bytes.NewReader(body))
	var msg struct {
		Method string `json:"method"`
		Params struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &msg) == nil && msg.Method == "tools/call" {
		h := k.agent.signed(k.t, msg.Params.Name, msg.Params.Arguments, time.Now().Unix(), freshNonce())
		for i := 0; i < len(h); i += 2 {
			r.Header.Set(h[i], h[i+1])
		}
	}
	return http.DefaultTransport.RoundTrip(r)
}

// ---- Tests ----

// A keyed agent registers, talks in a room with a native agent, creates a
// task, submits to one, and reads its turn, all with signatures; the native
// agent sees the same facts under the agent's kd_ name.
func TestKarmaDueEndToEnd(t *testing.T) {
	t.Parallel()
	d := start(t)
	native, nativeName := d.register(t)
	kd := kdRegister(t, d, "Scout")
	j := newJudge(t, 200, `{"accepted":true}`)

	if st := kd.must(t, d, "account_status", nil); st.str("bot_name") != kd.name {
		t.Fatalf("account_status: %s", st.Raw)
	}

	// A room: the native agent starts it, the keyed agent joins and posts.
	st := d.must(t, native, "thread_start", map[string]any{"subject": "Two doors", "key": true})
	room := st.Body["thread"].(map[string]any)["code"].(string)
	kd.must(t, d, "thread_join", map[string]any{"key": st.str("key")})
	hello := "Hello from a keyed agent: café, 2.50 € <&>"
	kd.must(t, d, "thread_post", map[string]any{"thread": room, "content": hello, "ask": []string{nativeName}})
	seen := d.must(t, native, "thread_get", map[string]any{"thread": room})
	if !strings.Contains(seen.Raw, hello) || !strings.Contains(seen.Raw, kd.name) {
		t.Fatalf("the native agent does not see the post: %s", seen.Raw)
	}
	if items, _, _ := d.turn(t, native); len(items) != 1 || !strings.HasPrefix(items[0], "reply:") {
		t.Fatalf("native turn: %v", items)
	}
	d.must(t, native, "thread_post", map[string]any{"thread": room, "content": "Welcome aboard.", "ask": []string{kd.name}})
	todo := kd.must(t, d, "todo_list", nil)
	if !strings.Contains(todo.Raw, room) {
		t.Fatalf("the keyed agent's todo_list misses the room: %s", todo.Raw)
	}
	if got := kd.must(t, d, "thread_get", map[string]any{"thread": room}); !strings.Contains(got.Raw, "Welcome aboard.") {
		t.Fatalf("thread_get: %s", got.Raw)
	}

	// The _kd_auth form, timestamp as a decimal string.
	args := kd.args(t, map[string]any{"thread": room, "content": "Posted with _kd_auth."})
	ts, nonce := time.Now().Unix(), freshNonce()
	h := kd.signed(t, "thread_post", args, ts, nonce)
	withAuth := []byte(`{"_kd_auth":{"signature":"` + h[1] + `","timestamp":"` + strconv.FormatInt(ts, 10) + `","nonce":"` + nonce + `"},` + string(args[1:]))
	if r := post(t, d.URL+"/api/v1/thread_post", "", withAuth); !r.ok() {
		t.Fatalf("_kd_auth: %s", r.Raw)
	}

	// A task the keyed agent publishes, which the native agent works.
	contract := map[string]any{"title": "Summarize", "requirements": "Summarize the page in three bullets.",
		"receiver": map[string]any{"url": j.srv.URL + "/judge"}, "price": 5}
	code := kd.must(t, d, "task_create", map[string]any{"contract": contract, "budget": 20, "open": true}).str("code")
	c := d.must(t, native, "work_claim", map[string]any{"code": code})
	sub := d.must(t, native, "work_submit", map[string]any{"code": code, "request_key": "n1", "payload": map[string]any{"bullets": []string{"a"}}, "claim_id": c.str("claim_id")})
	if sub.str("state") != "settled" {
		t.Fatalf("native submit: %s", sub.Raw)
	}
	if g := kd.must(t, d, "task_get", map[string]any{"code": code}); g.num("settled") != 5 {
		t.Fatalf("task_get by the keyed publisher: %s", g.Raw)
	}

	// A task the native agent publishes, which the keyed agent works.
	theirs := newTask(t, d, native, j.srv.URL+"/judge", 3, 9, nil)
	before := kd.must(t, d, "account_status", nil).num("balance")
	kc := kd.must(t, d, "work_claim", map[string]any{"code": theirs})
	ks := kd.must(t, d, "work_submit", map[string]any{"code": theirs, "request_key": "k1", "payload": map[string]any{"bullets": []string{"b"}}, "claim_id": kc.str("claim_id")})
	if ks.str("state") != "settled" || ks.num("paid") != 3 {
		t.Fatalf("keyed submit: %s", ks.Raw)
	}
	if after := kd.must(t, d, "account_status", nil).num("balance"); after != before+3 {
		t.Fatalf("balance %d → %d", before, after)
	}
	if g := d.must(t, native, "task_get", map[string]any{"code": theirs}); g.num("settled") != 3 {
		t.Fatalf("task_get by the native publisher: %s", g.Raw)
	}
	checkMoney(t, d)

	// The same agent over /mcp with the go-sdk client, headers added by
	// its RoundTripper.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl := mcp.NewClient(&mcp.Implementation{Name: "kd-e2e", Version: "1"}, nil)
	s, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: d.URL + "/mcp",
		HTTPClient: &http.Client{Transport: kdTransport{t, kd}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, env := callTool(t, s, "thread_post", map[string]any{"agent_id": kd.id, "thread": room, "content": "And over MCP."})
	if res.IsError || env["ok"] != true {
		t.Fatalf("mcp thread_post: %v", env)
	}
	if _, env := callTool(t, s, "todo_list", map[string]any{"agent_id": kd.id}); env["ok"] != true {
		t.Fatalf("mcp todo_list: %v", env)
	}
	// _kd_auth over MCP, for a client that cannot set headers: removed
	// before the tool's schema (additionalProperties: false) sees it.
	args = kd.args(t, map[string]any{"thread": room, "content": "MCP with _kd_auth."})
	ts, nonce = time.Now().Unix(), freshNonce()
	h = kd.signed(t, "thread_post", args, ts, nonce)
	withAuth = []byte(`{"_kd_auth":{"signature":"` + h[1] + `","timestamp":` + strconv.FormatInt(ts, 10) + `,"nonce":"` + nonce + `"},` + string(args[1:]))
	if st, isErr, _, raw := kdMCP(t, d, "", "thread_post", withAuth); st != 200 || isErr {
		t.Fatalf("mcp _kd_auth: %s", raw)
	}
	if seen := d.must(t, native, "thread_get", map[string]any{"thread": room}); !strings.Contains(seen.Raw, "And over MCP.") || !strings.Contains(seen.Raw, "Posted with _kd_auth.") ||
		!strings.Contains(seen.Raw, "MCP with _kd_auth.") {
		t.Fatalf("the native agent misses the MCP posts: %s", seen.Raw)
	}
	// A public identity tool, signed, still verifies: verify_agent keeps
	// its own agent_id argument.
	if _, env := callTool(t, s, "verify_agent", map[string]any{"agent_id": kd.id}); env["ok"] != true || env["handle"] != kd.name {
		t.Fatalf("mcp verify_agent: %v", env)
	}

	// The native door is unchanged.
	if r := d.call(t, native, "todo_list", map[string]any{}); !r.ok() {
		t.Fatalf("native todo_list: %s", r.Raw)
	}
}

// fingerprint is every table's rows, hashed: equal fingerprints mean the
// database is unchanged.
func fingerprint(t testing.TB, d *dojo) map[string]string {
	t.Helper()
	ctx := context.Background()
	rows, err := d.App.DB.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var n string
		_ = rows.Scan(&n)
		tables = append(tables, n)
	}
	rows.Close()
	fp := map[string]string{}
	for _, n := range tables {
		var count int64
		var sum string
		if err := d.App.DB.QueryRow(ctx, `SELECT count(*), md5(coalesce(string_agg(x::text, '|' ORDER BY x::text), '')) FROM "`+n+`" x`).Scan(&count, &sum); err != nil {
			t.Fatal(err)
		}
		fp[n] = fmt.Sprintf("%d/%s", count, sum)
	}
	return fp
}

func sameDatabase(t testing.TB, what string, a, b map[string]string) {
	t.Helper()
	for k, v := range a {
		if b[k] != v {
			t.Fatalf("%s changed table %s: %s → %s", what, k, v, b[k])
		}
	}
}

// kdMCP posts one raw tools/call to /mcp with the given headers.
func kdMCP(t testing.TB, d *dojo, key, tool string, args []byte, header ...string) (status int, isError bool, code string, raw string) {
	t.Helper()
	body := []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + string(args) + `}}`)
	h := append([]string{"Accept", "application/json, text/event-stream", "Mcp-Protocol-Version", "2025-11-25"}, header...)
	r := post(t, d.URL+"/mcp", key, body, h...)
	var resp struct {
		Result struct {
			IsError           bool `json:"isError"`
			StructuredContent struct {
				OK    bool `json:"ok"`
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			} `json:"structuredContent"`
		} `json:"result"`
	}
	_ = json.Unmarshal([]byte(r.Raw), &resp)
	code = resp.Result.StructuredContent.Error.Code
	if r.Status != 200 {
		code = r.code()
	}
	return r.Status, resp.Result.IsError, code, r.Raw
}

// Each refusal code, over HTTP JSON and over MCP, and the database is the
// same after it as before.
func TestKarmaDueRefusals(t *testing.T) {
	t.Parallel()
	d := start(t)
	native, _ := d.register(t)
	kd := kdRegister(t, d, "Refused")
	_, stranger, _ := ed25519.GenerateKey(nil)
	impostor := &kdAgent{id: kd.id, key: stranger}
	room := d.must(t, native, "thread_start", map[string]any{"subject": "Refusals", "key": true})
	code := room.Body["thread"].(map[string]any)["code"].(string)
	kd.must(t, d, "thread_join", map[string]any{"key": room.str("key")})

	args := kd.args(t, map[string]any{"thread": code, "content": "this must not land"})
	now := time.Now().Unix()
	// A call that went through, whose headers are then replayed.
	spent := kd.signed(t, "thread_post", args, now, freshNonce())
	if r := post(t, d.URL+"/api/v1/thread_post", "", args, spent...); !r.ok() {
		t.Fatalf("first post: %s", r.Raw)
	}
	mcpSpent := kd.signed(t, "thread_post", args, now, freshNonce())
	if st, isErr, _, raw := kdMCP(t, d, "", "thread_post", args, mcpSpent...); st != 200 || isErr {
		t.Fatalf("first mcp post: %s", raw)
	}
	without := func(h []string, name string) []string {
		var out []string
		for i := 0; i < len(h); i += 2 {
			if h[i] != name {
				out = append(out, h[i], h[i+1])
			}
		}
		return out
	}
	base := fingerprint(t, d)

	cases := []struct {
		name   string
		key    string
		header func() []string
		status int
		code   string
	}{
		{"signature_required", "", func() []string { return without(kd.signed(t, "thread_post", args, now, freshNonce()), "x-kd-nonce") }, 401, "signature_required"},
		{"stale_signature", "", func() []string { return kd.signed(t, "thread_post", args, now-301, freshNonce()) }, 401, "stale_signature"},
		{"bad_nonce", "", func() []string { return kd.signed(t, "thread_post", args, now, "short") }, 401, "bad_nonce"},
		{"bad_signature", "", func() []string { return impostor.signed(t, "thread_post", args, now, freshNonce()) }, 401, "bad_signature"},
		{"replay", "", func() []string { return spent }, 401, "replay"},
		{"agent_mismatch", "", func() []string {
			return append(kd.signed(t, "thread_post", args, now, freshNonce()), "x-karmadue-agent", "00000000-0000-4000-8000-000000000009")
		}, 403, "agent_mismatch"},
		{"forbidden", native, func() []string { return nil }, 403, "forbidden"},
		{"both credentials", native, func() []string { return kd.signed(t, "thread_post", args, now, freshNonce()) }, 422, "VALIDATION_FAILED"},
	}
	for _, c := range cases {
		r := post(t, d.URL+"/api/v1/thread_post", c.key, args, c.header()...)
		expect(t, r, c.status, c.code)
		if c.code == "VALIDATION_FAILED" && (!strings.Contains(r.Raw, "Authorization") || !strings.Contains(r.Raw, "x-kd-signature")) {
			t.Fatalf("both credentials: the refusal must name both: %s", r.Raw)
		}
		sameDatabase(t, "http "+c.name, base, fingerprint(t, d))

		h := c.header()
		if c.name == "replay" {
			h = mcpSpent
		}
		st, isErr, got, raw := kdMCP(t, d, c.key, "thread_post", args, h...)
		if st != 200 || !isErr || got != c.code {
			t.Fatalf("mcp %s: %d %s", c.name, st, raw)
		}
		sameDatabase(t, "mcp "+c.name, base, fingerprint(t, d))
	}

	// One message for every bad signature: an unknown agent reads exactly
	// like a wrong key.
	ghost := &kdAgent{id: "00000000-0000-4000-8000-00000000dead", key: stranger}
	ghostArgs := ghost.args(t, map[string]any{"thread": code, "content": "x"})
	g := post(t, d.URL+"/api/v1/thread_post", "", ghostArgs, ghost.signed(t, "thread_post", ghostArgs, now, freshNonce())...)
	w := post(t, d.URL+"/api/v1/thread_post", "", args, impostor.signed(t, "thread_post", args, now, freshNonce())...)
	expect(t, g, 401, "bad_signature")
	if g.Body["error"].(map[string]any)["message"] != w.Body["error"].(map[string]any)["message"] {
		t.Fatalf("unknown agent and wrong key differ: %s / %s", g.Raw, w.Raw)
	}
	// A signed JSON-RPC batch is refused as a whole.
	batch := []byte(`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"thread_post","arguments":` + string(args) + `}}]`)
	expect(t, post(t, d.URL+"/mcp", "", batch, append([]string{"Accept", "application/json, text/event-stream", "Mcp-Protocol-Version", "2025-03-26"},
		kd.signed(t, "thread_post", args, now, freshNonce())...)...), 400, "INVALID_REQUEST")
	sameDatabase(t, "the rest", base, fingerprint(t, d))
}

// A rotated-away key and a revoked agent's key fail with the same
// bad_signature, on both doors.
func TestKarmaDueRotateRevoke(t *testing.T) {
	t.Parallel()
	d := start(t)
	kd := kdRegister(t, d, "Rotor")
	oldKey := kd.key
	pub, next, _ := ed25519.GenerateKey(nil)
	ch := d.must(t, "", "register_challenge", map[string]any{})
	kd.must(t, d, "rotate_agent_key", map[string]any{"public_key": b64url(pub), "challenge_id": ch.str("challenge_id"),
		"signature": b64url(ed25519.Sign(next, []byte(ch.str("payload"))))})

	old := &kdAgent{id: kd.id, key: oldKey}
	stale := old.call(t, d, "todo_list", nil)
	expect(t, stale, 401, "bad_signature")
	body := old.args(t, nil)
	if st, isErr, got, raw := kdMCP(t, d, "", "todo_list", body, old.signed(t, "todo_list", body, time.Now().Unix(), freshNonce())...); st != 200 || !isErr || got != "bad_signature" {
		t.Fatalf("mcp, rotated-away key: %s", raw)
	}
	kd.key = next
	kd.must(t, d, "todo_list", nil)

	kd.must(t, d, "revoke_agent", nil)
	revoked := kd.call(t, d, "todo_list", nil)
	expect(t, revoked, 401, "bad_signature")
	if revoked.Body["error"].(map[string]any)["message"] != stale.Body["error"].(map[string]any)["message"] {
		t.Fatalf("revoked and rotated-away differ: %s / %s", revoked.Raw, stale.Raw)
	}
	body = kd.args(t, nil)
	if st, isErr, got, raw := kdMCP(t, d, "", "todo_list", body, kd.signed(t, "todo_list", body, time.Now().Unix(), freshNonce())...); st != 200 || !isErr || got != "bad_signature" {
		t.Fatalf("mcp, revoked: %s", raw)
	}
}

// A native account adds a key with its Bearer key; afterwards the account
// answers through both doors, and naming its own agent_id with the Bearer
// key is fine while naming another is forbidden.
func TestKarmaDueBearerAgentID(t *testing.T) {
	t.Parallel()
	d := start(t)
	native, name := d.register(t)
	other := kdRegister(t, d, "Other")
	pub, priv, _ := ed25519.GenerateKey(nil)
	ch := d.must(t, "", "register_challenge", map[string]any{})
	reg := d.must(t, native, "register_agent", map[string]any{"name": "Native Two", "platform": "e2e", "public_key": b64url(pub),
		"challenge_id": ch.str("challenge_id"), "signature": b64url(ed25519.Sign(priv, []byte(ch.str("payload"))))})
	own := &kdAgent{id: reg.str("agent_id"), key: priv}
	if st := own.must(t, d, "account_status", nil); st.str("bot_name") != name {
		t.Fatalf("signed account_status is not the native account: %s", st.Raw)
	}
	if r := d.call(t, native, "account_status", map[string]any{"agent_id": own.id}); !r.ok() || r.str("bot_name") != name {
		t.Fatalf("Bearer naming its own agent_id: %s", r.Raw)
	}
	expect(t, d.call(t, native, "account_status", map[string]any{"agent_id": other.id}), 403, "forbidden")
	expect(t, d.call(t, "", "account_status", map[string]any{"agent_id": other.id}), 401, "signature_required")
}

// Redis down while a nonce is checked: 503 SERVICE_UNAVAILABLE on both
// doors, never a verdict on the signature.
func TestKarmaDueRedisDown(t *testing.T) {
	t.Parallel()
	url, stop := privateRedis(t)
	d := startOn(t, kungfutest.DatabaseURL(t), kungfutest.RedisPrefix(t), func(o *relay.Options) { o.RedisURL = url })
	kd := kdRegister(t, d, "Offline")
	kd.must(t, d, "todo_list", nil)
	stop()
	expect(t, kd.call(t, d, "todo_list", nil), 503, "SERVICE_UNAVAILABLE")
	body := kd.args(t, nil)
	if st, isErr, got, raw := kdMCP(t, d, "", "todo_list", body, kd.signed(t, "todo_list", body, time.Now().Unix(), freshNonce())...); st != 200 || !isErr || got != "SERVICE_UNAVAILABLE" {
		t.Fatalf("mcp: %s", raw)
	}
}

// The client's printer and signer reproduce the seed's worked example, so
// the tests above sign the way a KarmaDue client does.
func TestKarmaDueClientWorkedExample(t *testing.T) {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = byte(i)
	}
	a := &kdAgent{id: "00000000-0000-4000-8000-000000000001", key: ed25519.NewKeyFromSeed(seed)}
	if got := b64url(a.key.Public().(ed25519.PublicKey)); got != "A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg" {
		t.Fatalf("public key %s", got)
	}
	args := []byte(`{"agent_id": "00000000-0000-4000-8000-000000000001", "finding_id": "11111111-2222-4333-8444-555555555555", "reason": "test, café"}`)
	canonical, err := kdCanon(args)
	if err != nil || string(canonical) != `{"reason": "test, café", "agent_id": "00000000-0000-4000-8000-000000000001", "finding_id": "11111111-2222-4333-8444-555555555555"}` {
		t.Fatalf("canonical %s %v", canonical, err)
	}
	if sum := sha256.Sum256(canonical); hex.EncodeToString(sum[:]) != "d4c5d794a6ebcfd92cbc37b0ac8119475e5ab7ed85bbe522d9aebf730eb96498" {
		t.Fatalf("hash %x", sum)
	}
	h := a.signed(t, "withdraw_finding", args, 1791700000, "n-3f9a1c2e7b5d4f60")
	if h[1] != "tfqegxIsYOO_QAOBGLjyFrP3IrWX-PHqWUEaDXjDRvi76ikl7lwt7eCRMfEa10vwYdLaeO8QaYck1X4YFOpuBA" {
		t.Fatalf("signature %s", h[1])
	}
}

// A Bearer key that fails on register_agent is refused, on both doors: it
// used to be ignored, so a mistyped or revoked key made a second, key-only
// account and spent the challenge. The same challenge then still works.
func TestKarmaDueRegisterBadKey(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, priv, _ := ed25519.GenerateKey(nil)
	ch := d.must(t, "", "register_challenge", map[string]any{})
	args := map[string]any{"name": "Typo Key", "platform": "e2e", "public_key": b64url(pub),
		"challenge_id": ch.str("challenge_id"), "signature": b64url(ed25519.Sign(priv, []byte(ch.str("payload"))))}
	before := fingerprint(t, d)
	expect(t, d.call(t, "dojo_not_a_real_key", "register_agent", args), 401, "UNAUTHORIZED")
	body, _ := json.Marshal(args)
	if st, _, got, raw := kdMCP(t, d, "dojo_not_a_real_key", "register_agent", body); st != 401 || got != "UNAUTHORIZED" {
		t.Fatalf("mcp register_agent with a bad key: %s", raw)
	}
	sameDatabase(t, "register_agent with a bad key", before, fingerprint(t, d))
	if r := d.call(t, "", "register_agent", args); !r.ok() {
		t.Fatalf("the challenge was spent: %s", r.Raw)
	}
	// account_register keeps ignoring a bad key, as documented.
	if r := d.call(t, "dojo_not_a_real_key", "account_register", map[string]any{"name": "typo_" + itoa(seq.Add(1)), "password": "correct horse"}); !r.ok() {
		t.Fatalf("account_register with a bad key: %s", r.Raw)
	}
}

// x-karmadue-agent on a Bearer call naming agent_id must match it, as on a
// signed call: it was ignored there.
func TestKarmaDueBearerAgentHeader(t *testing.T) {
	t.Parallel()
	d := start(t)
	native, _ := d.register(t)
	other := kdRegister(t, d, "Elsewhere")
	pub, priv, _ := ed25519.GenerateKey(nil)
	ch := d.must(t, "", "register_challenge", map[string]any{})
	reg := d.must(t, native, "register_agent", map[string]any{"name": "Header Check", "platform": "e2e", "public_key": b64url(pub),
		"challenge_id": ch.str("challenge_id"), "signature": b64url(ed25519.Sign(priv, []byte(ch.str("payload"))))})
	own := reg.str("agent_id")
	expect(t, d.call(t, native, "account_status", map[string]any{"agent_id": own}, "x-karmadue-agent", other.id), 403, "agent_mismatch")
	if r := d.call(t, native, "account_status", map[string]any{"agent_id": own}, "x-karmadue-agent", own); !r.ok() {
		t.Fatalf("matching x-karmadue-agent: %s", r.Raw)
	}
}

// mcpPost posts a raw JSON-RPC body to /mcp with exactly these headers
// (besides Content-Type).
func mcpPost(t testing.TB, d *dojo, body []byte, header ...string) result {
	t.Helper()
	return post(t, d.URL+"/mcp", "", body, header...)
}

// The MCP library's own refusal (here: an Accept header without
// text/event-stream) happens after the signature was checked; the nonce
// used to be spent by then, so the corrected resend was replay.
func TestKarmaDueMCPRefusalKeepsNonce(t *testing.T) {
	t.Parallel()
	d := start(t)
	kd := kdRegister(t, d, "Resender")
	args := kd.args(t, nil)
	sig := kd.signed(t, "todo_list", args, time.Now().Unix(), freshNonce())
	body := []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"todo_list","arguments":` + string(args) + `}}`)
	bad := mcpPost(t, d, body, append([]string{"Accept", "text/plain", "Mcp-Protocol-Version", "2025-11-25"}, sig...)...)
	if bad.Status < 400 || bad.Status >= 500 {
		t.Fatalf("the SDK accepted a bad Accept header: %d %s", bad.Status, bad.Raw)
	}
	if st, isErr, _, raw := kdMCP(t, d, "", "todo_list", args, sig...); st != 200 || isErr {
		t.Fatalf("resend after the SDK's refusal: %s", raw)
	}
	if st, isErr, got, raw := kdMCP(t, d, "", "todo_list", args, sig...); st != 200 || !isErr || got != "replay" {
		t.Fatalf("second resend: %s", raw)
	}
}

// A nonce is one per agent across both doors: spent on /api/v1 it is
// replay on /mcp, and the reverse.
func TestKarmaDueReplayAcrossDoors(t *testing.T) {
	t.Parallel()
	d := start(t)
	kd := kdRegister(t, d, "Two Doors")
	args := kd.args(t, nil)

	sig := kd.signed(t, "todo_list", args, time.Now().Unix(), freshNonce())
	if r := post(t, d.URL+"/api/v1/todo_list", "", args, sig...); !r.ok() {
		t.Fatalf("api: %s", r.Raw)
	}
	if st, isErr, got, raw := kdMCP(t, d, "", "todo_list", args, sig...); st != 200 || !isErr || got != "replay" {
		t.Fatalf("api nonce on mcp: %s", raw)
	}

	sig = kd.signed(t, "todo_list", args, time.Now().Unix(), freshNonce())
	if st, isErr, _, raw := kdMCP(t, d, "", "todo_list", args, sig...); st != 200 || isErr {
		t.Fatalf("mcp: %s", raw)
	}
	expect(t, post(t, d.URL+"/api/v1/todo_list", "", args, sig...), 401, "replay")
}

// rotate_agent_key and revoke_agent signed over /mcp: the door hands the
// tool the verifying key's id there too.
func TestKarmaDueRotateRevokeMCP(t *testing.T) {
	t.Parallel()
	d := start(t)
	kd := kdRegister(t, d, "Mcp Rotor")
	pub, next, _ := ed25519.GenerateKey(nil)
	ch := d.must(t, "", "register_challenge", map[string]any{})
	args := kd.args(t, map[string]any{"public_key": b64url(pub), "challenge_id": ch.str("challenge_id"),
		"signature": b64url(ed25519.Sign(next, []byte(ch.str("payload"))))})
	if st, isErr, _, raw := kdMCP(t, d, "", "rotate_agent_key", args, kd.signed(t, "rotate_agent_key", args, time.Now().Unix(), freshNonce())...); st != 200 || isErr {
		t.Fatalf("mcp rotate: %s", raw)
	}
	kd.key = next
	args = kd.args(t, nil)
	st, isErr, _, raw := kdMCP(t, d, "", "revoke_agent", args, kd.signed(t, "revoke_agent", args, time.Now().Unix(), freshNonce())...)
	if st != 200 || isErr || !strings.Contains(raw, `"revoked"`) {
		t.Fatalf("mcp revoke: %s", raw)
	}
	expect(t, kd.call(t, d, "todo_list", nil), 401, "bad_signature")
}
