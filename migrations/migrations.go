package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// FS returns the embedded migration files.
func FS() fs.FS { return files }

func provider(db *sql.DB) (*goose.Provider, error) {
	return goose.NewProvider(goose.DialectPostgres, db, files)
}

// open reads dsn the way the server's pool does, so pool settings such as
// pool_max_conns stay settings of Dojo's and never reach PostgreSQL as
// unknown run-time parameters.
func open(dsn string) (*sql.DB, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	return stdlib.OpenDB(*cfg.ConnConfig), nil
}

// Up applies every pending migration and returns how many ran. Running it
// again is a no-op, and two processes racing here are serialized by goose's
// session lock.
func Up(ctx context.Context, dsn string) (int, error) {
	db, err := open(dsn)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return 0, fmt.Errorf("migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, goose.WithSessionLocker(locker))
	if err != nil {
		return 0, fmt.Errorf("migrations: %w", err)
	}
	res, err := p.Up(ctx)
	if err != nil {
		return 0, fmt.Errorf("migrate up: %w", err)
	}
	return len(res), nil
}

// Pending reports how many embedded migrations the database has not applied.
func Pending(ctx context.Context, dsn string) (int, error) {
	db, err := open(dsn)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	p, err := provider(db)
	if err != nil {
		return 0, fmt.Errorf("migrations: %w", err)
	}
	st, err := p.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("migration status: %w", err)
	}
	n := 0
	for _, s := range st {
		if s.State == goose.StatePending {
			n++
		}
	}
	return n, nil
}
