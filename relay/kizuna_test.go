package relay_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/queue"
	"github.com/dojo-relay/dojo/relay"
)

// The letterbox below is written from the Kizuna contract alone (HMAC over
// timestamp + "." + raw body, spool before ACK, ACK = 200 with task_id): it
// uses no Dojo package, so it checks Dojo the way a real kizuna-box would.

// verifyLetter checks one delivery: the signature over the raw body and a
// timestamp within 300 s of now.
func verifyLetter(secret []byte, h http.Header, body []byte, now time.Time) error {
	ts := h.Get("X-Kizuna-Timestamp")
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("X-Kizuna-Timestamp %q is not unix seconds", ts)
	}
	if skew := now.Sub(time.Unix(secs, 0)); skew > 300*time.Second || skew < -300*time.Second {
		return fmt.Errorf("X-Kizuna-Timestamp %s is %v away", ts, skew)
	}
	got, ok := strings.CutPrefix(h.Get("X-Kizuna-Signature"), "sha256=")
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	want := hex.EncodeToString(mac.Sum(nil))
	if !ok || !hmac.Equal([]byte(got), []byte(want)) {
		return errors.New("bad X-Kizuna-Signature")
	}
	return nil
}

// delivery is one request that reached a letterbox's /kizuna/deliver.
type delivery struct {
	Header http.Header
	Body   []byte
	Status int   // what the box answered
	Err    error // the signature verdict
}

// letterbox is a loopback kizuna-box with an in-memory spool.
type letterbox struct {
	srv *httptest.Server

	mu      sync.Mutex
	secret  []byte
	failing bool // answer 500 instead of spooling
	spool   map[string][]byte
	order   []string
	seen    []delivery
}

func newLetterbox(t testing.TB) *letterbox {
	t.Helper()
	b := &letterbox{spool: map[string][]byte{}}
	b.srv = httptest.NewServer(http.HandlerFunc(b.deliver))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *letterbox) deliver(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/kizuna/deliver" {
		http.NotFound(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "read", http.StatusBadRequest)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	d := delivery{Header: r.Header.Clone(), Body: body}
	defer func() { b.seen = append(b.seen, d) }()
	answer := func(status int, v any) {
		d.Status = status
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
	if d.Err = verifyLetter(b.secret, r.Header, body, time.Now()); d.Err != nil {
		answer(http.StatusUnauthorized, map[string]string{"error": d.Err.Error()})
		return
	}
	var letter struct {
		TaskID string `json:"task_id"`
	}
	if json.Unmarshal(body, &letter) != nil || letter.TaskID == "" || letter.TaskID != r.Header.Get("X-Kizuna-Task-Id") {
		answer(http.StatusBadRequest, map[string]string{"error": "task_id"})
		return
	}
	// A letter already spooled is a duplicate: the same ACK, no second copy.
	if _, dup := b.spool[letter.TaskID]; !dup {
		if b.failing {
			answer(http.StatusInternalServerError, map[string]string{"error": "disk full"})
			return
		}
		b.spool[letter.TaskID] = body
		b.order = append(b.order, letter.TaskID)
	}
	answer(http.StatusOK, map[string]string{"status": "received", "task_id": letter.TaskID,
		"received_at": time.Now().UTC().Format(time.RFC3339)})
}

func (b *letterbox) setSecret(s string) { b.mu.Lock(); b.secret = []byte(s); b.mu.Unlock() }
func (b *letterbox) setFailing(f bool)  { b.mu.Lock(); b.failing = f; b.mu.Unlock() }

// letters returns the spooled letters in arrival order.
func (b *letterbox) letters() [][]byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([][]byte, 0, len(b.order))
	for _, id := range b.order {
		out = append(out, b.spool[id])
	}
	return out
}

// hits returns every delivery request of one task id.
func (b *letterbox) hits(taskID string) []delivery {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []delivery
	for _, d := range b.seen {
		if d.Header.Get("X-Kizuna-Task-Id") == taskID {
			out = append(out, d)
		}
	}
	return out
}

func (b *letterbox) requests() int { b.mu.Lock(); defer b.mu.Unlock(); return len(b.seen) }

// The hub side of the tests.

const kzAdmin = "kz-admin-token-for-tests-0123456789"

func withAdmin(o *relay.Options) { o.AdminToken = kzAdmin }

type hubReply struct {
	Status int
	Raw    string
	Body   map[string]any
}

func (r hubReply) str(k string) string { s, _ := r.Body[k].(string); return s }

func (r hubReply) code() string {
	e, _ := r.Body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

// hub calls a hub path; body is JSON-encoded unless it is already bytes.
func hub(t testing.TB, method, url, token string, body any) hubReply {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := hubReply{Status: resp.StatusCode, Raw: string(raw)}
	_ = json.Unmarshal(raw, &r.Body)
	return r
}

func hubWant(t testing.TB, r hubReply, status int, code string) {
	t.Helper()
	if r.Status != status || r.code() != code {
		t.Fatalf("want %d %s, got %d %s", status, code, r.Status, r.Raw)
	}
}

// kzAgent is a registered agent with its letterbox.
type kzAgent struct {
	ID, Token string
	Box       *letterbox
}

func enroll(t testing.TB, d *dojo, name string) kzAgent {
	t.Helper()
	box := newLetterbox(t)
	r := hub(t, http.MethodPost, d.URL+"/api/v1/agents", kzAdmin, map[string]any{
		"name": name, "capabilities": "answers letters", "capability_tags": []string{"test"},
		"webhook_url": box.srv.URL,
	})
	if r.Status != http.StatusCreated || r.str("agent_id") == "" || r.str("agent_token") == "" || r.str("endpoint_secret") == "" {
		t.Fatalf("register %s: %d %s", name, r.Status, r.Raw)
	}
	box.setSecret(r.str("endpoint_secret"))
	return kzAgent{ID: r.str("agent_id"), Token: r.str("agent_token"), Box: box}
}

// taskView polls GET /api/v1/tasks/{id} until its audit outcome is set.
func waitOutcome(t *testing.T, d *dojo, token, id string) hubReply {
	t.Helper()
	var r hubReply
	waitFor(t, 20*time.Second, func() bool {
		r = hub(t, http.MethodGet, d.URL+"/api/v1/tasks/"+id, token, nil)
		o, _ := r.Body["outcome"].(string)
		return r.Status == http.StatusOK && o != ""
	})
	return r
}

func decodeLetter(t testing.TB, raw []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("letter %s: %v", raw, err)
	}
	return m
}

func letterCount(t testing.TB, d *dojo) int {
	t.Helper()
	var n int
	if err := d.App.DB.QueryRow(context.Background(), `SELECT count(*) FROM kz_letters`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLetterboxVerifier pins the test letterbox to the contract's recipe
// with a made-up vector, so the end-to-end tests below judge Dojo with a
// correct box.
func TestLetterboxVerifier(t *testing.T) {
	t.Parallel()
	body := []byte(`{"task_id":"T-0001","from":"A-9X2M","to":"A-7K3P"}`)
	h := http.Header{}
	h.Set("X-Kizuna-Timestamp", "1761724800")
	h.Set("X-Kizuna-Signature", "sha256=c1ed1fd947cbb0fd9705bd8f15cc9bb8c2426f093db8b49010fc4db7b288db35")
	at := time.Unix(1761724800, 0)
	if err := verifyLetter([]byte("es_test_secret"), h, body, at.Add(299*time.Second)); err != nil {
		t.Errorf("vector: %v", err)
	}
	if verifyLetter([]byte("es_test_secret"), h, body, at.Add(301*time.Second)) == nil {
		t.Error("a stale timestamp passed")
	}
	if verifyLetter([]byte("es_test_secret"), h, append([]byte(" "), body...), at) == nil {
		t.Error("a changed body passed")
	}
	if verifyLetter([]byte("another"), h, body, at) == nil {
		t.Error("another secret passed")
	}
}

// TestKizunaLetterRoundTrip is issue 9's first acceptance point: A sends B
// a letter (with a forged from), B's box verifies and ACKs it, B reports
// working then completed, and A's box receives the kizuna.task-result reply.
func TestKizunaLetterRoundTrip(t *testing.T) {
	t.Parallel()
	d := start(t, withAdmin, withLadder(0.001))
	a, b, c := enroll(t, d, "Alice"), enroll(t, d, "Bob"), enroll(t, d, "Carol")
	// The agent token is the account's Agent key, good on the Kungfu door too.
	if r := d.call(t, a.Token, "account_status", map[string]any{}); !r.ok() {
		t.Errorf("account_status with the agent token: %s", r.Raw)
	}

	send := hub(t, http.MethodPost, d.URL+"/api/v1/tasks", a.Token,
		[]byte(`{"to":"`+b.ID+`","from":"`+c.ID+`","content":{"title":"sum","body":"add 2 and 2","priority":"high"}}`))
	if send.Status != http.StatusAccepted || send.str("status") != "queued" || !strings.HasPrefix(send.str("task_id"), "T-") {
		t.Fatalf("send: %d %s", send.Status, send.Raw)
	}
	id := send.str("task_id")

	waitFor(t, 20*time.Second, func() bool { return len(b.Box.letters()) == 1 })
	hits := b.Box.hits(id)
	if len(hits) != 1 || hits[0].Err != nil || hits[0].Status != http.StatusOK {
		t.Fatalf("B's box saw %d requests: %+v", len(hits), hits)
	}
	h := hits[0].Header
	if h.Get("X-Kizuna-Attempt") != "1" || h.Get("Content-Type") != "application/json" ||
		h.Get("webhook-id") == "" || !strings.Contains(h.Get("webhook-signature"), "v1a,") {
		t.Errorf("delivery headers: %v", h)
	}
	letter := decodeLetter(t, hits[0].Body)
	content, _ := letter["content"].(map[string]any)
	if letter["task_id"] != id || letter["from"] != a.ID || letter["to"] != b.ID ||
		letter["kind"] != "kizuna.task" || letter["reply_to"] != nil || letter["created_at"] == nil ||
		content["title"] != "sum" || content["body"] != "add 2 and 2" {
		// from is the token's agent: the body's "from" (Carol) is ignored.
		t.Errorf("letter: %s", hits[0].Body)
	}
	if _, ok := letter["reply_to"]; !ok {
		t.Errorf("letter has no reply_to key: %s", hits[0].Body)
	}

	view := waitOutcome(t, d, a.Token, id)
	if view.str("outcome") != "acked" {
		t.Fatalf("task view: %s", view.Raw)
	}
	if at, _ := view.Body["attempts"].([]any); len(at) != 1 {
		t.Errorf("attempts: %s", view.Raw)
	} else if first, _ := at[0].(map[string]any); first["status"] != float64(200) || first["n"] != float64(1) {
		t.Errorf("attempt 1: %s", view.Raw)
	}

	result := d.URL + "/api/v1/tasks/" + id + "/result"
	// Only the recipient reports.
	hubWant(t, hub(t, http.MethodPost, result, a.Token, map[string]any{"state": "working"}), http.StatusForbidden, "FORBIDDEN")
	hubWant(t, hub(t, http.MethodPost, result, c.Token, map[string]any{"state": "working"}), http.StatusForbidden, "FORBIDDEN")

	r := hub(t, http.MethodPost, result, b.Token, map[string]any{"state": "working", "message": "on it"})
	if r.Status != http.StatusAccepted || r.str("state") != "working" || r.str("category") != "in_progress" {
		t.Fatalf("working: %d %s", r.Status, r.Raw)
	}
	r = hub(t, http.MethodPost, result, b.Token,
		[]byte(`{"state":"completed","message":"done","result":{"sum":4,"unit":"apples"}}`))
	if r.Status != http.StatusAccepted || r.str("state") != "completed" || r.str("category") != "terminal" || r.Body["relayed"] != true {
		t.Fatalf("completed: %d %s", r.Status, r.Raw)
	}
	// The same terminal state again is idempotent; another one is refused.
	r = hub(t, http.MethodPost, result, b.Token, map[string]any{"state": "completed", "message": "done"})
	if r.Status != http.StatusAccepted || r.Body["relayed"] != false {
		t.Errorf("completed again: %d %s", r.Status, r.Raw)
	}
	hubWant(t, hub(t, http.MethodPost, result, b.Token, map[string]any{"state": "failed"}), http.StatusUnprocessableEntity, "VALIDATION_FAILED")

	// A's box receives exactly one letter: the reply, from B, signed with A's secret.
	waitFor(t, 20*time.Second, func() bool { return len(a.Box.letters()) == 1 })
	reply := decodeLetter(t, a.Box.letters()[0])
	rc, _ := reply["content"].(map[string]any)
	rb, _ := rc["body"].(map[string]any)
	rr, _ := rb["result"].(map[string]any)
	replyID, _ := reply["task_id"].(string)
	if reply["kind"] != "kizuna.task-result" || reply["reply_to"] != id || reply["from"] != b.ID || reply["to"] != a.ID ||
		!strings.HasPrefix(replyID, "T-") || replyID == id || rc["format"] != "json" ||
		rb["task_id"] != id || rb["state"] != "completed" || rb["message"] != "done" || rr["sum"] != float64(4) {
		t.Errorf("reply letter: %s", a.Box.letters()[0])
	}
	if rh := a.Box.hits(replyID); len(rh) != 1 || rh[0].Err != nil {
		t.Errorf("A's box saw %+v", rh)
	}
	if !bytes.Contains(a.Box.letters()[0], []byte(`"result":{"sum":4,"unit":"apples"}`)) {
		t.Errorf("the reported result is not relayed verbatim: %s", a.Box.letters()[0])
	}

	// The task as both parties see it, and its result history.
	for _, tok := range []string{a.Token, b.Token, kzAdmin} {
		v := hub(t, http.MethodGet, d.URL+"/api/v1/tasks/"+id, tok, nil)
		if v.Status != http.StatusOK || v.str("outcome") != "acked" {
			t.Errorf("view: %d %s", v.Status, v.Raw)
		}
	}
	hubWant(t, hub(t, http.MethodGet, d.URL+"/api/v1/tasks/"+id, c.Token, nil), http.StatusForbidden, "FORBIDDEN")
	hist := hub(t, http.MethodGet, result, a.Token, nil)
	items, _ := hist.Body["items"].([]any)
	if hist.Status != http.StatusOK || len(items) != 2 {
		t.Fatalf("history: %d %s", hist.Status, hist.Raw)
	}
	want := [][2]string{{"working", "in_progress"}, {"completed", "terminal"}}
	for i, it := range items {
		e, _ := it.(map[string]any)
		if e["state"] != want[i][0] || e["category"] != want[i][1] || e["at"] == nil {
			t.Errorf("history[%d]: %v", i, e)
		}
	}
	if e, _ := items[1].(map[string]any); e["message"] != "done" {
		t.Errorf("history[1] message: %v", e)
	}
	hubWant(t, hub(t, http.MethodGet, result, c.Token, nil), http.StatusForbidden, "FORBIDDEN")

	// The audit: one acked row per letter, with its attempt history.
	waitOutcome(t, d, a.Token, replyID)
	rows, err := d.App.DB.Query(context.Background(),
		`SELECT task_id, outcome, json_array_length(attempts) FROM kz_audit ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var audit []string
	for rows.Next() {
		var tid, outcome string
		var n int
		if err := rows.Scan(&tid, &outcome, &n); err != nil {
			t.Fatal(err)
		}
		audit = append(audit, fmt.Sprintf("%s %s %d", tid, outcome, n))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if w := []string{id + " acked 1", replyID + " acked 1"}; strings.Join(audit, ",") != strings.Join(w, ",") {
		t.Errorf("audit %v, want %v", audit, w)
	}
	if n := b.Box.requests() + a.Box.requests() + c.Box.requests(); n != 2 {
		t.Errorf("%d delivery requests in all, want 2", n)
	}
}

// TestKizunaRecoveringBox: a box that answers 500 gets the letter again on
// the ladder, byte-identical, and once it recovers it holds it exactly once.
func TestKizunaRecoveringBox(t *testing.T) {
	t.Parallel()
	d := start(t, withAdmin, withLadder(0.001))
	a, b := enroll(t, d, "Sender"), enroll(t, d, "Flaky")
	b.Box.setFailing(true)

	send := hub(t, http.MethodPost, d.URL+"/api/v1/tasks", a.Token,
		[]byte(`{"to":"`+b.ID+`","content":{"title":"t","format":"json","body":{"z":1,"a":[2]}}}`))
	if send.Status != http.StatusAccepted {
		t.Fatalf("send: %d %s", send.Status, send.Raw)
	}
	id := send.str("task_id")
	waitFor(t, 20*time.Second, func() bool { return len(b.Box.hits(id)) >= 1 })
	// Not acknowledged yet: no result may be reported.
	hubWant(t, hub(t, http.MethodPost, d.URL+"/api/v1/tasks/"+id+"/result", b.Token, map[string]any{"state": "working"}),
		http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	b.Box.setFailing(false)

	view := waitOutcome(t, d, a.Token, id)
	if view.str("outcome") != "acked" {
		t.Fatalf("view: %s", view.Raw)
	}
	// Long enough for another rung of the ladder at this scale.
	time.Sleep(2 * time.Second)
	hits := b.Box.hits(id)
	if len(hits) < 2 || len(b.Box.letters()) != 1 {
		t.Fatalf("%d requests, %d letters spooled", len(hits), len(b.Box.letters()))
	}
	oks := 0
	for i, h := range hits {
		if h.Err != nil || !bytes.Equal(h.Body, hits[0].Body) || h.Header.Get("X-Kizuna-Attempt") != strconv.Itoa(i+1) {
			t.Errorf("attempt %d: attempt header %q, err %v, body %s", i+1, h.Header.Get("X-Kizuna-Attempt"), h.Err, h.Body)
		}
		if h.Status == http.StatusOK {
			oks++
		}
	}
	if oks != 1 || hits[len(hits)-1].Status != http.StatusOK {
		t.Errorf("%d ACKs over %d requests", oks, len(hits))
	}
	if !bytes.Contains(hits[0].Body, []byte(`{"z":1,"a":[2]}`)) {
		t.Errorf("json body not verbatim: %s", hits[0].Body)
	}
	at, _ := view.Body["attempts"].([]any)
	if len(at) != len(hits) {
		t.Fatalf("%d attempts recorded for %d requests: %s", len(at), len(hits), view.Raw)
	}
	for i, x := range at {
		e, _ := x.(map[string]any)
		want := float64(http.StatusInternalServerError)
		if i == len(at)-1 {
			want = http.StatusOK
		}
		if e["n"] != float64(i+1) || e["status"] != want {
			t.Errorf("attempt %d: %v", i+1, e)
		}
	}
}

// TestKizunaDisabledTarget: a letter to a disabled agent is refused and
// changes nothing; an unknown one is 404.
func TestKizunaDisabledTarget(t *testing.T) {
	t.Parallel()
	d := start(t, withAdmin, withLadder(0.001))
	a, b := enroll(t, d, "Writer"), enroll(t, d, "Sleeper")
	r := hub(t, http.MethodPatch, d.URL+"/api/v1/agents/"+b.ID, kzAdmin, map[string]any{"enabled": false})
	if r.Status != http.StatusOK {
		t.Fatalf("patch: %d %s", r.Status, r.Raw)
	}
	if r = hub(t, http.MethodGet, d.URL+"/api/v1/agents/"+b.ID, a.Token, nil); r.str("status") != "disabled" {
		t.Errorf("status: %s", r.Raw)
	}
	before := letterCount(t, d)
	letter := map[string]any{"to": b.ID, "content": map[string]any{"title": "t", "body": "b"}}
	hubWant(t, hub(t, http.MethodPost, d.URL+"/api/v1/tasks", a.Token, letter), http.StatusUnprocessableEntity, "TARGET_DISABLED")
	letter["to"] = "nobody-here"
	hubWant(t, hub(t, http.MethodPost, d.URL+"/api/v1/tasks", a.Token, letter), http.StatusNotFound, "AGENT_NOT_FOUND")
	time.Sleep(500 * time.Millisecond)
	if after := letterCount(t, d); after != before || b.Box.requests() != 0 {
		t.Errorf("letters %d -> %d, %d requests at the disabled box", before, after, b.Box.requests())
	}
}

// TestKizunaDeletedRecipient: deleting an agent stops new letters to it
// (404) but a letter already on its ladder keeps going and is delivered.
func TestKizunaDeletedRecipient(t *testing.T) {
	t.Parallel()
	d := start(t, withAdmin, withLadder(0.001))
	a, b := enroll(t, d, "Sender"), enroll(t, d, "Leaving")
	b.Box.setFailing(true)
	send := hub(t, http.MethodPost, d.URL+"/api/v1/tasks", a.Token, map[string]any{"to": b.ID, "content": map[string]any{"title": "t", "body": "last words"}})
	if send.Status != http.StatusAccepted {
		t.Fatalf("send: %d %s", send.Status, send.Raw)
	}
	id := send.str("task_id")
	waitFor(t, 20*time.Second, func() bool { return len(b.Box.hits(id)) >= 1 })
	if r := hub(t, http.MethodDelete, d.URL+"/api/v1/agents/"+b.ID, kzAdmin, nil); r.Status != http.StatusOK {
		t.Fatalf("delete: %d %s", r.Status, r.Raw)
	}
	hubWant(t, hub(t, http.MethodPost, d.URL+"/api/v1/tasks", a.Token, map[string]any{"to": b.ID, "content": map[string]any{"title": "t", "body": "x"}}),
		http.StatusNotFound, "AGENT_NOT_FOUND")
	b.Box.setFailing(false)
	if view := waitOutcome(t, d, a.Token, id); view.str("outcome") != "acked" || len(b.Box.letters()) != 1 {
		t.Fatalf("the letter in flight did not keep going: %s", view.Raw)
	}
}

// Deliveries to one agent are bounded across the engine's workers: its
// letterbox address holds at most queue.DefaultHostLimit attempts at once,
// so a slow box cannot take every worker, and letters to another agent
// still go out meanwhile.
func TestKizunaPerAgentBound(t *testing.T) {
	t.Parallel()
	d := start(t, withAdmin, withLadder(0.001))
	a, fast := enroll(t, d, "BoundSender"), enroll(t, d, "FastTarget")
	slow := enroll(t, d, "SlowTarget")
	var mu sync.Mutex
	inFlight, peak := 0, 0
	release := make(chan struct{})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		inFlight++
		peak = max(peak, inFlight)
		mu.Unlock()
		<-release
		mu.Lock()
		inFlight--
		mu.Unlock()
		slow.Box.deliver(w, r)
	}))
	t.Cleanup(front.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	if r := hub(t, http.MethodPatch, d.URL+"/api/v1/agents/"+slow.ID, kzAdmin, map[string]any{"webhook_url": front.URL}); r.Status != http.StatusOK {
		t.Fatalf("patch webhook: %d %s", r.Status, r.Raw)
	}
	send := func(to string) string {
		r := hub(t, http.MethodPost, d.URL+"/api/v1/tasks", a.Token, map[string]any{"to": to, "content": map[string]any{"title": "t", "body": "b"}})
		if r.Status != http.StatusAccepted {
			t.Fatalf("send: %d %s", r.Status, r.Raw)
		}
		return r.str("task_id")
	}
	var slowIDs []string
	for range 10 {
		slowIDs = append(slowIDs, send(slow.ID))
	}
	waitFor(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return inFlight == queue.DefaultHostLimit })
	// The slow box holds its share; another agent's letter is not queued behind it.
	fastID := send(fast.ID)
	waitFor(t, 10*time.Second, func() bool { return len(fast.Box.hits(fastID)) == 1 })
	mu.Lock()
	if peak > queue.DefaultHostLimit {
		t.Errorf("peak %d deliveries in flight to one agent, want at most %d", peak, queue.DefaultHostLimit)
	}
	mu.Unlock()
	close(release)
	for _, id := range slowIDs {
		if v := waitOutcome(t, d, a.Token, id); v.str("outcome") != "acked" {
			t.Errorf("letter %s: %s", id, v.Raw)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if peak != queue.DefaultHostLimit {
		t.Errorf("peak %d, want exactly %d", peak, queue.DefaultHostLimit)
	}
}
