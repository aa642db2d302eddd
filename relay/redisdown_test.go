package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/relay"
)

// privateRedis runs a redis-server of t's own on a free loopback port, so a
// test can stop it without touching the Redis other tests share. stop kills
// it; it is also killed when t ends.
func privateRedis(t *testing.T) (url string, stop func()) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is needed to stop a Redis of the test's own: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(stop)
	url = fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	opt, _ := redis.ParseURL(url)
	c := redis.NewClient(opt)
	defer c.Close()
	for range 100 {
		if c.Ping(t.Context()).Err() == nil {
			return url, stop
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("private redis-server did not answer within 5 s")
	return "", nil
}

// logBuffer is an io.Writer the server's slog handler writes JSON lines to.
type logBuffer struct{ kungfutest.Buffer }

func (b *logBuffer) lines() []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b.Bytes()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// Reproduces issue 7 item 9: with Redis down every rate-limited tool
// answered 500 INTERNAL_ERROR, /readyz showed the raw dial error to anyone,
// and asynq's pollers logged their failure every 200 ms.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	url, stop := privateRedis(t)
	logs := &logBuffer{}
	limits := relay.DefaultLimits()
	// thread_join is otherwise refused by its rate limit before the join
	// guard, which keeps its own counts in Redis, is asked.
	delete(limits, "thread_write")
	d := startOn(t, kungfutest.DatabaseURL(t), kungfutest.RedisPrefix(t), func(o *relay.Options) {
		o.RedisURL = url
		o.Limits = limits
		o.Log = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	boss, _ := d.register(t)
	worker, _ := d.register(t)
	room := d.must(t, boss, "thread_start", map[string]any{"subject": "redis down", "key": true})
	s := connect(t, d, worker, "2025-06-18") // the handshake needs no Redis; connect before the outage

	stop()
	down := time.Now()

	unavailable := func(r result, what string) {
		t.Helper()
		expect(t, r, 503, "SERVICE_UNAVAILABLE")
		if r.Body["next_action"] != "wait" || r.num("retry_after") < 1 || r.num("retry_after") > 30 {
			t.Fatalf("%s: envelope %s", what, r.Raw)
		}
		if h, _ := strconv.Atoi(r.Header.Get("Retry-After")); int64(h) != r.num("retry_after") {
			t.Fatalf("%s: Retry-After header %q, body %s", what, r.Header.Get("Retry-After"), r.Raw)
		}
		if strings.Contains(r.Raw, "dial") || strings.Contains(r.Raw, "127.0.0.1") || strings.Contains(r.Raw, "refused") {
			t.Fatalf("%s: the refusal shows internals: %s", what, r.Raw)
		}
	}
	// Limited by address, by account, and the room join guard.
	unavailable(d.call(t, "", "account_register", map[string]any{"name": "late_comer", "password": "correct horse"}), "account_register")
	unavailable(d.call(t, worker, "memory_list", map[string]any{}), "memory_list")
	unavailable(d.call(t, worker, "todo_list", map[string]any{}), "todo_list")
	unavailable(d.call(t, worker, "thread_join", map[string]any{"key": room.str("key")}), "thread_join")
	unavailable(post(t, d.URL+"/owner/key", "", []byte(`{"name":"nobody_here","password":"correct horse"}`)), "owner/key")

	// MCP carries the same envelope.
	res, env := callTool(t, s, "todo_list", map[string]any{})
	if !res.IsError || env["ok"] != false {
		t.Fatalf("MCP todo_list with Redis down: %v", env)
	}
	if e, _ := env["error"].(map[string]any); e["code"] != "SERVICE_UNAVAILABLE" || env["next_action"] != "wait" || env["retry_after"] == nil {
		t.Fatalf("MCP todo_list with Redis down: %v", env)
	}

	// /readyz names the dependency, not its error.
	code, _, body := get(t, d.URL+"/readyz")
	var ready struct {
		OK     bool              `json:"ok"`
		Checks map[string]string `json:"checks"`
	}
	if err := json.Unmarshal([]byte(body), &ready); err != nil || code != 503 || ready.OK ||
		ready.Checks["postgres"] != "ok" || ready.Checks["redis"] != "unreachable" || len(ready.Checks) != 2 {
		t.Fatalf("readyz with Redis down: %d %s", code, body)
	}

	// asynq polls every 200 ms; each distinct failure may reach the log at
	// 0, 1 and 3 s of the outage, not 15 times.
	time.Sleep(3500*time.Millisecond - time.Since(down))
	perMsg := map[string]int{}
	when := map[string][]string{}
	var readyLogged, refusedLogged bool
	for _, l := range logs.lines() {
		msg, _ := l["msg"].(string)
		errText, _ := l["err"].(string)
		switch {
		case l["component"] == "asynq":
			perMsg[msg]++
			at, _ := l["time"].(string)
			when[msg] = append(when[msg], at)
		case msg == "readyz: redis unreachable" && strings.Contains(errText, "refused"):
			readyLogged = true
		case strings.Contains(msg, "redis unavailable") && strings.Contains(errText, "refused"):
			refusedLogged = true
		}
	}
	if !readyLogged || !refusedLogged {
		t.Errorf("the real errors are not in the server log (readyz %v, refusals %v)", readyLogged, refusedLogged)
	}
	if len(perMsg) == 0 {
		t.Fatal("asynq logged nothing while Redis was down")
	}
	for msg := range perMsg {
		// The checks above may outlast 3.5 s; judge the first 3.5 s of
		// each message by the log's own times.
		n := 0
		first, _ := time.Parse(time.RFC3339Nano, when[msg][0])
		for _, at := range when[msg] {
			if ts, err := time.Parse(time.RFC3339Nano, at); err != nil || ts.Sub(first) <= 3500*time.Millisecond {
				n++
			}
		}
		if n > 3 {
			t.Errorf("asynq logged %q %d times in 3.5 s (outage from %s): %v", msg, n, down.Format(time.RFC3339Nano), when[msg])
		}
	}
}

// go-redis prints every failed dial of a stopped server to stderr; the
// tests assert on Dojo's own log instead.
func init() { redis.SetLogger(quietRedis{}) }

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}
