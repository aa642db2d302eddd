package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
)

// holdingReceiver holds the first POST of every submission until the
// caller goes away (signalling on first), and accepts every later one.
type holdingReceiver struct {
	srv      *httptest.Server
	first    chan string
	mu       sync.Mutex
	attempts map[string]int
	accepted map[string]int
	bodies   map[string][][]byte
}

func newHoldingReceiver(t *testing.T) *holdingReceiver {
	t.Helper()
	h := &holdingReceiver{first: make(chan string, 16), attempts: map[string]int{}, accepted: map[string]int{}, bodies: map[string][][]byte{}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		h.mu.Lock()
		h.attempts[key]++
		n := h.attempts[key]
		h.bodies[key] = append(h.bodies[key], body)
		h.mu.Unlock()
		if n == 1 {
			h.first <- key
			select {
			case <-r.Context().Done():
			case <-time.After(2 * time.Minute):
			}
			return
		}
		h.mu.Lock()
		h.accepted[key]++
		h.mu.Unlock()
		_, _ = io.WriteString(w, `{"accepted":true}`)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *holdingReceiver) counts(key string) (attempts, accepted int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.attempts[key], h.accepted[key]
}

// tryCall is call that reports a dead server instead of failing the test.
func tryCall(base, key, tool string, args any) (map[string]any, error) {
	b, _ := json.Marshal(args)
	req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/"+tool, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var env map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return nil, err
	}
	env["http_status"] = float64(resp.StatusCode)
	return env, nil
}

func mustCall(t *testing.T, base, key, tool string, args any) map[string]any {
	t.Helper()
	r := call(t, base, key, tool, args)
	if r["ok"] != true {
		t.Fatalf("%s: %v", tool, r)
	}
	return r
}

func registerOn(t *testing.T, base, name string) string {
	t.Helper()
	r := mustCall(t, base, "", "account_register", map[string]any{"name": name, "password": "correct horse"})
	return r["api_key"].(string)
}

// taskEnv is the environment of one deployment's dojo processes: same
// database, Redis prefix and queue; loopback receivers allowed; a fast
// ladder; short receiver timeout and grace where the binary reads them.
func taskEnv(dsn, prefix, queue, scale string) func() map[string]string {
	return func() map[string]string {
		return map[string]string{"DATABASE_URL": dsn, "REDIS_URL": kungfutest.RedisURL(), "DOJO_REDIS_PREFIX": prefix,
			"DOJO_QUEUE": queue, "DOJO_ALLOW_TARGETS": "127.0.0.0/8", "DOJO_LADDER_SCALE": scale, "DOJO_RATE_LIMITS": "off",
			"DOJO_RECEIVER_TIMEOUT": "1s", "DOJO_DELIVERY_GRACE": "3s"}
	}
}

func waitState(t *testing.T, base, key, sub string, within time.Duration, states ...string) map[string]any {
	t.Helper()
	end := time.Now().Add(within)
	for {
		r := mustCall(t, base, key, "work_status", map[string]any{"submission_id": sub})
		for _, s := range states {
			if r["state"] == s {
				return r
			}
		}
		if time.Now().After(end) {
			t.Fatalf("submission %s is %v after %v, want %v", sub, r["state"], within, states)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func dbCount(t *testing.T, dsn, q string, args ...any) int64 {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int64
	if err := conn.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func dojoCheck(t *testing.T, env map[string]string) {
	t.Helper()
	out, err := command(t, env, "check").CombinedOutput()
	if err != nil {
		t.Fatalf("dojo check failed: %v\n%s", err, out)
	}
}

// A dojo process dies (SIGKILL) while the receiver holds the synchronous
// delivery. Another process on the same database and Redis finds the
// stalled submission, redelivers it with the same key, and it ends
// settled (or failed), paid at most once; dojo check passes.
func TestServeKilledDuringDelivery(t *testing.T) {
	t.Parallel()
	dsn, prefix, queue := kungfutest.DatabaseURL(t), kungfutest.RedisPrefix(t), kungfutest.Queue(t)
	env := taskEnv(dsn, prefix, queue, "0.001")
	rcv := newHoldingReceiver(t)
	first := startServe(t, env())
	pub := registerOn(t, first.base, "kill_publisher")
	exe := registerOn(t, first.base, "kill_executor")
	code := mustCall(t, first.base, pub, "task_create", map[string]any{"open": true, "budget": 10, "contract": map[string]any{
		"title": "Kill test", "requirements": "Anything.", "receiver": map[string]any{"url": rcv.srv.URL + "/judge"}, "price": 5}})["code"].(string)
	claim := mustCall(t, first.base, exe, "work_claim", map[string]any{"code": code})["claim_id"].(string)

	answered := make(chan error, 1)
	go func() {
		r, err := tryCall(first.base, exe, "work_submit", map[string]any{"code": code, "request_key": "kill-1",
			"payload": map[string]any{"n": 1}, "claim_id": claim})
		if err == nil && r["ok"] == true && r["state"] != "delivering" {
			err = fmt.Errorf("the submission was answered before the kill: %v", r)
		}
		answered <- err
	}()
	var sub string
	select {
	case sub = <-rcv.first:
	case <-time.After(30 * time.Second):
		t.Fatalf("the receiver never got the synchronous delivery: %s", first.out.String())
	}
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = first.cmd.Wait()
	if err := <-answered; err == nil {
		t.Fatal("work_submit answered although its process was killed mid-delivery")
	}
	if n := dbCount(t, dsn, `SELECT count(*) FROM submissions WHERE id = $1 AND state = 'delivering'`, sub); n != 1 {
		t.Fatalf("after the kill the submission is not delivering (%d)", n)
	}

	second := startServe(t, env())
	st := waitState(t, second.base, exe, sub, 90*time.Second, "settled", "failed")
	attempts, accepted := rcv.counts(sub)
	paid := dbCount(t, dsn, `SELECT count(*) FROM ledger WHERE type = 'earn_task' AND ref_type = 'task_submission' AND ref_id = $1`, sub)
	balance := mustCall(t, second.base, exe, "account_status", map[string]any{})["balance"].(float64)
	t.Logf("state %v after %d attempts; paid %d", st["state"], attempts, paid)
	switch st["state"] {
	case "settled":
		if paid != 1 || balance != 66+5 || accepted != 1 || st["paid"] != float64(5) {
			t.Fatalf("settled: %d earn rows, balance %v, receiver accepted %d: %v", paid, balance, accepted, st)
		}
	case "failed":
		if paid != 0 || balance != 66 {
			t.Fatalf("failed but paid: %d earn rows, balance %v", paid, balance)
		}
	}
	if attempts < 2 {
		t.Fatalf("receiver saw %d attempts", attempts)
	}
	rcv.mu.Lock()
	bodies := rcv.bodies[sub]
	rcv.mu.Unlock()
	var b0, b1 map[string]any
	_ = json.Unmarshal(bodies[0], &b0)
	_ = json.Unmarshal(bodies[1], &b1)
	if fmt.Sprint(b0) != fmt.Sprint(b1) || b0["submission_id"] != sub {
		t.Fatalf("redelivery carried another body: %s vs %s", bodies[0], bodies[1])
	}
	events, _ := st["events"].([]any)
	stalled := false
	for _, e := range events {
		m := e.(map[string]any)
		stalled = stalled || (m["from"] == "delivering" && m["to"] == "uncertain" && m["cause"] == "stalled")
	}
	if !stalled {
		t.Fatalf("no delivering→uncertain (stalled) event: %v", events)
	}
	g := mustCall(t, second.base, pub, "task_get", map[string]any{"code": code})
	if g["reserved"] != float64(0) {
		t.Fatalf("reservation left behind: %v", g)
	}
	time.Sleep(time.Second)
	if again, _ := rcv.counts(sub); again != attempts {
		t.Fatalf("receiver got %d more attempts after the outcome", again-attempts)
	}
	stopGracefully(t, second)
	dojoCheck(t, env())
}

// Redis loses every queued wake-up in the middle of a ladder; the
// PostgreSQL sweep re-enqueues the due attempt and the submission resolves.
func TestServeRedisFlushMidLadder(t *testing.T) {
	t.Parallel()
	dsn, prefix, queue := kungfutest.DatabaseURL(t), kungfutest.RedisPrefix(t), kungfutest.Queue(t)
	env := taskEnv(dsn, prefix, queue, "0.02") // first rung: 3.6 s
	rcv := newHoldingReceiver(t)
	s := startServe(t, env())
	pub := registerOn(t, s.base, "flush_publisher")
	exe := registerOn(t, s.base, "flush_executor")
	code := mustCall(t, s.base, pub, "task_create", map[string]any{"open": true, "budget": 4, "contract": map[string]any{
		"title": "Flush test", "requirements": "Anything.", "receiver": map[string]any{"url": rcv.srv.URL + "/judge"}, "price": 4}})["code"].(string)
	r := mustCall(t, s.base, exe, "work_submit", map[string]any{"code": code, "request_key": "flush-1", "payload": map[string]any{"n": 1}})
	if r["state"] != "uncertain" || r["next_action"] != "poll" {
		t.Fatalf("first try: %v", r)
	}
	sub := r["submission_id"].(string)

	rdb := kungfutest.Redis(t)
	ctx := context.Background()
	// The queues are named from DOJO_QUEUE: the deployment id and the task
	// type follow it.
	keys, err := rdb.Keys(ctx, "asynq:{"+queue+"*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("no queue keys to flush (%v): the wake-up was never scheduled", err)
	}
	if err := rdb.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	st := waitState(t, s.base, exe, sub, 90*time.Second, "settled", "failed")
	if st["state"] != "settled" {
		t.Fatalf("after the flush: %v", st)
	}
	if n := dbCount(t, dsn, `SELECT count(*) FROM ledger WHERE type = 'earn_task' AND ref_id = $1`, sub); n != 1 {
		t.Fatalf("%d earn rows", n)
	}
	if attempts, accepted := rcv.counts(sub); attempts != 2 || accepted != 1 {
		t.Fatalf("receiver: %d attempts, %d accepted", attempts, accepted)
	}
	stopGracefully(t, s)
	dojoCheck(t, env())
}
