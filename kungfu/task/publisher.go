package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/credits"
)

// Stats are a task's last 30 days, by terminal time.
type Stats struct {
	AcceptRate         *float64 `json:"accept_rate"`
	MedianReplySeconds *float64 `json:"median_reply_seconds"`
	FailureRate        *float64 `json:"failure_rate"`
	Submissions30d     *int     `json:"submissions_30d,omitempty"`
	ActiveClaims       *int     `json:"active_claims,omitempty"`
}

// View is a task as its publisher sees it.
type View struct {
	Code            string    `json:"code"`
	Status          string    `json:"status"`
	PausedReason    *string   `json:"paused_reason"`
	ContractVersion int       `json:"contract_version"`
	Contract        Contract  `json:"contract"`
	BudgetLocked    int64     `json:"budget_locked"`
	Settled         int64     `json:"settled"`
	Reserved        int64     `json:"reserved"`
	Refunded        int64     `json:"refunded"`
	Available       int64     `json:"available"`
	Slots           int64     `json:"slots"`
	Stats           Stats     `json:"stats"`
	CreatedAt       time.Time `json:"created_at"`
	UpdatedAt       time.Time `json:"updated_at"`
}

func (s *Service) view(ctx context.Context, q querier, r row) (View, error) {
	st, err := stats(ctx, q, r.ID, s.Now(), true)
	return View{Code: r.Code, Status: r.Status, PausedReason: r.PausedReason, ContractVersion: r.Version, Contract: r.v.Contract,
		BudgetLocked: r.BudgetLocked, Settled: r.Settled, Reserved: r.Reserved, Refunded: r.Refunded,
		Available: r.available(), Slots: r.slots(), Stats: st, CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC()}, err
}

// reload reads a task again inside the transaction that changed it.
func (s *Service) reload(ctx context.Context, tx pgx.Tx, who kungfu.Caller, code string) (View, error) {
	r, err := load(ctx, tx, who, code, false)
	if err != nil {
		return View{}, err
	}
	return s.view(ctx, tx, r)
}

func stats(ctx context.Context, q querier, taskID int64, now time.Time, publisher bool) (Stats, error) {
	var (
		st                        Stats
		settled, rejected, failed int
		all, claims               int
		median                    *float64
	)
	err := q.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE state = 'settled'), count(*) FILTER (WHERE state = 'rejected'),
		count(*) FILTER (WHERE state = 'failed'), count(*),
		percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM terminal_at - created_at))
		  FILTER (WHERE state IN ('settled', 'rejected')),
		(SELECT count(*) FROM claims WHERE task_id = $1 AND status = 'active')
		FROM submissions WHERE task_id = $1 AND terminal_at > $2`, taskID, now.Add(-30*24*time.Hour)).
		Scan(&settled, &rejected, &failed, &all, &median, &claims)
	if err != nil {
		return st, err
	}
	if settled+rejected > 0 {
		r := float64(settled) / float64(settled+rejected)
		st.AcceptRate = &r
	}
	if all > 0 {
		f := float64(failed) / float64(all)
		st.FailureRate = &f
	}
	st.MedianReplySeconds = median
	if publisher {
		st.Submissions30d, st.ActiveClaims = &all, &claims
	}
	return st, nil
}

// checkContract resolves what a normalized contract names: harness
// memories must be the publisher's own active ones, audience names must be
// other existing accounts. Normalizing (and compiling output.schema, which
// can take milliseconds) happens before the transaction, so no row lock
// waits on it.
func (s *Service) checkContract(ctx context.Context, tx pgx.Tx, who kungfu.Caller, c *Contract) ([]int64, error) {
	var errs []kungfu.FieldError
	for i, ref := range c.HarnessRefs {
		var ok bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM memories WHERE code = $1 AND account_id = $2
			AND status = 'active' AND origin = 'standalone')`, ref, who.AccountID).Scan(&ok); err != nil {
			return nil, err
		}
		if !ok {
			errs = append(errs, kungfu.FieldError{Field: fmt.Sprintf("contract.harness_refs.%d", i), Message: "not one of your active memories"})
		}
	}
	var audience []int64
	if c.Audience.Type == "restricted" {
		seen := map[int64]bool{}
		for i, name := range c.Audience.Agents {
			var id int64
			err := tx.QueryRow(ctx, `SELECT id FROM accounts WHERE lower(name) = lower($1) AND status = 'active'`, strings.TrimSpace(name)).Scan(&id)
			field := fmt.Sprintf("contract.audience.agents.%d", i)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				errs = append(errs, kungfu.FieldError{Field: field, Message: "no such agent"})
			case err != nil:
				return nil, err
			case id == who.AccountID:
				errs = append(errs, kungfu.FieldError{Field: field, Message: "you cannot be in your own task's audience"})
			case seen[id]:
				errs = append(errs, kungfu.FieldError{Field: field, Message: "named twice"})
			default:
				seen[id] = true
				audience = append(audience, id)
			}
		}
	}
	if len(errs) > 0 {
		return nil, kungfu.Invalid(errs...)
	}
	sort.Slice(audience, func(i, j int) bool { return audience[i] < audience[j] })
	return audience, nil
}

func insertVersion(ctx context.Context, tx pgx.Tx, taskID int64, n int, c Contract, now time.Time) error {
	contract, err := json.Marshal(c)
	if err != nil {
		return err
	}
	var schema []byte
	if c.Output != nil {
		schema = c.Output.Schema
	}
	_, err = tx.Exec(ctx, `INSERT INTO task_versions (task_id, version, contract, title, requirements, price, receiver_url,
		output_schema, harness_refs, claim_required, claim_ttl, claim_max, max_rejected, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		taskID, n, contract, c.Title, c.Requirements, c.Price, strings.TrimSpace(c.Receiver.URL), schema, c.HarnessRefs,
		c.Claim.Required, c.Claim.TTL, c.Claim.MaxDuration, c.Limits.MaxRejectedPerAgent, now)
	return err
}

// Create publishes a task (paused unless open) and locks its budget from
// the publisher's balance in the same transaction.
func (s *Service) Create(ctx context.Context, who kungfu.Caller, c Contract, budget int64, open bool) (View, error) {
	var out View
	if err := c.normalize(s.AllowHTTP); err != nil {
		return out, err
	}
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		audience, err := s.checkContract(ctx, tx, who, &c)
		if err != nil {
			return err
		}
		if budget < c.Price || budget > MaxMoney {
			return kungfu.Invalid(kungfu.FieldError{Field: "budget", Message: fmt.Sprintf("at least the price (%d) and at most %d", c.Price, int64(MaxMoney))})
		}
		now := s.Now()
		status := "paused"
		if open {
			status = "open"
		}
		var id int64
		var code string
		for range 5 {
			code = newCode()
			err = tx.QueryRow(ctx, `INSERT INTO tasks (code, publisher_id, status, audience, budget_locked, created_at, updated_at)
				VALUES ($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (code) DO NOTHING RETURNING id`,
				code, who.AccountID, status, c.Audience.Type, budget, now).Scan(&id)
			if !errors.Is(err, pgx.ErrNoRows) {
				break
			}
		}
		if err != nil {
			return err
		}
		if err := insertVersion(ctx, tx, id, 1, c, now); err != nil {
			return err
		}
		for _, a := range audience {
			if _, err := tx.Exec(ctx, `INSERT INTO task_audience (task_id, account_id) VALUES ($1, $2)`, id, a); err != nil {
				return err
			}
		}
		if _, err := credits.Apply(ctx, tx, now, credits.Movement{AccountID: who.AccountID, Type: credits.LockTask,
			Amount: -budget, RefType: "task", RefID: code}); err != nil {
			return err
		}
		out, err = s.reload(ctx, tx, who, code)
		return err
	})
	return out, wrap("task_create", err)
}

// Update replaces a paused task's contract whole, as a new immutable
// version. Existing claims keep the version they bound.
func (s *Service) Update(ctx context.Context, who kungfu.Caller, code string, c Contract) (View, error) {
	var out View
	if err := c.normalize(s.AllowHTTP); err != nil {
		return out, err
	}
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		r, err := ownTask(ctx, tx, who, code, true)
		if err != nil {
			return err
		}
		if r.Status != "paused" {
			return invalidState(r, "only a paused task's contract can be revised (task_pause first)")
		}
		audience, err := s.checkContract(ctx, tx, who, &c)
		if err != nil {
			return err
		}
		if err := sameAudience(ctx, tx, r, c, audience); err != nil {
			return err
		}
		now := s.Now()
		if err := insertVersion(ctx, tx, r.ID, r.Version+1, c, now); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE tasks SET version = version + 1, updated_at = $2 WHERE id = $1`, r.ID, now); err != nil {
			return err
		}
		out, err = s.reload(ctx, tx, who, r.Code)
		return err
	})
	return out, wrap("task_update", err)
}

// sameAudience refuses a revision that changes who the task is for.
func sameAudience(ctx context.Context, tx pgx.Tx, r row, c Contract, audience []int64) error {
	bad := kungfu.Invalid(kungfu.FieldError{Field: "contract.audience", Message: "the audience is fixed at creation; a different audience is a new task"})
	if c.Audience.Type != r.Audience {
		return bad
	}
	rows, err := tx.Query(ctx, `SELECT account_id FROM task_audience WHERE task_id = $1 ORDER BY account_id`, r.ID)
	if err != nil {
		return err
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return err
	}
	if len(have) != len(audience) {
		return bad
	}
	for i := range have {
		if have[i] != audience[i] {
			return bad
		}
	}
	return nil
}

// SetStatus opens, pauses or closes a task. Opening re-validates the
// contract's harness; closing is final.
func (s *Service) SetStatus(ctx context.Context, who kungfu.Caller, code, to string) (View, error) {
	var out View
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		r, err := ownTask(ctx, tx, who, code, true)
		if err != nil {
			return err
		}
		if r.Status == "closed" {
			return invalidState(r, "a closed task stays closed")
		}
		if to == "open" {
			// The stored contract was normalized when it was stored; only
			// what it names can have changed since.
			c := r.v.Contract
			if _, err := s.checkContract(ctx, tx, who, &c); err != nil {
				return err
			}
		}
		now := s.Now()
		if _, err := tx.Exec(ctx, `UPDATE tasks SET status = $2, paused_reason = NULL, updated_at = $3,
			closed_at = CASE WHEN $2::text = 'closed' THEN $3::timestamptz END WHERE id = $1`, r.ID, to, now); err != nil {
			return err
		}
		out, err = s.reload(ctx, tx, who, r.Code)
		return err
	})
	return out, wrap("task_status", err)
}

// Fund adds budget to a task that is not closed.
func (s *Service) Fund(ctx context.Context, who kungfu.Caller, code string, amount int64) (View, error) {
	if amount < 1 || amount > MaxMoney {
		return View{}, kungfu.Invalid(kungfu.FieldError{Field: "amount", Message: "a positive number of credits"})
	}
	var out View
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		r, err := ownTask(ctx, tx, who, code, true)
		if err != nil {
			return err
		}
		if r.Status == "closed" {
			return invalidState(r, "a closed task cannot be funded")
		}
		if r.BudgetLocked+amount > MaxMoney {
			return kungfu.Invalid(kungfu.FieldError{Field: "amount", Message: "the budget would pass 2^53-1"})
		}
		now := s.Now()
		if _, err := credits.Apply(ctx, tx, now, credits.Movement{AccountID: who.AccountID, Type: credits.FundTask,
			Amount: -amount, RefType: "task", RefID: r.Code}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE tasks SET budget_locked = budget_locked + $2, updated_at = $3 WHERE id = $1`, r.ID, amount, now); err != nil {
			return err
		}
		out, err = s.reload(ctx, tx, who, r.Code)
		return err
	})
	return out, wrap("task_fund", err)
}

// Refunded is task_refund's result.
type Refunded struct {
	View
	Amount int64 `json:"refunded_now"`
}

// Refund returns a closed task's available budget once nothing is reserved.
func (s *Service) Refund(ctx context.Context, who kungfu.Caller, code string) (Refunded, error) {
	var out Refunded
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		r, err := ownTask(ctx, tx, who, code, true)
		if err != nil {
			return err
		}
		switch {
		case r.Status != "closed":
			return invalidState(r, "close the task before refunding")
		case r.Reserved > 0:
			return kungfu.Errorf(kungfu.CodeHasReservations, "%d credits are still reserved by claims or deliveries", r.Reserved).
				WithDetails(map[string]any{"reserved": r.Reserved})
		case r.available() <= 0:
			return kungfu.Errorf(kungfu.CodeNothingToRefund, "task %s has nothing available to refund", r.Code)
		}
		amount, now := r.available(), s.Now()
		if _, err := tx.Exec(ctx, `UPDATE tasks SET refunded = refunded + $2, updated_at = $3 WHERE id = $1`, r.ID, amount, now); err != nil {
			return err
		}
		if _, err := credits.Apply(ctx, tx, now, credits.Movement{AccountID: who.AccountID, Type: credits.RefundTask,
			Amount: amount, RefType: "task", RefID: r.Code}); err != nil {
			return err
		}
		out.View, err = s.reload(ctx, tx, who, r.Code)
		out.Amount = amount
		return err
	})
	return out, wrap("task_refund", err)
}

// Get returns one of the caller's tasks.
func (s *Service) Get(ctx context.Context, who kungfu.Caller, code string) (View, error) {
	r, err := ownTask(ctx, s.DB, who, code, false)
	if err != nil {
		return View{}, err
	}
	return s.view(ctx, s.DB, r)
}

// Page is a page of results.
type Page[T any] struct {
	Items    []T `json:"-"`
	Total    int `json:"total"`
	Page     int `json:"page"`
	PageSize int `json:"page_size"`
}

func paging(page, size int) (int, int) {
	if page < 1 {
		page = 1
	}
	if size < 1 {
		size = 20
	}
	return page, min(size, 100)
}

// likeEscape makes a keyword match literally inside ILIKE.
func likeEscape(q string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return "%" + r.Replace(strings.TrimSpace(q)) + "%"
}

// List returns the caller's tasks, newest first.
func (s *Service) List(ctx context.Context, who kungfu.Caller, status, q, code string, page, size int) ([]View, int, int, int, error) {
	page, size = paging(page, size)
	if status != "" && status != "open" && status != "paused" && status != "closed" {
		return nil, 0, 0, 0, kungfu.Invalid(kungfu.FieldError{Field: "status", Message: "open, paused or closed"})
	}
	where := `t.publisher_id = $1 AND ($2 = '' OR t.status = $2) AND ($3 = '' OR v.title ILIKE $4 OR v.requirements ILIKE $4)
		AND ($5 = '' OR t.code = lower($5))`
	args := []any{who.AccountID, status, strings.TrimSpace(q), likeEscape(q), strings.TrimSpace(code)}
	var total int
	if err := s.DB.QueryRow(ctx, `SELECT count(*) FROM tasks t JOIN task_versions v ON v.task_id = t.id AND v.version = t.version WHERE `+where, args...).Scan(&total); err != nil {
		return nil, 0, 0, 0, wrap("task_list", err)
	}
	rows, err := s.DB.Query(ctx, `SELECT `+taskColumns+`, `+versionColumns+`
		FROM tasks t JOIN accounts p ON p.id = t.publisher_id JOIN task_versions v ON v.task_id = t.id AND v.version = t.version
		WHERE `+where+` ORDER BY t.id DESC LIMIT $6 OFFSET $7`, append(args, size, (page-1)*size)...)
	if err != nil {
		return nil, 0, 0, 0, wrap("task_list", err)
	}
	tasks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) { return scanTask(r) })
	if err != nil {
		return nil, 0, 0, 0, wrap("task_list", err)
	}
	out := make([]View, 0, len(tasks))
	for _, t := range tasks {
		v, err := s.view(ctx, s.DB, t)
		if err != nil {
			return nil, 0, 0, 0, wrap("task_list", err)
		}
		out = append(out, v)
	}
	return out, total, page, size, nil
}

func wrap(op string, err error) error {
	if err == nil || kungfu.AsError(err) != nil {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23514" {
		// A CHECK caught what a rule above should have: refuse, never corrupt.
		return kungfu.Errorf(kungfu.CodeInvalidState, "refused by a ledger invariant (%s)", pgErr.ConstraintName)
	}
	return fmt.Errorf("%s: %w", op, err)
}
