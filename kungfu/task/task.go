package task

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/netip"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/kungfu"
)

// Receiver POSTs one submission to a publisher's receiver. It lives in
// package queue; the domain only sees the outcome.
type Receiver interface {
	Deliver(ctx context.Context, d Delivery) Outcome
}

// Delivery is one POST to make.
type Delivery struct {
	SubmissionID int64
	TaskCode     string
	URL          string
	Body         []byte
}

// Outcome is what came of a POST. Sent reports whether the request reached
// the wire (headers written): a failure before that is RECEIVER_UNREACHABLE,
// after it, with no answer, the submission is uncertain.
type Outcome struct {
	Status  int
	Body    []byte
	Sent    bool
	Err     error
	Latency time.Duration
}

// Waker schedules a redelivery wake-up.
type Waker interface {
	EnqueueAttempt(ctx context.Context, id int64, attempt int, at time.Time) error
}

// TaskRedeliver is the queue task type of receiver redeliveries.
const TaskRedeliver = "receiver"

// Ladder is the redelivery ladder after the first, synchronous try.
var Ladder = []time.Duration{3 * time.Minute, 10 * time.Minute, 30 * time.Minute, 60 * time.Minute, 120 * time.Minute}

// Service owns tasks, claims and submissions.
type Service struct {
	DB       *pgxpool.Pool
	Now      kungfu.Clock
	Receiver Receiver
	Wake     Waker
	// AllowHTTP reports addresses a receiver URL may use plain http for.
	AllowHTTP func(netip.Addr) bool
	// AgentRef is the anonymous, stable per-(agent, task) reference the
	// receiver sees.
	AgentRef func(taskCode string, accountID int64) string
	// LadderScale multiplies the ladder (tests use 0.001).
	LadderScale float64
	// Grace is how long a submission may stay delivering before a crash is
	// assumed and it becomes uncertain (default 15 s).
	Grace time.Duration
}

func (s *Service) rung(attempt int) time.Duration {
	scale := s.LadderScale
	if scale <= 0 {
		scale = 1
	}
	return time.Duration(float64(Ladder[attempt-1]) * scale)
}

func (s *Service) grace() time.Duration {
	if s.Grace <= 0 {
		return 15 * time.Second
	}
	return s.Grace
}

var codeRE = regexp.MustCompile(`^(?i)[0-9a-f]{12}$`)

func newCode() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// row is a task with its current version.
type row struct {
	ID           int64
	Code         string
	PublisherID  int64
	Publisher    string
	Status       string
	PausedReason *string
	Version      int
	Audience     string
	BudgetLocked int64
	Settled      int64
	Reserved     int64
	Refunded     int64
	CreatedAt    time.Time
	UpdatedAt    time.Time
	v            version
}

func (r row) available() int64 { return r.BudgetLocked - r.Settled - r.Reserved - r.Refunded }

func (r row) slots() int64 { return r.available() / r.v.Price }

// version is one immutable contract version.
type version struct {
	Number        int
	Contract      Contract
	Title         string
	Requirements  string
	Price         int64
	ReceiverURL   string
	Schema        []byte
	HarnessRefs   []string
	ClaimRequired bool
	ClaimTTL      int
	ClaimMax      int
	MaxRejected   int
}

const taskColumns = `t.id, t.code, t.publisher_id, p.name, t.status, t.paused_reason, t.version, t.audience,
	t.budget_locked, t.settled, t.reserved, t.refunded, t.created_at, t.updated_at`

const versionColumns = `v.version, v.contract, v.title, v.requirements, v.price, v.receiver_url, v.output_schema,
	v.harness_refs, v.claim_required, v.claim_ttl, v.claim_max, v.max_rejected`

func scanTask(src pgx.Row) (row, error) {
	var r row
	var contract []byte
	err := src.Scan(&r.ID, &r.Code, &r.PublisherID, &r.Publisher, &r.Status, &r.PausedReason, &r.Version, &r.Audience,
		&r.BudgetLocked, &r.Settled, &r.Reserved, &r.Refunded, &r.CreatedAt, &r.UpdatedAt,
		&r.v.Number, &contract, &r.v.Title, &r.v.Requirements, &r.v.Price, &r.v.ReceiverURL, &r.v.Schema,
		&r.v.HarnessRefs, &r.v.ClaimRequired, &r.v.ClaimTTL, &r.v.ClaimMax, &r.v.MaxRejected)
	if err == nil {
		err = json.Unmarshal(contract, &r.v.Contract)
	}
	return r, err
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// load reads a task the caller may see, with its current version. A task
// restricted to an audience the caller is not in does not exist for them:
// the refusal is the same TASK_NOT_FOUND as for a missing code. With lock,
// more may queue reads to run in the same round trip right after the
// task's row lock is granted; they name the task by its normalized code and
// their results are read by the function more returns.
func load(ctx context.Context, q querier, who kungfu.Caller, code string, lock bool, more ...func(b *pgx.Batch, code string) func(pgx.BatchResults)) (row, error) {
	notFound := kungfu.Errorf(kungfu.CodeTaskNotFound, "no task %s", strings.TrimSpace(code))
	if !codeRE.MatchString(strings.TrimSpace(code)) {
		return row{}, notFound
	}
	code = strings.ToLower(strings.TrimSpace(code))
	sql := `SELECT ` + taskColumns + `, ` + versionColumns + `
		FROM tasks t JOIN accounts p ON p.id = t.publisher_id
		JOIN task_versions v ON v.task_id = t.id AND v.version = t.version
		WHERE t.code = $1 AND (t.audience = 'open' OR t.publisher_id = $2
		      OR EXISTS (SELECT 1 FROM task_audience a WHERE a.task_id = t.id AND a.account_id = $2))`
	if lock {
		sql += ` FOR UPDATE OF t`
	}
	var r row
	var err error
	if tx, ok := q.(pgx.Tx); ok && len(more) > 0 {
		b := &pgx.Batch{}
		b.Queue(sql, code, who.AccountID)
		var reads []func(pgx.BatchResults)
		for _, m := range more {
			reads = append(reads, m(b, code))
		}
		br := tx.SendBatch(ctx, b)
		r, err = scanTask(br.QueryRow())
		for _, read := range reads {
			read(br)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	} else {
		r, err = scanTask(q.QueryRow(ctx, sql, code, who.AccountID))
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return row{}, notFound
	}
	return r, err
}

// loadVersion reads one contract version of a task.
func loadVersion(ctx context.Context, q querier, taskID int64, n int) (version, error) {
	var v version
	var contract []byte
	err := q.QueryRow(ctx, `SELECT `+versionColumns+` FROM task_versions v WHERE v.task_id = $1 AND v.version = $2`, taskID, n).
		Scan(&v.Number, &contract, &v.Title, &v.Requirements, &v.Price, &v.ReceiverURL, &v.Schema,
			&v.HarnessRefs, &v.ClaimRequired, &v.ClaimTTL, &v.ClaimMax, &v.MaxRejected)
	if err == nil {
		err = json.Unmarshal(contract, &v.Contract)
	}
	return v, err
}

// ownTask loads a task for its publisher: outsiders of a restricted task get
// TASK_NOT_FOUND, everyone else who is not the publisher NOT_OWNER.
func ownTask(ctx context.Context, q querier, who kungfu.Caller, code string, lock bool) (row, error) {
	r, err := load(ctx, q, who, code, lock)
	if err != nil {
		return row{}, err
	}
	if r.PublisherID != who.AccountID {
		return row{}, kungfu.Errorf(kungfu.CodeNotOwner, "task %s is not yours", r.Code)
	}
	return r, nil
}

func invalidState(r row, msg string) error {
	return kungfu.Errorf(kungfu.CodeInvalidState, "task %s is %s: %s", r.Code, r.Status, msg).
		WithDetails(map[string]any{"status": r.Status})
}

func notOpen(r row) error {
	d := map[string]any{"status": r.Status}
	if r.PausedReason != nil {
		d["reason"] = *r.PausedReason
	}
	return kungfu.Errorf(kungfu.CodeTaskNotOpen, "task %s is %s", r.Code, r.Status).WithDetails(d)
}
