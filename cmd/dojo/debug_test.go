package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
)

// TestDebugAddress: the profiles are served on DOJO_DEBUG_ADDR only, never
// on the public address.
func TestDebugAddress(t *testing.T) {
	t.Parallel()
	debug := freeAddr(t)
	s := startServe(t, map[string]string{"DATABASE_URL": kungfutest.DatabaseURL(t), "REDIS_URL": kungfutest.RedisURL(),
		"DOJO_REDIS_PREFIX": kungfutest.RedisPrefix(t), "DOJO_DEBUG_ADDR": debug})
	get := func(u string) (int, string) {
		t.Helper()
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, p := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline"} {
		if code, _ := get(s.base + p); code != http.StatusNotFound {
			t.Errorf("public address answered %s with %d, want 404", p, code)
		}
	}
	if code, body := get("http://" + debug + "/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Fatalf("debug address: %d %.200s", code, body)
	}
	if code, body := get("http://" + debug + "/debug/pprof/goroutine?debug=1"); code != http.StatusOK || !strings.Contains(body, "goroutine profile") {
		t.Fatalf("debug goroutines: %d %.200s", code, body)
	}
	stopGracefully(t, s)
}
