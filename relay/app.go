package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/account"
	"github.com/dojo-relay/dojo/kungfu/memory"
	"github.com/dojo-relay/dojo/kungfu/thread"
	"github.com/dojo-relay/dojo/kungfu/tool"
	"github.com/dojo-relay/dojo/migrations"
)

// Options configure one Dojo process.
type Options struct {
	DatabaseURL    string
	RedisURL       string
	RedisPrefix    string
	PublicURL      string
	Limits         map[string]Rule
	TrustedProxies []netip.Prefix
	// BcryptCost is for tests; zero means bcrypt's default.
	BcryptCost int
	Clock      kungfu.Clock
	Log        *slog.Logger
}

// App is a fully wired Dojo process.
type App struct {
	Server  *Server
	Threads *thread.Service
	DB      *pgxpool.Pool
	Redis   *redis.Client
	log     *slog.Logger
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
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()

	pcfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres at %s:%d is unreachable: %w", pcfg.ConnConfig.Host, pcfg.ConnConfig.Port, err)
	}
	if n, err := migrations.Pending(pingCtx, o.DatabaseURL); err != nil || n > 0 {
		pool.Close()
		if err != nil {
			return nil, fmt.Errorf("postgres schema: %w", err)
		}
		return nil, fmt.Errorf("the database is not migrated (%d migrations pending): run `dojo migrate`", n)
	}
	ropt, err := redis.ParseURL(o.RedisURL)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	rdb := redis.NewClient(ropt)
	if err := rdb.Ping(pingCtx).Err(); err != nil {
		pool.Close()
		_ = rdb.Close()
		return nil, fmt.Errorf("redis at %s is unreachable: %w", ropt.Addr, err)
	}

	accounts := &account.Service{DB: pool, Now: o.Clock, BcryptCost: o.BcryptCost}
	threads := &thread.Service{DB: pool, Now: o.Clock}
	reg, err := tool.NewRegistry(tool.Kungfu(tool.Services{
		Accounts:  accounts,
		Memories:  &memory.Service{DB: pool, Now: o.Clock},
		Threads:   threads,
		JoinGuard: &JoinGuard{Redis: rdb, Prefix: o.RedisPrefix, MaxFailures: 20, Window: 15 * time.Minute},
		Links:     Links(o.PublicURL),
	})...)
	if err != nil {
		pool.Close()
		_ = rdb.Close()
		return nil, err
	}
	srv := New(Config{PublicURL: o.PublicURL, TrustedProxies: o.TrustedProxies}, Deps{
		DB: pool, Redis: rdb, Accounts: accounts, Tools: reg, Log: o.Log,
		Limiter: &Limiter{Redis: rdb, Prefix: o.RedisPrefix, Rules: o.Limits},
	})
	return &App{Server: srv, Threads: threads, DB: pool, Redis: rdb, log: o.Log}, nil
}

// Links are the onboarding addresses under a public URL.
func Links(public string) tool.Links {
	return tool.Links{MCP: public + "/mcp", API: public + "/api/v1/", Docs: public + "/docs/"}
}

// Serve answers on ln until ctx ends, then stops accepting, lets in-flight
// requests finish (up to 10 s) and returns nil.
func (a *App) Serve(ctx context.Context, ln net.Listener) error {
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
	a.DB.Close()
	_ = a.Redis.Close()
}
