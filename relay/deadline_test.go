package relay_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/relay"
)

// shiftClock is the wall clock moved by an adjustable offset.
type shiftClock struct{ offset atomic.Int64 }

func (c *shiftClock) now() time.Time {
	return time.Now().UTC().Add(time.Duration(c.offset.Load())).Truncate(time.Microsecond)
}
func (c *shiftClock) set(d time.Duration) { c.offset.Store(int64(d)) }

func withClock(c kungfu.Clock) option  { return func(o *relay.Options) { o.Clock = c } }
func withSweep(d time.Duration) option { return func(o *relay.Options) { o.Sweep = d } }

// flushQueue drops every asynq key of this server's queue: Redis "lost"
// every scheduled wake-up.
func flushQueue(t *testing.T, d *dojo) {
	t.Helper()
	ctx := context.Background()
	// One queue per task type, each named <base>:<type>.
	keys, err := d.App.Redis.Keys(ctx, "asynq:{"+d.App.Engine.Queue()+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) == 0 {
		t.Fatal("no queue keys to flush: the wake-up was never scheduled")
	}
	if err := d.App.Redis.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
}

func assignState(t *testing.T, d *dojo, key, room string, assign int64) string {
	t.Helper()
	v := d.must(t, key, "thread_get", map[string]any{"thread": room, "assignments": []any{assign}})
	for _, x := range v.Body["assignments"].([]any) {
		if m := x.(map[string]any); int64(m["id"].(float64)) == assign {
			return m["state"].(string)
		}
	}
	t.Fatalf("assignment %d not in the room", assign)
	return ""
}

func waitState(t *testing.T, d *dojo, key, room string, assign int64, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := assignState(t, d, key, room, assign)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("assignment %d is %s after %v, want %s", assign, got, within, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pair starts a two-member room and returns creator key, assignee key and
// assignee name.
func pair(t *testing.T, d *dojo) (room, boss, worker, workerName string) {
	t.Helper()
	boss, _ = d.register(t)
	worker, workerName = d.register(t)
	st := d.must(t, boss, "thread_start", map[string]any{"subject": "deadlines", "key": true})
	room = st.Body["thread"].(map[string]any)["code"].(string)
	d.must(t, worker, "thread_join", map[string]any{"key": st.str("key")})
	return
}

func newAssign(t *testing.T, d *dojo, boss, room, to string) int64 {
	t.Helper()
	r := d.must(t, boss, "thread_post", map[string]any{"thread": room, "content": "do it", "ask": []string{},
		"assign": map[string]any{"to": to, "requirements": "do it", "deliver_due": 60, "judge_due": 60}})
	return int64(r.Body["assign"].(map[string]any)["id"].(float64))
}

// The PostgreSQL sweep times out overdue work even when Redis lost every
// wake-up; the deadline also wins over an action in flight, and the item
// leaves the turn at its deadline before anything is recorded.
func TestDeadlinesSurviveRedisFlush(t *testing.T) {
	t.Parallel()
	clock := &shiftClock{}
	d := start(t, withClock(clock.now), withSweep(100*time.Millisecond))
	room, boss, worker, wname := pair(t, d)

	late := newAssign(t, d, boss, room, wname)
	d.must(t, worker, "assign_take", map[string]any{"assign": late})
	judged := newAssign(t, d, boss, room, wname)
	d.must(t, worker, "assign_take", map[string]any{"assign": judged, "payload": map[string]any{"ok": true}})
	expectTurn(t, d, "worker", worker, fmt.Sprintf("deliver:%d", late))
	expectTurn(t, d, "boss", boss, fmt.Sprintf("judge:%d", judged))
	flushQueue(t, d)

	clock.set(61 * time.Second)
	expectTurn(t, d, "worker", worker)
	expectTurn(t, d, "boss", boss)
	waitState(t, d, boss, room, late, "timed_out", 5*time.Second)
	waitState(t, d, boss, room, judged, "undecided", 5*time.Second)
	expect(t, d.call(t, worker, "assign_submit", map[string]any{"assign": late, "payload": map[string]any{"x": 1}}), 409, "INVALID_STATE")
	expect(t, d.call(t, boss, "assign_judge", map[string]any{"assign": judged, "verdict": "adopt"}), 409, "INVALID_STATE")
}

// A deadline passed but not yet swept: the action in flight loses, and the
// refusal records the timeout itself.
func TestDeadlineBeatsInFlightAction(t *testing.T) {
	t.Parallel()
	clock := &shiftClock{}
	d := start(t, withClock(clock.now), withSweep(time.Hour))
	room, boss, worker, wname := pair(t, d)
	a := newAssign(t, d, boss, room, wname)
	d.must(t, worker, "assign_take", map[string]any{"assign": a})
	clock.set(60 * time.Second)
	r := d.call(t, worker, "assign_submit", map[string]any{"assign": a, "payload": map[string]any{"x": 1}})
	expect(t, r, 409, "INVALID_STATE")
	if s := assignState(t, d, boss, room, a); s != "timed_out" {
		t.Fatalf("state %s, want timed_out", s)
	}
	b := newAssign(t, d, boss, room, wname)
	d.must(t, worker, "assign_take", map[string]any{"assign": b, "payload": map[string]any{"x": 1}})
	clock.set(121 * time.Second)
	expect(t, d.call(t, boss, "assign_judge", map[string]any{"assign": b, "verdict": "reject", "reason": "late"}), 409, "INVALID_STATE")
	if s := assignState(t, d, boss, room, b); s != "undecided" {
		t.Fatalf("state %s, want undecided", s)
	}
}

// With the sweep effectively off, the asynq wake-up scheduled at the due
// time is what records the timeout.
func TestDeadlineWakeUp(t *testing.T) {
	t.Parallel()
	clock := &shiftClock{}
	d := start(t, withClock(clock.now), withSweep(time.Hour))
	room, boss, worker, wname := pair(t, d)
	a := newAssign(t, d, boss, room, wname)
	clock.set(-59 * time.Second) // the deliver clock (60 s) ends one second from now
	d.must(t, worker, "assign_take", map[string]any{"assign": a})
	clock.set(0)
	waitState(t, d, boss, room, a, "timed_out", 10*time.Second)
}
