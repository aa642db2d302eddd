package kungfutest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/migrations"
)

// AdminURL is the maintenance database tests create their databases from.
func AdminURL() string {
	if v := os.Getenv("DOJO_TEST_DATABASE_URL"); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// RedisURL is the Redis tests share (each under its own prefix).
func RedisURL() string {
	if v := os.Getenv("DOJO_TEST_REDIS_URL"); v != "" {
		return v
	}
	return "redis://127.0.0.1:6379/0"
}

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// template returns the name of a database holding the current migrations.
// Its name carries a hash of the migration files, so a changed schema gets
// a new template; an advisory lock stops parallel test binaries from
// building it twice.
func template(ctx context.Context) (string, error) {
	templateOnce.Do(func() {
		h := sha256.New()
		names, _ := fs.Glob(migrations.FS(), "*.sql")
		sort.Strings(names)
		for _, n := range names {
			b, _ := fs.ReadFile(migrations.FS(), n)
			h.Write([]byte(n))
			h.Write(b)
		}
		templateName = "dojo_tmpl_" + hex.EncodeToString(h.Sum(nil))[:16]
		templateErr = buildTemplate(ctx, templateName)
	})
	return templateName, templateErr
}

func buildTemplate(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return fmt.Errorf("kungfutest: PostgreSQL at %s is not reachable (run .ci/run, or set DOJO_TEST_DATABASE_URL): %w", AdminURL(), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(7320514)`); err != nil {
		return err
	}
	defer conn.Exec(context.Background(), `SELECT pg_advisory_unlock(7320514)`)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	// Build under a scratch name and rename when complete, so a crash never
	// leaves a half-migrated template behind.
	scratch := name + "_build"
	_, _ = conn.Exec(ctx, `DROP DATABASE IF EXISTS `+scratch+` WITH (FORCE)`)
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+scratch); err != nil {
		return err
	}
	if _, err := migrations.Up(ctx, withDB(AdminURL(), scratch)); err != nil {
		return fmt.Errorf("kungfutest: migrate template: %w", err)
	}
	_, err = conn.Exec(ctx, `ALTER DATABASE `+scratch+` RENAME TO `+name)
	return err
}

func withDB(dsn, db string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		panic(err)
	}
	u.Path = "/" + db
	return u.String()
}

func random() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// DatabaseURL creates a fresh migrated database for t and drops it when t
// ends.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tmpl, err := template(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	name := "dojo_t_" + random()
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+name+` TEMPLATE `+tmpl); err != nil {
		t.Fatalf("kungfutest: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, AdminURL())
		if err != nil {
			t.Errorf("kungfutest: drop %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`); err != nil {
			t.Errorf("kungfutest: drop %s: %v", name, err)
		}
	})
	return withDB(AdminURL(), name)
}

// Pool opens a pool on a fresh database.
func Pool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := DatabaseURL(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, dsn
}

// Redis is a client of the test Redis, closed when t ends.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// RedisPrefix returns a key prefix owned by t; its keys are deleted when t
// ends.
func RedisPrefix(t testing.TB) string {
	t.Helper()
	opt, err := redis.ParseURL(RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		t.Fatalf("kungfutest: Redis at %s is not reachable (run .ci/run, or set DOJO_TEST_REDIS_URL): %v", opt.Addr, err)
	}
	prefix := "dojotest:" + random() + ":"
	t.Cleanup(func() {
		defer rdb.Close()
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 500).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	})
	return prefix
}

// Queue returns an asynq queue name owned by t. asynq keeps a queue's keys
// under asynq:{<name>}:; they, and those of every queue whose name starts
// with name (relay.Open appends the deployment id), are removed when t ends.
func Queue(t testing.TB) string {
	t.Helper()
	name := "dojotest-" + random()
	t.Cleanup(func() {
		opt, err := redis.ParseURL(RedisURL())
		if err != nil {
			return
		}
		rdb := redis.NewClient(opt)
		defer rdb.Close()
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, "asynq:{"+name+"*", 500).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
		queues, _ := rdb.SMembers(ctx, "asynq:queues").Result()
		for _, q := range queues {
			if strings.HasPrefix(q, name) {
				rdb.SRem(ctx, "asynq:queues", q)
			}
		}
	})
	return name
}

// Account inserts a bare active account for domain tests that need an id
// but not the registration path; it holds no key and no credits.
func Account(t testing.TB, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, name string) kungfu.Caller {
	t.Helper()
	var id int64
	if err := db.QueryRow(context.Background(),
		`INSERT INTO accounts (name, password_hash, created_at, updated_at) VALUES ($1, 'x', now(), now()) RETURNING id`, name).Scan(&id); err != nil {
		t.Fatalf("kungfutest: account %s: %v", name, err)
	}
	return kungfu.Caller{AccountID: id, Name: name}
}
