package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/migrations"
	"github.com/dojo-relay/dojo/signing"
)

// The test binary doubles as the dojo binary: with DOJO_TEST_EXEC=1 it runs
// main, so process tests exercise the real command, race detector included.
func TestMain(m *testing.M) {
	if os.Getenv("DOJO_TEST_EXEC") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func command(t *testing.T, env map[string]string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = []string{"DOJO_TEST_EXEC=1", "PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"DOJO_SECRET_KEY=" + secretKey, "DOJO_QUEUE=" + kungfutest.Queue(t)}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return cmd
}

var secretKey, _ = signing.GenerateServerKey()

func migrationCount() int {
	names, _ := fs.Glob(migrations.FS(), "*.sql")
	return len(names)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", p)
}

// emptyDatabase is a database with no migrations applied.
func emptyDatabase(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, kungfutest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("dojo_empty_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), kungfutest.AdminURL())
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			c.Close(context.Background())
		}
	})
	return strings.Replace(kungfutest.AdminURL(), "/postgres?", "/"+name+"?", 1)
}

func TestServeRefusesToStart(t *testing.T) {
	t.Parallel()
	good := kungfutest.DatabaseURL(t)
	cases := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"postgres down", map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/x?sslmode=disable"}, "postgres at 127.0.0.1:1 is unreachable"},
		// Up but missing is not "unreachable": the fix is createdb, not the network.
		{"database missing", map[string]string{"DATABASE_URL": strings.Replace(kungfutest.AdminURL(), "/postgres?", "/dojo_no_such_db?", 1)},
			`is up, but database "dojo_no_such_db" does not exist: create it`},
		{"bad pool size", map[string]string{"DATABASE_URL": good, "DOJO_DB_MAX_CONNS": "lots"}, "DOJO_DB_MAX_CONNS: want a positive whole number"},
		{"not migrated", map[string]string{"DATABASE_URL": emptyDatabase(t)}, fmt.Sprintf("not migrated (%d migrations pending): run `dojo migrate`", migrationCount())},
		{"redis down", map[string]string{"DATABASE_URL": good, "REDIS_URL": "redis://127.0.0.1:1/0"}, "redis at 127.0.0.1:1 is unreachable"},
		{"no secret key", map[string]string{"DATABASE_URL": good, "DOJO_SECRET_KEY": ""}, "DOJO_SECRET_KEY is not set: run `dojo keygen`"},
		{"bad secret key", map[string]string{"DATABASE_URL": good, "DOJO_SECRET_KEY": "nope"}, "DOJO_SECRET_KEY:"},
		{"short admin token", map[string]string{"DATABASE_URL": good, "DOJO_ADMIN_TOKEN": "guessable"}, "DOJO_ADMIN_TOKEN: want at least 16 characters"},
	}
	for _, c := range cases {
		c.env["DOJO_ADDR"] = freeAddr(t)
		if c.env["REDIS_URL"] == "" {
			c.env["REDIS_URL"] = kungfutest.RedisURL()
		}
		var stderr bytes.Buffer
		cmd := command(t, c.env, "serve")
		cmd.Stderr = &stderr
		err := cmd.Run()
		exit, _ := err.(*exec.ExitError)
		if exit == nil || exit.ExitCode() != 1 {
			t.Errorf("%s: exit %v", c.name, err)
		}
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if len(lines) != 1 || !strings.Contains(lines[0], c.want) {
			t.Errorf("%s: stderr %q, want one line containing %q", c.name, stderr.String(), c.want)
		}
	}
}

// TestServeWithPoolSettings: pgx pool settings in DATABASE_URL are Dojo's,
// not PostgreSQL's; the migration check used to send pool_max_conns to the
// server as a run-time parameter, and serve refused to start.
func TestServeWithPoolSettings(t *testing.T) {
	t.Parallel()
	dsn := kungfutest.DatabaseURL(t) + "&pool_max_conns=3&pool_min_conns=1"
	s := startServe(t, map[string]string{"DATABASE_URL": dsn, "REDIS_URL": kungfutest.RedisURL()})
	reg := call(t, s.base, "", "account_register", map[string]any{"name": "pool_settings", "password": "secret1"})
	if reg["ok"] != true {
		t.Fatalf("register: %v", reg)
	}
	out, err := command(t, map[string]string{"DATABASE_URL": dsn}, "migrate").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "0 migrations applied") {
		t.Fatalf("migrate with pool settings: %v %s", err, out)
	}
	stopGracefully(t, s)
}

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	dsn := emptyDatabase(t)
	for _, want := range []string{fmt.Sprintf("%d migrations applied", migrationCount()), "0 migrations applied"} {
		out, err := command(t, map[string]string{"DATABASE_URL": dsn}, "migrate").CombinedOutput()
		if err != nil || !strings.Contains(string(out), want) {
			t.Fatalf("migrate: %v %s, want %q", err, out, want)
		}
	}
}

// server is one `dojo serve` process.
type server struct {
	cmd  *exec.Cmd
	base string
	out  *bytes.Buffer
}

func startServe(t *testing.T, env map[string]string) *server {
	t.Helper()
	return serveAt(t, env, freeAddr(t))
}

// serveAt starts `dojo serve` on addr, so that a restart can come back
// on the address the boxes' hub_url names.
func serveAt(t *testing.T, env map[string]string, addr string) *server {
	t.Helper()
	env["DOJO_ADDR"] = addr
	cmd := command(t, env, "serve")
	// stopGracefully reads out only after Wait, when exec has stopped
	// writing to it.
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, base: "http://" + addr, out: out}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for range 300 {
		if resp, err := http.Get(s.base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	t.Fatalf("dojo serve did not become ready on %s: %s", addr, out.String())
	return nil
}

// twoServes starts two `dojo serve` processes of one deployment: one
// database, one Redis prefix, and the extra variables given.
func twoServes(t *testing.T, extra map[string]string) (a, b *server) {
	t.Helper()
	dsn, pfx := kungfutest.DatabaseURL(t), kungfutest.RedisPrefix(t)
	env := func() map[string]string {
		e := map[string]string{"DATABASE_URL": dsn, "REDIS_URL": kungfutest.RedisURL(), "DOJO_REDIS_PREFIX": pfx}
		maps.Copy(e, extra)
		return e
	}
	return startServe(t, env()), startServe(t, env())
}

// call invokes a tool over HTTP JSON; the envelope gains http_status.
func call(t *testing.T, base, key, tool string, args any) map[string]any {
	t.Helper()
	env, err := tryCall(base, key, tool, args)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func stopGracefully(t *testing.T, s *server) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dojo serve exited with %v after SIGTERM: %s", err, s.out.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("dojo serve did not exit after SIGTERM")
	}
}

func TestTwoServersShareRateLimits(t *testing.T) {
	t.Parallel()
	a, b := twoServes(t, map[string]string{"DOJO_RATE_LIMITS": "push=3/1h"})
	reg := call(t, a.base, "", "account_register", map[string]any{"name": "shared_limit", "password": "secret1"})
	key, _ := reg["api_key"].(string)
	if key == "" {
		t.Fatalf("register: %v", reg)
	}
	put := map[string]any{"title": "t", "tags": []string{"x"}, "content": strings.Repeat("shared window ", 5)}
	for i, s := range []*server{a, b, a} {
		if r := call(t, s.base, key, "memory_put", put); r["ok"] != true {
			t.Fatalf("put %d: %v", i, r)
		}
	}
	r := call(t, b.base, key, "memory_put", put)
	if r["http_status"] != float64(429) || r["error"].(map[string]any)["code"] != "RATE_LIMIT" {
		t.Fatalf("fourth put through the other process: %v", r)
	}
	r = call(t, a.base, key, "memory_put", put)
	if r["http_status"] != float64(429) {
		t.Fatalf("fifth put: %v", r)
	}
	stopGracefully(t, a)
	stopGracefully(t, b)
}

// A request in flight when SIGTERM arrives is finished, then dojo exits 0.
func TestSIGTERMFinishesInFlight(t *testing.T) {
	t.Parallel()
	s := startServe(t, map[string]string{"DATABASE_URL": kungfutest.DatabaseURL(t), "REDIS_URL": kungfutest.RedisURL(),
		"DOJO_REDIS_PREFIX": kungfutest.RedisPrefix(t)})
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"name":"late_arrival","password":"secret1"}`
	fmt.Fprintf(conn, "POST /api/v1/account_register HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:10])
	time.Sleep(200 * time.Millisecond)
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	// New connections are refused while the in-flight one finishes.
	if c, err := net.DialTimeout("tcp", strings.TrimPrefix(s.base, "http://"), time.Second); err == nil {
		c.Close()
		t.Error("dojo still accepted a new connection after SIGTERM")
	}
	_, _ = io.WriteString(conn, body[10:])
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("in-flight request lost: %v", err)
	}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(raw), `"ok":true`) {
		t.Fatalf("in-flight request: %d %s", resp.StatusCode, raw)
	}
	if err := s.cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, s.out.String())
	}
}

func TestKeygen(t *testing.T) {
	var a, b bytes.Buffer
	if err := keygen(&a); err != nil {
		t.Fatal(err)
	}
	_ = keygen(&b)
	k := strings.TrimSpace(a.String())
	if _, err := signing.ParseServerKey(k); err != nil || k == strings.TrimSpace(b.String()) {
		t.Fatalf("keygen printed %q (%v)", k, err)
	}
}

func TestToolsMarkdownIsCurrent(t *testing.T) {
	var buf bytes.Buffer
	if err := tools(&buf, []string{"--markdown"}); err != nil {
		t.Fatal(err)
	}
	onDisk, err := os.ReadFile(filepath.Join("..", "..", "docs", "tools.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), onDisk) {
		t.Fatal("docs/tools.md is stale: run `go run ./cmd/dojo tools --markdown > docs/tools.md`")
	}
	if !strings.Contains(buf.String(), "### `memory_put`") || !strings.Contains(buf.String(), "| `title` | string | yes |") {
		t.Fatalf("markdown lacks tool details:\n%s", buf.String())
	}
}
