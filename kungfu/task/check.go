package task

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Problem is one broken money invariant.
type Problem struct {
	Task    string `json:"task"`
	Problem string `json:"problem"`
}

// Check audits every task's money: available is never negative; reserved
// equals the active claims plus the submissions still being delivered;
// settled equals the earnings paid; budget_locked equals what the
// publisher locked and funded; refunded equals what was refunded. An empty
// result is healthy.
func Check(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) ([]Problem, error) {
	rows, err := db.Query(ctx, `
	WITH res AS (
	  SELECT t.id,
	    coalesce((SELECT sum(amount) FROM claims c WHERE c.task_id = t.id AND c.status = 'active'), 0)
	  + coalesce((SELECT sum(amount) FROM submissions s WHERE s.task_id = t.id AND s.state IN ('delivering', 'uncertain')), 0) AS reserved,
	    coalesce((SELECT sum(amount) FROM submissions s WHERE s.task_id = t.id AND s.state = 'settled'), 0) AS settled_subs,
	    coalesce((SELECT sum(l.amount) FROM ledger l JOIN submissions s ON l.ref_type = 'task_submission' AND l.ref_id = s.id::text
	              WHERE s.task_id = t.id AND l.type = 'earn_task'), 0) AS earned,
	    coalesce((SELECT -sum(amount) FROM ledger l WHERE l.ref_type = 'task' AND l.ref_id = t.code AND l.type IN ('lock_task', 'fund_task')), 0) AS locked,
	    coalesce((SELECT sum(amount) FROM ledger l WHERE l.ref_type = 'task' AND l.ref_id = t.code AND l.type = 'refund_task'), 0) AS refunds
	  FROM tasks t)
	SELECT t.code, CASE
	  WHEN t.budget_locked - t.settled - t.reserved - t.refunded < 0 THEN 'available is negative'
	  WHEN t.reserved <> r.reserved THEN format('reserved %s but claims and deliveries hold %s', t.reserved, r.reserved)
	  WHEN t.settled <> r.settled_subs THEN format('settled %s but settled submissions sum to %s', t.settled, r.settled_subs)
	  WHEN t.settled <> r.earned THEN format('settled %s but executors were paid %s', t.settled, r.earned)
	  WHEN t.budget_locked <> r.locked THEN format('budget_locked %s but the ledger locked %s', t.budget_locked, r.locked)
	  WHEN t.refunded <> r.refunds THEN format('refunded %s but the ledger refunded %s', t.refunded, r.refunds)
	END
	FROM tasks t JOIN res r ON r.id = t.id
	WHERE t.budget_locked - t.settled - t.reserved - t.refunded < 0 OR t.reserved <> r.reserved OR t.settled <> r.settled_subs
	   OR t.settled <> r.earned OR t.budget_locked <> r.locked OR t.refunded <> r.refunds
	UNION ALL
	SELECT 'submission ' || s.id, 'paid ' || count(*) || ' times'
	FROM submissions s JOIN ledger l ON l.ref_type = 'task_submission' AND l.ref_id = s.id::text AND l.type = 'earn_task'
	GROUP BY s.id HAVING count(*) > 1`)
	if err != nil {
		return nil, fmt.Errorf("task check: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Problem, error) {
		var p Problem
		err := r.Scan(&p.Task, &p.Problem)
		return p, err
	})
}
