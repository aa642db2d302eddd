package thread

import (
	"context"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/dojo-relay/dojo/kungfu"
)

// Todo is one item of the turn.
type Todo struct {
	Kind       string     `json:"kind"`
	Thread     string     `json:"thread,omitempty"`
	Task       string     `json:"task,omitempty"`
	Claim      string     `json:"claim,omitempty"`
	Entry      *int64     `json:"entry,omitempty"`
	Assign     *int64     `json:"assign,omitempty"`
	Seq        *int64     `json:"seq,omitempty"`
	Author     string     `json:"author"`
	Summary    string     `json:"summary"`
	DueAt      *time.Time `json:"due_at,omitempty"`
	NextAction string     `json:"next_action"`
	ProducedAt time.Time  `json:"produced_at"`

	branch int
	rowID  int64
}

// todoCursor is a keyset position: items strictly after (produced, branch,
// id). Settling an item removes it without moving any neighbour.
type todoCursor struct {
	produced time.Time
	branch   int
	id       int64
}

func (c todoCursor) String() string {
	return c.produced.UTC().Format(time.RFC3339Nano) + "|" + strconv.Itoa(c.branch) + "|" + strconv.FormatInt(c.id, 10)
}

func parseTodoCursor(s string) (todoCursor, error) {
	if s == "" {
		return todoCursor{}, nil
	}
	bad := kungfu.Invalid(kungfu.FieldError{Field: "cursor", Message: "not a cursor this server issued"})
	parts := strings.Split(s, "|")
	if len(parts) != 3 {
		return todoCursor{}, bad
	}
	t, err1 := time.Parse(time.RFC3339Nano, parts[0])
	b, err2 := strconv.Atoi(parts[1])
	id, err3 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || b < 1 || b > 4 || id < 1 {
		return todoCursor{}, bad
	}
	return todoCursor{t, b, id}, nil
}

// The turn is a pure projection of facts: receipts pending for me, work I
// took and still can deliver, deliveries I can still judge. An item leaves
// at its deadline even before the sweep records the timeout. Each branch
// seeks its own partial index from the cursor and stops at the page size,
// so a page costs the same however much the account owes.
//
// $3 is the cursor's produced time ('-infinity' for the first page); the
// per-branch row bound ($4, $5, $6) encodes the cursor's branch and id:
// rows of an earlier branch at the same time are already read, rows of a
// later branch are not.
const turnSQL = `
SELECT * FROM (
  (SELECT r.created_at AS produced, 1 AS branch, r.id AS row_id, t.code, e.id AS entry, NULL::bigint AS assign, e.seq,
          a.name AS author, e.summary, NULL::timestamptz AS due
   FROM thread_receipts r JOIN thread_entries e ON e.id = r.entry_id JOIN threads t ON t.id = r.thread_id
   JOIN accounts a ON a.id = e.author_id
   WHERE r.account_id = $1 AND r.state = 'pending' AND (r.created_at, r.id) > ($3, $4) AND ($8::bigint = 0 OR r.thread_id = $8)
   ORDER BY r.created_at, r.id LIMIT $7)
  UNION ALL
  (SELECT s.taken_at, 2, s.id, t.code, s.entry_id, s.id, e.seq, c.name, e.summary, s.deliver_due_at
   FROM assigns s JOIN threads t ON t.id = s.thread_id JOIN thread_entries e ON e.id = s.entry_id
   JOIN accounts c ON c.id = s.creator_id
   WHERE s.assignee_id = $1 AND s.state = 'taken' AND s.deliver_due_at > $2 AND (s.taken_at, s.id) > ($3, $5)
     AND ($8::bigint = 0 OR s.thread_id = $8)
   ORDER BY s.taken_at, s.id LIMIT $7)
  UNION ALL
  (SELECT s.delivered_at, 3, s.id, t.code, s.entry_id, s.id, e.seq, x.name, e.summary, s.judge_due_at
   FROM assigns s JOIN threads t ON t.id = s.thread_id JOIN thread_entries e ON e.id = s.entry_id
   JOIN accounts x ON x.id = s.assignee_id
   WHERE s.creator_id = $1 AND s.state = 'delivered' AND s.judge_due_at > $2 AND s.judge_forfeited_at IS NULL
     AND (s.delivered_at, s.id) > ($3, $6) AND ($8::bigint = 0 OR s.thread_id = $8)
   ORDER BY s.delivered_at, s.id LIMIT $7)
  UNION ALL
  (SELECT c.created_at, 4, c.id, t.code, NULL, NULL, NULL, p.name, v.title, c.expires_at
   FROM claims c JOIN tasks t ON t.id = c.task_id JOIN task_versions v ON v.task_id = c.task_id AND v.version = c.version
   JOIN accounts p ON p.id = t.publisher_id
   WHERE c.account_id = $1 AND c.status = 'active' AND c.expires_at > $2 AND (c.created_at, c.id) > ($3, $9) AND $8::bigint = 0
   ORDER BY c.created_at, c.id LIMIT $7)
) turn
ORDER BY produced, branch, row_id
LIMIT $7`

// bounds turns a cursor into each branch's id bound at the cursor's time.
func (c todoCursor) bounds() (after time.Time, b1, b2, b3, b4 int64) {
	if c.produced.IsZero() {
		return time.Time{}, 0, 0, 0, 0
	}
	bound := func(branch int) int64 {
		switch {
		case branch < c.branch:
			return math.MaxInt64 // this branch's rows at the cursor time came earlier
		case branch == c.branch:
			return c.id
		}
		return 0
	}
	return c.produced, bound(1), bound(2), bound(3), bound(4)
}

var nextActions = map[int]string{1: "respond", 2: "deliver", 3: "judge", 4: "submit"}
var kinds = map[int]string{1: "reply", 2: "deliver", 3: "judge", 4: "deliver"}

func todos(ctx context.Context, tx pgx.Tx, me int64, now time.Time, c todoCursor, roomID int64, limit int) ([]Todo, *string, error) {
	after, b1, b2, b3, b4 := c.bounds()
	var from any = after
	if after.IsZero() {
		from = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	}
	rows, err := tx.Query(ctx, turnSQL, me, now, from, b1, b2, b3, limit+1, roomID, b4)
	if err != nil {
		return nil, nil, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Todo, error) {
		var t Todo
		err := r.Scan(&t.ProducedAt, &t.branch, &t.rowID, &t.Thread, &t.Entry, &t.Assign, &t.Seq, &t.Author, &t.Summary, &t.DueAt)
		t.Kind, t.NextAction = kinds[t.branch], nextActions[t.branch]
		if t.branch == 4 {
			// A task claim: the work is owed to a task, not a room.
			t.Task, t.Thread, t.Claim = t.Thread, "", strconv.FormatInt(t.rowID, 10)
		}
		t.ProducedAt = t.ProducedAt.UTC()
		return t, err
	})
	if err != nil {
		return nil, nil, err
	}
	var next *string
	if len(items) > limit {
		items = items[:limit]
		last := items[limit-1]
		s := todoCursor{last.ProducedAt, last.branch, last.rowID}.String()
		next = &s
	}
	return items, next, nil
}

// Turn is todo_list's result.
type Turn struct {
	Todos         []Todo        `json:"todos"`
	NextCursor    *string       `json:"next_cursor"`
	Opportunities Opportunities `json:"opportunities"`
}

// Opportunities are pointers to work addressed to the caller that is not
// yet theirs. They never enter the turn.
type Opportunities struct {
	Tasks       int `json:"tasks"`
	Assignments int `json:"assignments"`
}

// Advice: an empty turn means wait and look again.
func (t Turn) Advice() (string, *int) {
	if len(t.Todos) > 0 || t.NextCursor != nil {
		return "", nil
	}
	n := 60
	return "wait", &n
}

// Todo rebuilds the caller's turn from facts, oldest first, 50 a page.
func (s *Service) Todo(ctx context.Context, who kungfu.Caller, cursor string) (Turn, error) {
	c, err := parseTodoCursor(cursor)
	if err != nil {
		return Turn{}, err
	}
	now := s.Now()
	var out Turn
	err = s.read(ctx, func(tx pgx.Tx) error {
		var err error
		if out.Todos, out.NextCursor, err = todos(ctx, tx, who.AccountID, now, c, 0, PageSize); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM assigns s JOIN threads t ON t.id = s.thread_id
			JOIN thread_members m ON m.thread_id = t.id AND m.account_id = s.assignee_id
			WHERE s.assignee_id = $1 AND s.state = 'open' AND t.status = 'open'`, who.AccountID).Scan(&out.Opportunities.Assignments); err != nil {
			return err
		}
		// Restricted tasks naming me that I could claim right now.
		return tx.QueryRow(ctx, `SELECT count(*) FROM task_audience a JOIN tasks t ON t.id = a.task_id
			JOIN task_versions v ON v.task_id = t.id AND v.version = t.version
			WHERE a.account_id = $1 AND t.status = 'open' AND t.budget_locked - t.settled - t.reserved - t.refunded >= v.price
			  AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.task_id = t.id AND c.account_id = $1 AND c.status = 'active')
			  AND (SELECT count(*) FROM submissions x WHERE x.task_id = t.id AND x.account_id = $1 AND x.state = 'rejected'
			       AND x.terminal_at > $2) < v.max_rejected`, who.AccountID, now.Add(-24*time.Hour)).Scan(&out.Opportunities.Tasks)
	})
	return out, err
}
