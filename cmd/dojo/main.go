package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dojo-relay/dojo/adapters/karmadue"
	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/credits"
	"github.com/dojo-relay/dojo/kungfu/task"
	"github.com/dojo-relay/dojo/kungfu/tool"
	"github.com/dojo-relay/dojo/letterbox"
	"github.com/dojo-relay/dojo/migrations"
	"github.com/dojo-relay/dojo/queue"
	"github.com/dojo-relay/dojo/relay"
	"github.com/dojo-relay/dojo/signing"
)

const usage = `dojo — a federation relay for agent work (Kungfu 3.0)

Usage:
  dojo dev [--install] [--private]   run locally with zero configuration
  dojo serve                         serve with DATABASE_URL, REDIS_URL, DOJO_ADDR, DOJO_PUBLIC_URL
  dojo migrate                       apply the embedded migrations to DATABASE_URL
  dojo keygen                        print a new server key for DOJO_SECRET_KEY
  dojo check [--dir DIR]             audit the money: every task's budget and every balance
                                     (without DATABASE_URL: the database of a running dojo dev)
  dojo tools [--markdown]            list the tools (Markdown for docs/tools.md)
  dojo bench --url URL --database-url DSN [flags]
                                     drive a running dojo and print the issue 11 ratio table
  dojo box <enroll|run|status|version> the dojo-box letterbox (also: this binary named dojo-box)
  dojo version                       print the version
`

func main() {
	// One binary, two programs: installed under a name starting with
	// dojo-box, dojo is the letterbox. So a hub can always hand its own
	// platform's letterbox to an install script (selfExecutable).
	if strings.HasPrefix(filepath.Base(os.Args[0]), "dojo-box") {
		os.Exit(letterbox.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "box" {
		os.Exit(letterbox.Main(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "serve":
		err = serve(ctx, env())
	case "migrate":
		err = migrate(ctx, env())
	case "dev":
		err = dev(ctx, args)
	case "tools":
		err = tools(os.Stdout, args)
	case "bench":
		err = bench(ctx, os.Stdout, args)
	case "keygen":
		err = keygen(os.Stdout)
	case "check":
		err = check(ctx, os.Stdout, env(), args)
	case "version", "--version", "-v":
		fmt.Println("dojo", kungfu.Version)
	case "help", "--help", "-h":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "dojo: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if errors.Is(err, flag.ErrHelp) {
		return // the flag set printed its usage; asking for help is not a failure
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dojo:", err)
		os.Exit(1)
	}
}

// config is the process configuration, read from the environment.
type config struct {
	Addr         string
	DatabaseURL  string
	RedisURL     string
	RedisPrefix  string
	PublicURL    string
	RateLimits   string
	TrustedProxy string
	LogLevel     string
	SecretKey    string
	AllowTargets string
	Queue        string
	LadderScale  string
	Timeout      string
	Grace        string
	DBMaxConns   string
	DBMinConns   string
	// RedisPoolSize and RedisMinIdle size the request path's Redis pool.
	RedisPoolSize string
	RedisMinIdle  string
	// DebugAddr serves /debug/pprof (DOJO_DEBUG_ADDR); empty serves none.
	DebugAddr string
	// AdminToken grants the Kizuna hub's admin paths (DOJO_ADMIN_TOKEN).
	AdminToken string
	// BoxDir holds the letterbox builds the hub serves (DOJO_BOX_DIR).
	BoxDir string
	// Dev marks `dojo dev`: loopback clients skip the per-address limits.
	Dev bool
}

func env() config {
	get := func(k, def string) string {
		if v := strings.TrimSpace(os.Getenv(k)); v != "" {
			return v
		}
		return def
	}
	return config{
		Addr:          get("DOJO_ADDR", "127.0.0.1:8080"),
		DatabaseURL:   get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/dojo?sslmode=disable"),
		RedisURL:      get("REDIS_URL", "redis://127.0.0.1:6379/0"),
		RedisPrefix:   get("DOJO_REDIS_PREFIX", "dojo:"),
		PublicURL:     os.Getenv("DOJO_PUBLIC_URL"),
		RateLimits:    os.Getenv("DOJO_RATE_LIMITS"),
		TrustedProxy:  get("DOJO_TRUSTED_PROXIES", "127.0.0.0/8,::1/128"),
		LogLevel:      get("DOJO_LOG_LEVEL", "info"),
		SecretKey:     os.Getenv("DOJO_SECRET_KEY"),
		AllowTargets:  os.Getenv("DOJO_ALLOW_TARGETS"),
		Queue:         get("DOJO_QUEUE", "dojo"),
		LadderScale:   get("DOJO_LADDER_SCALE", "1"),
		Timeout:       get("DOJO_RECEIVER_TIMEOUT", "10s"),
		Grace:         get("DOJO_DELIVERY_GRACE", "15s"),
		DBMaxConns:    os.Getenv("DOJO_DB_MAX_CONNS"),
		DBMinConns:    os.Getenv("DOJO_DB_MIN_CONNS"),
		RedisPoolSize: os.Getenv("DOJO_REDIS_POOL_SIZE"),
		RedisMinIdle:  os.Getenv("DOJO_REDIS_MIN_IDLE"),
		DebugAddr:     strings.TrimSpace(os.Getenv("DOJO_DEBUG_ADDR")),
		AdminToken:    strings.TrimSpace(os.Getenv("DOJO_ADMIN_TOKEN")),
		BoxDir:        os.Getenv("DOJO_BOX_DIR"),
	}
}

func (c config) options() (relay.Options, error) {
	limits, err := relay.ParseLimits(c.RateLimits)
	if err != nil {
		return relay.Options{}, fmt.Errorf("DOJO_RATE_LIMITS: %w", err)
	}
	var proxies []netip.Prefix
	for p := range strings.SplitSeq(c.TrustedProxy, ",") {
		if p = strings.TrimSpace(p); p == "" || p == "none" {
			continue
		}
		pfx, err := netip.ParsePrefix(p)
		if err != nil {
			return relay.Options{}, fmt.Errorf("DOJO_TRUSTED_PROXIES: %w", err)
		}
		proxies = append(proxies, pfx)
	}
	public := strings.TrimRight(c.PublicURL, "/")
	if public == "" {
		public = "http://" + c.Addr
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return relay.Options{}, fmt.Errorf("DOJO_LOG_LEVEL: %w", err)
	}
	var key *signing.ServerKey
	if c.SecretKey != "" {
		if key, err = signing.ParseServerKey(c.SecretKey); err != nil {
			return relay.Options{}, fmt.Errorf("DOJO_SECRET_KEY: %w", err)
		}
	}
	allow, err := queue.ParseAllow(c.AllowTargets)
	if err != nil {
		return relay.Options{}, fmt.Errorf("DOJO_ALLOW_TARGETS: %w", err)
	}
	scale, err := strconv.ParseFloat(c.LadderScale, 64)
	if err != nil || scale <= 0 {
		return relay.Options{}, fmt.Errorf("DOJO_LADDER_SCALE: want a positive number, got %q", c.LadderScale)
	}
	timeout, err := time.ParseDuration(c.Timeout)
	if err != nil || timeout <= 0 {
		return relay.Options{}, fmt.Errorf("DOJO_RECEIVER_TIMEOUT: want a duration such as 10s, got %q", c.Timeout)
	}
	grace, err := time.ParseDuration(c.Grace)
	if err != nil || grace <= timeout {
		return relay.Options{}, fmt.Errorf("DOJO_DELIVERY_GRACE: want a duration longer than DOJO_RECEIVER_TIMEOUT, got %q", c.Grace)
	}
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		return relay.Options{}, errors.New("DOJO_ADMIN_TOKEN: want at least 16 characters")
	}
	var pools [4]int
	for i, v := range []struct{ name, value string }{
		{"DOJO_DB_MAX_CONNS", c.DBMaxConns}, {"DOJO_DB_MIN_CONNS", c.DBMinConns},
		{"DOJO_REDIS_POOL_SIZE", c.RedisPoolSize}, {"DOJO_REDIS_MIN_IDLE", c.RedisMinIdle},
	} {
		if v.value == "" {
			continue
		}
		// A bound keeps a typo from asking for millions of connections.
		if pools[i], err = strconv.Atoi(strings.TrimSpace(v.value)); err != nil || pools[i] < 1 || pools[i] > 10000 {
			return relay.Options{}, fmt.Errorf("%s: want a positive whole number up to 10000, got %q", v.name, v.value)
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	// go-redis prints its own retries; route them through slog at debug so a
	// refusal to start stays one line.
	redis.SetLogger(redisLog{log})
	return relay.Options{
		DatabaseURL: c.DatabaseURL, RedisURL: c.RedisURL, RedisPrefix: c.RedisPrefix,
		PublicURL: public, Limits: limits, TrustedProxies: proxies, Log: log,
		SecretKey: key, AllowTargets: allow, Queue: c.Queue, LadderScale: scale,
		ReceiverTimeout: timeout, DeliveryGrace: grace, DBMaxConns: pools[0], DBMinConns: pools[1],
		RedisPoolSize: pools[2], RedisMinIdle: pools[3], LoopbackUnlimited: c.Dev,
		AdminToken: c.AdminToken,
		BoxDir:     c.BoxDir,
		BoxSelf:    selfExecutable(),
	}, nil
}

type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "redis")
}

func migrate(ctx context.Context, c config) error {
	n, err := migrations.Up(ctx, c.DatabaseURL)
	if err != nil {
		var pe *pgconn.PgError
		var ce *pgconn.ConnectError
		if errors.As(err, &pe) || errors.As(err, &ce) {
			return relay.DatabaseError(c.DatabaseURL, err)
		}
		return err
	}
	fmt.Printf("dojo: %d migrations applied; the schema is current\n", n)
	return nil
}

// serve runs until SIGINT/SIGTERM, then drains and exits 0.
func serve(ctx context.Context, c config) error { return run(ctx, c, nil) }

// run opens Dojo, listens, calls ready with the public base URL once
// requests are accepted, and serves until ctx ends.
func run(ctx context.Context, c config, ready func(base string)) error {
	opts, err := c.options()
	if err != nil {
		return err
	}
	app, err := relay.Open(ctx, opts)
	if err != nil {
		return err
	}
	defer app.Close()
	if c.DebugAddr != "" {
		stop, err := serveDebug(c.DebugAddr, opts.Log)
		if err != nil {
			return err
		}
		defer stop()
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.Addr, err)
	}
	opts.Log.Info("dojo serving", "addr", ln.Addr().String(), "public", opts.PublicURL, "version", kungfu.Version)
	if ready != nil {
		ready(opts.PublicURL)
	}
	return app.Serve(ctx, ln)
}

// serveDebug serves the runtime profiles on addr, a listener of its own:
// profiles show request arguments on stacks and let a caller spend CPU on
// a 30-second trace, so they never share the public address (which has no
// /debug route at all).
func serveDebug(addr string, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("DOJO_DEBUG_ADDR: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("debug server", "err", err)
		}
	}()
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); !isLoopback(host) {
		log.Warn("debug profiles are served beyond loopback: firewall DOJO_DEBUG_ADDR", "addr", ln.Addr().String())
	}
	log.Info("debug profiles", "addr", ln.Addr().String(), "path", "/debug/pprof/")
	return func() { _ = hs.Close() }, nil
}

func isLoopback(host string) bool {
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// check audits the money invariants and exits non-zero on any problem.
// Without DATABASE_URL it audits the database of a `dojo dev` running from
// this folder, which may be a private server on a port chosen at start.
func check(ctx context.Context, w io.Writer, c config, args []string) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(os.Stdout)
	dir := fs.String("dir", devDir, "the --dir of a running `dojo dev`, used when DATABASE_URL is not set")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if os.Getenv("DATABASE_URL") == "" {
		if dsn := devDatabase(*dir); dsn != "" {
			c.DatabaseURL = dsn
		}
	}
	fmt.Fprintf(w, "dojo check: auditing %s\n", redact(c.DatabaseURL))
	pool, err := pgxpool.New(ctx, c.DatabaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return relay.DatabaseError(c.DatabaseURL, err)
	}
	drift, err := credits.Check(ctx, pool)
	if err != nil {
		return err
	}
	problems, err := task.Check(ctx, pool)
	if err != nil {
		return err
	}
	for _, d := range drift {
		fmt.Fprintf(w, "account %d: balance %d but its ledger sums to %d\n", d.AccountID, d.Balance, d.Ledger)
	}
	for _, p := range problems {
		fmt.Fprintf(w, "task %s: %s\n", p.Task, p.Problem)
	}
	if n := len(drift) + len(problems); n > 0 {
		return fmt.Errorf("check: %d problems", n)
	}
	fmt.Fprintln(w, "dojo check: every balance equals its ledger; every task has budget_locked = settled + reserved + refunded + available")
	return nil
}

// keygen prints a fresh server key. It seals stored secrets and signs what
// Dojo sends, so keep it like a database password.
func keygen(w io.Writer) error {
	k, err := signing.GenerateServerKey()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, k)
	return err
}

func tools(w io.Writer, args []string) error {
	fs := flag.NewFlagSet("tools", flag.ContinueOnError)
	fs.SetOutput(os.Stdout)
	md := fs.Bool("markdown", false, "print docs/tools.md")
	if err := fs.Parse(args); err != nil {
		return err
	}
	reg, err := tool.NewRegistry(append(tool.Kungfu(tool.Services{}), karmadue.Tools(nil)...)...)
	if err != nil {
		return err
	}
	if *md {
		_, err := io.WriteString(w, tool.Markdown(reg))
		return err
	}
	for _, t := range reg.Tools() {
		fmt.Fprintf(w, "%-20s %s\n", t.Name, firstSentence(t.Description))
	}
	return nil
}

func firstSentence(s string) string {
	if i := strings.Index(s, ". "); i > 0 {
		return s[:i+1]
	}
	return s
}

// selfExecutable is this binary's path, served as the host platform's
// dojo-box when DOJO_BOX_DIR has no build for it; empty when unknown.
func selfExecutable() string {
	p, err := os.Executable()
	if err != nil {
		return ""
	}
	return p
}
