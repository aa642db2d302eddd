package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
)

// TestBenchSmoke runs `dojo bench` for a few hundred milliseconds per
// window against two real `dojo serve` processes on one database, limits
// on and off, and checks that every row of the table is there with sane
// figures. It asserts no threshold: CI machines differ too much.
func TestBenchSmoke(t *testing.T) {
	t.Parallel()
	dsn := kungfutest.DatabaseURL(t)
	shared := map[string]string{"DATABASE_URL": dsn, "REDIS_URL": kungfutest.RedisURL(),
		"DOJO_REDIS_PREFIX": kungfutest.RedisPrefix(t), "DOJO_QUEUE": kungfutest.Queue(t),
		"DOJO_ALLOW_TARGETS": "127.0.0.1", "DOJO_DB_MAX_CONNS": "8"}
	with := func(limits string) map[string]string {
		env := map[string]string{"DOJO_RATE_LIMITS": limits}
		for k, v := range shared {
			env[k] = v
		}
		return env
	}
	on, off := startServe(t, with(benchLimits)), startServe(t, with("off"))

	// Each run gets its own bound: on a busy CI machine the fsynced
	// baseline alone can crawl, and three runs must not share one minute.
	run := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 2*time.Minute)
	}
	ctx, cancel := run()
	defer cancel()
	var out bytes.Buffer
	err := bench(ctx, &out, []string{"--url", on.base, "--unlimited-url", off.base, "--database-url", dsn,
		"--duration", "300ms", "--warmup", "0s", "-c", "4"})
	if err != nil {
		t.Fatalf("bench: %v\n%s\n%s\n%s", err, out.String(), on.out.String(), off.out.String())
	}
	text := out.String()
	t.Log("\n" + text)
	for _, name := range []string{"raw INSERT, fsynced", "memory_get HTTP JSON, c=4", "memory_get MCP tools/call",
		"thread_post, own rooms", "work_submit → settled, one task per client", "limits off", "limits on"} {
		line := lineWith(text, name)
		if line == "" {
			t.Errorf("no row %q in:\n%s", name, text)
			continue
		}
		// The second column is ops/s: more than zero, and not absurd
		// for a loopback server on a test machine.
		f := strings.Fields(line[strings.Index(line, name)+len(name):])
		for len(f) > 0 && !isNumber(f[0]) {
			f = f[1:]
		}
		if len(f) < 3 {
			t.Errorf("row %q has no figures: %q", name, line)
			continue
		}
		ops, _ := strconv.ParseFloat(f[0], 64)
		p50, _ := strconv.ParseFloat(f[1], 64)
		p99, _ := strconv.ParseFloat(f[2], 64)
		if ops <= 0 || ops > 1e6 || p50 <= 0 || p99 < p50 {
			t.Errorf("row %q: ops/s %v, p50 %v ms, p99 %v ms", name, ops, p50, p99)
		}
	}
	if !strings.Contains(text, "× HTTP") || !strings.Contains(text, "% vs off") {
		t.Errorf("ratios missing:\n%s", text)
	}
	// The scratch table is gone; the bench's accounts stay, and the money
	// it granted went through the ledger.
	out.Reset()
	if err := check(ctx, &out, config{DatabaseURL: dsn}, nil); err != nil {
		t.Fatalf("dojo check after the bench: %v\n%s", err, out.String())
	}

	// Markdown, for docs/performance.md, and a refusal that says what to fix.
	out.Reset()
	ctx, cancel = run()
	defer cancel()
	if err := bench(ctx, &out, []string{"--url", on.base, "--database-url", dsn, "--duration", "50ms", "--warmup", "0s", "-c", "2", "--markdown"}); err != nil {
		t.Fatalf("bench --markdown: %v", err)
	}
	if md := out.String(); !strings.Contains(md, "| workload | ops/s |") || !strings.Contains(md, "skipped: no --unlimited-url") {
		t.Errorf("markdown:\n%s", md)
	}
	// --only measures the rows named, and refuses a name it does not know.
	out.Reset()
	ctx, cancel = run()
	defer cancel()
	if err := bench(ctx, &out, []string{"--url", on.base, "--unlimited-url", off.base, "--database-url", dsn, "--duration", "50ms", "--warmup", "0s", "-c", "2", "--only", "get"}); err != nil {
		t.Fatalf("bench --only get: %v", err)
	}
	if text := out.String(); lineWith(text, "memory_get HTTP JSON, c=2") == "" || lineWith(text, "thread_post") != "" ||
		lineWith(text, "MCP") != "" || !strings.Contains(text, "skipped: not in --only") {
		t.Errorf("bench --only get:\n%s", text)
	}
	if err := bench(ctx, &out, []string{"--url", on.base, "--database-url", dsn, "--only", "get,nope"}); err == nil || !strings.Contains(err.Error(), `unknown row "nope"`) {
		t.Errorf("bench --only nope: %v", err)
	}
	err = bench(ctx, &out, []string{"--url", off.base, "--database-url", kungfutest.DatabaseURL(t), "--duration", "50ms", "-c", "1"})
	if err == nil || !strings.Contains(err.Error(), "is not in --database-url") {
		t.Errorf("bench against another database: %v", err)
	}
}

func lineWith(text, s string) string {
	for line := range strings.SplitSeq(text, "\n") {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}

func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

// TestWireClient checks the measured windows' HTTP client against a real
// net/http server: headers sent, bodies read whole whether sized or
// chunked, and a connection the server closes is dialled again.
func TestWireClient(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.Header.Get("Authorization") != "Bearer k1" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "bad request line or headers", http.StatusBadRequest)
			return
		}
		switch r.URL.Path {
		case "/base/mcp":
			if r.Header.Get("Mcp-Protocol-Version") == "" || !strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
				http.Error(w, "no MCP headers", http.StatusBadRequest)
				return
			}
			_, _ = w.Write(body)
		case "/base/chunked":
			for range 3 {
				_, _ = w.Write([]byte(strings.Repeat("x", 4096)))
				w.(http.Flusher).Flush()
			}
		case "/base/close":
			w.Header().Set("Connection", "close")
			_, _ = w.Write([]byte("bye"))
		default:
			w.WriteHeader(http.StatusTeapot)
			_, _ = w.Write(body)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	wc := newWireClient()
	defer wc.close()
	ctx := context.Background()
	base := srv.URL + "/base"

	raw, status, err := wc.post(ctx, 0, base, "/mcp", "k1", []byte(`{"a":1}`), true)
	if err != nil || status != http.StatusOK || string(raw) != `{"a":1}` {
		t.Fatalf("mcp: %d %q %v", status, raw, err)
	}
	raw, status, err = wc.post(ctx, 0, base, "/other", "k1", []byte(`{}`), false)
	if err != nil || status != http.StatusTeapot || string(raw) != `{}` {
		t.Fatalf("other: %d %q %v", status, raw, err)
	}
	raw, status, err = wc.post(ctx, 0, base, "/chunked", "k1", nil, false)
	if err != nil || status != http.StatusOK || len(raw) != 3*4096 {
		t.Fatalf("chunked: %d, %d bytes, %v", status, len(raw), err)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for three calls on one worker, want 1", n)
	}
	if _, _, err := wc.post(ctx, 1, base, "/other", "k1", nil, false); err != nil {
		t.Fatal(err)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections after a second worker's call, want 2", n)
	}
	raw, status, err = wc.post(ctx, 0, base, "/close", "k1", nil, false)
	if err != nil || status != http.StatusOK || string(raw) != "bye" {
		t.Fatalf("close: %d %q %v", status, raw, err)
	}
	if _, _, err := wc.post(ctx, 0, base, "/other", "k1", nil, false); err != nil {
		t.Fatalf("after the server closed: %v", err)
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections, want 3: a closed connection is dialled again", n)
	}
	// A connection the server closed while idle is dialled again, and the
	// call goes through.
	idle := httptest.NewUnstartedServer(srv.Config.Handler)
	idle.Config.IdleTimeout = 50 * time.Millisecond
	idle.Start()
	defer idle.Close()
	if _, _, err := wc.post(ctx, 5, idle.URL+"/base", "/other", "k1", nil, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if raw, status, err := wc.post(ctx, 5, idle.URL+"/base", "/other", "k1", []byte(`{}`), false); err != nil || status != http.StatusTeapot || string(raw) != `{}` {
		t.Fatalf("after the server's idle timeout: %d %q %v", status, raw, err)
	}
}
