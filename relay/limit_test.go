package relay_test

import (
	"strconv"
	"testing"
	"time"

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
