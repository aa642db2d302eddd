package credits

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dojo-relay/dojo/kungfu"
)

// Ledger entry types.
const (
	GrantSignup = "grant_signup"
	LockTask    = "lock_task"
	FundTask    = "fund_task"
	EarnTask    = "earn_task"
	RefundTask  = "refund_task"
)

// SignupGrant is what every new account starts with.
const SignupGrant = 66

// Movement is one change of one balance. Amount is signed: credits in are
// positive, debits negative.
type Movement struct {
	AccountID int64
	Type      string
	Amount    int64
	RefType   string
	RefID     string
}

// moveSQL moves the balance and yields the balance after it, or no row
// when the movement would take it below zero (or there is no such
// account). $1 account, $2 amount, $3 now, $4 type, $5 ref_type, $6
// ref_id; the statements below append the ledger row from it.
const moveSQL = `WITH u AS (UPDATE accounts SET balance = balance + $2, updated_at = $3
		WHERE id = $1 AND balance + $2 >= 0 RETURNING balance)
	INSERT INTO ledger (account_id, type, amount, balance_after, ref_type, ref_id, created_at)`

// applySQL moves and appends in one statement; no row means nothing moved.
const applySQL = moveSQL + `
	SELECT $1, $4, $2, balance, $5, $6, $3 FROM u
	RETURNING balance_after`

// queueSQL is applySQL for a credit, which only a missing account stops:
// then the ledger row has no balance, which its NOT NULL refuses, so the
// statement fails and nothing queued after it (a COMMIT included) runs.
const queueSQL = moveSQL + `
	VALUES ($1, $4, $2, (SELECT balance FROM u), $5, $6, $3)`

// Apply moves m inside tx and returns the balance after it. A debit that
// would take the balance below zero changes nothing and returns
// INSUFFICIENT_CREDITS.
func Apply(ctx context.Context, tx pgx.Tx, now time.Time, m Movement) (int64, error) {
	if m.Amount == 0 {
		return 0, errZero
	}
	var after int64
	err := tx.QueryRow(ctx, applySQL, m.args(now)...).Scan(&after)
	if errors.Is(err, pgx.ErrNoRows) {
		// A statement of its own sees the balance as it is now, after any
		// debit the update waited for.
		var balance int64
		if err := tx.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = $1`, m.AccountID).Scan(&balance); err != nil {
			return 0, fmt.Errorf("credits: read balance: %w", err)
		}
		return 0, (&kungfu.Error{
			Code:    kungfu.CodeInsufficientCredits,
			Message: fmt.Sprintf("balance %d is below the required %d", balance, -m.Amount),
		}).WithDetails(map[string]any{"balance": balance, "required": -m.Amount})
	}
	if err != nil {
		return 0, failed(err)
	}
	return after, nil
}

// Queue puts the credit m (a positive amount) in b as one statement, for a
// batch that ends a transaction: if it cannot apply (no such account), it
// fails on the server, so the rest of b and a COMMIT behind it do not run,
// and b's Close reports it. A debit can be refused with the balance to
// show, so it goes through Apply.
func Queue(b *pgx.Batch, now time.Time, m Movement) error {
	switch {
	case m.Amount == 0:
		return errZero
	case m.Amount < 0:
		return errors.New("credits: Queue takes credits; a debit goes through Apply")
	}
	b.Queue(queueSQL, m.args(now)...).Fn = func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return failed(err)
		}
		return nil
	}
	return nil
}

var errZero = errors.New("credits: zero movement")

func (m Movement) args(now time.Time) []any {
	return []any{m.AccountID, m.Amount, now, m.Type, m.RefType, m.RefID}
}

// failed words a failed movement as the two statements it once was did.
func failed(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "23502" && pgErr.ColumnName == "balance_after":
		return fmt.Errorf("credits: read balance: %w", pgx.ErrNoRows)
	case errors.As(err, &pgErr) && pgErr.TableName == "ledger":
		return fmt.Errorf("credits: ledger: %w", err)
	}
	return fmt.Errorf("credits: move: %w", err)
}

// Drift is an account whose balance differs from the sum of its ledger.
type Drift struct {
	AccountID int64
	Balance   int64
	Ledger    int64
}

// Check returns every account whose balance is not its ledger sum, or whose
// newest ledger row disagrees with its balance. An empty result is healthy.
func Check(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) ([]Drift, error) {
	rows, err := db.Query(ctx, `
		SELECT a.id, a.balance, COALESCE(l.total, 0)
		FROM accounts a
		LEFT JOIN (SELECT account_id, SUM(amount) AS total FROM ledger GROUP BY account_id) l
		       ON l.account_id = a.id
		WHERE a.balance <> COALESCE(l.total, 0)
		   OR a.balance <> COALESCE((SELECT balance_after FROM ledger x
		                             WHERE x.account_id = a.id ORDER BY id DESC LIMIT 1), 0)`)
	if err != nil {
		return nil, fmt.Errorf("credits: check: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Drift, error) {
		var d Drift
		err := r.Scan(&d.AccountID, &d.Balance, &d.Ledger)
		return d, err
	})
}
