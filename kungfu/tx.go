package kungfu

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BeginFunc is pgx.BeginFunc on one of db's connections, minus the round
// trip BEGIN spends on its own: BEGIN travels in one batch with the
// transaction's first statement (or first batch). PostgreSQL makes the
// batch's implicit transaction explicit at BEGIN, so everything after it
// behaves as in a transaction begun apart. fn sending nothing sends no
// BEGIN and no COMMIT.
func BeginFunc(ctx context.Context, db *pgxpool.Pool, fn func(pgx.Tx) error) (err error) {
	c, err := db.Acquire(ctx)
	if err != nil {
		return err
	}
	// The pool destroys a connection released busy or inside a
	// transaction, e.g. after a failed rollback.
	defer c.Release()
	t := &lazyTx{conn: c.Conn()}
	defer func() {
		if rerr := t.Rollback(ctx); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
			err = rerr
		}
	}()
	if err := fn(t); err != nil {
		_ = t.Rollback(ctx) // fn's error is the one to report
		return err
	}
	return t.Commit(ctx)
}

// lazyTx is a pgx.Tx that begins with its first statement. Once BEGIN is
// sent, real is pgx's own transaction and every call goes to it.
type lazyTx struct {
	conn *pgx.Conn
	real pgx.Tx
	// final is the last batch (SendFinal), whose Close settles the end.
	final *finalResults
	// over says the transaction ended in its last batch, and committed
	// that PostgreSQL confirmed the COMMIT there: BeginFunc has nothing
	// left to end, and every later statement fails with pgx.ErrTxClosed.
	over, committed bool
}

// SendFinal sends b as the last batch of a transaction begun by BeginFunc,
// with COMMIT behind it in the same round trip, and returns its results;
// COMMIT's own is read by Close (BeginFunc closes them if fn did not).
//
// If PostgreSQL refuses a statement of b, it skips the rest and COMMIT with
// them: the transaction stays open, aborted, and is rolled back when fn
// returns the error, as ever. If the COMMIT itself fails, nothing was kept
// and BeginFunc reports it even if fn does not. An error PostgreSQL did
// not raise (a Scan into the wrong type, a callback's own error) comes
// after the server ran everything, COMMIT included: what b wrote stays.
// So a caller only sends as final what it keeps whatever it then reads.
// Once b is sent, the transaction is over for the caller: any later
// statement, a savepoint's included, fails with pgx.ErrTxClosed.
//
// On any other pgx.Tx, SendFinal is SendBatch and the commit comes when fn
// returns.
func SendFinal(ctx context.Context, tx pgx.Tx, b *pgx.Batch) pgx.BatchResults {
	t, ok := tx.(*lazyTx)
	if !ok || len(b.QueuedQueries) == 0 || t.over || t.final != nil {
		return tx.SendBatch(ctx, b)
	}
	b.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
		// COMMIT of a transaction that failed answers ROLLBACK; in a
		// batch it never runs then, but the tag is the proof either way.
		if tag.String() != "COMMIT" {
			return pgx.ErrTxCommitRollback
		}
		t.committed = true
		return nil
	})
	t.final = &finalResults{BatchResults: t.SendBatch(ctx, b), t: t}
	return t.final
}

// finalResults are the results of the batch that carried COMMIT.
type finalResults struct {
	pgx.BatchResults
	t      *lazyTx
	closed bool
	err    error
}

func (r *finalResults) Close() error {
	if r.closed {
		return r.err
	}
	r.closed = true
	r.err = r.BatchResults.Close()
	// Outside a transaction now (it committed, or its COMMIT failed): no
	// other statement of it may run, least of all in autocommit.
	if r.t.committed || r.t.conn.PgConn().TxStatus() == 'I' {
		r.t.over = true
		r.t.real = closedTx()
	}
	return r.err
}

// errUnconfirmed ends a transaction whose last batch left the connection
// outside any transaction without its COMMIT's answer read: the COMMIT
// failed, or a callback's error came before it.
var errUnconfirmed = errors.New("the transaction's last batch did not confirm its COMMIT")

// settle closes the last batch's results if fn did not.
func (t *lazyTx) settle() error {
	if t.final == nil {
		return nil
	}
	return t.final.Close()
}

// begin sends queued with BEGIN ahead of it, and reads BEGIN's result: an
// error stays in the results and meets the caller's first read.
func (t *lazyTx) begin(ctx context.Context, queued ...*pgx.QueuedQuery) pgx.BatchResults {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.QueuedQueries = append(b.QueuedQueries, queued...)
	br := t.conn.SendBatch(ctx, b)
	t.real = br.Tx()
	_, _ = br.Exec()
	return br
}

// start sends BEGIN on its own, for the calls a batch cannot carry.
func (t *lazyTx) start(ctx context.Context) error {
	if t.real != nil {
		return nil
	}
	real, err := t.conn.Begin(ctx)
	if err != nil {
		t.real = closedTx()
		return err
	}
	t.real = real
	return nil
}

// closedTx is a transaction that is over: every call returns
// pgx.ErrTxClosed.
func closedTx() pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, pgx.ErrTxClosed).Tx()
}

// batchable reports whether a statement can ride in a batch: a batch takes
// no per-statement exec mode or result formats.
func batchable(args []any) bool {
	if len(args) == 0 {
		return true
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

// single returns a statement's error as the statement alone would have:
// pgx wraps a batch's prepare and encode errors.
func single(err error) error {
	var pe pgx.ErrPreprocessingBatch
	if errors.As(err, &pe) {
		return pe.Unwrap()
	}
	return err
}

func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	// Without arguments pgx sends the simple protocol, whose SQL may hold
	// several statements; a batch takes one each.
	if t.real == nil && len(args) > 0 && batchable(args) {
		br := t.begin(ctx, &pgx.QueuedQuery{SQL: sql, Arguments: args})
		tag, err := br.Exec()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return tag, single(err)
	}
	if err := t.start(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.real.Exec(ctx, sql, args...)
}

func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.real == nil && batchable(args) {
		br := t.begin(ctx, &pgx.QueuedQuery{SQL: sql, Arguments: args})
		inner, err := br.Query()
		r := &firstRows{Rows: inner, br: br}
		if err != nil {
			r.Close()
			return r, single(err)
		}
		return r, nil
	}
	if err := t.start(ctx); err != nil {
		rows, _ := t.real.Query(ctx, sql, args...)
		return rows, err
	}
	return t.real.Query(ctx, sql, args...)
}

func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.real == nil && batchable(args) {
		br := t.begin(ctx, &pgx.QueuedQuery{SQL: sql, Arguments: args})
		return firstRow{br: br, row: br.QueryRow()}
	}
	if err := t.start(ctx); err != nil {
		return errRow{err}
	}
	return t.real.QueryRow(ctx, sql, args...)
}

func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	switch {
	case t.real != nil:
		return t.real.SendBatch(ctx, b)
	case len(b.QueuedQueries) == 0:
		return t.conn.SendBatch(ctx, b) // sends nothing, as in a transaction
	}
	return batchResults{t.begin(ctx, b.QueuedQueries...)}
}

func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.start(ctx); err != nil {
		return nil, err
	}
	sp, err := t.real.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return savepoint{Tx: sp, parent: t}, nil
}

func (t *lazyTx) Commit(ctx context.Context) error {
	serr := t.settle()
	switch {
	case t.committed:
		return nil
	case t.over && serr != nil:
		return serr
	case t.over:
		return errUnconfirmed
	}
	if t.real == nil {
		t.real = closedTx()
		return nil
	}
	return t.real.Commit(ctx)
}

func (t *lazyTx) Rollback(ctx context.Context) error {
	_ = t.settle() // its error is fn's to report
	if t.over {
		return nil
	}
	if t.real == nil {
		t.real = closedTx()
		return nil
	}
	return t.real.Rollback(ctx)
}

func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.start(ctx); err != nil {
		return 0, err
	}
	return t.real.CopyFrom(ctx, table, columns, src)
}

func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.start(ctx); err != nil {
		return nil, err
	}
	return t.real.Prepare(ctx, name, sql)
}

// LargeObjects has no context to begin with; its objects live in the
// transaction, so it must have begun.
func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	_ = t.start(context.Background())
	return t.real.LargeObjects()
}

func (t *lazyTx) Conn() *pgx.Conn { return t.conn }

// firstRow is the first statement's row: scanning it finishes the batch
// that carried BEGIN.
type firstRow struct {
	br  pgx.BatchResults
	row pgx.Row
}

func (r firstRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return single(err)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// firstRows are the first statement's rows: closing them, or reading past
// the last, finishes the batch that carried BEGIN.
type firstRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error
}

func (r *firstRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *firstRows) Scan(dest ...any) error {
	err := r.Rows.Scan(dest...)
	if err != nil {
		r.Close() // pgx closed the rows; the batch must follow
	}
	return err
}

func (r *firstRows) Values() ([]any, error) {
	v, err := r.Rows.Values()
	if err != nil {
		r.Close()
	}
	return v, err
}

func (r *firstRows) Close() {
	r.Rows.Close()
	if r.br != nil {
		r.err = r.br.Close()
		r.br = nil
	}
}

func (r *firstRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return single(err)
	}
	return single(r.err)
}

// batchResults hides that the batch began the transaction.
type batchResults struct{ pgx.BatchResults }

func (batchResults) Tx() pgx.Tx { return nil }

// savepoint is a savepoint of a lazyTx: once the transaction ended in its
// last batch, its statements fail rather than run in autocommit.
type savepoint struct {
	pgx.Tx
	parent *lazyTx
}

func (s savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	if s.parent.over {
		return nil, pgx.ErrTxClosed
	}
	sp, err := s.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return savepoint{Tx: sp, parent: s.parent}, nil
}

func (s savepoint) Commit(ctx context.Context) error {
	if s.parent.over {
		return pgx.ErrTxClosed
	}
	return s.Tx.Commit(ctx)
}

func (s savepoint) Rollback(ctx context.Context) error {
	if s.parent.over {
		return pgx.ErrTxClosed
	}
	return s.Tx.Rollback(ctx)
}

func (s savepoint) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if s.parent.over {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return s.Tx.Exec(ctx, sql, args...)
}

func (s savepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if s.parent.over {
		return closedTx().Query(ctx, sql, args...)
	}
	return s.Tx.Query(ctx, sql, args...)
}

func (s savepoint) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if s.parent.over {
		return errRow{pgx.ErrTxClosed}
	}
	return s.Tx.QueryRow(ctx, sql, args...)
}

func (s savepoint) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if s.parent.over {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return s.Tx.SendBatch(ctx, b)
}

func (s savepoint) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if s.parent.over {
		return 0, pgx.ErrTxClosed
	}
	return s.Tx.CopyFrom(ctx, table, columns, src)
}
