package relay

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dojo-relay/dojo/adapters/karmadue"
	"github.com/dojo-relay/dojo/adapters/kizuna"
	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/account"
	"github.com/dojo-relay/dojo/kungfu/memory"
	"github.com/dojo-relay/dojo/kungfu/notify"
	"github.com/dojo-relay/dojo/kungfu/task"
	"github.com/dojo-relay/dojo/kungfu/thread"
	"github.com/dojo-relay/dojo/kungfu/tool"
	"github.com/dojo-relay/dojo/migrations"
	"github.com/dojo-relay/dojo/queue"
	"github.com/dojo-relay/dojo/signing"
)

// Options configure one Dojo process.
type Options struct {
	DatabaseURL string
	RedisURL    string
	// RedisPrefix is an outer prefix of every Redis key; inside it each
	// deployment (database) keeps its keys under its own id.
	RedisPrefix    string
	PublicURL      string
	Limits         map[string]Rule
	TrustedProxies []netip.Prefix
	// SecretKey seals secrets Dojo must use again and signs what it sends.
	SecretKey *signing.ServerKey
	// AllowTargets lets outbound POSTs reach these otherwise refused
	// (private, loopback) addresses: tests and local daemons opt in here.
	AllowTargets []netip.Prefix
	// RootCAs, when set, replaces the system roots for outbound TLS (tests).
	RootCAs *x509.CertPool
	// Queue is the base of the asynq queue names; the deployment id is
	// appended, so the processes of one database serve each other and no
	// other database's processes.
	Queue string
	// Sweep is how often PostgreSQL is swept for work Redis lost (default 5 s).
	Sweep time.Duration
	// NotifyBackoff overrides the wait between notify tries (tests).
	NotifyBackoff func(attempts int) time.Duration
	// LadderScale multiplies the receiver redelivery ladder (tests: 0.001).
	LadderScale float64
	// ReceiverTimeout bounds one POST to a receiver or a notify endpoint
	// (default 10 s).
	ReceiverTimeout time.Duration
	// DeliveryGrace is how long a submission may stay delivering before a
	// crash is assumed (default 15 s; must exceed ReceiverTimeout).
	DeliveryGrace time.Duration
	// HostCooldown is how long a target host that keeps timing out is first
	// left alone (default queue.DefaultCooldown; tests shorten it).
	HostCooldown time.Duration
	// DBMaxConns caps the PostgreSQL pool (DOJO_DB_MAX_CONNS); zero keeps
	// pool_max_conns from DATABASE_URL, else DefaultDBMaxConns.
	DBMaxConns int
	// DBMinConns is how many PostgreSQL connections are kept open while
	// idle (DOJO_DB_MIN_CONNS); zero keeps pool_min_conns from DATABASE_URL,
	// else DefaultDBMinConns.
	DBMinConns int
	// RedisPoolSize caps the Redis connections of the request path
	// (DOJO_REDIS_POOL_SIZE); zero keeps pool_size from REDIS_URL, else
	// DefaultRedisPoolSize.
	RedisPoolSize int
	// RedisMinIdle is how many Redis connections are kept open while idle
	// (DOJO_REDIS_MIN_IDLE); zero keeps min_idle_conns from REDIS_URL, else
	// as many as the PostgreSQL pool keeps (capped by the pool size).
	RedisMinIdle int
	// LoopbackUnlimited lifts per-address limits for loopback clients
	// (`dojo dev` only).
	LoopbackUnlimited bool
	// AdminToken grants the Kizuna hub's admin paths (DOJO_ADMIN_TOKEN);
	// empty disables them.
	AdminToken string
	// BoxDir holds letterbox builds served to install scripts
	// (DOJO_BOX_DIR); BoxSelf is an executable that runs as dojo-box on
	// the host's own platform, served when BoxDir has none for it.
	BoxDir, BoxSelf string
	// BcryptCost is for tests; zero means bcrypt's default.
	BcryptCost int
	Clock      kungfu.Clock
	Log        *slog.Logger
}

// App is a fully wired Dojo process.
type App struct {
	Server  *Server
	Threads *thread.Service
	Tasks   *task.Service
	Notify  *notify.Service
	Engine  *queue.Engine
	// Deployment is the id, stored in PostgreSQL, that namespaces Redis.
	Deployment string
	DB         *pgxpool.Pool
	Redis      *redis.Client
	log        *slog.Logger
}

// Open connects to PostgreSQL and Redis and wires the domains. It refuses,
// with a one-line reason, when either is unreachable or the schema is not
// fully migrated, so a half-working server never starts.
func Open(ctx context.Context, o Options) (*App, error) {
	if o.Clock == nil {
		o.Clock = kungfu.SystemClock
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.SecretKey == nil {
		return nil, errors.New("DOJO_SECRET_KEY is not set: run `dojo keygen` and export its output")
	}
	if o.Queue == "" {
		o.Queue = "dojo"
	}
	if o.Sweep <= 0 {
		o.Sweep = 5 * time.Second
	}
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()

	pcfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	switch {
	case o.DBMaxConns > 0:
		pcfg.MaxConns = int32(min(o.DBMaxConns, math.MaxInt32))
	case !strings.Contains(o.DatabaseURL, "pool_max_conns"):
		pcfg.MaxConns = DefaultDBMaxConns()
	}
	switch {
	case o.DBMinConns > 0:
		pcfg.MinConns = int32(min(o.DBMinConns, math.MaxInt32))
	case !strings.Contains(o.DatabaseURL, "pool_min_conns"):
		pcfg.MinConns = DefaultDBMinConns(pcfg.MaxConns)
	}
	// pgx refuses a minimum above the maximum; a smaller explicit maximum wins.
	pcfg.MinConns = min(pcfg.MinConns, pcfg.MaxConns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, DatabaseError(o.DatabaseURL, err)
	}
	if n, err := migrations.Pending(pingCtx, o.DatabaseURL); err != nil || n > 0 {
		pool.Close()
		if err != nil {
			return nil, fmt.Errorf("postgres schema: %w", err)
		}
		return nil, fmt.Errorf("the database is not migrated (%d migrations pending): run `dojo migrate`", n)
	}
	dep, err := deployment(pingCtx, pool)
	if err != nil {
		pool.Close()
		return nil, err
	}
	// Every Redis name below comes from the deployment: a fresh database on
	// a Redis that served another starts with empty windows and queues.
	prefix := o.RedisPrefix + dep + ":"
	ropt, err := redis.ParseURL(o.RedisURL)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	switch {
	case o.RedisPoolSize > 0:
		ropt.PoolSize = o.RedisPoolSize
	case !strings.Contains(o.RedisURL, "pool_size"):
		ropt.PoolSize = DefaultRedisPoolSize()
	}
	switch {
	case o.RedisMinIdle > 0:
		ropt.MinIdleConns = o.RedisMinIdle
	case !strings.Contains(o.RedisURL, "min_idle_conns"):
		// Rate-limit checks travel one pipeline at a time per process
		// (limit.go); the join guard, the hub and the queue take a few
		// more. Keeping that many warm spares a burst the dials.
		ropt.MinIdleConns = 4
	}
	ropt.MinIdleConns = min(ropt.MinIdleConns, ropt.PoolSize)
	rdb := redis.NewClient(ropt)
	if err := rdb.Ping(pingCtx).Err(); err != nil {
		pool.Close()
		_ = rdb.Close()
		return nil, fmt.Errorf("redis at %s is unreachable: %w", ropt.Addr, err)
	}

	engine, err := queue.NewEngine(o.RedisURL, o.Queue+"-"+dep, o.Log)
	if err != nil {
		pool.Close()
		_ = rdb.Close()
		return nil, fmt.Errorf("queue: %w", err)
	}
	accounts := &account.Service{DB: pool, Now: o.Clock, BcryptCost: o.BcryptCost}
	agents := &karmadue.Service{DB: pool, Now: o.Clock}
	outbound := queue.NewOutbound(o.AllowTargets, o.RootCAs)
	notifier := &queue.Notifier{Client: outbound, Keys: o.SecretKey, Engine: engine, Log: o.Log, Sweep: o.Sweep, Timeout: o.ReceiverTimeout}
	notes := &notify.Service{DB: pool, Now: o.Clock, Keys: o.SecretKey, Verifier: notifier, Backoff: o.NotifyBackoff}
	notifier.Service = notes
	notifier.Register(engine)
	threads := &thread.Service{DB: pool, Now: o.Clock, Notify: roomNotify{notes, notifier}, Wake: engine}
	engine.Handle(thread.TaskDeadline, func(ctx context.Context, id int64) error {
		_, err := threads.Expire(ctx, id)
		return err
	})
	engine.Every("assign-sweep", o.Sweep, func(ctx context.Context) error {
		_, err := threads.Sweep(ctx, 50)
		return err
	})
	engine.Hosts().Cooldown = o.HostCooldown
	receivers := &queue.Receivers{Client: outbound, Keys: o.SecretKey, Timeout: o.ReceiverTimeout, Hosts: engine.Hosts()}
	tasks := &task.Service{DB: pool, Now: o.Clock,
		Receiver:  receivers,
		Wake:      taskWaker{engine},
		AllowHTTP: func(a netip.Addr) bool { return allowed(o.AllowTargets, a) },
		AgentRef: func(code string, accountID int64) string {
			return hex.EncodeToString(o.SecretKey.MAC("agent-ref", []byte("agent-ref:"+code+":"+strconv.FormatInt(accountID, 10))))[:16]
		},
		LadderScale: o.LadderScale, Grace: o.DeliveryGrace,
	}
	// A redelivery takes its turn at the receiver's host before the
	// attempt is counted.
	engine.Handle(task.TaskRedeliver, receivers.Paced(tasks.Target, tasks.Redeliver))
	engine.Every("receiver-sweep", o.Sweep, func(ctx context.Context) error {
		due, err := tasks.Due(ctx, 50)
		if err != nil {
			return err
		}
		for _, p := range due {
			if err := engine.EnqueueKey(ctx, task.TaskRedeliver, p.ID, p.Key(), time.Time{}); err != nil {
				// Redis is down: deliver from here rather than wait for it.
				if err := tasks.Redeliver(ctx, p.ID); err != nil {
					return err
				}
			}
		}
		return nil
	})
	engine.Every("claim-expiry", o.Sweep, func(ctx context.Context) error {
		_, err := tasks.ExpireClaims(ctx, 100)
		return err
	})
	letters := &kizuna.Delivery{DB: pool, Client: outbound, Keys: o.SecretKey, Now: o.Clock,
		LadderScale: o.LadderScale, Timeout: o.ReceiverTimeout, Log: o.Log}
	letters.Register(engine, o.Sweep)
	hub := &kizuna.Hub{DB: pool, Accounts: accounts, Keys: o.SecretKey, AdminToken: o.AdminToken, URL: o.PublicURL,
		Deliver: letters, BoxDir: o.BoxDir, Self: o.BoxSelf, Now: o.Clock, Log: o.Log}
	reg, err := tool.NewRegistry(append(tool.Kungfu(tool.Services{
		Accounts:  accounts,
		Memories:  &memory.Service{DB: pool, Now: o.Clock},
		Threads:   threads,
		Notify:    notes,
		Tasks:     tasks,
		JoinGuard: &JoinGuard{Redis: rdb, Prefix: prefix, MaxFailures: 20, Window: 15 * time.Minute},
		Links:     Links(o.PublicURL),
	}), karmadue.Tools(agents)...)...)
	if err != nil {
		pool.Close()
		_ = rdb.Close()
		return nil, err
	}
	srv := New(Config{PublicURL: o.PublicURL, TrustedProxies: o.TrustedProxies, LoopbackUnlimited: o.LoopbackUnlimited}, Deps{
		DB: pool, Redis: rdb, Accounts: accounts, Tools: reg, Log: o.Log, Keys: o.SecretKey,
		Limiter: &Limiter{Redis: rdb, Prefix: prefix, Rules: o.Limits},
		// Spent nonces live under the deployment's prefix, like the limits:
		// every process of one deployment refuses a nonce any of them saw.
		Door: &karmadue.Door{Agents: agents, Redis: rdb, Prefix: prefix, Now: o.Clock},
		Hub:  hub,
	})
	// The hub answers 429 in its own error shape from the same Redis windows.
	if srv.limiter != nil {
		hub.Limits = srv.limiter
	}
	hub.ClientIP = func(r *http.Request) (string, bool) {
		ip := srv.clientIP(r)
		return ip, srv.unlimited(ip)
	}
	return &App{Server: srv, Threads: threads, Tasks: tasks, Notify: notes, Engine: engine, Deployment: dep, DB: pool, Redis: rdb, log: o.Log}, nil
}

// deployment returns the id that namespaces this database's Redis keys and
// queues. A database copied from another (a test template, CREATE DATABASE
// ... TEMPLATE, a restore beside the original) carries the original's row
// under another oid: it takes an id of its own here, before anything
// touches Redis. Two processes racing on a fresh copy both read the id that
// won, since the loser's UPDATE waits for the winner and then matches
// nothing.
func deployment(ctx context.Context, db *pgxpool.Pool) (string, error) {
	if _, err := db.Exec(ctx, `UPDATE deployment SET id = replace(gen_random_uuid()::text, '-', ''), db_oid = d.oid, created_at = now()
		FROM pg_database d WHERE d.datname = current_database() AND deployment.db_oid <> d.oid`); err != nil {
		return "", fmt.Errorf("deployment id: %w", err)
	}
	var id string
	if err := db.QueryRow(ctx, `SELECT id FROM deployment`).Scan(&id); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return "", errors.New("deployment id: the deployment table is empty (its one row is made by migration 00006)")
		}
		return "", fmt.Errorf("deployment id: %w", err)
	}
	return id, nil
}

// DefaultDBMaxConns sizes the pool from the machine: pgx's own default (the
// CPU count, at least 4) leaves PostgreSQL idle while requests queue for a
// connection, and 16 is where fsynced writes on a small machine stop
// gaining. Each process of a deployment opens at most this many.
func DefaultDBMaxConns() int32 {
	return int32(max(16, 4*runtime.GOMAXPROCS(0)))
}

// DefaultDBMinConns keeps a quarter of max open while idle. pgx's default
// of zero lets the health check close every connection after an idle half
// hour, and the next burst then waits on a TCP handshake, authentication
// and a backend fork per connection before its first query; a quarter
// serves a burst's first requests at once while the pool opens the rest in
// parallel, and keeps many processes on one PostgreSQL well inside its
// max_connections.
func DefaultDBMinConns(max int32) int32 {
	return (max + 3) / 4
}

// DefaultRedisPoolSize is go-redis's own default (10 per CPU), stated here
// so the figure in the docs is the one Dojo uses: each request takes a
// Redis connection only for its rate-limit script, so the pool needs not
// grow with PostgreSQL's.
func DefaultRedisPoolSize() int {
	return 10 * runtime.GOMAXPROCS(0)
}

// DatabaseError says in one line why PostgreSQL could not be used: a server
// that answers is not "unreachable" because the database or the login is
// wrong, and the fix differs.
func DatabaseError(dsn string, err error) error {
	where := "postgres"
	db := ""
	if cfg, perr := pgconn.ParseConfig(dsn); perr == nil {
		where = fmt.Sprintf("postgres at %s:%d", cfg.Host, cfg.Port)
		db = cfg.Database
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "3D000":
			return fmt.Errorf("%s is up, but database %q does not exist: create it (createdb %s) or point DATABASE_URL at another", where, db, db)
		case "28000", "28P01":
			return fmt.Errorf("%s is up, but refused the login: check the user and password in DATABASE_URL", where)
		}
		return fmt.Errorf("%s refused the connection: %s", where, pe.Message)
	}
	return fmt.Errorf("%s is unreachable: %w", where, err)
}

// Links are the onboarding addresses under a public URL.
func Links(public string) tool.Links {
	return tool.Links{MCP: public + "/mcp", API: public + "/api/v1/", Docs: public + "/docs/"}
}

// taskWaker schedules receiver redeliveries, one queue task per attempt.
type taskWaker struct{ e *queue.Engine }

func (w taskWaker) EnqueueAttempt(ctx context.Context, id int64, attempt int, at time.Time) error {
	return w.e.EnqueueKey(ctx, task.TaskRedeliver, id, strconv.Itoa(attempt), at)
}

func allowed(allow []netip.Prefix, a netip.Addr) bool {
	for _, p := range allow {
		if p.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

// roomNotify joins the notify outbox (written in the fact's transaction)
// with the queue that pushes it after commit.
type roomNotify struct {
	svc *notify.Service
	q   *queue.Notifier
}

func (n roomNotify) Emit(ctx context.Context, tx pgx.Tx, accountID int64, kind string) (int64, bool, error) {
	return n.svc.Emit(ctx, tx, accountID, kind)
}

func (n roomNotify) Enqueue(ctx context.Context, ids ...int64) { n.q.Enqueue(ctx, ids...) }

// Serve answers on ln and runs the background engine until ctx ends, then
// stops accepting, lets in-flight requests finish (up to 10 s), stops the
// workers and returns nil.
func (a *App) Serve(ctx context.Context, ln net.Listener) error {
	workCtx, stopWork := context.WithCancel(context.Background())
	workDone := make(chan error, 1)
	go func() { workDone <- a.Engine.Run(workCtx) }()
	defer func() {
		stopWork()
		if err := <-workDone; err != nil {
			a.log.Error("background engine", "err", err)
		}
	}()
	hs := &http.Server{
		Handler:           a.Server.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	a.log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close releases the connections.
func (a *App) Close() {
	_ = a.Engine.Close()
	a.DB.Close()
	_ = a.Redis.Close()
}
