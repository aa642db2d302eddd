package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/dojo-relay/dojo/signing"
)

// dev runs Dojo with zero configuration: it uses PostgreSQL and Redis
// already answering on loopback, or starts private ones under ./.dojo/,
// migrates, serves, and stops whatever it started on Ctrl-C.
func dev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	fs.SetOutput(os.Stdout)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), devUsage)
		fs.PrintDefaults()
	}
	install := fs.Bool("install", false, "install missing PostgreSQL/Redis with apt-get (root only)")
	private := fs.Bool("private", false, "always start private PostgreSQL and Redis under --dir")
	dir := fs.String("dir", devDir, "where private services keep their data")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c := env()
	c.Dev = true
	st := &stack{dir: *dir, install: *install}
	defer st.stop()

	var pgNote, redisNote string
	switch {
	case os.Getenv("DATABASE_URL") != "":
		pgNote = "from DATABASE_URL"
	case !*private && answers("127.0.0.1:5432"):
		dsn, err := ensureDatabase(ctx, "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "dojo")
		if err != nil {
			return fmt.Errorf("PostgreSQL on 127.0.0.1:5432 answers but %w; set DATABASE_URL or use --private", err)
		}
		c.DatabaseURL, pgNote = dsn, "found on 127.0.0.1:5432"
	default:
		dsn, err := st.startPostgres(ctx)
		if err != nil {
			return err
		}
		c.DatabaseURL, pgNote = dsn, "private, data in "+filepath.Join(st.dir, "pg")
	}
	switch {
	case os.Getenv("REDIS_URL") != "":
		redisNote = "from REDIS_URL"
	case !*private && answers("127.0.0.1:6379") && redisPings(ctx, "redis://127.0.0.1:6379/0"):
		redisNote = "found on 127.0.0.1:6379"
	default:
		url, err := st.startRedis(ctx)
		if err != nil {
			return err
		}
		c.RedisURL, redisNote = url, "private, in memory"
	}
	if c.SecretKey == "" {
		k, err := devKey(st.dir)
		if err != nil {
			return err
		}
		c.SecretKey = k
	}
	adminNote := "from DOJO_ADMIN_TOKEN"
	if c.AdminToken == "" {
		c.AdminToken, adminNote = devAdminToken(), "generated for this run"
	}
	if c.AllowTargets == "" {
		// Local daemons (letterboxes, receivers) live on loopback in dev.
		c.AllowTargets = "127.0.0.0/8,::1/128"
	}
	if err := migrate(ctx, c); err != nil {
		return err
	}
	// dojo check (and the operator) find this run's database here, even a
	// private one on a port chosen just now; it goes when dev stops.
	marker := filepath.Join(st.dir, devEnvFile)
	if err := os.MkdirAll(st.dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(marker, []byte("DATABASE_URL="+c.DatabaseURL+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(marker)
	return run(ctx, c, func(base string) {
		fmt.Printf(`
Dojo is running (dev mode).
  MCP:        %[1]s/mcp
  HTTP JSON:  %[1]s/api/v1/<tool>
  Docs:       %[1]s/docs/
  Key reset:  %[1]s/owner/key
  PostgreSQL: %[2]s (%[3]s)
  Redis:      %[4]s (%[5]s)
  Kizuna hub: %[1]s/api/v1/agents
  Admin token (DOJO_ADMIN_TOKEN, %[7]s):
              %[6]s

Create your first account (the key is shown once):
  curl -s %[1]s/api/v1/account_register -H 'Content-Type: application/json' \
    -d '{"name":"my_first_agent","password":"change-me-please"}'

Ctrl-C stops Dojo and everything it started.
`, base, redact(c.DatabaseURL), pgNote, c.RedisURL, redisNote, c.AdminToken, adminNote)
	})
}

const devUsage = `Usage: dojo dev [--install] [--private] [--dir DIR]

Runs Dojo locally with nothing configured. PostgreSQL and Redis that answer
on loopback are used; otherwise private ones are started under DIR. The
schema is migrated, Dojo serves on DOJO_ADDR (127.0.0.1:8080), and Ctrl-C
stops Dojo and everything it started. Loopback clients are not held to the
per-address limits (register, owner login). While it runs, ` + "`dojo check`" + `
from the same folder audits its database.

Flags:
`

// devDir is where dev keeps private services, its key and its marker.
const devDir = ".dojo"

// devEnvFile names the running dev's database, for dojo check.
const devEnvFile = "dev.env"

// devDatabase returns the DATABASE_URL of a dojo dev running with dir, or
// "" when none is.
func devDatabase(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, devEnvFile))
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "DATABASE_URL="); ok {
			return v
		}
	}
	return ""
}

// devKey reads the dev server key from dir, creating it on first use, so a
// restart can still open the secrets it sealed.
func devKey(dir string) (string, error) {
	path := filepath.Join(dir, "secret.key")
	if b, err := os.ReadFile(path); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	k, err := signing.GenerateServerKey()
	if err != nil {
		return "", err
	}
	return k, os.WriteFile(path, []byte(k+"\n"), 0o600)
}

// stack is the private services dev started, so it can stop exactly those.
type stack struct {
	dir     string
	install bool
	pgData  string
	pgCtl   string
	asUser  string
	redis   *exec.Cmd
}

func (s *stack) stop() {
	if s.redis != nil && s.redis.Process != nil {
		_ = s.redis.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = s.redis.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			// Only once it is gone is its port free: wait for the kill too.
			_ = s.redis.Process.Kill()
			<-done
		}
	}
	if s.pgData != "" {
		// pg_ctl gives up after 60 s by default; a loaded machine can need
		// longer, and a PostgreSQL left running keeps its port.
		_ = s.command(s.pgCtl, "-D", s.pgData, "-m", "fast", "-w", "-t", "300", "stop").Run()
	}
}

// command runs name as the PostgreSQL owner when Dojo runs as root, since
// PostgreSQL refuses to run as root. Its own process group keeps a
// terminal's Ctrl-C away, so Dojo stops it in order.
func (s *stack) command(name string, args ...string) *exec.Cmd {
	var cmd *exec.Cmd
	if s.asUser != "" {
		cmd = exec.Command("runuser", append([]string{"-u", s.asUser, "--", name}, args...)...)
	} else {
		cmd = exec.Command(name, args...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

func (s *stack) startPostgres(ctx context.Context) (string, error) {
	bin, err := s.find("pg_ctl", "postgresql", postgresBinDirs())
	if err != nil {
		return "", err
	}
	s.pgCtl = bin
	initdb := filepath.Join(filepath.Dir(bin), "initdb")
	data, err := filepath.Abs(filepath.Join(s.dir, "pg"))
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(data, 0o700); err != nil {
		return "", err
	}
	if err := os.Chmod(s.dir, 0o755); err != nil {
		return "", err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return "", errors.New("running as root, and PostgreSQL refuses root: create a 'postgres' user (apt-get install postgresql does) or run dojo dev as a normal user")
		}
		s.asUser = "postgres"
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := filepath.Walk(data, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, uid, gid)
		}); err != nil {
			return "", err
		}
	}
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err != nil {
		out, err := s.command(initdb, "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale").CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("initdb: %v: %s", err, lastLine(out))
		}
	}
	// A crashed earlier run may have left a server behind on this data.
	_ = s.command(bin, "-D", data, "-m", "immediate", "-w", "stop").Run()
	port, err := freePort()
	if err != nil {
		return "", err
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", port, data)
	out, err := s.command(bin, "-D", data, "-l", filepath.Join(data, "server.log"), "-o", opts, "-w", "-t", "60", "start").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("start PostgreSQL: %v: %s (see %s)", err, lastLine(out), filepath.Join(data, "server.log"))
	}
	s.pgData = data
	return ensureDatabase(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port), "dojo")
}

func (s *stack) startRedis(ctx context.Context) (string, error) {
	bin, err := s.find("redis-server", "redis-server", nil)
	if err != nil {
		return "", err
	}
	port, err := freePort()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start redis-server: %w", err)
	}
	s.redis = cmd
	url := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	for range 100 {
		if redisPings(ctx, url) {
			return url, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", errors.New("redis-server did not answer within 5 s")
}

// find locates a binary, installing its Debian package first when allowed.
func (s *stack) find(name, pkg string, dirs []string) (string, error) {
	look := func() string {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		for _, d := range dirs {
			if p := filepath.Join(d, name); isExec(p) {
				return p
			}
		}
		return ""
	}
	if p := look(); p != "" {
		return p, nil
	}
	if !s.install || os.Geteuid() != 0 {
		return "", fmt.Errorf("%s is not installed and nothing answers on loopback: run `apt-get install -y postgresql redis-server` (or `dojo dev --install` as root)", name)
	}
	fmt.Printf("dojo: installing %s with apt-get…\n", pkg)
	for _, args := range [][]string{{"update"}, {"install", "-y", "--no-install-recommends", pkg}} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("apt-get %s: %v: %s", strings.Join(args, " "), err, lastLine(out))
		}
	}
	if dirs != nil {
		dirs = postgresBinDirs()
	}
	if p := look(); p != "" {
		return p, nil
	}
	return "", fmt.Errorf("%s still not found after installing %s", name, pkg)
}

// postgresBinDirs lists Debian's versioned server directories, newest first.
func postgresBinDirs() []string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		b, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return a > b
	})
	return dirs
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

func answers(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

func redisPings(ctx context.Context, url string) bool {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return false
	}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return c.Ping(ctx).Err() == nil
}

// ensureDatabase creates db on the server behind admin if it is missing and
// returns a URL for it.
func ensureDatabase(ctx context.Context, admin, db string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("cannot connect as postgres: %w", err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, db).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		if _, err := conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{db}.Sanitize()); err != nil {
			var again bool
			if conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, db).Scan(&again); !again {
				return "", fmt.Errorf("create database %s: %w", db, err)
			}
		}
	}
	return strings.Replace(admin, "/postgres?", "/"+db+"?", 1), nil
}

// freePort returns a loopback port that is free now, for a server that
// binds it a moment later (the private PostgreSQL and Redis). It is drawn
// below the kernel's ephemeral range: a port from that range, which is
// what listening on :0 gives, can meanwhile become the source port of any
// outgoing connection, and the server then fails to bind it.
func freePort() (int, error) {
	const floor = 10000
	top := 32768
	if raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(raw)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				top = n
			}
		}
	}
	for range 100 {
		if top-floor < 1000 {
			break
		}
		p := floor + mrand.IntN(top-floor)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue // taken
		}
		ln.Close()
		return p, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

func redact(dsn string) string {
	if i := strings.Index(dsn, "://"); i >= 0 {
		if at := strings.Index(dsn[i+3:], "@"); at >= 0 {
			if colon := strings.Index(dsn[i+3:i+3+at], ":"); colon >= 0 {
				return dsn[:i+3+colon] + ":***" + dsn[i+3+at:]
			}
		}
	}
	return dsn
}

// devAdminToken is a fresh admin token for one dev run; a developer who
// wants a stable one sets DOJO_ADMIN_TOKEN.
func devAdminToken() string {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return "dojo_admin_" + hex.EncodeToString(b[:])
}
