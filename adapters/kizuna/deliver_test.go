package kizuna_test

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
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/adapters/kizuna"
	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/queue"
	"github.com/dojo-relay/dojo/signing"
)

// fixture is one hub's delivery engine on a database and queue of its own.
type fixture struct {
	db    *pgxpool.Pool
	keys  *signing.ServerKey
	d     *kizuna.Delivery
	e     *queue.Engine
	base  string
	from  int64
	scale float64
}

func newFixture(t *testing.T, scale float64, timeout time.Duration, run bool) *fixture {
	t.Helper()
	db, _ := kungfutest.Pool(t)
	text, _ := signing.GenerateServerKey()
	keys, err := signing.ParseServerKey(text)
	if err != nil {
		t.Fatal(err)
	}
	base := kungfutest.Queue(t)
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := queue.NewEngine(kungfutest.RedisURL(), base, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	f := &fixture{db: db, keys: keys, e: e, base: base, scale: scale}
	f.d = &kizuna.Delivery{DB: db, Keys: keys, LadderScale: scale, Timeout: timeout, Log: log,
		Client: queue.NewOutbound([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil)}
	f.d.Register(e, 200*time.Millisecond)
	f.from = kungfutest.Account(t, db, "A-SEND").AccountID
	if run {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	return f
}

// agent registers a recipient the way the hub stores one.
func (f *fixture) agent(t *testing.T, name, webhook, secret string, enabled bool) int64 {
	t.Helper()
	id := kungfutest.Account(t, f.db, name).AccountID
	sealed, err := f.keys.Seal([]byte(secret), kizuna.SecretPurpose(id))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(context.Background(), `INSERT INTO kz_agents (account_id, webhook_url, endpoint_secret, enabled, created_at, updated_at)
		VALUES ($1, $2, $3, $4, now(), now())`, id, webhook, sealed, enabled); err != nil {
		t.Fatal(err)
	}
	return id
}

// letter stores a letter to to and wakes the engine, as the hub does.
func (f *fixture) letter(t *testing.T, taskID string, to int64) (int64, []byte) {
	t.Helper()
	// Key order and spacing a re-encoder would change.
	body := fmt.Appendf(nil, `{"task_id":%q,"from":"A-SEND","to":"B","kind":"kizuna.task","reply_to":null,"content":{"title":"hi","body":{"z":1,  "a":[2,1]},"format":"json"},"created_at":"2026-11-30T00:00:00Z"}`, taskID)
	var id int64
	if err := f.db.QueryRow(context.Background(), `INSERT INTO kz_letters (task_id, from_account, to_account, kind, body, created_at, next_attempt_at)
		VALUES ($1, $2, $3, 'kizuna.task', $4, now(), now()) RETURNING id`, taskID, f.from, to, string(body)).Scan(&id); err != nil {
		t.Fatal(err)
	}
	f.d.Enqueue(context.Background(), id)
	return id, body
}

func (f *fixture) state(t *testing.T, id int64) (string, int) {
	t.Helper()
	var state string
	var n int
	if err := f.db.QueryRow(context.Background(), `SELECT state, attempts FROM kz_letters WHERE id = $1`, id).Scan(&state, &n); err != nil {
		t.Fatal(err)
	}
	return state, n
}

type auditRow struct {
	outcome  string
	attempts []struct {
		N      int    `json:"n"`
		Status *int   `json:"status"`
		Error  string `json:"error"`
	}
}

func (f *fixture) audit(t *testing.T, id int64) []auditRow {
	t.Helper()
	rows, err := f.db.Query(context.Background(), `SELECT outcome, attempts::text FROM kz_audit WHERE letter_id = $1`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []auditRow
	for rows.Next() {
		var r auditRow
		var raw string
		if err := rows.Scan(&r.outcome, &raw); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(raw), &r.attempts); err != nil {
			t.Fatalf("audit attempts %s: %v", raw, err)
		}
		out = append(out, r)
	}
	return out
}

// box is a letterbox written from the contract: it checks the signature
// itself with crypto/hmac, then answers as answer says for each attempt.
type box struct {
	t      *testing.T
	secret string
	srv    *httptest.Server
	answer func(n int, taskID string, w http.ResponseWriter)

	mu        sync.Mutex
	bodies    [][]byte
	attempts  []int
	at        []time.Time
	acked     int
	forgeries int
}

func newBox(t *testing.T, secret string, answer func(n int, taskID string, w http.ResponseWriter)) *box {
	b := &box{t: t, secret: secret, answer: answer}
	b.srv = httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *box) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	ts := r.Header.Get("X-Kizuna-Timestamp")
	m := hmac.New(sha256.New, []byte(b.secret))
	m.Write([]byte(ts + "."))
	m.Write(raw)
	want := "sha256=" + hex.EncodeToString(m.Sum(nil))
	unix, err := strconv.ParseInt(ts, 10, 64)
	fresh := err == nil && time.Since(time.Unix(unix, 0)).Abs() <= 300*time.Second
	var letter struct {
		TaskID string `json:"task_id"`
	}
	_ = json.Unmarshal(raw, &letter)
	n, _ := strconv.Atoi(r.Header.Get("X-Kizuna-Attempt"))
	b.mu.Lock()
	ok := r.Method == http.MethodPost && r.URL.Path == "/kizuna/deliver" &&
		hmac.Equal([]byte(r.Header.Get("X-Kizuna-Signature")), []byte(want)) && fresh &&
		r.Header.Get("Content-Type") == "application/json" &&
		r.Header.Get("X-Kizuna-Task-Id") == letter.TaskID &&
		r.Header.Get("webhook-id") == "letter_"+letter.TaskID && r.Header.Get("webhook-signature") != ""
	if !ok {
		b.forgeries++
		b.mu.Unlock()
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	b.bodies = append(b.bodies, raw)
	b.attempts = append(b.attempts, n)
	b.at = append(b.at, time.Now())
	b.mu.Unlock()
	b.answer(n, letter.TaskID, &ackCounter{ResponseWriter: w, b: b})
}

// ackCounter counts the replies that are valid ACKs, i.e. the times the
// letter landed in the box.
type ackCounter struct {
	http.ResponseWriter
	b      *box
	status int
}

func (a *ackCounter) WriteHeader(s int) { a.status = s; a.ResponseWriter.WriteHeader(s) }

func ack(taskID string, w http.ResponseWriter) {
	if a, ok := w.(*ackCounter); ok {
		a.b.mu.Lock()
		a.b.acked++
		a.b.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"status":"received","task_id":%q,"received_at":%q}`, taskID, time.Now().UTC().Format(time.RFC3339))
}

func (b *box) snapshot() (bodies [][]byte, attempts []int, at []time.Time, acked, forgeries int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([][]byte(nil), b.bodies...), append([]int(nil), b.attempts...), append([]time.Time(nil), b.at...), b.acked, b.forgeries
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func TestDeliverAck(t *testing.T) {
	f := newFixture(t, 0.0001, 2*time.Second, true)
	b := newBox(t, "es_bob", func(_ int, id string, w http.ResponseWriter) { ack(id, w) })
	to := f.agent(t, "A-BOB", b.srv.URL+"/", "es_bob", true)
	id, body := f.letter(t, "T-ACK1", to)
	eventually(t, 10*time.Second, "acked", func() bool { s, _ := f.state(t, id); return s == "acked" })

	bodies, attempts, _, acked, forged := b.snapshot()
	if len(bodies) != 1 || !bytes.Equal(bodies[0], body) || attempts[0] != 1 || acked != 1 || forged != 0 {
		t.Fatalf("box got %q attempts %v acked %d forged %d", bodies, attempts, acked, forged)
	}
	var status, n int
	var ackedAt *time.Time
	if err := f.db.QueryRow(context.Background(), `SELECT a.status, l.attempts, l.acked_at FROM kz_attempts a JOIN kz_letters l ON l.id = a.letter_id WHERE a.letter_id = $1`, id).Scan(&status, &n, &ackedAt); err != nil {
		t.Fatal(err)
	}
	if status != 200 || n != 1 || ackedAt == nil {
		t.Fatalf("attempt status %d, attempts %d, ackedAt %v", status, n, ackedAt)
	}
	au := f.audit(t, id)
	if len(au) != 1 || au[0].outcome != "acked" || len(au[0].attempts) != 1 || *au[0].attempts[0].Status != 200 {
		t.Fatalf("audit %+v", au)
	}

	// The audit is append-only in PostgreSQL itself.
	ctx := context.Background()
	if _, err := f.db.Exec(ctx, `UPDATE kz_audit SET outcome = 'delivery_failed' WHERE letter_id = $1`, id); err == nil {
		t.Fatal("UPDATE on kz_audit was allowed")
	}
	if _, err := f.db.Exec(ctx, `DELETE FROM kz_audit WHERE letter_id = $1`, id); err == nil {
		t.Fatal("DELETE on kz_audit was allowed")
	}
	if au := f.audit(t, id); len(au) != 1 || au[0].outcome != "acked" {
		t.Fatalf("audit changed: %+v", au)
	}
}

// Each kind of failed attempt is retried on the ladder; a box that
// recovers at attempt 3 gets the letter once, with the same bytes every
// time.
func TestDeliverRetries(t *testing.T) {
	fail := map[string]func(id string, w http.ResponseWriter){
		"500": func(_ string, w http.ResponseWriter) { http.Error(w, "down", 500) },
		"timeout": func(id string, w http.ResponseWriter) {
			time.Sleep(1500 * time.Millisecond) // past the hub's 1 s timeout: too late to count
			fmt.Fprintf(w, `{"task_id":%q}`, id)
		},
		"no task_id":   func(_ string, w http.ResponseWriter) { fmt.Fprint(w, `{"status":"received"}`) },
		"other task":   func(_ string, w http.ResponseWriter) { fmt.Fprint(w, `{"task_id":"T-OTHER"}`) },
		"not json 2xx": func(_ string, w http.ResponseWriter) { w.WriteHeader(204) },
	}
	for name, failure := range fail {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, 0.0001, time.Second, true)
			b := newBox(t, "es_"+name, func(n int, id string, w http.ResponseWriter) {
				if n < 3 {
					failure(id, w)
					return
				}
				ack(id, w)
			})
			to := f.agent(t, "A-BOX", b.srv.URL, "es_"+name, true)
			id, body := f.letter(t, "T-R1", to)
			eventually(t, 20*time.Second, "acked", func() bool { s, _ := f.state(t, id); return s == "acked" })
			time.Sleep(500 * time.Millisecond) // a duplicate would show by now
			bodies, attempts, _, acked, forged := b.snapshot()
			if acked != 1 || forged != 0 || len(bodies) != 3 {
				t.Fatalf("acked %d times, %d forged, %d deliveries (attempts %v)", acked, forged, len(bodies), attempts)
			}
			for i, got := range bodies {
				if !bytes.Equal(got, body) || attempts[i] != i+1 {
					t.Fatalf("delivery %d: attempt %d body %s", i, attempts[i], got)
				}
			}
			au := f.audit(t, id)
			if len(au) != 1 || au[0].outcome != "acked" || len(au[0].attempts) != 3 ||
				au[0].attempts[0].Error == "" || au[0].attempts[1].Error == "" || au[0].attempts[2].Error != "" {
				t.Fatalf("audit %+v", au)
			}
		})
	}
}

func TestDeliverSixFailures(t *testing.T) {
	scale := 0.0002
	f := newFixture(t, scale, time.Second, true)
	b := newBox(t, "es_dead", func(_ int, _ string, w http.ResponseWriter) { http.Error(w, "down", 503) })
	to := f.agent(t, "A-DEAD", b.srv.URL, "es_dead", true)
	id, body := f.letter(t, "T-DEAD", to)
	eventually(t, 30*time.Second, "delivery_failed", func() bool { s, _ := f.state(t, id); return s == "delivery_failed" })
	time.Sleep(500 * time.Millisecond)
	bodies, attempts, at, _, _ := b.snapshot()
	if len(bodies) != kizuna.MaxAttempts {
		t.Fatalf("%d deliveries, want 6 (attempts %v)", len(bodies), attempts)
	}
	for i := range bodies {
		if !bytes.Equal(bodies[i], body) || attempts[i] != i+1 {
			t.Fatalf("delivery %d: attempt %d body %s", i, attempts[i], bodies[i])
		}
		if i > 0 {
			if gap := at[i].Sub(at[i-1]); gap < time.Duration(float64(kizuna.Ladder[i-1])*scale) {
				t.Fatalf("attempt %d came %v after the previous, before the ladder's gap", i+1, gap)
			}
		}
	}
	au := f.audit(t, id)
	if len(au) != 1 || au[0].outcome != "delivery_failed" || len(au[0].attempts) != 6 || *au[0].attempts[5].Status != 503 {
		t.Fatalf("audit %+v", au)
	}
}

func TestDeliverInvalidTarget(t *testing.T) {
	f := newFixture(t, 0.0001, time.Second, true)
	b := newBox(t, "es_x", func(_ int, id string, w http.ResponseWriter) { ack(id, w) })
	disabled := f.agent(t, "A-OFF", b.srv.URL, "es_x", false)
	noHook := f.agent(t, "A-NOHOOK", "", "es_x", true)
	unknown := kungfutest.Account(t, f.db, "A-PLAIN").AccountID // an account, not an agent
	for _, to := range []int64{disabled, noHook, unknown} {
		id, _ := f.letter(t, "T-INV"+strconv.FormatInt(to, 10), to)
		eventually(t, 10*time.Second, "invalid_target", func() bool { s, _ := f.state(t, id); return s == "invalid_target" })
		if _, n := f.state(t, id); n != 0 {
			t.Fatalf("letter to %d made %d attempts", to, n)
		}
		if au := f.audit(t, id); len(au) != 1 || au[0].outcome != "invalid_target" || len(au[0].attempts) != 0 {
			t.Fatalf("audit %+v", au)
		}
	}
	if bodies, _, _, _, _ := b.snapshot(); len(bodies) != 0 {
		t.Fatalf("a disabled agent's box got %d letters", len(bodies))
	}
}

// Concurrent wake-ups of one letter (duplicate tasks, two processes) make
// one attempt: the claim in PostgreSQL decides.
func TestDeliverClaimOnce(t *testing.T) {
	f := newFixture(t, 0.0001, time.Second, false)
	b := newBox(t, "es_once", func(_ int, id string, w http.ResponseWriter) {
		time.Sleep(100 * time.Millisecond)
		ack(id, w)
	})
	to := f.agent(t, "A-ONCE", b.srv.URL, "es_once", true)
	id, _ := f.letter(t, "T-ONCE", to)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			// A wake-up beyond the host's turns is deferred, not attempted.
			if err := f.d.Deliver(context.Background(), id); err != nil && !errors.As(err, new(*queue.Deferred)) {
				t.Errorf("Deliver: %v", err)
			}
		})
	}
	wg.Wait()
	if bodies, _, _, acked, _ := b.snapshot(); len(bodies) != 1 || acked != 1 {
		t.Fatalf("%d deliveries for 8 concurrent wake-ups", len(bodies))
	}
	if s, n := f.state(t, id); s != "acked" || n != 1 {
		t.Fatalf("state %s after %d attempts", s, n)
	}
}

// Losing every queued task in Redis mid-ladder loses no letter: the sweep
// finds it due in PostgreSQL.
func TestDeliverRedisFlush(t *testing.T) {
	f := newFixture(t, 0.01, time.Second, true) // attempt 2 is ~1.8 s after attempt 1
	b := newBox(t, "es_flush", func(n int, id string, w http.ResponseWriter) {
		if n == 1 {
			http.Error(w, "down", 500)
			return
		}
		ack(id, w)
	})
	to := f.agent(t, "A-FLUSH", b.srv.URL, "es_flush", true)
	id, _ := f.letter(t, "T-FLUSH", to)

	rdb := kungfutest.Redis(t)
	ctx := context.Background()
	scheduled := "asynq:{" + f.e.QueueOf(kizuna.TaskLetter) + "}:scheduled"
	eventually(t, 10*time.Second, "attempt 2 scheduled in Redis", func() bool { return rdb.ZCard(ctx, scheduled).Val() == 1 })
	// Only this deployment's keys: other tests share the Redis.
	keys, err := rdb.Keys(ctx, "asynq:{"+f.base+"*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys %v: %v", keys, err)
	}
	if err := rdb.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	if rdb.ZCard(ctx, scheduled).Val() != 0 {
		t.Fatal("the scheduled attempt survived the flush")
	}
	eventually(t, 15*time.Second, "acked after the flush", func() bool { s, _ := f.state(t, id); return s == "acked" })
	if _, attempts, _, acked, _ := b.snapshot(); acked != 1 || len(attempts) != 2 {
		t.Fatalf("attempts %v, acked %d", attempts, acked)
	}
}
