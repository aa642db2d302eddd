package relay_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/relay"
)

func TestRateLimitPerIP(t *testing.T) {
	t.Parallel()
	d := start(t, withLimits("register=2/1h"))
	reg := func(name, ip string) result {
		return d.call(t, "", "account_register", map[string]any{"name": name, "password": "secret1"}, "X-Forwarded-For", ip)
	}
	if !reg("limit_one", "203.0.113.7").ok() || !reg("limit_two", "203.0.113.7").ok() {
		t.Fatal("registrations under the limit were refused")
	}
	r := reg("limit_three", "203.0.113.7")
	expect(t, r, 429, "RATE_LIMIT")
	ra, _ := r.Body["retry_after"].(float64)
	if r.Body["next_action"] != "wait" || ra < 3500 || ra > 3600 {
		t.Fatalf("rate limit envelope: %s", r.Raw)
	}
	if h, _ := strconv.Atoi(r.Header.Get("Retry-After")); h != int(ra) {
		t.Fatalf("Retry-After header %q, body %v", r.Header.Get("Retry-After"), ra)
	}
	// The refused call changed nothing, and another address is not affected.
	if !reg("limit_three", "198.51.100.9").ok() {
		t.Fatal("another client IP was limited")
	}
}

func TestRateLimitPerAccountAndWindow(t *testing.T) {
	t.Parallel()
	d := start(t, withLimits("get=2/2s"))
	key, _ := d.register(t)
	other, _ := d.register(t)
	code := d.call(t, key, "memory_put", putArgs()).str("code")
	for range 2 {
		if r := d.call(t, key, "memory_get", map[string]any{"code": code}); !r.ok() {
			t.Fatalf("under limit: %s", r.Raw)
		}
	}
	expect(t, d.call(t, key, "memory_get", map[string]any{"code": code}), 429, "RATE_LIMIT")
	// Another account has its own window.
	expect(t, d.call(t, other, "memory_get", map[string]any{"code": code}), 403, "PRIVATE_KUNGFU")
	time.Sleep(2100 * time.Millisecond)
	if r := d.call(t, key, "memory_get", map[string]any{"code": code}); !r.ok() {
		t.Fatalf("after the window slid: %s", r.Raw)
	}
}

func TestParseLimits(t *testing.T) {
	l, err := relay.ParseLimits("push=3/1m, get=10/30s")
	if err != nil || l["push"] != (relay.Rule{Limit: 3, Window: time.Minute}) || l["get"].Window != 30*time.Second || l["register"].Limit != 5 {
		t.Fatalf("ParseLimits: %v %v", l, err)
	}
	if off, _ := relay.ParseLimits("off"); len(off) != 0 {
		t.Fatalf("off: %v", off)
	}
	for _, bad := range []string{"push", "push=3", "push=x/1m", "push=3/soon", "push=-1/1m"} {
		if _, err := relay.ParseLimits(bad); err == nil {
			t.Errorf("ParseLimits(%q) accepted", bad)
		}
	}
}

// newLimiter is a Limiter of t's own on the shared Redis.
func newLimiter(t *testing.T, prefix string, rules map[string]relay.Rule) *relay.Limiter {
	t.Helper()
	return &relay.Limiter{Redis: kungfutest.Redis(t), Prefix: prefix, Rules: rules}
}

// TestLimiterExactUnderConcurrency: checks from many requests travel in
// shared pipelines and scripts, from two processes at once, and still
// exactly Limit hits are allowed; every refusal says how long to wait.
func TestLimiterExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	prefix := kungfutest.RedisPrefix(t)
	rules := map[string]relay.Rule{"get": {Limit: 50, Window: time.Minute}, "list": {Limit: 7, Window: time.Minute}}
	a, b := newLimiter(t, prefix, rules), newLimiter(t, prefix, rules)
	var allowed, refused, others atomic.Int32
	var wg sync.WaitGroup
	for i := range 400 {
		l := a
		if i%2 == 1 {
			l = b
		}
		wg.Go(func() {
			// A second subject and a second action share the batches
			// and keep counts of their own.
			if i%4 == 0 {
				if wait, err := l.Allow(t.Context(), "list", "a2"); err != nil {
					t.Error(err)
				} else if wait == 0 {
					others.Add(1)
				}
				return
			}
			wait, err := l.Allow(t.Context(), "get", "a1")
			switch {
			case err != nil:
				t.Error(err)
			case wait == 0:
				allowed.Add(1)
			case wait > time.Minute:
				t.Errorf("wait %s is longer than the window", wait)
			default:
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 50 || refused.Load() != 250 || others.Load() != 7 {
		t.Fatalf("allowed %d, refused %d, other subject allowed %d; want 50, 250, 7", allowed.Load(), refused.Load(), others.Load())
	}
}

// TestLimiterWindowSlides: a refused hit is not counted, and a hit is
// allowed again as soon as the oldest one leaves the window.
func TestLimiterWindowSlides(t *testing.T) {
	t.Parallel()
	l := newLimiter(t, kungfutest.RedisPrefix(t), map[string]relay.Rule{"get": {Limit: 2, Window: 700 * time.Millisecond}, "none": {Limit: 0, Window: time.Hour}})
	ctx := t.Context()
	for i := range 2 {
		if wait, err := l.Allow(ctx, "get", "s"); wait != 0 || err != nil {
			t.Fatalf("hit %d: %s %v", i, wait, err)
		}
	}
	wait, err := l.Allow(ctx, "get", "s")
	if err != nil || wait <= 0 || wait > 700*time.Millisecond {
		t.Fatalf("third hit: %s %v", wait, err)
	}
	time.Sleep(wait + 20*time.Millisecond)
	if wait, err := l.Allow(ctx, "get", "s"); wait != 0 || err != nil {
		t.Fatalf("after the oldest left: %s %v", wait, err)
	}
	// An action without a rule is never limited; a limit of 0 always is,
	// without asking Redis.
	if wait, err := l.Allow(ctx, "unknown", "s"); wait != 0 || err != nil {
		t.Fatalf("no rule: %s %v", wait, err)
	}
	if wait, err := l.Allow(ctx, "none", "s"); wait != time.Hour || err != nil {
		t.Fatalf("limit 0: %s %v", wait, err)
	}
}

// TestLimiterCallerGone: a check whose caller has gone charges nothing.
func TestLimiterCallerGone(t *testing.T) {
	t.Parallel()
	l := newLimiter(t, kungfutest.RedisPrefix(t), map[string]relay.Rule{"get": {Limit: 1, Window: time.Minute}})
	gone, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := l.Allow(gone, "get", "s"); err == nil {
		t.Fatal("a cancelled check was judged")
	}
	if wait, err := l.Allow(t.Context(), "get", "s"); wait != 0 || err != nil {
		t.Fatalf("the cancelled check was charged: %s %v", wait, err)
	}
}

// TestLimiterScriptFlushed: a Redis that lost its scripts (restarted,
// SCRIPT FLUSH) answers NOSCRIPT; the batch goes again once, and counts
// once. The Redis is the test's own, so no other test sees the flush.
func TestLimiterScriptFlushed(t *testing.T) {
	t.Parallel()
	url, _ := privateRedis(t)
	c := redisAt(t, url)
	l := &relay.Limiter{Redis: c, Prefix: "t:", Rules: map[string]relay.Rule{"get": {Limit: 3, Window: time.Minute}}}
	ctx := t.Context()
	for i := range 3 {
		if i > 0 {
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if wait, err := l.Allow(ctx, "get", "s"); wait != 0 || err != nil {
			t.Fatalf("hit %d after a flush: %s %v", i, wait, err)
		}
	}
	if wait, _ := l.Allow(ctx, "get", "s"); wait == 0 {
		t.Fatal("a hit counted twice or not at all: the fourth was allowed")
	}
}

// TestLimiterDropsOldHits: more hits than one trim takes leave the window
// at once; the next check still sees an empty window, and a key holds no
// more than about its window's hits however long it is used.
func TestLimiterDropsOldHits(t *testing.T) {
	t.Parallel()
	prefix := kungfutest.RedisPrefix(t)
	l := newLimiter(t, prefix, map[string]relay.Rule{"get": {Limit: 40, Window: 300 * time.Millisecond}, "list": {Limit: 1000, Window: 200 * time.Millisecond}})
	ctx := t.Context()
	for round := range 2 {
		for i := range 40 {
			if wait, err := l.Allow(ctx, "get", "s"); wait != 0 || err != nil {
				t.Fatalf("round %d, hit %d: %s %v", round, i, wait, err)
			}
		}
		wait, err := l.Allow(ctx, "get", "s")
		if err != nil || wait <= 0 || wait > 300*time.Millisecond {
			t.Fatalf("round %d, hit 41: %s %v", round, wait, err)
		}
		time.Sleep(wait + 20*time.Millisecond)
	}
	// Far under its limit, a key is still trimmed as it goes.
	for range 60 {
		for range 10 {
			if wait, err := l.Allow(ctx, "list", "s"); wait != 0 || err != nil {
				t.Fatalf("list: %s %v", wait, err)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	n, err := l.Redis.LLen(ctx, prefix+"rlq:list:s").Result()
	if err != nil || n > 400 {
		t.Fatalf("the window holds %d hits (%v); about 200 were made in its last 200 ms", n, err)
	}
}

// TestLimiterStalledRedis: a Redis that stops answering holds no check
// much past checkTimeout (5 s), however many are queued behind the stalled
// pipeline; each is refused as unavailable, and checks judge again as soon
// as Redis answers.
func TestLimiterStalledRedis(t *testing.T) {
	t.Parallel()
	url, _ := privateRedis(t)
	c, admin := redisAt(t, url), redisAt(t, url)
	l := &relay.Limiter{Redis: c, Prefix: "t:", Rules: map[string]relay.Rule{"get": {Limit: 100, Window: time.Minute}}}
	ctx := t.Context()
	if wait, err := l.Allow(ctx, "get", "s"); wait != 0 || err != nil {
		t.Fatalf("before the stall: %s %v", wait, err)
	}
	// Redis answers nobody, not even CLIENT UNPAUSE, until the pause ends.
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "7000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 6 {
		time.Sleep(300 * time.Millisecond)
		wg.Go(func() {
			start := time.Now()
			_, err := l.Allow(ctx, "get", "s")
			if took := time.Since(start); err == nil || took > 7*time.Second {
				t.Errorf("check %d during the stall: %v after %s", i, err, took)
			}
		})
	}
	wg.Wait()
	start := time.Now()
	for time.Since(start) < 10*time.Second {
		if wait, err := l.Allow(ctx, "get", "s"); err == nil && wait == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("checks were not judged again after the stall")
}

// redisAt is a client of the Redis at url, closed when t ends.
func redisAt(t *testing.T, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}
