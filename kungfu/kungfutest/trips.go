package kungfutest

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Trips is a pgx tracer that records what a pool sends PostgreSQL, one
// entry per round trip: a query's SQL, or a batch's statements in order.
// Preparing a statement the first time is not recorded.
type Trips struct {
	mu   sync.Mutex
	sent [][]string
}

func (tr *Trips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.sent = append(tr.sent, []string{d.SQL})
	return ctx
}

func (tr *Trips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *Trips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var sqls []string
	for _, q := range d.Batch.QueuedQueries {
		sqls = append(sqls, q.SQL)
	}
	tr.sent = append(tr.sent, sqls)
	return ctx
}

func (tr *Trips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (tr *Trips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// Take returns what was sent since the last Take.
func (tr *Trips) Take() [][]string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	s := tr.sent
	tr.sent = nil
	return s
}

// TracedPool is a pool on a database of t's own whose round trips tr
// records; maxConns 0 keeps pgx's default.
func TracedPool(t testing.TB, maxConns int32) (*pgxpool.Pool, *Trips) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	tr := &Trips{}
	cfg.ConnConfig.Tracer = tr
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db, tr
}
