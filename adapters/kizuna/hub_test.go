package kizuna_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"github.com/dojo-relay/dojo/adapters/kizuna"
	"github.com/dojo-relay/dojo/kungfu/account"
	"github.com/dojo-relay/dojo/kungfu/credits"
	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/signing"
)

const hubAdmin = "test-admin-token-0123456789"

// hubRecorder is the Deliverer hook: it records which letters were handed
// on, so a test can check the hand-off happens after the commit.
type hubRecorder struct {
	mu  sync.Mutex
	db  *pgxpool.Pool
	ids []int64
	// committed says whether each letter's row was visible when handed on.
	committed []bool
}

// Redeliver is recorded like a first hand-over.
func (r *hubRecorder) Redeliver(ctx context.Context, id int64) { r.Enqueue(ctx, id) }

func (r *hubRecorder) Enqueue(ctx context.Context, id int64) {
	var ok bool
	_ = r.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM kz_letters WHERE id = $1)`, id).Scan(&ok)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids = append(r.ids, id)
	r.committed = append(r.committed, ok)
}

type hubFixture struct {
	url  string
	db   *pgxpool.Pool
	keys *signing.ServerKey
	rec  *hubRecorder
	now  atomic.Pointer[time.Time]
}

func newHub(t *testing.T, opts ...func(*kizuna.Hub)) *hubFixture {
	t.Helper()
	db, _ := kungfutest.Pool(t)
	text, _ := signing.GenerateServerKey()
	keys, err := signing.ParseServerKey(text)
	if err != nil {
		t.Fatal(err)
	}
	f := &hubFixture{db: db, keys: keys, rec: &hubRecorder{db: db}}
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.now.Store(&start)
	clock := func() time.Time { return *f.now.Load() }
	h := &kizuna.Hub{DB: db, Keys: keys, AdminToken: hubAdmin, Deliver: f.rec, Now: clock,
		Accounts: &account.Service{DB: db, Now: clock, BcryptCost: bcrypt.MinCost},
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, o := range opts {
		o(h)
	}
	r := mux.NewRouter()
	h.Mount(r)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		if drift, err := credits.Check(context.Background(), db); err != nil || len(drift) > 0 {
			t.Errorf("credits.Check: drift %+v, err %v", drift, err)
		}
	})
	f.url = srv.URL
	return f
}

func (f *hubFixture) advance(d time.Duration) {
	t := f.now.Load().Add(d)
	f.now.Store(&t)
}

type hubReply struct {
	status int
	body   map[string]any
	raw    string
}

func (r hubReply) code() string {
	e, _ := r.body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func (r hubReply) str(k string) string { s, _ := r.body[k].(string); return s }

func (f *hubFixture) do(t *testing.T, method, path, token string, body any) hubReply {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, f.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := hubReply{status: resp.StatusCode, raw: string(raw)}
	_ = json.Unmarshal(raw, &out.body)
	return out
}

func hubExpect(t *testing.T, r hubReply, status int, code string) {
	t.Helper()
	if r.status != status || r.code() != code {
		t.Fatalf("want %d %s, got %d %s", status, code, r.status, r.raw)
	}
	if code != "" {
		e, _ := r.body["error"].(map[string]any)
		if m, _ := e["message"].(string); m == "" {
			t.Fatalf("refusal without message: %s", r.raw)
		}
	}
}

// hubFields returns the field names a VALIDATION_FAILED refusal names.
func hubFields(r hubReply) []string {
	e, _ := r.body["error"].(map[string]any)
	d, _ := e["details"].(map[string]any)
	fs, _ := d["fields"].([]any)
	var out []string
	for _, x := range fs {
		m, _ := x.(map[string]any)
		s, _ := m["field"].(string)
		out = append(out, s)
	}
	return out
}

type hubAgent struct{ id, token, secret string }

func (f *hubFixture) agent(t *testing.T, id string, extra map[string]any) hubAgent {
	t.Helper()
	body := map[string]any{"name": "Agent " + id, "capabilities": "translates letters", "webhook_url": "http://127.0.0.1:9/"}
	if id != "" {
		body["agent_id"] = id
	}
	for k, v := range extra {
		body[k] = v
	}
	r := f.do(t, http.MethodPost, "/api/v1/agents", hubAdmin, body)
	hubExpect(t, r, http.StatusCreated, "")
	return hubAgent{r.str("agent_id"), r.str("agent_token"), r.str("endpoint_secret")}
}

func (f *hubFixture) enroll(t *testing.T, token string, expires time.Time) {
	t.Helper()
	sum := sha256.Sum256([]byte(token))
	if _, err := f.db.Exec(context.Background(), `INSERT INTO kz_enroll_tokens (token_hash, expires_at, created_at) VALUES ($1, $2, $3)`,
		sum[:], expires, *f.now.Load()); err != nil {
		t.Fatal(err)
	}
}

func TestHubRegister(t *testing.T) {
	f := newHub(t)
	minted := f.agent(t, "", map[string]any{"capability_tags": []string{"ja", "en"}})
	if !regexp.MustCompile(`^A-[2-9A-HJ-NP-Z]{4}$`).MatchString(minted.id) {
		t.Fatalf("minted id %q", minted.id)
	}
	if !account.LooksLikeKey(minted.token) || !strings.HasPrefix(minted.secret, "kzs_") {
		t.Fatalf("token %q secret %q", minted.token, minted.secret)
	}
	// The secret is stored sealed, never in the clear, and opens again.
	var (
		acc    int64
		sealed []byte
	)
	if err := f.db.QueryRow(context.Background(), `SELECT k.account_id, k.endpoint_secret FROM kz_agents k JOIN accounts a ON a.id = k.account_id WHERE a.name = $1`,
		minted.id).Scan(&acc, &sealed); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte(minted.secret)) {
		t.Fatal("endpoint secret stored in the clear")
	}
	if open, err := f.keys.Open(sealed, kizuna.SecretPurpose(acc)); err != nil || string(open) != minted.secret {
		t.Fatalf("sealed secret: %q %v", open, err)
	}
	// The agent token works at once.
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/heartbeat", minted.token, nil), http.StatusOK, "")

	custom := f.agent(t, "translator.jp", nil)
	if custom.id != "translator.jp" {
		t.Fatalf("custom id not kept: %q", custom.id)
	}
	for _, id := range []string{"Translator.JP", "ab", "admin", "kd_000000000000", "has space in it"} {
		r := f.do(t, http.MethodPost, "/api/v1/agents", hubAdmin, map[string]any{"agent_id": id, "name": "x", "capabilities": "", "webhook_url": "https://example.com"})
		hubExpect(t, r, http.StatusConflict, "AGENT_CONFLICT")
	}
	r := f.do(t, http.MethodPost, "/api/v1/agents", hubAdmin, map[string]any{"capabilities": 7, "webhook_url": "ftp://x"})
	hubExpect(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	if got := hubFields(r); len(got) != 1 || got[0] != "capabilities" {
		t.Fatalf("fields %v", got)
	}
	r = f.do(t, http.MethodPost, "/api/v1/agents", hubAdmin, map[string]any{"capabilities": "x", "webhook_url": "ftp://x", "capability_tags": []string{""}})
	hubExpect(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	if got := strings.Join(hubFields(r), ","); got != "name,capability_tags.0,webhook_url" {
		t.Fatalf("fields %v", got)
	}
	// A repeated key is refused by the strict reader.
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/agents", hubAdmin, `{"name":"a","name":"b"}`), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	good := map[string]any{"name": "Box", "capabilities": "", "webhook_url": "https://example.com/"}
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/agents", "", good), http.StatusUnauthorized, "UNAUTHORIZED")
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/agents", "test-admin-token-0123456788", good), http.StatusUnauthorized, "UNAUTHORIZED")
	// An agent token is no admin token.
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/agents", minted.token, good), http.StatusUnauthorized, "UNAUTHORIZED")

	// Enroll tokens: single use, by query or body; a failed registration
	// does not spend one.
	f.enroll(t, "enroll-one", f.now.Load().Add(3*time.Hour))
	f.enroll(t, "enroll-two", f.now.Load().Add(3*time.Hour))
	f.enroll(t, "enroll-old", f.now.Load().Add(-time.Second))
	taken := map[string]any{"agent_id": "translator.jp", "name": "Box", "capabilities": "", "webhook_url": "https://example.com/"}
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/agents?token=enroll-one", "", taken), http.StatusConflict, "AGENT_CONFLICT")
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/agents?token=enroll-one", "", good), http.StatusCreated, "")
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/agents?token=enroll-one", "", good), http.StatusGone, "ENROLL_TOKEN_USED")
	withBody := map[string]any{"name": "Box", "capabilities": "", "webhook_url": "https://example.com/", "enroll_token": "enroll-two"}
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/agents", "", withBody), http.StatusCreated, "")
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/agents", "", withBody), http.StatusGone, "ENROLL_TOKEN_USED")
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/agents?token=enroll-old", "", good), http.StatusGone, "ENROLL_TOKEN_EXPIRED")
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/agents?token=never-issued", "", good), http.StatusUnauthorized, "UNAUTHORIZED")
	var n int
	if err := f.db.QueryRow(context.Background(), `SELECT count(*) FROM kz_agents`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("%d agents, err %v", n, err)
	}
}

func TestHubDirectory(t *testing.T) {
	f := newHub(t)
	a := f.agent(t, "alpha_agent", map[string]any{"capability_tags": []string{"ocr"}, "capabilities": "reads scans"})
	b := f.agent(t, "bravo_agent", map[string]any{"capability_tags": []string{"tts"}})
	c := f.agent(t, "charlie_agent", nil)

	r := f.do(t, http.MethodGet, "/api/v1/agents/bravo_agent", a.token, nil)
	hubExpect(t, r, http.StatusOK, "")
	if r.str("agent_id") != "bravo_agent" || r.str("status") != "offline" || strings.Contains(r.raw, b.secret) || strings.Contains(r.raw, b.token) ||
		strings.Contains(r.raw, "endpoint_secret") || strings.Contains(r.raw, "agent_token") {
		t.Fatalf("agent view %s", r.raw)
	}
	hubExpect(t, f.do(t, http.MethodGet, "/api/v1/agents/bravo_agent", hubAdmin, nil), http.StatusOK, "")
	hubExpect(t, f.do(t, http.MethodGet, "/api/v1/agents/bravo_agent", "", nil), http.StatusUnauthorized, "UNAUTHORIZED")
	hubExpect(t, f.do(t, http.MethodGet, "/api/v1/agents/nobody_here", a.token, nil), http.StatusNotFound, "AGENT_NOT_FOUND")

	// Heartbeat: online until five minutes of silence.
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/heartbeat", a.token, nil), http.StatusOK, "")
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/heartbeat", hubAdmin, nil), http.StatusForbidden, "FORBIDDEN")
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/heartbeat", "", nil), http.StatusUnauthorized, "UNAUTHORIZED")
	list := func(query string) []string {
		t.Helper()
		r := f.do(t, http.MethodGet, "/api/v1/agents"+query, b.token, nil)
		hubExpect(t, r, http.StatusOK, "")
		items, _ := r.body["items"].([]any)
		var ids []string
		for _, it := range items {
			m, _ := it.(map[string]any)
			ids = append(ids, m["agent_id"].(string))
		}
		if int(r.body["total"].(float64)) < len(ids) || r.body["limit"] == nil || r.body["offset"] == nil {
			t.Fatalf("page %s", r.raw)
		}
		return ids
	}
	check := func(query, want string) {
		t.Helper()
		if got := strings.Join(list(query), ","); got != want {
			t.Fatalf("%s: got %q want %q", query, got, want)
		}
	}
	check("", "alpha_agent,bravo_agent,charlie_agent")
	check("?status=online", "alpha_agent")
	check("?status=offline", "bravo_agent,charlie_agent")
	check("?tag=tts", "bravo_agent")
	check("?q=SCANS", "alpha_agent")
	check("?limit=1&offset=1", "bravo_agent")
	f.advance(5*time.Minute + time.Second)
	check("?status=online", "")
	hubExpect(t, f.do(t, http.MethodGet, "/api/v1/agents?status=asleep", b.token, nil), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	hubExpect(t, f.do(t, http.MethodGet, "/api/v1/agents?limit=0", b.token, nil), http.StatusUnprocessableEntity, "VALIDATION_FAILED")

	// Admin PATCH: disable, retag, publish and withdraw a card.
	hubExpect(t, f.do(t, http.MethodPatch, "/api/v1/agents/charlie_agent", a.token, map[string]any{"enabled": false}), http.StatusForbidden, "FORBIDDEN")
	r = f.do(t, http.MethodPatch, "/api/v1/agents/charlie_agent", hubAdmin, map[string]any{"enabled": false, "capability_tags": []string{"x"}, "agent_card": map[string]any{"name": "C"}})
	hubExpect(t, r, http.StatusOK, "")
	if r.str("status") != "disabled" || r.str("name") != "Agent charlie_agent" || !strings.Contains(r.raw, `"agent_card":{"name":"C"}`) {
		t.Fatalf("patched %s", r.raw)
	}
	check("?status=disabled", "charlie_agent")
	r = f.do(t, http.MethodPatch, "/api/v1/agents/charlie_agent", hubAdmin, map[string]any{"agent_card": nil})
	if !strings.Contains(r.raw, `"agent_card":null`) || !strings.Contains(r.raw, `"capability_tags":["x"]`) {
		t.Fatalf("withdrawn %s", r.raw)
	}
	hubExpect(t, f.do(t, http.MethodPatch, "/api/v1/agents/charlie_agent", hubAdmin, map[string]any{"agent_card": map[string]any{"url": "x"}}), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	hubExpect(t, f.do(t, http.MethodPatch, "/api/v1/agents/nobody_here", hubAdmin, map[string]any{"enabled": true}), http.StatusNotFound, "AGENT_NOT_FOUND")

	// DELETE: gone from the directory, its token dead, its id not reusable.
	hubExpect(t, f.do(t, http.MethodDelete, "/api/v1/agents/charlie_agent", c.token, nil), http.StatusForbidden, "FORBIDDEN")
	hubExpect(t, f.do(t, http.MethodDelete, "/api/v1/agents/charlie_agent", hubAdmin, nil), http.StatusOK, "")
	hubExpect(t, f.do(t, http.MethodGet, "/api/v1/agents/charlie_agent", a.token, nil), http.StatusNotFound, "AGENT_NOT_FOUND")
	hubExpect(t, f.do(t, http.MethodDelete, "/api/v1/agents/charlie_agent", hubAdmin, nil), http.StatusNotFound, "AGENT_NOT_FOUND")
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/heartbeat", c.token, nil), http.StatusUnauthorized, "UNAUTHORIZED")
	check("", "alpha_agent,bravo_agent")

	hubExpect(t, f.do(t, http.MethodPut, "/api/v1/agents", hubAdmin, nil), http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED")
}

func (f *hubFixture) letterBody(t *testing.T, taskID string) string {
	t.Helper()
	var body string
	if err := f.db.QueryRow(context.Background(), `SELECT body::text FROM kz_letters WHERE task_id = $1`, taskID).Scan(&body); err != nil {
		t.Fatal(err)
	}
	return body
}

func TestHubSend(t *testing.T) {
	f := newHub(t)
	a := f.agent(t, "sender_agent", nil)
	b := f.agent(t, "target_agent", nil)
	f.agent(t, "sleepy_agent", nil)
	hubExpect(t, f.do(t, http.MethodPatch, "/api/v1/agents/sleepy_agent", hubAdmin, map[string]any{"enabled": false}), http.StatusOK, "")

	// A forged from is ignored; a JSON body keeps its exact bytes.
	content := `{"title":"Translate <this>","format":"json","body":{"z":1,  "a":[true,{"k":"v"}],"m":1.50},"priority":"high"}`
	r := f.do(t, http.MethodPost, "/api/v1/tasks", a.token, `{"from":"target_agent","to":"TARGET_AGENT","content":`+content+`}`)
	hubExpect(t, r, http.StatusAccepted, "")
	task := r.str("task_id")
	if !regexp.MustCompile(`^T-[2-9A-HJ-NP-Z]{12}$`).MatchString(task) || r.str("status") != "queued" {
		t.Fatalf("send %s", r.raw)
	}
	want := `{"task_id":"` + task + `","from":"sender_agent","to":"target_agent","kind":"kizuna.task","reply_to":null,"content":` +
		content + `,"created_at":"2026-11-30T12:00:00.000Z"}`
	if got := f.letterBody(t, task); got != want {
		t.Fatalf("stored body\n got %s\nwant %s", got, want)
	}
	f.rec.mu.Lock()
	handed := len(f.rec.ids) == 1 && f.rec.committed[0]
	f.rec.mu.Unlock()
	if !handed {
		t.Fatalf("deliverer: %+v", f.rec)
	}

	text := map[string]any{"to": "target_agent", "content": map[string]any{"title": "hi", "body": "plain text"}}
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/tasks", b.token, text), http.StatusAccepted, "")

	count := func() int {
		var n int
		if err := f.db.QueryRow(context.Background(), `SELECT count(*) FROM kz_letters`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := count()
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/tasks", a.token, map[string]any{"to": "nobody_here", "content": map[string]any{"title": "x", "body": "y"}}),
		http.StatusNotFound, "AGENT_NOT_FOUND")
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/tasks", a.token, map[string]any{"to": "sleepy_agent", "content": map[string]any{"title": "x", "body": "y"}}),
		http.StatusUnprocessableEntity, "TARGET_DISABLED")
	for _, c := range []struct {
		body   string
		fields string
	}{
		{`{"content":{"title":"x","body":"y"}}`, "to"},
		{`{"to":"target_agent"}`, "content"},
		{`{"to":"target_agent","content":{"body":{"a":1}}}`, "content.title,content.body"},
		{`{"to":"target_agent","content":{"title":"x","body":"y","format":"yaml","priority":"now","deadline":"tomorrow"}}`, "content.format,content.priority,content.deadline"},
		{`{"to":"target_agent","content":{"title":"x","body":null,"format":"json"}}`, "content.body"},
		{`{"to":7,"content":{"title":"x","body":"y"}}`, "to"},
		{`{"to":"target_agent","content":{"title":"x","body":"y","body":"z"}}`, "content"},
	} {
		r := f.do(t, http.MethodPost, "/api/v1/tasks", a.token, c.body)
		hubExpect(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		if got := strings.Join(hubFields(r), ","); !strings.HasPrefix(got, c.fields) {
			t.Fatalf("%s: fields %q want %q", c.body, got, c.fields)
		}
	}
	huge := `{"to":"target_agent","content":{"title":"x","body":"` + strings.Repeat("a", 1<<20) + `"}}`
	r = f.do(t, http.MethodPost, "/api/v1/tasks", a.token, huge)
	hubExpect(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	if got := hubFields(r); len(got) != 1 || got[0] != "body" {
		t.Fatalf("fields %v", got)
	}
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/tasks", "", text), http.StatusUnauthorized, "UNAUTHORIZED")
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/tasks", hubAdmin, text), http.StatusForbidden, "FORBIDDEN")
	if n := count(); n != before {
		t.Fatalf("refused sends wrote letters: %d -> %d", before, n)
	}
}

func (f *hubFixture) ack(t *testing.T, task string) {
	t.Helper()
	if _, err := f.db.Exec(context.Background(), `UPDATE kz_letters SET state = 'acked', acked_at = $2, finished_at = $2, next_attempt_at = NULL WHERE task_id = $1`,
		task, *f.now.Load()); err != nil {
		t.Fatal(err)
	}
}

func TestHubResults(t *testing.T) {
	f := newHub(t)
	a := f.agent(t, "sender_agent", nil)
	b := f.agent(t, "worker_agent", nil)
	o := f.agent(t, "outsider_agent", nil)
	r := f.do(t, http.MethodPost, "/api/v1/tasks", a.token, map[string]any{"to": "worker_agent", "content": map[string]any{"title": "t", "body": "b"}})
	hubExpect(t, r, http.StatusAccepted, "")
	task := r.str("task_id")
	path := "/api/v1/tasks/" + task

	for _, tok := range []string{a.token, b.token, hubAdmin} {
		r := f.do(t, http.MethodGet, path, tok, nil)
		hubExpect(t, r, http.StatusOK, "")
		if r.str("state") != "queued" || r.str("from") != "sender_agent" || r.str("to") != "worker_agent" || r.body["outcome"] != nil ||
			!strings.Contains(r.raw, `"attempts":[]`) || !strings.Contains(r.raw, `"content":{"body":"b","title":"t"}`) {
			t.Fatalf("task view %s", r.raw)
		}
	}
	hubExpect(t, f.do(t, http.MethodGet, path, o.token, nil), http.StatusForbidden, "FORBIDDEN")
	hubExpect(t, f.do(t, http.MethodGet, path, "", nil), http.StatusUnauthorized, "UNAUTHORIZED")
	hubExpect(t, f.do(t, http.MethodGet, "/api/v1/tasks/T-NOSUCHTASK22", a.token, nil), http.StatusNotFound, "TASK_NOT_FOUND")

	working := map[string]any{"state": "working", "message": "on it"}
	// Before the ACK a report is refused and changes nothing.
	hubExpect(t, f.do(t, http.MethodPost, path+"/result", b.token, working), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	f.ack(t, task)
	hubExpect(t, f.do(t, http.MethodPost, path+"/result", a.token, working), http.StatusForbidden, "FORBIDDEN")
	hubExpect(t, f.do(t, http.MethodPost, path+"/result", o.token, working), http.StatusForbidden, "FORBIDDEN")
	hubExpect(t, f.do(t, http.MethodPost, path+"/result", hubAdmin, working), http.StatusForbidden, "FORBIDDEN")
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/tasks/T-NOSUCHTASK22/result", b.token, working), http.StatusNotFound, "TASK_NOT_FOUND")
	r = f.do(t, http.MethodPost, path+"/result", b.token, map[string]any{"state": "done"})
	hubExpect(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	if got := hubFields(r); len(got) != 1 || got[0] != "state" {
		t.Fatalf("fields %v", got)
	}

	report := func(body string, category string, relayed bool) {
		t.Helper()
		r := f.do(t, http.MethodPost, path+"/result", b.token, body)
		hubExpect(t, r, http.StatusAccepted, "")
		if r.str("category") != category || r.body["relayed"] != relayed {
			t.Fatalf("%s: %s", body, r.raw)
		}
	}
	report(`{"state":"working","message":"on it"}`, "in_progress", false)
	report(`{"state":"input-required","message":"which dialect?"}`, "interrupted", false)
	report(`{"state":"completed","result":{"text":"done",  "n":[1,2]}}`, "terminal", true)
	// The same terminal state again is idempotent; another is refused.
	report(`{"state":"completed"}`, "terminal", false)
	hubExpect(t, f.do(t, http.MethodPost, path+"/result", b.token, map[string]any{"state": "failed"}), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	hubExpect(t, f.do(t, http.MethodPost, path+"/result", b.token, working), http.StatusUnprocessableEntity, "VALIDATION_FAILED")

	// Exactly one reply letter, from the worker to the sender.
	var (
		reply string
		n     int
	)
	if err := f.db.QueryRow(context.Background(), `SELECT max(task_id), count(*) FROM kz_letters WHERE reply_to = $1 AND kind = 'kizuna.task-result'`, task).Scan(&reply, &n); err != nil || n != 1 {
		t.Fatalf("%d reply letters, err %v", n, err)
	}
	want := `{"task_id":"` + reply + `","from":"worker_agent","to":"sender_agent","kind":"kizuna.task-result","reply_to":"` + task +
		`","content":{"title":"Result of ` + task + `: completed","format":"json","body":{"task_id":"` + task +
		`","state":"completed","message":null,"result":{"text":"done",  "n":[1,2]}}},"created_at":"2026-11-30T12:00:00.000Z"}`
	if got := f.letterBody(t, reply); got != want {
		t.Fatalf("reply body\n got %s\nwant %s", got, want)
	}
	f.rec.mu.Lock()
	handed := len(f.rec.ids)
	f.rec.mu.Unlock()
	if handed != 2 {
		t.Fatalf("%d letters handed to delivery, want 2", handed)
	}

	r = f.do(t, http.MethodGet, path+"/result", a.token, nil)
	hubExpect(t, r, http.StatusOK, "")
	items, _ := r.body["items"].([]any)
	var states []string
	for _, it := range items {
		m := it.(map[string]any)
		states = append(states, m["state"].(string)+"/"+m["category"].(string))
	}
	if strings.Join(states, ",") != "working/in_progress,input-required/interrupted,completed/terminal" ||
		!strings.Contains(r.raw, `"result":{"text":"done","n":[1,2]}`) || !strings.Contains(r.raw, `"message":"which dialect?"`) {
		t.Fatalf("history %s", r.raw)
	}
	hubExpect(t, f.do(t, http.MethodGet, path+"/result", b.token, nil), http.StatusOK, "")
	hubExpect(t, f.do(t, http.MethodGet, path+"/results", hubAdmin, nil), http.StatusOK, "")
	hubExpect(t, f.do(t, http.MethodGet, path+"/result", o.token, nil), http.StatusForbidden, "FORBIDDEN")
	hubExpect(t, f.do(t, http.MethodGet, "/api/v1/tasks/T-NOSUCHTASK22/result", a.token, nil), http.StatusNotFound, "TASK_NOT_FOUND")
}
