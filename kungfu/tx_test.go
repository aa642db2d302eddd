package kungfu_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/kungfu/notify"
)

// txDB is a database with a table t (id, v) and a traced pool of conns
// connections.
type txDB struct {
	pool *pgxpool.Pool
	tr   *kungfutest.Trips
}

func newTxDB(t *testing.T, conns int32) txDB {
	t.Helper()
	pool, tr := kungfutest.TracedPool(t, conns)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	tr.Take()
	return txDB{pool, tr}
}

// rows returns t's contents as id=v pairs.
func (db txDB) rows(t *testing.T) string {
	t.Helper()
	rows, err := db.pool.Query(context.Background(), `SELECT id::text || '=' || v FROM t ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(got, " ")
}

// reset empties t outside any transaction under test.
func (db txDB) reset(t *testing.T) {
	t.Helper()
	if _, err := db.pool.Exec(context.Background(), `TRUNCATE t`); err != nil {
		t.Fatal(err)
	}
	db.tr.Take()
}

// clean checks that every idle connection is outside any transaction:
// its status is idle and a fresh transaction on it has no xid yet.
func (db txDB) clean(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if n := db.pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired", n)
	}
	conns := db.pool.AcquireAllIdle(ctx)
	for _, c := range conns {
		if s := c.Conn().PgConn().TxStatus(); s != 'I' {
			t.Errorf("connection back in the pool with status %c", s)
		}
		var xid *string
		err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid)
		})
		if err != nil || xid != nil {
			t.Errorf("fresh transaction: xid %v, err %v", xid, err)
		}
		c.Release()
	}
	db.tr.Take()
}

// newConns is how many connections the pool has opened so far: one more
// than before means a connection was destroyed.
func (db txDB) newConns() int64 { return db.pool.Stat().NewConnsCount() }

func TestBeginFuncRoundTrips(t *testing.T) {
	t.Parallel()
	db := newTxDB(t, 1)
	ctx := context.Background()
	type begin func(context.Context, *pgxpool.Pool, func(pgx.Tx) error) error
	pgxBegin := func(ctx context.Context, p *pgxpool.Pool, fn func(pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, p, fn)
	}
	cases := []struct {
		name      string
		fn        func(pgx.Tx) error
		pgx, lazy int
	}{
		{"nothing", func(pgx.Tx) error { return nil }, 2, 0},
		{"row then exec", func(tx pgx.Tx) error {
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM t WHERE id > $1`, 0).Scan(&n); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, n+1, "x")
			return err
		}, 4, 3},
		{"batch", func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue(`SELECT 1 FROM t WHERE id = $1 FOR UPDATE`, 1)
			b.Queue(`INSERT INTO t VALUES ($1, $2)`, 2, "y")
			return tx.SendBatch(ctx, b).Close()
		}, 3, 2},
		{"exec first", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 3, "z")
			return err
		}, 3, 2},
		{"query first", func(tx pgx.Tx) error {
			rows, _ := tx.Query(ctx, `SELECT id FROM t WHERE id > $1`, 0)
			_, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			return err
		}, 3, 2},
		// Without arguments pgx sends the simple protocol: BEGIN goes alone.
		{"exec without arguments", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DELETE FROM t`)
			return err
		}, 3, 3},
	}
	for _, c := range cases {
		for _, impl := range []struct {
			name  string
			begin begin
			want  int
		}{{"pgx", pgxBegin, c.pgx}, {"lazy", kungfu.BeginFunc, c.lazy}} {
			db.reset(t)
			// Warm the statement cache so only executions count.
			_ = impl.begin(ctx, db.pool, c.fn)
			db.reset(t)
			if err := impl.begin(ctx, db.pool, c.fn); err != nil {
				t.Fatalf("%s %s: %v", c.name, impl.name, err)
			}
			got := db.tr.Take()
			if len(got) != impl.want {
				t.Errorf("%s %s: %d round trips %q, want %d", c.name, impl.name, len(got), got, impl.want)
			}
			if impl.name == "lazy" && c.lazy > 0 && c.lazy < c.pgx && (len(got) == 0 || got[0][0] != "begin" || len(got[0]) < 2) {
				t.Errorf("%s: BEGIN did not ride with the first statement: %q", c.name, got)
			}
		}
	}
	db.clean(t)
}

func TestBeginFuncCommitRollback(t *testing.T) {
	t.Parallel()
	db := newTxDB(t, 1)
	ctx := context.Background()
	conns := db.newConns()

	if err := kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 1, "kept")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got := db.rows(t); got != "1=kept" {
		t.Fatalf("after commit: %q", got)
	}

	boom := errors.New("boom")
	err := kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 2, "lost"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("fn's error: got %v", err)
	}
	if got := db.rows(t); got != "1=kept" {
		t.Fatalf("after rollback: %q", got)
	}
	db.clean(t)

	func() {
		defer func() {
			if r := recover(); r != "panic in fn" {
				t.Fatalf("recovered %v", r)
			}
		}()
		_ = kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 3, "lost"); err != nil {
				return err
			}
			panic("panic in fn")
		})
		t.Fatal("no panic")
	}()
	if got := db.rows(t); got != "1=kept" {
		t.Fatalf("after panic: %q", got)
	}
	db.clean(t)

	// A failing fn that sent nothing costs nothing.
	if err := kungfu.BeginFunc(ctx, db.pool, func(pgx.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("empty fn's error: got %v", err)
	}
	if got := db.tr.Take(); len(got) != 0 {
		t.Fatalf("empty transaction sent %q", got)
	}
	if n := db.newConns(); n != conns {
		t.Fatalf("%d connections opened, want %d: one was destroyed", n, conns)
	}
}

func TestBeginFuncFirstStatementFails(t *testing.T) {
	t.Parallel()
	db := newTxDB(t, 1)
	ctx := context.Background()
	if _, err := db.pool.Exec(ctx, `INSERT INTO t VALUES (1, 'a')`); err != nil {
		t.Fatal(err)
	}
	conns := db.newConns()
	insert := func(tx pgx.Tx, id int) error {
		_, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, id, "b")
		return err
	}
	code := func(err error) string {
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return pe.Code
		}
		return ""
	}
	for _, c := range []struct {
		name  string
		first func(pgx.Tx) error
		code  string
		// what a fn that swallows the error and commits gets
		commit error
	}{
		// A statement that fails to prepare fails before BEGIN runs.
		{"syntax error, row", func(tx pgx.Tx) error { var n int; return tx.QueryRow(ctx, `SELEC $1::int`, 1).Scan(&n) }, "42601", nil},
		{"syntax error, exec", func(tx pgx.Tx) error { _, err := tx.Exec(ctx, `INSERT INTO nowhere VALUES ($1)`, 1); return err }, "42P01", nil},
		{"syntax error, query", func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT nothing FROM t WHERE id = $1`, 1)
			if err == nil {
				rows.Close()
				err = rows.Err()
			}
			return err
		}, "42703", nil},
		{"unique violation", func(tx pgx.Tx) error { return insert(tx, 1) }, "23505", pgx.ErrTxCommitRollback},
		{"division by zero, row", func(tx pgx.Tx) error { var n int; return tx.QueryRow(ctx, `SELECT 1 / $1::int`, 0).Scan(&n) }, "22012", pgx.ErrTxCommitRollback},
	} {
		// fn returns the error: it is the statement's, unwrapped, and
		// nothing commits.
		err := kungfu.BeginFunc(ctx, db.pool, c.first)
		if code(err) != c.code {
			t.Errorf("%s: got %v, want SQLSTATE %s", c.name, err, c.code)
		}
		var pe pgx.ErrPreprocessingBatch
		if errors.As(err, &pe) {
			t.Errorf("%s: error %v is the batch's, not the statement's", c.name, err)
		}
		db.clean(t)

		// fn swallows it and goes on: nothing after it commits either.
		var later error
		err = kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
			_ = c.first(tx)
			later = insert(tx, 2)
			return nil
		})
		if err == nil || later == nil {
			t.Errorf("%s swallowed: commit %v, later statement %v; want errors", c.name, err, later)
		}
		if c.commit != nil && !errors.Is(err, c.commit) {
			t.Errorf("%s swallowed: commit %v, want %v", c.name, err, c.commit)
		}
		if got := db.rows(t); got != "1=a" {
			t.Fatalf("%s: rows %q", c.name, got)
		}
		db.clean(t)
	}

	// No row and a bad scan leave the transaction usable, as in pgx.
	for name, first := range map[string]func(pgx.Tx) error{
		"no rows": func(tx pgx.Tx) error {
			var n int
			return tx.QueryRow(ctx, `SELECT id FROM t WHERE id = $1`, 99).Scan(&n)
		},
		"bad scan": func(tx pgx.Tx) error { var n int; return tx.QueryRow(ctx, `SELECT v FROM t WHERE id = $1`, 1).Scan(&n) },
		"rows scan": func(tx pgx.Tx) error {
			rows, _ := tx.Query(ctx, `SELECT v FROM t WHERE id = $1`, 1)
			_, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			return err
		},
	} {
		var firstErr error
		err := kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
			firstErr = first(tx)
			return insert(tx, 2)
		})
		if firstErr == nil || err != nil {
			t.Errorf("%s: first %v, transaction %v", name, firstErr, err)
		}
		if name == "no rows" && !errors.Is(firstErr, pgx.ErrNoRows) {
			t.Errorf("no rows: %v", firstErr)
		}
		if got := db.rows(t); got != "1=a 2=b" {
			t.Fatalf("%s: rows %q", name, got)
		}
		if _, err := db.pool.Exec(ctx, `DELETE FROM t WHERE id = 2`); err != nil {
			t.Fatal(err)
		}
		db.clean(t)
	}
	if n := db.newConns(); n != conns {
		t.Fatalf("%d connections opened, want %d: one was destroyed", n, conns)
	}
}

func TestBeginFuncRowsAndBatches(t *testing.T) {
	t.Parallel()
	db := newTxDB(t, 1)
	ctx := context.Background()
	conns := db.newConns()

	// Rows closed early, and rows read to the end without Close: the
	// connection goes on in the same transaction.
	err := kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT g FROM generate_series(1, $1::int) g`, 10000)
		if err != nil {
			return err
		}
		if !rows.Next() {
			return rows.Err()
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 1, "after early close"); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT g FROM generate_series(1, $1::int) g`, 3)
		if err != nil {
			return err
		}
		n := 0
		for rows.Next() {
			n++
		}
		if err := rows.Err(); err != nil || n != 3 {
			return errors.Join(err, errors.New("wrong count"))
		}
		_, err = tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 2, "after reading all")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	// A batch first, with callbacks that Close runs; BEGIN's result is not
	// one of them.
	var got []string
	err = kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`SELECT v FROM t WHERE id = $1 FOR UPDATE`, 1).QueryRow(func(row pgx.Row) error {
			var v string
			err := row.Scan(&v)
			got = append(got, v)
			return err
		})
		b.Queue(`INSERT INTO t VALUES ($1, $2)`, 3, "batched").Exec(func(ct pgconn.CommandTag) error {
			got = append(got, ct.String())
			return nil
		})
		b.Queue(`SELECT id FROM t WHERE id > $1 ORDER BY id`, 0).Query(func(rows pgx.Rows) error {
			ids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			got = append(got, fmt.Sprint(ids))
			return err
		})
		b.Queue(`UPDATE t SET v = v || '!' WHERE id = $1`, 3)
		br := tx.SendBatch(ctx, b)
		if br.Tx() != nil {
			return errors.New("a batch inside a transaction has no Tx of its own")
		}
		return br.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, "|") != "after early close|INSERT 0 1|[1 2 3]" {
		t.Fatalf("callbacks saw %q", got)
	}
	if rows := db.rows(t); rows != "1=after early close 2=after reading all 3=batched!" {
		t.Fatalf("rows %q", rows)
	}

	// A callback's error fails the batch and the transaction.
	boom := errors.New("boom")
	err = kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`DELETE FROM t WHERE id = $1`, 1)
		b.Queue(`SELECT 1`).QueryRow(func(pgx.Row) error { return boom })
		return tx.SendBatch(ctx, b).Close()
	})
	if !errors.Is(err, boom) {
		t.Fatalf("callback error: %v", err)
	}
	if rows := db.rows(t); !strings.HasPrefix(rows, "1=") {
		t.Fatalf("rows %q", rows)
	}
	db.clean(t)
	if n := db.newConns(); n != conns {
		t.Fatalf("%d connections opened, want %d: one was destroyed", n, conns)
	}
}

// TestBeginFuncSavepoints nests a transaction the way notify.Emit does: a
// savepoint rolled back on ErrNoRows leaves the outer transaction going.
func TestBeginFuncSavepoints(t *testing.T) {
	t.Parallel()
	db := newTxDB(t, 1)
	ctx := context.Background()
	nested := func(tx pgx.Tx) error {
		err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			if _, err := sp.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 9, "rolled back"); err != nil {
				return err
			}
			var id int
			return sp.QueryRow(ctx, `SELECT id FROM t WHERE id = $1`, 99).Scan(&id)
		})
		if !errors.Is(err, pgx.ErrNoRows) {
			return errors.Join(errors.New("nested"), err)
		}
		_, _, err = (&notify.Service{Now: kungfu.SystemClock}).Emit(ctx, tx, 1, notify.KindReply)
		return err
	}
	for i, fn := range []func(pgx.Tx) error{
		func(tx pgx.Tx) error { // savepoint after the first statement
			if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 1, "outer"); err != nil {
				return err
			}
			return nested(tx)
		},
		func(tx pgx.Tx) error { // savepoint first: BEGIN goes alone
			if err := nested(tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 2, "outer")
			return err
		},
	} {
		if err := kungfu.BeginFunc(ctx, db.pool, fn); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
	}
	if rows := db.rows(t); rows != "1=outer 2=outer" {
		t.Fatalf("rows %q", rows)
	}
	db.clean(t)
}

// TestBeginFuncOther covers the calls a batch cannot carry: they send
// BEGIN on its own first.
func TestBeginFuncOther(t *testing.T) {
	t.Parallel()
	db := newTxDB(t, 1)
	ctx := context.Background()
	steps := []func(pgx.Tx) error{
		func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, pgx.QueryExecModeSimpleProtocol, 1, "simple")
			return err
		},
		func(tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"t"}, []string{"id", "v"}, pgx.CopyFromRows([][]any{{2, "copied"}}))
			return err
		},
		func(tx pgx.Tx) error {
			if _, err := tx.Prepare(ctx, "ins", `INSERT INTO t VALUES ($1, $2)`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "ins", 3, "prepared")
			return err
		},
		func(tx pgx.Tx) error {
			lo := tx.LargeObjects()
			_, err := lo.Create(ctx, 0)
			return err
		},
		func(tx pgx.Tx) error {
			var v string
			return tx.QueryRow(ctx, `SELECT v FROM t WHERE id = $1`, pgx.QueryResultFormats{pgx.TextFormatCode}, 1).Scan(&v)
		},
	}
	for i, step := range steps {
		if err := kungfu.BeginFunc(ctx, db.pool, step); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got := db.tr.Take(); len(got) == 0 || got[0][0] != "begin" || len(got[0]) != 1 {
			t.Errorf("step %d: %q, want BEGIN alone first", i, got)
		}
	}
	if rows := db.rows(t); rows != "1=simple 2=copied 3=prepared" {
		t.Fatalf("rows %q", rows)
	}
	db.clean(t)
}

// TestBeginFuncLocks runs two transactions on one row: the second waits
// for the first's lock, taken by the statement BEGIN rode with, exactly as
// with pgx.BeginFunc.
func TestBeginFuncLocks(t *testing.T) {
	t.Parallel()
	db := newTxDB(t, 2)
	ctx := context.Background()
	if _, err := db.pool.Exec(ctx, `INSERT INTO t VALUES (1, '0')`); err != nil {
		t.Fatal(err)
	}
	type begin func(context.Context, *pgxpool.Pool, func(pgx.Tx) error) error
	for name, b := range map[string]begin{
		"pgx": func(ctx context.Context, p *pgxpool.Pool, fn func(pgx.Tx) error) error {
			return pgx.BeginFunc(ctx, p, fn)
		},
		"lazy": kungfu.BeginFunc,
	} {
		const hold = 300 * time.Millisecond
		locked := make(chan struct{})
		var wg sync.WaitGroup
		var first error
		wg.Go(func() {
			first = b(ctx, db.pool, func(tx pgx.Tx) error {
				var v string
				if err := tx.QueryRow(ctx, `SELECT v FROM t WHERE id = $1 FOR UPDATE`, 1).Scan(&v); err != nil {
					return err
				}
				close(locked)
				time.Sleep(hold)
				_, err := tx.Exec(ctx, `UPDATE t SET v = v || 'a' WHERE id = $1`, 1)
				return err
			})
		})
		<-locked
		start := time.Now()
		var seen string
		err := b(ctx, db.pool, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT v FROM t WHERE id = $1 FOR UPDATE`, 1).Scan(&seen); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE t SET v = v || 'b' WHERE id = $1`, 1)
			return err
		})
		waited := time.Since(start)
		wg.Wait()
		if first != nil || err != nil {
			t.Fatalf("%s: %v, %v", name, first, err)
		}
		if waited < hold*2/3 || !strings.HasSuffix(seen, "a") {
			t.Errorf("%s: the second waited %v and saw %q; want it to wait for the first and see its update", name, waited, seen)
		}
	}
	if rows := db.rows(t); rows != "1=0abab" {
		t.Fatalf("rows %q", rows)
	}
	db.clean(t)
}

func TestBeginFuncContext(t *testing.T) {
	t.Parallel()
	db := newTxDB(t, 1)
	insert := func(ctx context.Context, tx pgx.Tx, id int) error {
		_, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, id, "lost")
		return err
	}

	// Cancelled before anything is sent.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error { return insert(ctx, tx, 1) }); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	// Cancelled after the first statement.
	ctx, cancel = context.WithCancel(context.Background())
	err := kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if err := insert(ctx, tx, 2); err != nil {
			return err
		}
		cancel()
		return insert(ctx, tx, 3)
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled midway: %v", err)
	}
	// Cancelled while the first statement runs.
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t SELECT $1, 'lost' FROM pg_sleep(5)`, 4); err != nil {
			return err
		}
		return insert(ctx, tx, 5)
	})
	if err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("timed out statement: %v after %v", err, time.Since(start))
	}
	if rows := db.rows(t); rows != "" {
		t.Fatalf("rows %q", rows)
	}
	db.clean(t)
}

func TestSendFinal(t *testing.T) {
	t.Parallel()
	db := newTxDB(t, 1)
	ctx := context.Background()
	insert := func(id int, v string) *pgx.Batch {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO t VALUES ($1, $2)`, id, v)
		return b
	}
	// Warm the statement cache, COMMIT's included, so only executions count.
	_ = kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		return kungfu.SendFinal(ctx, tx, insert(0, "warm")).Close()
	})
	db.reset(t)

	// Alone, the whole transaction is one round trip.
	if err := kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		return kungfu.SendFinal(ctx, tx, insert(1, "a")).Close()
	}); err != nil {
		t.Fatal(err)
	}
	if got := db.tr.Take(); len(got) != 1 || len(got[0]) != 3 || got[0][0] != "begin" || got[0][2] != "COMMIT" {
		t.Fatalf("round trips %q, want one: BEGIN, the insert, COMMIT", got)
	}
	if got := db.rows(t); got != "1=a" {
		t.Fatalf("rows %q, want 1=a", got)
	}

	// After a first statement: two round trips, and the rows are there.
	db.reset(t)
	if err := kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 1, "a"); err != nil {
			return err
		}
		return kungfu.SendFinal(ctx, tx, insert(2, "b")).Close()
	}); err != nil {
		t.Fatal(err)
	}
	if got := db.tr.Take(); len(got) != 2 {
		t.Fatalf("round trips %q, want 2", got)
	}
	if got := db.rows(t); got != "1=a 2=b" {
		t.Fatalf("rows %q, want 1=a 2=b", got)
	}

	// A failing statement skips COMMIT: nothing of the transaction stays.
	db.reset(t)
	err := kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 1, "a"); err != nil {
			return err
		}
		b := insert(2, "b")
		b.Queue(`INSERT INTO t VALUES ($1, $2)`, 1, "dup")
		return kungfu.SendFinal(ctx, tx, b).Close()
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("err %v, want the unique violation", err)
	}
	if got := db.rows(t); got != "" {
		t.Fatalf("rows %q after a failed last batch, want none", got)
	}
	db.clean(t)

	// fn ignoring that failure still commits nothing.
	err = kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		b := insert(1, "a")
		b.Queue(`INSERT INTO t VALUES ($1, $2)`, 1, "dup")
		_ = kungfu.SendFinal(ctx, tx, b).Close()
		return nil
	})
	if err == nil || db.rows(t) != "" {
		t.Fatalf("err %v, rows %q: an aborted transaction must not report a commit", err, db.rows(t))
	}
	db.clean(t)

	// Once committed, the transaction is over: later statements fail and
	// write nothing, and an error from fn after it does not undo it.
	db.reset(t)
	late := errors.New("late")
	var after error
	err = kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if err := kungfu.SendFinal(ctx, tx, insert(1, "a")).Close(); err != nil {
			return err
		}
		_, after = tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 2, "b")
		return late
	})
	if !errors.Is(err, late) || !errors.Is(after, pgx.ErrTxClosed) {
		t.Fatalf("err %v, statement after commit %v; want late and ErrTxClosed", err, after)
	}
	if got := db.rows(t); got != "1=a" {
		t.Fatalf("rows %q, want 1=a: the commit stands", got)
	}
	db.clean(t)

	// Outside BeginFunc it is SendBatch, and the commit comes as usual.
	db.reset(t)
	if err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		return kungfu.SendFinal(ctx, tx, insert(1, "a")).Close()
	}); err != nil {
		t.Fatal(err)
	}
	if got := db.tr.Take(); len(got) != 3 {
		t.Fatalf("round trips %q on a pgx transaction, want 3 (BEGIN, batch, COMMIT)", got)
	}
	if got := db.rows(t); got != "1=a" {
		t.Fatalf("rows %q, want 1=a", got)
	}
	db.clean(t)
}

// TestSendFinalEdges covers what a last batch leaves when something goes
// wrong after PostgreSQL ran it, or when fn forgets its results: the
// outcome BeginFunc reports is the server's, and nothing of the
// transaction ever runs in autocommit afterwards.
func TestSendFinalEdges(t *testing.T) {
	t.Parallel()
	db := newTxDB(t, 1)
	ctx := context.Background()
	if _, err := db.pool.Exec(ctx, `CREATE TABLE d (k int, CONSTRAINT d_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	count := func(table string) int {
		var n int
		if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The COMMIT itself fails (a deferred unique key): nothing is kept,
	// and BeginFunc says so even when fn ignores it.
	for _, ignore := range []bool{false, true} {
		err := kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO d VALUES ($1)`, 1); err != nil {
				return err
			}
			b := &pgx.Batch{}
			b.Queue(`INSERT INTO d VALUES ($1)`, 1)
			err := kungfu.SendFinal(ctx, tx, b).Close()
			if ignore {
				return nil
			}
			return err
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" || count("d") != 0 {
			t.Fatalf("failed COMMIT (fn ignores it: %v): err %v, %d rows", ignore, err, count("d"))
		}
		db.clean(t)
	}

	// An error PostgreSQL did not raise comes after the COMMIT ran: the
	// rows stay, and a statement after it fails instead of autocommitting,
	// a savepoint's included.
	db.reset(t)
	var after, inSavepoint error
	err := kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 1, "a"); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO t VALUES ($1, $2)`, 2, "b")
		b.Queue(`SELECT 'not a number'::text`)
		br := kungfu.SendFinal(ctx, tx, b)
		_, _ = br.Exec()
		var n int
		scanErr := br.QueryRow().Scan(&n)
		_ = br.Close()
		_, after = tx.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 3, "c")
		_, inSavepoint = sp.Exec(ctx, `INSERT INTO t VALUES ($1, $2)`, 4, "d")
		return scanErr
	})
	if err == nil || !errors.Is(after, pgx.ErrTxClosed) || !errors.Is(inSavepoint, pgx.ErrTxClosed) {
		t.Fatalf("err %v, after %v, in the savepoint %v", err, after, inSavepoint)
	}
	if got := db.rows(t); got != "1=a 2=b" {
		t.Fatalf("rows %q, want 1=a 2=b: the server committed, and nothing ran after", got)
	}
	db.clean(t)

	// fn never closes the last batch's results: BeginFunc does, and the
	// transaction commits.
	db.reset(t)
	if err := kungfu.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO t VALUES ($1, $2)`, 1, "a")
		_ = kungfu.SendFinal(ctx, tx, b)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := db.rows(t); got != "1=a" {
		t.Fatalf("rows %q, want 1=a", got)
	}
	db.clean(t)
}
