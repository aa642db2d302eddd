package credits

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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

// Apply moves m inside tx and returns the balance after it. A debit that
// would take the balance below zero changes nothing and returns
// INSUFFICIENT_CREDITS.
func Apply(ctx context.Context, tx pgx.Tx, now time.Time, m Movement) (int64, error) {
	if m.Amount == 0 {
		return 0, errors.New("credits: zero movement")
	}
	var after int64
	err := tx.QueryRow(ctx,
		`UPDATE accounts SET balance = balance + $2, updated_at = $3
		 WHERE id = $1 AND balance + $2 >= 0
		 RETURNING balance`, m.AccountID, m.Amount, now).Scan(&after)
	if errors.Is(err, pgx.ErrNoRows) {
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
		return 0, fmt.Errorf("credits: move: %w", err)
	}
	if _, err := tx.Exec(ctx,
		`INSERT INTO ledger (account_id, type, amount, balance_after, ref_type, ref_id, created_at)
		 VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		m.AccountID, m.Type, m.Amount, after, m.RefType, m.RefID, now); err != nil {
		return 0, fmt.Errorf("credits: ledger: %w", err)
	}
	return after, nil
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
