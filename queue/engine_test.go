package queue_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/queue"
)

type calls struct {
	mu  sync.Mutex
	ids []int64
	at  []time.Time
}

func (c *calls) add(id int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ids = append(c.ids, id)
	c.at = append(c.at, time.Now())
}

func (c *calls) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ids)
}

func TestEnqueueRunsOnceAndDedupes(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	var got calls
	e.Handle("ping", func(ctx context.Context, id int64) error { got.add(id); return nil })
	e.Handle("ping-other", func(ctx context.Context, id int64) error { got.add(-id); return nil })
	ctx := context.Background()
	for range 3 {
		if err := e.Enqueue(ctx, "ping", 7, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Enqueue(ctx, "ping-other", 7, time.Time{}); err != nil {
		t.Fatal(err)
	}
	run(t, e)
	eventually(t, 5*time.Second, "two runs", func() bool { return got.n() == 2 })
	// While the completed task is retained its id still dedupes.
	if err := e.Enqueue(ctx, "ping", 7, time.Time{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	got.mu.Lock()
	defer got.mu.Unlock()
	if len(got.ids) != 2 || got.ids[0]+got.ids[1] != 0 {
		t.Fatalf("runs: %v, want 7 and -7 once each", got.ids)
	}
}

func TestEnqueueScheduled(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	var got calls
	e.Handle("later", func(ctx context.Context, id int64) error { got.add(id); return nil })
	run(t, e)
	at := time.Now().Add(1500 * time.Millisecond)
	if err := e.Enqueue(context.Background(), "later", 1, at); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(at) - 300*time.Millisecond)
	if got.n() != 0 {
		t.Fatal("scheduled task ran early")
	}
	eventually(t, 5*time.Second, "scheduled run", func() bool { return got.n() == 1 })
	if ran := got.at[0]; ran.Before(at) || ran.After(at.Add(2*time.Second)) {
		t.Fatalf("ran at %v, scheduled for %v", ran, at)
	}
}

func TestRetryAndGiveUp(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	var flaky, failing atomic.Int32
	e.Handle("flaky", func(ctx context.Context, id int64) error {
		if flaky.Add(1) < 3 {
			return errors.New("not yet")
		}
		return fmt.Errorf("row %d abandoned: %w", id, queue.ErrGiveUp)
	})
	e.Retry("flaky", 10, func(int) time.Duration { return 10 * time.Millisecond })
	e.Handle("failing", func(ctx context.Context, id int64) error {
		failing.Add(1)
		return errors.New("always")
	})
	e.Retry("failing", 2, func(int) time.Duration { return 10 * time.Millisecond })
	ctx := context.Background()
	if err := e.Enqueue(ctx, "flaky", 1, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := e.Enqueue(ctx, "failing", 1, time.Time{}); err != nil {
		t.Fatal(err)
	}
	run(t, e)
	eventually(t, 10*time.Second, "give up and retries exhausted", func() bool {
		return flaky.Load() == 3 && failing.Load() == 3
	})
	time.Sleep(1500 * time.Millisecond)
	if flaky.Load() != 3 || failing.Load() != 3 {
		t.Fatalf("flaky ran %d times (want 3: ErrGiveUp stops), failing %d (want 1+2 retries)", flaky.Load(), failing.Load())
	}
	// An archived task does not block the row from being enqueued again:
	// PostgreSQL, not Redis, decides whether work is due.
	if err := e.Enqueue(ctx, "failing", 1, time.Time{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "re-enqueued archived task", func() bool { return failing.Load() == 6 })
}

func TestEvery(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	var n atomic.Int32
	e.Every("tick", 100*time.Millisecond, func(ctx context.Context) error {
		n.Add(1)
		return errors.New("logged, not fatal")
	})
	run(t, e)
	eventually(t, 5*time.Second, "four ticks", func() bool { return n.Load() >= 4 })
}

func TestRunStopsOnCancel(t *testing.T) {
	t.Parallel()
	e := newEngine(t)
	started := make(chan struct{})
	var finished atomic.Bool
	e.Handle("slow", func(ctx context.Context, id int64) error {
		close(started)
		time.Sleep(300 * time.Millisecond)
		finished.Store(true)
		return nil
	})
	var ticks atomic.Int32
	e.Every("tick", 50*time.Millisecond, func(ctx context.Context) error { ticks.Add(1); return nil })
	if err := e.Enqueue(context.Background(), "slow", 1, time.Time{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("task did not start")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	if !finished.Load() {
		t.Fatal("Run returned before the running task finished")
	}
	after := ticks.Load()
	time.Sleep(200 * time.Millisecond)
	if ticks.Load() != after || after == 0 {
		t.Fatalf("ticks %d then %d: loops must stop with Run", after, ticks.Load())
	}
}

func TestEngineErrors(t *testing.T) {
	t.Parallel()
	if _, err := queue.NewEngine(kungfutest.RedisURL(), "bad{name}", nil); err == nil {
		t.Error("queue name with braces accepted")
	}
	if _, err := queue.NewEngine("http://nope", "q", nil); err == nil {
		t.Error("non-redis URL accepted")
	}
	e, err := queue.NewEngine("redis://127.0.0.1:1/0", "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.Run(ctx); err == nil {
		t.Error("Run with unreachable Redis returned nil")
	}
}

// TestEveryHoldsBackRepeats: while Redis is down every sweep fails, and
// each failure used to be one warning per sweep for the whole outage.
func TestEveryHoldsBackRepeats(t *testing.T) {
	t.Parallel()
	var buf kungfutest.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := queue.NewEngine(kungfutest.RedisURL(), kungfutest.Queue(t), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	var n atomic.Int32
	e.Every("sweep", 20*time.Millisecond, func(ctx context.Context) error {
		n.Add(1)
		return fmt.Errorf("enqueue row %d: redis down", n.Load())
	})
	run(t, e)
	eventually(t, 10*time.Second, "60 failed sweeps", func() bool { return n.Load() >= 60 })
	lines := strings.Count(buf.String(), "periodic job failed")
	// 60 sweeps at 20 ms take at least 1.2 s: logged at 0 s and 1 s, maybe
	// at 3 s on a slow machine; never once per sweep.
	if lines < 1 || lines > 3 {
		t.Fatalf("%d warnings for %d failed sweeps:\n%s", lines, n.Load(), buf.String())
	}
}
