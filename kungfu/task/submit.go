package task

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/credential"
	"github.com/dojo-relay/dojo/kungfu/credits"
	"github.com/dojo-relay/dojo/kungfu/schema"
	"github.com/dojo-relay/dojo/kungfu/userjson"
)

var requestKeyRE = regexp.MustCompile(`^[A-Za-z0-9._~-]{1,128}$`)

// Claim is an engagement as its holder sees it.
type Claim struct {
	ClaimID         string    `json:"claim_id"`
	TaskCode        string    `json:"task_code"`
	ExpiresAt       time.Time `json:"expires_at"`
	Deadline        time.Time `json:"deadline"`
	Amount          int64     `json:"amount"`
	Status          string    `json:"status"`
	ContractVersion int       `json:"contract_version"`
}

// Advice: an active claim means submit.
func (c Claim) Advice() (string, *int) {
	if c.Status == "active" {
		return "submit", nil
	}
	return "", nil
}

type harnessPin struct {
	RefID    string `json:"ref_id"`
	MemoryID int64  `json:"memory_id"`
	Revision int    `json:"revision"`
}

// pinHarness records the current revision of every harness memory of v
// that still exists, so the engagement reads them as they were.
func pinHarness(ctx context.Context, tx pgx.Tx, v version) ([]byte, error) {
	pins := []harnessPin{}
	for _, ref := range v.HarnessRefs {
		var p harnessPin
		err := tx.QueryRow(ctx, `SELECT id, revision FROM memories WHERE code = $1 AND status = 'active'`, ref).Scan(&p.MemoryID, &p.Revision)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, err
		}
		p.RefID = ref
		pins = append(pins, p)
	}
	return json.Marshal(pins)
}

// limitSQL counts the caller's rejections on a task in the last 24 h.
const limitSQL = `SELECT count(*), min(terminal_at) FROM submissions WHERE task_id = $1 AND account_id = $2
	AND state = 'rejected' AND terminal_at > $3`

// underLimit counts the caller's rejections on the task in the last 24 h
// and refuses at the limit.
func (s *Service) underLimit(ctx context.Context, q querier, r row, who kungfu.Caller, now time.Time) error {
	var n int
	var oldest *time.Time
	if err := q.QueryRow(ctx, limitSQL, r.ID, who.AccountID, now.Add(-24*time.Hour)).Scan(&n, &oldest); err != nil {
		return err
	}
	return limited(r, n, oldest, now)
}

// limited refuses n rejections, the oldest at oldest, at r's limit.
func limited(r row, n int, oldest *time.Time, now time.Time) error {
	if n < r.v.MaxRejected {
		return nil
	}
	at := oldest.Add(24 * time.Hour).UTC()
	secs := max(1, int(at.Sub(now).Seconds()+0.999))
	return &kungfu.Error{Code: kungfu.CodeSubmissionLimit, RetryAfter: &secs,
		Message: fmt.Sprintf("%d rejections in the last 24 hours reach this task's limit of %d", n, r.v.MaxRejected),
		Details: map[string]any{"rejected_24h": n, "max": r.v.MaxRejected, "window_hours": 24, "retry_after_at": at, "retry_after": secs}}
}

// ClaimTask reserves one price unit and binds the current contract version
// and harness revisions. Claiming again returns the active claim.
func (s *Service) ClaimTask(ctx context.Context, who kungfu.Caller, code string) (Claim, error) {
	var out Claim
	err := kungfu.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		r, err := load(ctx, tx, who, code, true)
		if err != nil {
			return err
		}
		if r.PublisherID == who.AccountID {
			return kungfu.Errorf(kungfu.CodeOwnTask, "you published task %s", r.Code)
		}
		now := s.Now()
		if c, err := activeClaim(ctx, tx, r, who.AccountID, 0); err == nil {
			if now.Before(c.ExpiresAt) {
				out = c
				return nil
			}
			// Expired but not yet swept: end it here, then claim afresh.
			if err := endClaim(ctx, tx, r.ID, c, "expired", now); err != nil {
				return err
			}
			r.Reserved -= c.Amount
		} else if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if r.Status != "open" {
			return notOpen(r)
		}
		if r.slots() < 1 {
			return kungfu.Errorf(kungfu.CodeSlotsExhausted, "task %s has no budget left for another unit", r.Code)
		}
		if err := s.underLimit(ctx, tx, r, who, now); err != nil {
			return err
		}
		harness, err := pinHarness(ctx, tx, r.v)
		if err != nil {
			return err
		}
		exp := now.Add(time.Duration(r.v.ClaimTTL) * time.Second)
		deadline := now.Add(time.Duration(r.v.ClaimMax) * time.Second)
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO claims (task_id, account_id, version, amount, status, harness, expires_at, deadline, created_at)
			VALUES ($1, $2, $3, $4, 'active', $5, $6, $7, $8) RETURNING id`,
			r.ID, who.AccountID, r.Version, r.v.Price, harness, exp, deadline, now).Scan(&id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE tasks SET reserved = reserved + $2 WHERE id = $1`, r.ID, r.v.Price); err != nil {
			return err
		}
		out = Claim{ClaimID: strconv.FormatInt(id, 10), TaskCode: r.Code, ExpiresAt: exp, Deadline: deadline,
			Amount: r.v.Price, Status: "active", ContractVersion: r.Version}
		return nil
	})
	return out, wrap("work_claim", err)
}

// activeClaim finds the caller's active, unexpired claim on r (a specific
// one when id > 0).
func activeClaim(ctx context.Context, q querier, r row, accountID, id int64) (Claim, error) {
	var c Claim
	var cid int64
	err := q.QueryRow(ctx, `SELECT id, expires_at, deadline, amount, status, version FROM claims
		WHERE task_id = $1 AND account_id = $2 AND status = 'active' AND ($3::bigint = 0 OR id = $3)`, r.ID, accountID, id).
		Scan(&cid, &c.ExpiresAt, &c.Deadline, &c.Amount, &c.Status, &c.ContractVersion)
	c.ClaimID, c.TaskCode = strconv.FormatInt(cid, 10), r.Code
	c.ExpiresAt, c.Deadline = c.ExpiresAt.UTC(), c.Deadline.UTC()
	return c, err
}

// claimByID locks one of the caller's claims with its task.
func (s *Service) claimByID(ctx context.Context, tx pgx.Tx, who kungfu.Caller, claimID string) (row, Claim, error) {
	invalid := kungfu.Errorf(kungfu.CodeClaimInvalid, "claim %s is not an active claim of yours", claimID)
	id, err := strconv.ParseInt(strings.TrimSpace(claimID), 10, 64)
	if err != nil || id < 1 {
		return row{}, Claim{}, invalid
	}
	var code string
	if err := tx.QueryRow(ctx, `SELECT t.code FROM claims c JOIN tasks t ON t.id = c.task_id WHERE c.id = $1 AND c.account_id = $2`,
		id, who.AccountID).Scan(&code); err != nil {
		return row{}, Claim{}, invalid
	}
	r, err := load(ctx, tx, who, code, true)
	if err != nil {
		return row{}, Claim{}, invalid
	}
	c, err := activeClaim(ctx, tx, r, who.AccountID, id)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !s.Now().Before(c.ExpiresAt)) {
		return row{}, Claim{}, invalid
	}
	return r, c, err
}

// Renew extends an active claim up to its deadline while the task is open.
func (s *Service) Renew(ctx context.Context, who kungfu.Caller, claimID string) (Claim, error) {
	var out Claim
	err := kungfu.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		r, c, err := s.claimByID(ctx, tx, who, claimID)
		if err != nil {
			return err
		}
		now := s.Now()
		if r.Status != "open" || !now.Before(c.Deadline) {
			return kungfu.Errorf(kungfu.CodeClaimInvalid, "claim %s cannot be renewed (task %s, deadline %s)", claimID, r.Status, c.Deadline.Format(time.RFC3339))
		}
		c.ExpiresAt = now.Add(time.Duration(r.v.ClaimTTL) * time.Second)
		if c.ExpiresAt.After(c.Deadline) {
			c.ExpiresAt = c.Deadline
		}
		_, err = tx.Exec(ctx, `UPDATE claims SET expires_at = $2 WHERE id = $1`, c.ClaimID, c.ExpiresAt)
		out = c
		return err
	})
	return out, wrap("work_claim_renew", err)
}

// Release gives an active claim's reservation back.
func (s *Service) Release(ctx context.Context, who kungfu.Caller, claimID string) (Claim, error) {
	var out Claim
	err := kungfu.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		r, c, err := s.claimByID(ctx, tx, who, claimID)
		if err != nil {
			return err
		}
		if err := endClaim(ctx, tx, r.ID, c, "released", s.Now()); err != nil {
			return err
		}
		c.Status = "released"
		out = c
		return nil
	})
	return out, wrap("work_release", err)
}

func endClaim(ctx context.Context, tx pgx.Tx, taskID int64, c Claim, status string, now time.Time) error {
	if _, err := tx.Exec(ctx, `UPDATE claims SET status = $2, ended_at = $3 WHERE id = $1 AND status = 'active'`, c.ClaimID, status, now); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE tasks SET reserved = reserved - $2 WHERE id = $1`, taskID, c.Amount)
	return err
}

// ExpireClaims ends up to limit claims past expires_at and releases their
// reservations. Like every writer of claims it locks the task first, so it
// never deadlocks with a submission on the same task.
func (s *Service) ExpireClaims(ctx context.Context, limit int) (int, error) {
	rows, err := s.DB.Query(ctx, `SELECT id, task_id FROM claims WHERE status = 'active' AND expires_at <= $1
		ORDER BY expires_at LIMIT $2`, s.Now(), limit)
	if err != nil {
		return 0, wrap("claim_expiry", err)
	}
	type due struct{ id, task int64 }
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (due, error) {
		var d due
		err := r.Scan(&d.id, &d.task)
		return d, err
	})
	if err != nil {
		return 0, wrap("claim_expiry", err)
	}
	n := 0
	for _, d := range list {
		err := kungfu.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT 1 FROM tasks WHERE id = $1 FOR UPDATE`, d.task); err != nil {
				return err
			}
			now := s.Now()
			var amount int64
			err := tx.QueryRow(ctx, `SELECT amount FROM claims WHERE id = $1 AND status = 'active' AND expires_at <= $2`, d.id, now).Scan(&amount)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // renewed, used or released meanwhile
			}
			if err != nil {
				return err
			}
			n++
			return endClaim(ctx, tx, d.task, Claim{ClaimID: strconv.FormatInt(d.id, 10), Amount: amount}, "expired", now)
		})
		if err != nil {
			return n, wrap("claim_expiry", err)
		}
	}
	return n, nil
}

// SubmitInput is work_submit's arguments.
type SubmitInput struct {
	Code       string
	RequestKey string
	Payload    json.RawMessage
	ClaimID    string
	Revises    string
	rechecks   int // times the contract moved between checking and locking
}

// Result is a submission as its executor sees it.
type Result struct {
	TaskCode        string     `json:"task_code"`
	SubmissionID    string     `json:"submission_id"`
	State           string     `json:"state"`
	Amount          int64      `json:"amount"`
	Paid            int64      `json:"paid"`
	Reply           *Reply     `json:"reply"`
	Failure         *string    `json:"failure"`
	ContractVersion int        `json:"contract_version"`
	Events          []Event    `json:"events,omitempty"`
	CreatedAt       time.Time  `json:"created_at"`
	TerminalAt      *time.Time `json:"terminal_at"`
	next            string
	retry           *int
}

// Reply is the receiver's answer, verbatim (first 4000 bytes).
type Reply struct {
	Status int    `json:"status"`
	Body   string `json:"body"`
}

// Event is one state change.
type Event struct {
	Seq   int       `json:"seq"`
	From  *string   `json:"from"`
	To    string    `json:"to"`
	Cause string    `json:"cause"`
	At    time.Time `json:"at"`
}

// Advice is the executor's next step for a submission state.
func (r Result) Advice() (string, *int) { return r.next, r.retry }

func intp(n int) *int { return &n }

// advise sets next_action and retry_after from the state, checking the
// rejection limit for a rejected result.
func (s *Service) advise(ctx context.Context, res *Result, r row, who kungfu.Caller) {
	switch res.State {
	case "delivering":
		res.next, res.retry = "poll", intp(5)
	case "uncertain":
		res.next, res.retry = "poll", intp(30)
	case "settled":
		res.next = "done"
	case "failed":
		res.next = "stop"
	case "rejected":
		res.next = "revise"
		if err := s.underLimit(ctx, s.DB, r, who, s.Now()); err != nil {
			if e := kungfu.AsError(err); e != nil {
				res.next, res.retry = "wait", e.RetryAfter
			}
		}
	}
}

// Submit takes a submission in, reserving its amount, then delivers it to
// the receiver synchronously and records the outcome. A crash between the
// two leaves it delivering, which the recovery sweep turns into uncertain
// and redelivers with the same Idempotency-Key.
func (s *Service) Submit(ctx context.Context, who kungfu.Caller, in SubmitInput) (Result, error) {
	if !requestKeyRE.MatchString(in.RequestKey) {
		return Result{}, kungfu.Errorf(kungfu.CodeInvalidRequestKey, "request_key is 1-128 characters of A-Z a-z 0-9 . _ ~ -")
	}
	if len(in.Payload) > MaxPayload {
		return Result{}, kungfu.Errorf(kungfu.CodePayloadTooLarge, "payload is larger than %d bytes", MaxPayload)
	}
	// Hash is byte-for-byte the form this hash always had, so request_keys
	// stored earlier still replay.
	sum := userjson.Hash(in.Payload)
	pre := s.precheck(ctx, who, in)
	var (
		res      Result
		r        row
		d        *Delivery
		existing bool
	)
	err := kungfu.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		var (
			err           error
			id            int64
			hash          []byte
			rejections    []time.Time
			prior, recent error
		)
		// One round trip: the task lock, then, each on a fresh snapshot
		// taken once the lock is held, the same request's earlier
		// submission and the caller's recent rejections. The rejections are
		// read from a window opened before the lock wait and cut to the
		// window of now, taken once the lock is held, below.
		since := s.Now().Add(-24 * time.Hour)
		r, err = load(ctx, tx, who, in.Code, true, func(b *pgx.Batch, code string) func(pgx.BatchResults) {
			b.Queue(`SELECT id, payload_hash FROM submissions
				WHERE account_id = $1 AND request_key = $2 AND task_id = (SELECT id FROM tasks WHERE code = $3)`,
				who.AccountID, in.RequestKey, code)
			b.Queue(`SELECT terminal_at FROM submissions WHERE account_id = $1 AND state = 'rejected'
				AND terminal_at > $2 AND task_id = (SELECT id FROM tasks WHERE code = $3) ORDER BY terminal_at`, who.AccountID, since, code)
			return func(br pgx.BatchResults) {
				prior = br.QueryRow().Scan(&id, &hash)
				rows, err := br.Query()
				if err == nil {
					rejections, err = pgx.CollectRows(rows, pgx.RowTo[time.Time])
				}
				recent = err
			}
		})
		if err != nil {
			return err
		}
		now := s.Now()
		err = prior
		// The same request under the same key is the same submission.
		if err == nil {
			if !bytes.Equal(hash, sum[:]) {
				return kungfu.Errorf(kungfu.CodeIdempotencyConflict, "request_key %q was used with a different payload", in.RequestKey)
			}
			existing = true
			b := &pgx.Batch{}
			b.Queue(resultSQL, id).QueryRow(func(row pgx.Row) error {
				res, err = scanResult(row, r.Code, id)
				return err
			})
			return kungfu.SendFinal(ctx, tx, b).Close()
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if r.PublisherID == who.AccountID {
			return kungfu.Errorf(kungfu.CodeOwnTask, "you published task %s", r.Code)
		}
		var c Claim
		withClaim := strings.TrimSpace(in.ClaimID) != ""
		if withClaim {
			// A valid claim only needs the task to exist.
			if c, err = s.claimOn(ctx, tx, r, who, in.ClaimID, now); err != nil {
				return err
			}
		} else {
			if r.Status != "open" {
				return notOpen(r)
			}
			if r.slots() < 1 {
				return kungfu.Errorf(kungfu.CodeSlotsExhausted, "task %s has no budget left for another unit", r.Code)
			}
		}
		if recent != nil {
			return recent
		}
		var oldest *time.Time
		n := 0
		for _, at := range rejections {
			if at.After(now.Add(-24 * time.Hour)) {
				if n == 0 {
					oldest = &at
				}
				n++
			}
		}
		if err := limited(r, n, oldest, now); err != nil {
			return err
		}
		if !withClaim && r.v.ClaimRequired {
			return kungfu.Errorf(kungfu.CodeClaimRequired, "task %s requires work_claim before work_submit", r.Code)
		}
		var revises *int64
		if strings.TrimSpace(in.Revises) != "" {
			rid, err := strconv.ParseInt(strings.TrimSpace(in.Revises), 10, 64)
			var ok bool
			if err == nil {
				_ = tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM submissions WHERE id = $1 AND task_id = $2 AND account_id = $3
					AND state = 'rejected')`, rid, r.ID, who.AccountID).Scan(&ok)
			}
			if !ok {
				return kungfu.Errorf(kungfu.CodeInvalidRevises, "revises must name a rejected submission of yours on this task")
			}
			revises = &rid
		}
		v := r.v
		if withClaim && c.ContractVersion != r.Version {
			if v, err = loadVersion(ctx, tx, r.ID, c.ContractVersion); err != nil {
				return err
			}
		}
		if pre.task != r.ID || pre.version != v.Number {
			if in.rechecks < 2 {
				return errRecheck
			}
			// A third race with task_update in a row: check here, the
			// budget bounds it.
			pre = check(in.Payload, r.ID, v)
		}
		payload, err := pre.payload, pre.err
		if err != nil {
			return err
		}
		var amount int64
		args := []any{r.ID, who.AccountID, v.Number, in.RequestKey, payload, sum[:], revises, now.Add(s.grace()), now}
		var claim string
		if withClaim {
			// The claim's reservation moves onto the submission.
			amount = c.Amount
			claimID, _ := strconv.ParseInt(c.ClaimID, 10, 64)
			claim = `c AS (UPDATE claims SET status = 'used', ended_at = $9 WHERE id = $10 RETURNING id, amount)`
			args = append(args, claimID)
		} else {
			// A claim-less submission binds its engagement the same way,
			// born used, and reserves its amount on the task.
			harness, err := pinHarness(ctx, tx, v)
			if err != nil {
				return err
			}
			amount = v.Price
			claim = `c AS (INSERT INTO claims (task_id, account_id, version, amount, status, harness, expires_at, deadline, created_at, ended_at)
				VALUES ($1, $2, $3, $10, 'used', $11, $9, $9, $9, $9) RETURNING id, amount),
				t AS (UPDATE tasks SET reserved = reserved + $10 WHERE id = $1)`
			args = append(args, amount, harness)
		}
		// One statement, the transaction's last: the engagement, the
		// submission and its first event.
		b := &pgx.Batch{}
		b.Queue(`WITH `+claim+`,
			s AS (INSERT INTO submissions (task_id, account_id, claim_id, version, request_key, payload, payload_hash,
				amount, state, revises, attempts, next_attempt_at, created_at)
				SELECT $1, $2, c.id, $3, $4, $5, $6, c.amount, 'delivering', $7, 1, $8, $9 FROM c RETURNING id),
			e AS (INSERT INTO submission_events (submission_id, seq, from_state, to_state, cause, at)
				SELECT id, 1, NULL, 'delivering', 'submitted', $9 FROM s)
			SELECT id FROM s`, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&id) })
		if err := kungfu.SendFinal(ctx, tx, b).Close(); err != nil {
			return err
		}
		d = &Delivery{SubmissionID: id, TaskCode: r.Code, URL: v.ReceiverURL, Body: s.body(id, r.Code, who.AccountID, payload)}
		res = Result{TaskCode: r.Code, SubmissionID: strconv.FormatInt(id, 10), State: "delivering", Amount: amount,
			ContractVersion: v.Number, CreatedAt: now}
		return nil
	})
	if errors.Is(err, errRecheck) {
		in.rechecks++
		return s.Submit(ctx, who, in)
	}
	if err != nil {
		return Result{}, wrap("work_submit", err)
	}
	if !existing && d != nil && s.Receiver != nil {
		// The POST runs detached from the caller: a client that goes away
		// does not abort a delivery whose outcome moves money.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		out := s.Receiver.Deliver(dctx, *d)
		if rec, err := s.record(dctx, d.SubmissionID, 1, out); err == nil {
			res = rec
		} else {
			return Result{}, wrap("work_submit", err)
		}
	}
	s.advise(ctx, &res, r, who)
	return res, nil
}

// claimOn validates a claim given to work_submit.
func (s *Service) claimOn(ctx context.Context, tx pgx.Tx, r row, who kungfu.Caller, claimID string, now time.Time) (Claim, error) {
	invalid := kungfu.Errorf(kungfu.CodeClaimInvalid, "claim %s is not an active claim of yours on this task", claimID)
	id, err := strconv.ParseInt(strings.TrimSpace(claimID), 10, 64)
	if err != nil {
		return Claim{}, invalid
	}
	c, err := activeClaim(ctx, tx, r, who.AccountID, id)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !now.Before(c.ExpiresAt)) {
		return Claim{}, invalid
	}
	if err == nil {
		_, err = tx.Exec(ctx, `SELECT 1 FROM claims WHERE id = $1 FOR UPDATE`, id)
	}
	return c, err
}

// checked is a payload checked against one contract version before the
// transaction. The schema check is the one step of a submission whose cost
// the submitter chooses; run under the task's row lock it would hold up
// task_pause and every other submission to the task.
type checked struct {
	task    int64
	version int
	payload []byte
	err     error
}

// errRecheck aborts a transaction whose contract version is not the one
// the payload was checked against: the check runs again, unlocked.
var errRecheck = errors.New("the contract changed while the payload was checked")

// precheck checks the payload against the version the submission will
// bind unless the contract moves meanwhile: its claim's, else the task's
// current one. It reads without locking; failures to read are left to the
// transaction, which meets them again and reports them in their place.
func (s *Service) precheck(ctx context.Context, who kungfu.Caller, in SubmitInput) checked {
	r, err := load(ctx, s.DB, who, in.Code, false)
	if err != nil {
		return checked{}
	}
	v := r.v
	if id, err := strconv.ParseInt(strings.TrimSpace(in.ClaimID), 10, 64); err == nil {
		var n int
		err := s.DB.QueryRow(ctx, `SELECT version FROM claims WHERE id = $1 AND task_id = $2 AND account_id = $3`,
			id, r.ID, who.AccountID).Scan(&n)
		if err == nil && n != v.Number {
			if v, err = loadVersion(ctx, s.DB, r.ID, n); err != nil {
				return checked{}
			}
		}
	}
	return check(in.Payload, r.ID, v)
}

func check(raw json.RawMessage, task int64, v version) checked {
	p, err := checkPayload(raw, v)
	return checked{task: task, version: v.Number, payload: p, err: err}
}

// checkPayload applies the bound version's rules: a JSON object, the
// output schema, no credential-shaped strings.
func checkPayload(raw json.RawMessage, v version) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if _, ok := inst.(map[string]any); err != nil || !ok {
		return nil, kungfu.Errorf(kungfu.CodeSchemaMismatch, "payload must be a JSON object").
			WithDetails(map[string]any{"errors": []map[string]string{{"pointer": "", "message": "not a JSON object"}}})
	}
	if len(v.Schema) > 0 {
		if err := schema.CheckStored(v.Schema, inst, "the payload does not match the task's output.schema"); err != nil {
			return nil, err
		}
	}
	if ptr, kind := credential.FindIn(inst); kind != "" {
		return nil, kungfu.Errorf(kungfu.CodeCredentialInPayload, "the payload holds a credential-shaped string (%s)", kind).
			WithDetails(map[string]any{"pointer": ptr})
	}
	return raw, nil
}

// body is the receiver's request body: exactly four keys.
func (s *Service) body(id int64, code string, accountID int64, payload []byte) []byte {
	ref := ""
	if s.AgentRef != nil {
		ref = s.AgentRef(code, accountID)
	}
	b, _ := json.Marshal(struct {
		SubmissionID string          `json:"submission_id"`
		TaskCode     string          `json:"task_code"`
		AgentRef     string          `json:"agent_ref"`
		Payload      json.RawMessage `json:"payload"`
	}{strconv.FormatInt(id, 10), code, ref, payload})
	return b
}

const eventSQL = `INSERT INTO submission_events (submission_id, seq, from_state, to_state, cause, at)
	VALUES ($1, (SELECT coalesce(max(seq), 0) + 1 FROM submission_events WHERE submission_id = $1), $2, $3, $4, $5)`

func event(ctx context.Context, tx pgx.Tx, id int64, from *string, to, cause string, at time.Time) error {
	_, err := tx.Exec(ctx, eventSQL, id, from, to, cause, at)
	return err
}

// queueEvent is event in a batch.
func queueEvent(b *pgx.Batch, id int64, from *string, to, cause string, at time.Time) {
	b.Queue(eventSQL, id, from, to, cause, at)
}

// classify maps an outcome to a state and failure by status code alone.
func classify(o Outcome) (state, failure string) {
	switch {
	case o.Status >= 200 && o.Status < 300:
		return "settled", ""
	case o.Status >= 400 && o.Status < 500:
		return "rejected", ""
	case o.Status >= 500:
		return "failed", "RECEIVER_FAULT"
	case o.Status > 0:
		return "failed", "RECEIVER_PROTOCOL"
	case !o.Sent:
		return "failed", "RECEIVER_UNREACHABLE"
	}
	return "uncertain", ""
}

// record writes an attempt and its outcome. Locks go task, claim,
// submission; a submission already settled by a concurrent writer keeps
// that outcome, so money moves at most once. The locks are taken in one
// round trip and everything else, COMMIT included, sent in another: a
// batch runs its statements in order, so the lock order holds.
func (s *Service) record(ctx context.Context, id int64, attempt int, o Outcome) (Result, error) {
	var res Result
	var wake *time.Time
	err := kungfu.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		var taskID, claimID, accountID, amount int64
		var code, state string
		var attempts int
		var since *time.Time
		locks := &pgx.Batch{}
		locks.Queue(`SELECT id, code FROM tasks WHERE id = (SELECT task_id FROM submissions WHERE id = $1) FOR UPDATE`, id)
		locks.Queue(`SELECT 1 FROM claims WHERE id = (SELECT claim_id FROM submissions WHERE id = $1) FOR UPDATE`, id)
		locks.Queue(`SELECT claim_id, account_id, amount, state, attempts, uncertain_since FROM submissions WHERE id = $1 FOR UPDATE`, id)
		br := tx.SendBatch(ctx, locks)
		err := br.QueryRow().Scan(&taskID, &code)
		if _, cerr := br.Exec(); err == nil {
			err = cerr
		}
		if serr := br.QueryRow().Scan(&claimID, &accountID, &amount, &state, &attempts, &since); err == nil {
			err = serr
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		now := s.Now()
		to, failure := classify(o)
		var status *int
		var reply *string
		if o.Status > 0 {
			status = &o.Status
			e := kungfu.Excerpt(o.Body)
			reply = &e
		}
		var errText *string
		if o.Err != nil {
			e := o.Err.Error()
			errText = &e
		}
		writes := &pgx.Batch{}
		writes.Queue(`INSERT INTO delivery_attempts (submission_id, attempt, started_at, status, latency_ms, reply, error, outcome)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, id, attempt, now.Add(-o.Latency), status, o.Latency.Milliseconds(), reply, errText, to)
		// send ends the transaction in one round trip: the writes, the
		// result the caller gets, then after (the money and the pause, as
		// they always ran last) and COMMIT. after's failures abort the
		// batch, so a COMMIT behind them never runs.
		send := func(after func(b *pgx.Batch) error) error {
			n := writes.Len()
			writes.Queue(resultSQL, id)
			if after != nil {
				if err := after(writes); err != nil {
					return err
				}
			}
			br := kungfu.SendFinal(ctx, tx, writes)
			var err error
			for range n {
				if _, e := br.Exec(); err == nil {
					err = e
				}
			}
			r, e := scanResult(br.QueryRow(), code, id)
			if err == nil {
				res, err = r, e
			}
			if e := br.Close(); err == nil {
				err = e
			}
			return err
		}
		if state != "delivering" && state != "uncertain" {
			return send(nil) // a concurrent writer's outcome stands
		}
		from := state
		switch {
		case to == "uncertain" && attempt > len(Ladder):
			to, failure = "failed", "DELIVERY_UNRESOLVED"
		case to == "uncertain":
			next := now.Add(s.rung(attempt))
			if since == nil {
				since = &now
			}
			writes.Queue(`UPDATE submissions SET state = 'uncertain', uncertain_since = $2, next_attempt_at = $3 WHERE id = $1`, id, since, next)
			wake = &next
			if from != "uncertain" {
				queueEvent(writes, id, &from, "uncertain", "no_answer", now)
			}
			return send(nil)
		}
		var fail *string
		if failure != "" {
			fail = &failure
		}
		writes.Queue(`UPDATE submissions SET state = $2, failure = $3, response_code = $4, response_body = $5,
			payload = NULL, next_attempt_at = NULL, terminal_at = $6 WHERE id = $1`, id, to, fail, status, reply, now)
		cause := map[string]string{"settled": "accepted", "rejected": "rejected", "failed": strings.ToLower(failure)}[to]
		queueEvent(writes, id, &from, to, cause, now)
		switch to {
		case "settled":
			writes.Queue(`UPDATE tasks SET reserved = reserved - $2, settled = settled + $2 WHERE id = $1`, taskID, amount)
			return send(func(b *pgx.Batch) error {
				return credits.Queue(b, now, credits.Movement{AccountID: accountID, Type: credits.EarnTask, Amount: amount,
					RefType: "task_submission", RefID: strconv.FormatInt(id, 10)})
			})
		case "failed":
			writes.Queue(`UPDATE tasks SET reserved = reserved - $2 WHERE id = $1`, taskID, amount)
			return send(func(b *pgx.Batch) error {
				b.Queue(pauseSQL, taskID, now)
				return nil
			})
		}
		writes.Queue(`UPDATE tasks SET reserved = reserved - $2 WHERE id = $1`, taskID, amount)
		return send(nil)
	})
	if err != nil {
		return Result{}, err
	}
	if wake != nil && s.Wake != nil {
		_ = s.Wake.EnqueueAttempt(ctx, id, attempt+1, *wake)
	}
	return res, nil
}

// pauseSQL pauses an open task ($1) whose five most recent terminal
// submissions all failed on the receiver's side.
const pauseSQL = `UPDATE tasks SET status = 'paused', paused_reason = 'RECEIVER_FAULT', updated_at = $2
	WHERE id = $1 AND status = 'open' AND 5 = (
	  SELECT count(*) FROM (SELECT failure FROM submissions WHERE task_id = $1 AND terminal_at IS NOT NULL
	                        ORDER BY terminal_at DESC, id DESC LIMIT 5) recent
	  WHERE failure IN ('RECEIVER_PROTOCOL', 'RECEIVER_FAULT', 'RECEIVER_UNREACHABLE'))`

// resultSQL reads a submission for its executor; scanResult scans it.
const resultSQL = `SELECT state, amount, failure, response_code, response_body, version, created_at, terminal_at
	FROM submissions WHERE id = $1`

// result reads a submission for its executor.
func result(ctx context.Context, q querier, code string, id int64, events bool) (Result, error) {
	return scanResult(q.QueryRow(ctx, resultSQL, id), code, id)
}

func scanResult(row pgx.Row, code string, id int64) (Result, error) {
	res := Result{TaskCode: code, SubmissionID: strconv.FormatInt(id, 10)}
	var status *int
	var body *string
	err := row.Scan(&res.State, &res.Amount, &res.Failure, &status, &body, &res.ContractVersion, &res.CreatedAt, &res.TerminalAt)
	if err != nil {
		return Result{}, err
	}
	res.CreatedAt = res.CreatedAt.UTC()
	if res.TerminalAt != nil {
		t := res.TerminalAt.UTC()
		res.TerminalAt = &t
	}
	if status != nil {
		res.Reply = &Reply{Status: *status, Body: *body}
	}
	if res.State == "settled" {
		res.Paid = res.Amount
	}
	return res, nil
}
