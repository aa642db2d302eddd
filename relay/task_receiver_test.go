package relay_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dojo-relay/dojo/relay"
)

// Options of the Task acceptance tests.
func withLadder(scale float64) option { return func(o *relay.Options) { o.LadderScale = scale } }
func withReceiverTimeout(d time.Duration) option {
	return func(o *relay.Options) { o.ReceiverTimeout = d }
}
func withGrace(d time.Duration) option { return func(o *relay.Options) { o.DeliveryGrace = d } }
func withQueue(name string) option     { return func(o *relay.Options) { o.Queue = name } }

// tapHit is one request a scripted receiver saw.
type tapHit struct {
	Header http.Header
	Body   []byte
	At     time.Time
}

// answer is what a scripted receiver does with one request: hang until the
// caller gives up, or answer status + body (+ Location).
type answer struct {
	hang     bool
	status   int
	body     string
	location string
}

func hangs() answer                       { return answer{hang: true} }
func says(status int, body string) answer { return answer{status: status, body: body} }

// scripted is a loopback receiver whose behaviour is a function of the
// request and of how many times its Idempotency-Key was seen (1-based).
type scripted struct {
	srv      *httptest.Server
	mu       sync.Mutex
	hits     []tapHit
	perKey   map[string]int
	answered map[string][]int // Idempotency-Key -> statuses actually answered
	plan     func(h tapHit, attempt int) answer
}

func newScripted(t testing.TB, plan func(h tapHit, attempt int) answer) *scripted {
	t.Helper()
	s := &scripted{plan: plan, perKey: map[string]int{}, answered: map[string][]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h := tapHit{Header: r.Header.Clone(), Body: b, At: time.Now()}
		key := r.Header.Get("Idempotency-Key")
		s.mu.Lock()
		s.hits = append(s.hits, h)
		s.perKey[key]++
		n, plan := s.perKey[key], s.plan
		s.mu.Unlock()
		a := plan(h, n)
		if a.hang {
			select {
			case <-r.Context().Done():
			case <-time.After(time.Minute):
			}
			return
		}
		if a.status == 0 {
			a.status = http.StatusOK
		}
		s.mu.Lock()
		s.answered[key] = append(s.answered[key], a.status)
		s.mu.Unlock()
		if a.location != "" {
			w.Header().Set("Location", a.location)
		}
		w.WriteHeader(a.status)
		_, _ = io.WriteString(w, a.body)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *scripted) url() string { return s.srv.URL + "/judge" }

func (s *scripted) setPlan(plan func(h tapHit, attempt int) answer) {
	s.mu.Lock()
	s.plan = plan
	s.mu.Unlock()
}

func (s *scripted) count() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.hits) }

func (s *scripted) forKey(key string) []tapHit {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []tapHit
	for _, h := range s.hits {
		if h.Header.Get("Idempotency-Key") == key {
			out = append(out, h)
		}
	}
	return out
}

// always answers every request the same way.
func always(a answer) func(tapHit, int) answer { return func(tapHit, int) answer { return a } }

// waitSubmission polls work_status until the submission is in one of states.
func waitSubmission(t testing.TB, d *dojo, key, sub string, within time.Duration, states ...string) result {
	t.Helper()
	end := time.Now().Add(within)
	for {
		r := d.must(t, key, "work_status", map[string]any{"submission_id": sub})
		if slices.Contains(states, r.str("state")) {
			return r
		}
		if time.Now().After(end) {
			t.Fatalf("submission %s still %s after %v, want %v: %s", sub, r.str("state"), within, states, r.Raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func balanceOf(t testing.TB, d *dojo, key string) int64 {
	t.Helper()
	return d.must(t, key, "account_status", map[string]any{}).num("balance")
}

// earnRows counts the earn_task ledger rows of one submission.
func earnRows(t testing.TB, d *dojo, sub string) int64 {
	t.Helper()
	return d.dbInt(t, `SELECT count(*) FROM ledger WHERE type = 'earn_task' AND ref_type = 'task_submission' AND ref_id = $1`, sub)
}

// delivered returns the publisher's record of one submission.
func delivered(t testing.TB, d *dojo, pub, code, sub string) map[string]any {
	t.Helper()
	r := d.must(t, pub, "task_submissions", map[string]any{"code": code, "page_size": 100})
	for _, x := range r.Body["submissions"].([]any) {
		if m := x.(map[string]any); m["submission_id"] == sub {
			return m
		}
	}
	t.Fatalf("submission %s not in task_submissions: %s", sub, r.Raw)
	return nil
}

func attemptsOf(rec map[string]any) []map[string]any {
	var out []map[string]any
	for _, a := range rec["attempts"].([]any) {
		out = append(out, a.(map[string]any))
	}
	return out
}

// eventsOf renders work_status events as "from>to:cause".
func eventsOf(r result) []string {
	var out []string
	evs, _ := r.Body["events"].([]any)
	for _, e := range evs {
		m := e.(map[string]any)
		from := "nil"
		if f, ok := m["from"].(string); ok {
			from = f
		}
		out = append(out, fmt.Sprintf("%s>%s:%s", from, m["to"], m["cause"]))
		if s, _ := m["at"].(string); s == "" {
			out = append(out, "missing at")
		}
	}
	return out
}

func replyOf(r result) (int, string, bool) {
	m, ok := r.Body["reply"].(map[string]any)
	if !ok {
		return 0, "", false
	}
	body, _ := m["body"].(string)
	return int(m["status"].(float64)), body, true
}

func taskView(t testing.TB, d *dojo, pub, code string) result {
	t.Helper()
	return d.must(t, pub, "task_get", map[string]any{"code": code})
}

func submit(t testing.TB, d *dojo, key, code, reqKey string, payload any, extra ...any) result {
	t.Helper()
	args := map[string]any{"code": code, "request_key": reqKey, "payload": payload}
	for i := 0; i+1 < len(extra); i += 2 {
		args[extra[i].(string)] = extra[i+1]
	}
	return d.call(t, key, "work_submit", args)
}

// closedPort returns a loopback port nobody listens on.
func closedPort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	return port
}

var bullets = map[string]any{"bullets": []string{"one", "two", "three"}}

// A 2xx settles and pays in the same call; the receiver gets the protocol's
// headers and exactly four body keys; the publisher sees the attempt.
func TestReceiverAccept(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	rcv := newScripted(t, always(says(200, `{"accepted":true}`)))
	code := newTask(t, d, pub, rcv.url(), 7, 21, nil)

	c := d.must(t, exe, "work_claim", map[string]any{"code": code})
	if g := taskView(t, d, pub, code); g.num("reserved") != 7 || g.num("available") != 14 {
		t.Fatalf("after claim: %s", g.Raw)
	}
	sub := d.must(t, exe, "work_submit", map[string]any{"code": code, "request_key": "accept-1", "payload": bullets, "claim_id": c.str("claim_id")})
	id := sub.str("submission_id")
	if sub.str("state") != "settled" || sub.num("paid") != 7 || sub.num("amount") != 7 || sub.Body["next_action"] != "done" ||
		sub.Body["failure"] != nil || sub.num("contract_version") != 1 || sub.Body["retry_after"] != nil {
		t.Fatalf("submit: %s", sub.Raw)
	}
	if st, body, ok := replyOf(sub); !ok || st != 200 || body != `{"accepted":true}` {
		t.Fatalf("reply: %s", sub.Raw)
	}
	hits := rcv.forKey(id)
	if len(hits) != 1 {
		t.Fatalf("receiver saw %d requests for %s", len(hits), id)
	}
	h := hits[0]
	if h.Header.Get("Content-Type") != "application/json" || h.Header.Get("Kungfu-Task") != code ||
		h.Header.Get("Content-Length") != fmt.Sprint(len(h.Body)) {
		t.Fatalf("receiver headers: %v", h.Header)
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(h.Body, &body); err != nil || len(body) != 4 {
		t.Fatalf("receiver body: %s", h.Body)
	}
	if string(body["submission_id"]) != `"`+id+`"` || string(body["task_code"]) != `"`+code+`"` {
		t.Fatalf("receiver body: %s", h.Body)
	}
	if bal := balanceOf(t, d, exe); bal != 66+7 {
		t.Fatalf("executor balance %d", bal)
	}
	if n := earnRows(t, d, id); n != 1 {
		t.Fatalf("%d earn_task rows", n)
	}
	g := taskView(t, d, pub, code)
	if g.num("settled") != 7 || g.num("reserved") != 0 || g.num("available") != 14 || g.num("slots") != 2 {
		t.Fatalf("task after settle: %s", g.Raw)
	}
	st := d.must(t, exe, "work_status", map[string]any{"submission_id": id})
	if ev := eventsOf(st); !slices.Equal(ev, []string{"nil>delivering:submitted", "delivering>settled:accepted"}) || st.Body["next_action"] != "done" {
		t.Fatalf("events %v: %s", ev, st.Raw)
	}
	rec := delivered(t, d, pub, code, id)
	at := attemptsOf(rec)
	if rec["state"] != "settled" || len(at) != 1 || at[0]["status"] != float64(200) || at[0]["reply"] != `{"accepted":true}` ||
		at[0]["at"] == "" || at[0]["latency_ms"] == nil || at[0]["outcome"] != "settled" {
		t.Fatalf("task_submissions: %v", rec)
	}
	if len(rec["agent_ref"].(string)) != 16 || string(body["agent_ref"]) != `"`+rec["agent_ref"].(string)+`"` {
		t.Fatalf("agent_ref differs between receiver and publisher view: %s vs %v", body["agent_ref"], rec["agent_ref"])
	}
	checkMoney(t, d)
}

// A 4xx is a rejection: the reply reaches the executor verbatim, the
// reservation is released and the executor is told to revise.
func TestReceiverRejectWithBody(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	why := `{"accepted":false,"message":"bullet 3 has no source URL","problems":[{"pointer":"/bullets/2"}]}`
	rcv := newScripted(t, always(says(422, why)))
	code := newTask(t, d, pub, rcv.url(), 5, 10, nil)

	sub := submit(t, d, exe, code, "rej-1", bullets)
	if !sub.ok() || sub.Status != 200 || sub.str("state") != "rejected" || sub.num("paid") != 0 || sub.Body["next_action"] != "revise" || sub.Body["failure"] != nil {
		t.Fatalf("reject: %d %s", sub.Status, sub.Raw)
	}
	if st, body, ok := replyOf(sub); !ok || st != 422 || body != why {
		t.Fatalf("reply not verbatim: %s", sub.Raw)
	}
	if g := taskView(t, d, pub, code); g.num("reserved") != 0 || g.num("available") != 10 {
		t.Fatalf("reservation not released: %s", g.Raw)
	}
	if bal := balanceOf(t, d, exe); bal != 66 {
		t.Fatalf("executor balance %d", bal)
	}
	st := d.must(t, exe, "work_status", map[string]any{"submission_id": sub.str("submission_id")})
	if ev := eventsOf(st); !slices.Equal(ev, []string{"nil>delivering:submitted", "delivering>rejected:rejected"}) {
		t.Fatalf("events %v", ev)
	}

	// A long multi-byte reply is cut at 4000 bytes on a rune boundary.
	long := strings.Repeat("€", 2000) // 6000 bytes
	rcv.setPlan(always(says(400, long)))
	sub = submit(t, d, exe, code, "rej-2", bullets, "revises", sub.str("submission_id"))
	_, body, _ := replyOf(sub)
	if sub.str("state") != "rejected" || body != strings.Repeat("€", 1333) || !utf8.ValidString(body) {
		t.Fatalf("long reply: %d bytes, valid %v: %.80s", len(body), utf8.ValidString(body), sub.Raw)
	}
	rec := delivered(t, d, pub, code, sub.str("submission_id"))
	if r := rec["reply"].(map[string]any); r["body"] != body || attemptsOf(rec)[0]["reply"] != body {
		t.Fatalf("publisher excerpt differs")
	}
	// Invalid UTF-8 becomes U+FFFD.
	rcv.setPlan(always(says(409, "bad \xff byte")))
	sub = submit(t, d, exe, code, "rej-3", bullets)
	if _, body, _ := replyOf(sub); body != "bad \uFFFD byte" {
		t.Fatalf("invalid UTF-8 reply: %q", body)
	}
	// So does a NUL, which PostgreSQL text cannot hold: the verdict is
	// still recorded instead of failing the whole write.
	rcv.setPlan(always(says(409, "nul \x00 byte")))
	sub = submit(t, d, exe, code, "rej-nul", bullets)
	if _, body, _ := replyOf(sub); sub.str("state") != "rejected" || body != "nul \uFFFD byte" {
		t.Fatalf("NUL reply: %d %s", sub.Status, sub.Raw)
	}
	// Revising a rejection with a fixed payload settles.
	rcv.setPlan(always(says(201, "")))
	sub = submit(t, d, exe, code, "rej-4", bullets, "revises", sub.str("submission_id"))
	if st, body, ok := replyOf(sub); sub.str("state") != "settled" || !ok || st != 201 || body != "" {
		t.Fatalf("revision: %s", sub.Raw)
	}
	checkMoney(t, d)
}

// A 5xx fails the submission on the receiver's side: RECEIVER_FAULT, stop,
// the claim's reservation released, the executor not charged a rejection.
func TestReceiverFault500(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	rcv := newScripted(t, always(says(503, "maintenance")))
	code := newTask(t, d, pub, rcv.url(), 4, 8, nil)
	c := d.must(t, exe, "work_claim", map[string]any{"code": code})
	sub := submit(t, d, exe, code, "f-1", bullets, "claim_id", c.str("claim_id"))
	if !sub.ok() || sub.str("state") != "failed" || sub.Body["failure"] != "RECEIVER_FAULT" || sub.Body["next_action"] != "stop" || sub.num("paid") != 0 {
		t.Fatalf("500: %s", sub.Raw)
	}
	if st, body, ok := replyOf(sub); !ok || st != 503 || body != "maintenance" {
		t.Fatalf("reply: %s", sub.Raw)
	}
	if g := taskView(t, d, pub, code); g.num("reserved") != 0 || g.num("available") != 8 || g.num("settled") != 0 {
		t.Fatalf("reservation not released: %s", g.Raw)
	}
	if w := d.must(t, exe, "work_get", map[string]any{"code": code}); w.Body["my"].(map[string]any)["rejections_left"] != float64(5) {
		t.Fatalf("a failure counted against the executor: %s", w.Raw)
	}
	if n := d.dbInt(t, `SELECT count(*) FROM claims WHERE id = $1 AND status = 'used'`, c.str("claim_id")); n != 1 {
		t.Fatal("claim not used")
	}
	checkMoney(t, d)
}

// A 3xx is RECEIVER_PROTOCOL and the redirect is never followed.
func TestReceiverRedirectNotFollowed(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	target := newScripted(t, always(says(200, "followed")))
	rcv := newScripted(t, always(answer{status: 302, body: "moved", location: target.url()}))
	code := newTask(t, d, pub, rcv.url(), 3, 6, nil)
	sub := submit(t, d, exe, code, "r-1", bullets)
	if sub.str("state") != "failed" || sub.Body["failure"] != "RECEIVER_PROTOCOL" || sub.Body["next_action"] != "stop" {
		t.Fatalf("302: %s", sub.Raw)
	}
	if st, _, ok := replyOf(sub); !ok || st != 302 {
		t.Fatalf("reply: %s", sub.Raw)
	}
	time.Sleep(300 * time.Millisecond)
	if target.count() != 0 || rcv.count() != 1 {
		t.Fatalf("redirect followed: target saw %d, receiver %d", target.count(), rcv.count())
	}
	if g := taskView(t, d, pub, code); g.num("reserved") != 0 || g.num("available") != 6 {
		t.Fatalf("reservation: %s", g.Raw)
	}
	checkMoney(t, d)
}

// Nothing listening: RECEIVER_UNREACHABLE, no reply.
func TestReceiverUnreachable(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	code := newTask(t, d, pub, fmt.Sprintf("http://127.0.0.1:%d/judge", closedPort(t)), 3, 6, nil)
	sub := submit(t, d, exe, code, "u-1", bullets)
	if sub.str("state") != "failed" || sub.Body["failure"] != "RECEIVER_UNREACHABLE" || sub.Body["reply"] != nil || sub.Body["next_action"] != "stop" {
		t.Fatalf("unreachable: %s", sub.Raw)
	}
	rec := delivered(t, d, pub, sub.Body["task_code"].(string), sub.str("submission_id"))
	if at := attemptsOf(rec); len(at) != 1 || at[0]["status"] != nil || at[0]["outcome"] != "failed" {
		t.Fatalf("attempt record: %v", rec)
	}
	if g := taskView(t, d, pub, code); g.num("reserved") != 0 {
		t.Fatalf("reservation: %s", g.Raw)
	}
	// An https receiver on a refused (private, not allowed) address: nothing is sent.
	refused := newTask(t, d, pub, "https://10.1.2.3/judge", 3, 6, nil)
	began := time.Now()
	sub = submit(t, d, exe, refused, "u-2", bullets)
	if sub.str("state") != "failed" || sub.Body["failure"] != "RECEIVER_UNREACHABLE" || sub.Body["reply"] != nil || time.Since(began) > 3*time.Second {
		t.Fatalf("refused address: %s after %v", sub.Raw, time.Since(began))
	}
	checkMoney(t, d)
}

// The receiver hangs past the timeout: uncertain (poll, 30 s); the ladder
// redelivers with the same Idempotency-Key and the 200 settles, once.
func TestReceiverHangThenAccept(t *testing.T) {
	t.Parallel()
	d := start(t, withReceiverTimeout(500*time.Millisecond), withLadder(0.001), withSweep(100*time.Millisecond), withGrace(2*time.Second))
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	rcv := newScripted(t, func(_ tapHit, attempt int) answer {
		if attempt == 1 {
			return hangs()
		}
		return says(200, `{"accepted":true,"receipt":"r-1"}`)
	})
	code := newTask(t, d, pub, rcv.url(), 6, 12, nil)
	sub := submit(t, d, exe, code, "hang-1", bullets)
	id := sub.str("submission_id")
	if !sub.ok() || sub.str("state") != "uncertain" || sub.Body["next_action"] != "poll" || sub.num("retry_after") != 30 ||
		sub.num("paid") != 0 || sub.Body["reply"] != nil || sub.Body["failure"] != nil {
		t.Fatalf("first answer: %s", sub.Raw)
	}
	if g := taskView(t, d, pub, code); g.num("reserved") != 6 {
		t.Fatalf("uncertain must hold the reservation: %s", g.Raw)
	}
	st := waitSubmission(t, d, exe, id, 20*time.Second, "settled", "failed", "rejected")
	if st.str("state") != "settled" || st.num("paid") != 6 || st.Body["next_action"] != "done" {
		t.Fatalf("after redelivery: %s", st.Raw)
	}
	if ev := eventsOf(st); !slices.Equal(ev, []string{"nil>delivering:submitted", "delivering>uncertain:no_answer", "uncertain>settled:accepted"}) {
		t.Fatalf("events %v", ev)
	}
	time.Sleep(time.Second) // no further attempt after the settlement
	hits := rcv.forKey(id)
	if len(hits) != 2 || rcv.count() != 2 {
		t.Fatalf("receiver saw %d requests for %s (%d in all), want 2", len(hits), id, rcv.count())
	}
	for _, h := range hits {
		if h.Header.Get("Idempotency-Key") != id || h.Header.Get("Kungfu-Task") != code || h.Header.Get("webhook-id") != hits[0].Header.Get("webhook-id") {
			t.Fatalf("redelivery headers differ: %v vs %v", h.Header, hits[0].Header)
		}
	}
	if bal := balanceOf(t, d, exe); bal != 66+6 {
		t.Fatalf("paid %d", bal-66)
	}
	if n := earnRows(t, d, id); n != 1 {
		t.Fatalf("%d earn_task rows", n)
	}
	rec := delivered(t, d, pub, code, id)
	at := attemptsOf(rec)
	if len(at) != 2 || at[0]["status"] != nil || at[0]["outcome"] != "uncertain" || at[0]["reply"] != nil ||
		at[1]["status"] != float64(200) || at[1]["reply"] != `{"accepted":true,"receipt":"r-1"}` || at[1]["outcome"] != "settled" {
		t.Fatalf("attempts: %v", at)
	}
	for _, a := range at {
		if a["at"] == "" || a["latency_ms"] == nil {
			t.Fatalf("attempt lacks time or latency: %v", a)
		}
	}
	if lat := at[0]["latency_ms"].(float64); lat < 400 {
		t.Fatalf("first attempt latency %v ms, the receiver held it for the whole timeout", lat)
	}
	g := taskView(t, d, pub, code)
	if g.num("reserved") != 0 || g.num("settled") != 6 || g.num("available") != 6 {
		t.Fatalf("task: %s", g.Raw)
	}
	checkMoney(t, d)
}

// A redelivery repeats the body byte for byte (docs/receivers.md), even
// for a payload whose keys are not in canonical order.
func TestReceiverRedeliveryRepeatsBody(t *testing.T) {
	t.Parallel()
	d := start(t, withReceiverTimeout(400*time.Millisecond), withLadder(0.001), withSweep(100*time.Millisecond), withGrace(2*time.Second))
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	rcv := newScripted(t, func(_ tapHit, attempt int) answer {
		if attempt == 1 {
			return hangs()
		}
		return says(200, "ok")
	})
	code := newTask(t, d, pub, rcv.url(), 2, 4, nil)
	raw := fmt.Sprintf(`{"code":%q,"request_key":"order-1","payload":{"zeta":1,"alpha":[1.0,2e2],"mid":"x"}}`, code)
	sub := post(t, d.URL+"/api/v1/work_submit", exe, []byte(raw))
	if sub.str("state") != "uncertain" {
		t.Fatalf("submit: %s", sub.Raw)
	}
	waitSubmission(t, d, exe, sub.str("submission_id"), 20*time.Second, "settled")
	hits := rcv.forKey(sub.str("submission_id"))
	if len(hits) != 2 {
		t.Fatalf("%d hits", len(hits))
	}
	if string(hits[0].Body) != string(hits[1].Body) {
		t.Errorf("redelivery body differs from the first POST:\n first %s\n again %s", hits[0].Body, hits[1].Body)
	}
	checkMoney(t, d)
}

// A receiver that never answers exhausts the ladder: six POSTs, then
// failed DELIVERY_UNRESOLVED, reservation released, stop.
func TestReceiverLadderExhausted(t *testing.T) {
	t.Parallel()
	// Every attempt times out, so the host is left alone between attempts
	// (queue.Hosts); a short pause keeps the test quick.
	d := start(t, withReceiverTimeout(300*time.Millisecond), withLadder(0.0001), withSweep(100*time.Millisecond), withGrace(2*time.Second),
		withHostCooldown(50*time.Millisecond))
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	rcv := newScripted(t, always(hangs()))
	code := newTask(t, d, pub, rcv.url(), 5, 10, nil)
	c := d.must(t, exe, "work_claim", map[string]any{"code": code})
	sub := submit(t, d, exe, code, "lost-1", bullets, "claim_id", c.str("claim_id"))
	id := sub.str("submission_id")
	if sub.str("state") != "uncertain" {
		t.Fatalf("submit: %s", sub.Raw)
	}
	st := waitSubmission(t, d, exe, id, 60*time.Second, "failed", "settled", "rejected")
	if st.str("state") != "failed" || st.Body["failure"] != "DELIVERY_UNRESOLVED" || st.Body["next_action"] != "stop" || st.Body["reply"] != nil {
		t.Fatalf("exhausted: %s", st.Raw)
	}
	if ev := eventsOf(st); len(ev) != 3 || ev[1] != "delivering>uncertain:no_answer" || ev[2] != "uncertain>failed:delivery_unresolved" {
		t.Fatalf("events %v", ev)
	}
	time.Sleep(time.Second)
	if n := len(rcv.forKey(id)); n != 6 {
		t.Fatalf("receiver saw %d attempts, want 6", n)
	}
	rec := delivered(t, d, pub, code, id)
	at := attemptsOf(rec)
	if len(at) != 6 {
		t.Fatalf("publisher sees %d attempts: %v", len(at), at)
	}
	for i, a := range at {
		if a["attempt"] != float64(i+1) || a["status"] != nil {
			t.Fatalf("attempt %d: %v", i, a)
		}
	}
	g := taskView(t, d, pub, code)
	if g.num("reserved") != 0 || g.num("available") != 10 || g.Body["status"] != "open" {
		t.Fatalf("task: %s", g.Raw)
	}
	if bal := balanceOf(t, d, exe); bal != 66 {
		t.Fatalf("executor balance %d", bal)
	}
	checkMoney(t, d)
}

// Five consecutive counting failures pause the task (RECEIVER_FAULT); a
// settled or rejected submission in between breaks the streak.
func TestReceiverFiveFailuresPause(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	other, _ := d.register(t)
	var mu sync.Mutex
	mode := []answer{says(500, "boom")}
	rcv := newScripted(t, func(tapHit, int) answer {
		mu.Lock()
		defer mu.Unlock()
		a := mode[0]
		if len(mode) > 1 {
			mode = mode[1:]
		}
		return a
	})
	set := func(as ...answer) { mu.Lock(); mode = as; mu.Unlock() }
	code := newTask(t, d, pub, rcv.url(), 1, 10, nil)
	n := 0
	send := func(want string) {
		t.Helper()
		n++
		r := submit(t, d, exe, code, fmt.Sprintf("p-%d", n), bullets)
		if r.str("state") != want {
			t.Fatalf("submission %d: want %s, got %s", n, want, r.Raw)
		}
	}
	status := func() (string, any) {
		g := taskView(t, d, pub, code)
		return g.str("status"), g.Body["paused_reason"]
	}

	// Mixed counting failures: 500, 302, 500, 302, 500.
	set(says(500, "a"), answer{status: 302, location: "http://127.0.0.1:1/"}, says(500, "b"), answer{status: 302, location: "http://127.0.0.1:1/"}, says(500, "c"))
	for i := range 4 {
		send("failed")
		if s, _ := status(); s != "open" {
			t.Fatalf("paused after %d failures", i+1)
		}
	}
	send("failed")
	if s, why := status(); s != "paused" || why != "RECEIVER_FAULT" {
		t.Fatalf("after five failures: %s %v", s, why)
	}
	if w := d.must(t, other, "work_get", map[string]any{"code": code}); w.Body["paused_reason"] != "RECEIVER_FAULT" || w.str("status") != "paused" {
		t.Fatalf("work_get: %s", w.Raw)
	}
	cl := d.call(t, other, "work_claim", map[string]any{"code": code})
	expect(t, cl, 409, "TASK_NOT_OPEN")
	if details(cl, "status") != "paused" || details(cl, "reason") != "RECEIVER_FAULT" || cl.Body["next_action"] != "stop" {
		t.Fatalf("TASK_NOT_OPEN details: %s", cl.Raw)
	}
	expect(t, submit(t, d, other, code, "x", bullets), 409, "TASK_NOT_OPEN")

	// Re-opened: a settled one and a rejected one each break the streak.
	if o := d.must(t, pub, "task_open", map[string]any{"code": code}); o.str("status") != "open" || o.Body["paused_reason"] != nil {
		t.Fatalf("reopen: %s", o.Raw)
	}
	// Re-opening does not reset the window: the success comes first.
	set(says(200, "ok"))
	send("settled")
	set(says(500, "x"))
	for range 4 {
		send("failed")
	}
	if s, _ := status(); s != "open" {
		t.Fatal("a settled submission did not break the streak")
	}
	set(says(422, "no"))
	send("rejected")
	set(says(500, "x"))
	for range 4 {
		send("failed")
	}
	if s, _ := status(); s != "open" {
		t.Fatal("a rejected submission did not break the streak")
	}
	send("failed")
	if s, why := status(); s != "paused" || why != "RECEIVER_FAULT" {
		t.Fatalf("streak of five after the rejection: %s %v", s, why)
	}
	checkMoney(t, d)
}

// Redis loses the scheduled redelivery; the PostgreSQL sweep finds the due
// attempt and the submission still resolves.
func TestReceiverRedisFlushMidLadder(t *testing.T) {
	t.Parallel()
	d := start(t, withReceiverTimeout(300*time.Millisecond), withLadder(0.01), withSweep(150*time.Millisecond), withGrace(2*time.Second))
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	rcv := newScripted(t, func(_ tapHit, attempt int) answer {
		if attempt == 1 {
			return hangs()
		}
		return says(200, "ok")
	})
	code := newTask(t, d, pub, rcv.url(), 3, 3, nil)
	sub := submit(t, d, exe, code, "flush-1", bullets)
	if sub.str("state") != "uncertain" {
		t.Fatalf("submit: %s", sub.Raw)
	}
	flushQueue(t, d) // the +1.8 s wake-up is gone
	st := waitSubmission(t, d, exe, sub.str("submission_id"), 20*time.Second, "settled", "failed")
	if st.str("state") != "settled" || earnRows(t, d, sub.str("submission_id")) != 1 {
		t.Fatalf("after flush: %s", st.Raw)
	}
	if n := len(rcv.forKey(sub.str("submission_id"))); n != 2 {
		t.Fatalf("%d attempts", n)
	}
	checkMoney(t, d)
}

// A claim binds contract version N: after a revision the holder still sees
// and is judged by N (and delivered to N's receiver, paid N's price);
// claim-less submissions use N+1.
func TestTaskContractVersionBinding(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	holder, _ := d.register(t)
	late, _ := d.register(t)
	r1 := newScripted(t, always(says(200, "v1 ok")))
	r2 := newScripted(t, always(says(200, "v2 ok")))
	schema1 := map[string]any{"type": "object", "required": []string{"summary"}, "additionalProperties": false,
		"properties": map[string]any{"summary": map[string]any{"type": "string"}}}
	schema2 := map[string]any{"type": "object", "required": []string{"bullets"}, "additionalProperties": false,
		"properties": map[string]any{"bullets": map[string]any{"type": "array", "items": map[string]any{"type": "string"}}}}
	contract1 := map[string]any{"title": "Version one", "requirements": "Write a summary.", "receiver": map[string]any{"url": r1.url()},
		"price": 5, "output": map[string]any{"schema": schema1}}
	code := d.must(t, pub, "task_create", map[string]any{"contract": contract1, "budget": 30, "open": true}).str("code")

	c := d.must(t, holder, "work_claim", map[string]any{"code": code})
	if c.num("contract_version") != 1 || c.num("amount") != 5 {
		t.Fatalf("claim: %s", c.Raw)
	}
	d.must(t, pub, "task_pause", map[string]any{"code": code})
	contract2 := map[string]any{"title": "Version two", "requirements": "Write three bullets.", "receiver": map[string]any{"url": r2.url()},
		"price": 7, "output": map[string]any{"schema": schema2}}
	u := d.must(t, pub, "task_update", map[string]any{"code": code, "contract": contract2})
	if u.num("contract_version") != 2 {
		t.Fatalf("update: %s", u.Raw)
	}
	d.must(t, pub, "task_open", map[string]any{"code": code})

	w := d.must(t, holder, "work_get", map[string]any{"code": code})
	ct := w.Body["contract"].(map[string]any)
	if w.num("contract_version") != 1 || ct["requirements"] != "Write a summary." || ct["title"] != "Version one" ||
		!strings.Contains(w.Raw, `"summary"`) || strings.Contains(w.Raw, r1.srv.URL) || strings.Contains(w.Raw, r2.srv.URL) {
		t.Fatalf("holder's package is not version 1 (or shows the receiver): %s", w.Raw)
	}
	if my := w.Body["my"].(map[string]any); my["claim"] == nil {
		t.Fatalf("holder's claim missing: %s", w.Raw)
	}
	w = d.must(t, late, "work_get", map[string]any{"code": code})
	if w.num("contract_version") != 2 || w.Body["contract"].(map[string]any)["requirements"] != "Write three bullets." {
		t.Fatalf("newcomer's package: %s", w.Raw)
	}

	// Valid for version 1, invalid for version 2: settles under the claim.
	s := submit(t, d, holder, code, "v1", map[string]any{"summary": "short"}, "claim_id", c.str("claim_id"))
	if s.str("state") != "settled" || s.num("contract_version") != 1 || s.num("paid") != 5 {
		t.Fatalf("claim-bound submission: %s", s.Raw)
	}
	if r1.count() != 1 || r2.count() != 0 {
		t.Fatalf("claim-bound submission went to the wrong receiver: v1 %d, v2 %d", r1.count(), r2.count())
	}
	// Claim-less after the update: version 2's schema, receiver and price.
	bad := submit(t, d, late, code, "v2-bad", map[string]any{"summary": "short"})
	expect(t, bad, 422, "SCHEMA_MISMATCH")
	s = submit(t, d, late, code, "v2-good", map[string]any{"bullets": []string{"a"}})
	if s.str("state") != "settled" || s.num("contract_version") != 2 || s.num("paid") != 7 || r2.count() != 1 {
		t.Fatalf("claim-less submission: %s", s.Raw)
	}
	// The holder's claim is used: its next claim-less submission is version 2 too.
	expect(t, submit(t, d, holder, code, "v1-again", map[string]any{"summary": "short"}), 422, "SCHEMA_MISMATCH")
	g := taskView(t, d, pub, code)
	if g.num("settled") != 12 || g.num("reserved") != 0 {
		t.Fatalf("task: %s", g.Raw)
	}
	checkMoney(t, d)
}

// A claim pins harness revisions: the holder reads them through edits and
// withdrawal; others read the current revision, and nothing once withdrawn.
func TestTaskHarnessPinning(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	holder, _ := d.register(t)
	other, _ := d.register(t)
	rcv := newScripted(t, always(says(200, "ok")))
	rev1 := "Revision one of the house style: " + content(60)
	mem := d.must(t, pub, "memory_put", putArgs("title", "House style", "content", rev1)).str("code")
	code := newTask(t, d, pub, rcv.url(), 2, 10, map[string]any{"harness_refs": []string{mem}})

	c := d.must(t, holder, "work_claim", map[string]any{"code": code})
	rev2 := "Revision two of the house style: " + content(70)
	if r := d.must(t, pub, "memory_put", putArgs("code", mem, "title", "House style v2", "content", rev2)); r.num("revision") != 2 {
		t.Fatalf("memory update: %s", r.Raw)
	}
	read := func(key string, args map[string]any) result {
		args["code"], args["ref_id"] = code, mem
		return d.call(t, key, "work_harness", args)
	}
	h := read(holder, map[string]any{"claim_id": c.str("claim_id")})
	if !h.ok() || h.num("revision") != 1 || h.str("content") != rev1 || h.Body["pinned"] != true {
		t.Fatalf("holder with claim_id: %s", h.Raw)
	}
	if h := read(holder, map[string]any{}); h.num("revision") != 1 || h.Body["pinned"] != true {
		t.Fatalf("holder without claim_id: %s", h.Raw)
	}
	if h := read(other, map[string]any{}); !h.ok() || h.num("revision") != 2 || h.str("content") != rev2 || h.Body["pinned"] != false {
		t.Fatalf("other executor: %s", h.Raw)
	}
	d.must(t, pub, "memory_delete", map[string]any{"code": mem})
	if h := read(holder, map[string]any{"claim_id": c.str("claim_id")}); !h.ok() || h.num("revision") != 1 || h.str("content") != rev1 {
		t.Fatalf("holder after withdrawal: %s", h.Raw)
	}
	w := d.must(t, holder, "work_get", map[string]any{"code": code})
	if hs := w.Body["harness"].([]any); len(hs) != 1 || hs[0].(map[string]any)["revision"] != float64(1) || hs[0].(map[string]any)["pinned"] != true {
		t.Fatalf("holder's harness directory: %s", w.Raw)
	}
	expect(t, read(other, map[string]any{}), 404, "HARNESS_REF_NOT_FOUND")
	// Someone else's claim id is not a way in.
	expect(t, read(other, map[string]any{"claim_id": c.str("claim_id")}), 409, "CLAIM_INVALID")
}
