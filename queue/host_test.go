package queue_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/kungfu/notify"
	"github.com/dojo-relay/dojo/kungfu/task"
	"github.com/dojo-relay/dojo/queue"
)

// engineOn returns an engine on base, as another process of the same
// deployment would open it.
func engineOn(t *testing.T, base string) *queue.Engine {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := queue.NewEngine(kungfutest.RedisURL(), base, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func mustTake(t *testing.T, h *queue.Hosts, url string, hold time.Duration) *queue.Turn {
	t.Helper()
	turn, err := h.Take(context.Background(), url, hold)
	if err != nil || turn == nil {
		t.Fatalf("Take(%s) = %v, %v; want a turn", url, turn, err)
	}
	return turn
}

// deferred asserts that Take is refused with a *queue.Deferred and returns it.
func mustDefer(t *testing.T, h *queue.Hosts, url string) *queue.Deferred {
	t.Helper()
	turn, err := h.Take(context.Background(), url, time.Minute)
	var d *queue.Deferred
	if turn != nil || !errors.As(err, &d) {
		t.Fatalf("Take(%s) = %v, %v; want a deferral", url, turn, err)
	}
	return d
}

// The turns at a host are shared by every process of a deployment (two
// engines on one base), bounded by Limit, freed by Done once, and by their
// lease when a process never gives them back; other hosts and other
// deployments are not affected.
func TestHostTurns(t *testing.T) {
	t.Parallel()
	base := kungfutest.Queue(t)
	one, two := engineOn(t, base).Hosts(), engineOn(t, base).Hosts()
	for _, h := range []*queue.Hosts{one, two} {
		h.Limit, h.Busy = 2, 100*time.Millisecond
	}
	const url = "https://Hooks.Example.com/a"
	a := mustTake(t, one, url, time.Minute)
	mustTake(t, two, "https://hooks.example.com:443/b", time.Minute) // the same host, spelt otherwise
	d := mustDefer(t, one, url)
	if d.After < 100*time.Millisecond || d.After >= 200*time.Millisecond || !strings.Contains(d.Why, "hooks.example.com:443 is busy") {
		t.Fatalf("deferral %+v", d)
	}
	mustDefer(t, two, url)
	// Another host, and the same host in another deployment, are free.
	mustTake(t, one, "https://hooks.example.com:8443/", time.Minute)
	mustTake(t, one, "http://hooks.example.com/", time.Minute)
	other := engineOn(t, kungfutest.Queue(t)).Hosts()
	mustTake(t, other, url, time.Minute)

	a.Done(context.Background(), queue.Answered)
	a.Done(context.Background(), queue.Answered) // a second Done frees nothing more
	mustTake(t, two, url, time.Second)           // never given back
	mustDefer(t, one, url)
	time.Sleep(1200 * time.Millisecond)
	mustTake(t, one, url, time.Minute) // its lease expired

	// Without Hosts there are no turns and nothing is refused.
	var none *queue.Hosts
	if turn, err := none.Take(context.Background(), url, time.Second); turn != nil || err != nil {
		t.Fatalf("nil Hosts: %v %v", turn, err)
	}
	turn := (*queue.Turn)(nil)
	turn.Done(context.Background(), queue.TimedOut)
}

// A host that times out Trip times in a row is closed for Cooldown, then
// probed one delivery at a time; every timeout of a probe doubles the
// pause, an answer opens the host again. Fast failures change nothing.
func TestHostClosesAfterTimeouts(t *testing.T) {
	t.Parallel()
	base := kungfutest.Queue(t)
	h := engineOn(t, base).Hosts()
	// Pauses of a second leave room for a loaded machine between steps.
	h.Limit, h.Trip, h.Cooldown, h.MaxCooldown, h.Busy = 3, 2, time.Second, 1600*time.Millisecond, 10*time.Millisecond
	ctx := context.Background()
	const url = "https://slow.example.com/"
	mustTake(t, h, url, time.Minute).Done(ctx, queue.TimedOut)
	mustTake(t, h, url, time.Minute).Done(ctx, queue.Unsent) // refused fast: no change
	mustTake(t, h, url, time.Minute).Done(ctx, queue.TimedOut)

	d := mustDefer(t, h, url)
	if d.After < 500*time.Millisecond || d.After > 1020*time.Millisecond || !strings.Contains(d.Why, "closed") {
		t.Fatalf("closed host: %+v", d)
	}
	// Another process sees it closed too.
	mustDefer(t, engineOn(t, base).Hosts(), url)
	mustTake(t, h, "https://fast.example.com/", time.Minute)

	time.Sleep(d.After)
	probe := mustTake(t, h, url, time.Minute)
	if d := mustDefer(t, h, url); strings.Contains(d.Why, "closed") {
		t.Fatalf("while probing the host is busy, not closed: %+v", d)
	}
	probe.Done(ctx, queue.TimedOut)
	d = mustDefer(t, h, url)
	if d.After < 1100*time.Millisecond || d.After > 1620*time.Millisecond {
		t.Fatalf("second pause %v, want 1.6s (doubled, capped)", d.After)
	}
	time.Sleep(d.After)
	mustTake(t, h, url, time.Minute).Done(ctx, queue.Answered)
	for range 3 {
		mustTake(t, h, url, time.Minute) // open again, at the full limit
	}
	mustDefer(t, h, url)
}

// Join, for a delivery made in a caller's request, is let in at a full
// host and counts there, is refused at once at a closed host, and waits
// for the one probe of a host that was closed.
func TestHostJoin(t *testing.T) {
	t.Parallel()
	h := engineOn(t, kungfutest.Queue(t)).Hosts()
	h.Limit, h.Trip, h.Cooldown, h.Busy = 1, 1, time.Second, 10*time.Millisecond
	ctx := context.Background()
	const url = "https://a.example.com/"
	first := mustTake(t, h, url, time.Minute)
	joined, err := h.Join(ctx, url, time.Minute, 5*time.Second)
	if joined == nil || err != nil {
		t.Fatalf("Join at a full host: %v %v", joined, err)
	}
	joined.Done(ctx, queue.Answered)
	first.Done(ctx, queue.Answered)
	second, _ := h.Join(ctx, url, time.Minute, 5*time.Second)
	mustDefer(t, h, url) // background work defers to the joined delivery

	second.Done(ctx, queue.TimedOut) // closed for 1s
	start := time.Now()
	if _, err := h.Join(ctx, url, time.Minute, 5*time.Second); !errors.As(err, new(*queue.Deferred)) || time.Since(start) > 900*time.Millisecond {
		t.Fatalf("Join at a closed host: %v after %v", err, time.Since(start))
	}
	time.Sleep(1050 * time.Millisecond)
	probe := mustTake(t, h, url, time.Minute)
	time.AfterFunc(300*time.Millisecond, func() { probe.Done(ctx, queue.Answered) })
	start = time.Now()
	if turn, err := h.Join(ctx, url, time.Minute, 5*time.Second); turn == nil || err != nil {
		t.Fatalf("Join behind a probe: %v %v", turn, err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 2*time.Second {
		t.Fatalf("Join behind a probe took %v, want about 300ms", d)
	}
}

// A deferral runs the task again without counting a try: the retry limit
// and the retry count the handler sees are those of real failures.
func TestDeferralIsNotATry(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	var (
		runs    atomic.Int32
		mu      sync.Mutex
		retried []int
	)
	e.Handle("busy", func(ctx context.Context, id int64) error {
		if runs.Add(1) <= 4 {
			return &queue.Deferred{After: 20 * time.Millisecond, Why: "host busy"}
		}
		n, _ := asynq.GetRetryCount(ctx)
		mu.Lock()
		retried = append(retried, n)
		mu.Unlock()
		return errors.New("answered 500")
	})
	e.Retry("busy", 1, func(int) time.Duration { return 20 * time.Millisecond })
	if err := e.Enqueue(context.Background(), "busy", 1, time.Time{}); err != nil {
		t.Fatal(err)
	}
	run(t, e)
	eventually(t, 10*time.Second, "four deferrals and two tries", func() bool { return runs.Load() == 6 })
	time.Sleep(time.Second)
	mu.Lock()
	defer mu.Unlock()
	if runs.Load() != 6 || len(retried) != 2 || retried[0] != 0 || retried[1] != 1 {
		t.Fatalf("%d runs, real tries saw retry counts %v; want 6 runs and [0 1]", runs.Load(), retried)
	}
}

// Each task type has workers of its own: a kind stuck on a slow target
// fills only its own, and another kind runs at once.
func TestKindsHaveTheirOwnWorkers(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	release := make(chan struct{})
	var running, most atomic.Int32
	e.Handle("slow", func(ctx context.Context, id int64) error {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		defer running.Add(-1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	e.Workers("slow", 3)
	ran := make(chan time.Time, 1)
	e.Handle("fast", func(ctx context.Context, id int64) error { ran <- time.Now(); return nil })
	ctx := context.Background()
	for id := range int64(20) {
		if err := e.Enqueue(ctx, "slow", id, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	run(t, e)
	defer close(release)
	eventually(t, 5*time.Second, "the slow kind's workers busy", func() bool { return running.Load() == 3 })
	start := time.Now()
	if err := e.Enqueue(ctx, "fast", 1, time.Time{}); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-ran:
		if d := at.Sub(start); d > time.Second {
			t.Fatalf("the fast kind waited %v", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the fast kind never ran while the slow kind was stuck")
	}
	if most.Load() != 3 {
		t.Fatalf("%d slow tasks ran at once, want 3", most.Load())
	}
	if q := e.QueueOf("slow"); q != e.Queue()+":slow" {
		t.Fatalf("queue of slow: %q", q)
	}
}

// A push deferred at a busy host is made later and is not a try: PostgreSQL
// counts no attempt until the endpoint was actually asked.
func TestPushWaitsForAHostTurn(t *testing.T) {
	t.Parallel()
	s := newStack(t, http.StatusNoContent, time.Minute)
	h := s.notifier.Hosts
	var held []*queue.Turn
	for range queue.DefaultHostLimit {
		held = append(held, mustTake(t, h, s.ep.URL, time.Minute))
	}
	id := s.emit(t, notify.KindReply)
	s.notifier.Enqueue(context.Background(), id)
	time.Sleep(2 * time.Second) // several deferrals
	var attempts int
	if err := s.db.QueryRow(context.Background(), `SELECT attempts FROM notify_outbox WHERE id = $1`, id).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if n := len(s.ep.received()); n != 0 || attempts != 0 {
		t.Fatalf("at a full host: %d pushes, %d attempts counted", n, attempts)
	}
	for _, turn := range held {
		turn.Done(context.Background(), queue.Answered)
	}
	eventually(t, 10*time.Second, "the push once a turn is free", func() bool { return len(s.ep.received()) == 1 })
	s.checkSigned(t, id, s.ep.received()[0])
}

// A first POST is made at a full host, but not at a closed one, where it
// is reported as sent without an answer (so the submission goes up the
// ladder); a redelivery waits for its turn before the domain counts it,
// and uses that turn.
func TestReceiverTurns(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Write([]byte(`{"accepted":true}`))
	}))
	t.Cleanup(srv.Close)
	allow, _ := queue.ParseAllow("127.0.0.0/8")
	hosts := engineOn(t, kungfutest.Queue(t)).Hosts()
	hosts.Limit, hosts.Trip, hosts.Cooldown = 1, 1, time.Minute
	r := &queue.Receivers{Client: queue.NewOutbound(allow, nil), Hosts: hosts, Wait: 300 * time.Millisecond}
	ctx := context.Background()
	d := task.Delivery{SubmissionID: 7, TaskCode: "T-1", URL: srv.URL + "/judge", Body: []byte(`{}`)}

	// A full host: the first POST is made all the same (the agent waits
	// for it; it holds no worker).
	turn := mustTake(t, hosts, d.URL, time.Minute)
	if out := r.Deliver(ctx, d); out.Status != 200 || hits.Load() != 1 {
		t.Fatalf("full host: %+v, %d hits", out, hits.Load())
	}

	// Paced: no turn, no attempt; with one, the attempt is made and the
	// turn given back.
	var calls atomic.Int32
	target := func(context.Context, int64) (string, error) { return d.URL, nil }
	redeliver := r.Paced(target, func(ctx context.Context, id int64) error {
		calls.Add(1)
		if out := r.Deliver(ctx, d); out.Status != 200 {
			return errors.New("not delivered: " + out.Err.Error())
		}
		return nil
	})
	err := redeliver(ctx, 7)
	if !errors.As(err, new(*queue.Deferred)) || calls.Load() != 0 {
		t.Fatalf("busy host: %v, %d calls", err, calls.Load())
	}
	turn.Done(ctx, queue.Answered)
	if err := redeliver(ctx, 7); err != nil || calls.Load() != 1 || hits.Load() != 2 {
		t.Fatalf("free host: %v, %d calls, %d hits", err, calls.Load(), hits.Load())
	}
	mustTake(t, hosts, d.URL, time.Minute).Done(ctx, queue.Answered) // Deliver gave its turn back
	notDue := r.Paced(func(context.Context, int64) (string, error) { return "", nil }, func(context.Context, int64) error {
		t.Error("redelivered a submission that is not due")
		return nil
	})
	if err := notDue(ctx, 8); err != nil {
		t.Fatal(err)
	}

	// A host that timed out is closed: the first POST is not sent, and
	// reported as sent without an answer, so the ladder takes it up.
	mustTake(t, hosts, d.URL, time.Minute).Done(ctx, queue.TimedOut)
	start := time.Now()
	if out := r.Deliver(ctx, d); !out.Sent || out.Status != 0 || !strings.Contains(out.Err.Error(), "closed") || time.Since(start) > 200*time.Millisecond {
		t.Fatalf("closed host: %+v after %v", out, time.Since(start))
	}
	if hits.Load() != 2 {
		t.Fatalf("%d hits", hits.Load())
	}
}
