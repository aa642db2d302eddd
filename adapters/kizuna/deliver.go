package kizuna

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	neturl "net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/queue"
	"github.com/dojo-relay/dojo/signing"
)

// TaskLetter is the queue task type of letter deliveries; its id is the
// kz_letters row.
const TaskLetter = "letter"

// MaxAttempts is the contract's six tries: one at once, then the ladder.
const MaxAttempts = 6

// Ladder is the gap before attempts 2..6, measured from the previous
// attempt (the contract's +3, +10, +30, +60, +120 minutes).
var Ladder = []time.Duration{3 * time.Minute, 10 * time.Minute, 30 * time.Minute, 60 * time.Minute, 120 * time.Minute}

// maxReply is how much of a letterbox's answer is read; 4 000 bytes of it
// are kept.
const maxReply = 64 << 10

// leaseMargin is how long after its POST's timeout a claimed attempt is
// presumed lost (its process died) and the letter due again.
const leaseMargin = 20 * time.Second

// Delivery posts letters to their recipients' letterboxes on the ladder.
// PostgreSQL is the truth: a queue task only wakes Deliver, which claims
// the attempt in a row lock before it POSTs, so a duplicate task or a
// second process never makes the same attempt twice, and the sweep
// re-enqueues whatever Redis lost.
type Delivery struct {
	DB     *pgxpool.Pool
	Engine *queue.Engine
	// Client is the guarded outbound client (queue.NewOutbound).
	Client *http.Client
	// Keys opens endpoint secrets and signs the Standard Webhooks headers.
	Keys *signing.ServerKey
	// Hosts paces deliveries per letterbox host; nil sends without turns.
	Hosts *queue.Hosts
	Now   kungfu.Clock
	// LadderScale multiplies the ladder (tests: 0.001); zero means 1.
	LadderScale float64
	// Timeout bounds one POST (default queue.RequestTimeout, 10 s).
	Timeout time.Duration
	Log     *slog.Logger
}

func (d *Delivery) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return kungfu.SystemClock()
}

func (d *Delivery) timeout() time.Duration {
	if d.Timeout > 0 {
		return d.Timeout
	}
	return queue.RequestTimeout
}

func (d *Delivery) log() *slog.Logger {
	if d.Log != nil {
		return d.Log
	}
	return slog.Default()
}

// Gap is the wait after failed attempt n (1-based) before attempt n+1,
// scaled, with up to a tenth more of jitter so letters failed together do
// not return together.
func (d *Delivery) Gap(n int) time.Duration {
	scale := d.LadderScale
	if scale <= 0 {
		scale = 1
	}
	g := time.Duration(float64(Ladder[min(max(n, 1), len(Ladder))-1]) * scale)
	if g/10 > 0 {
		g += rand.N(g / 10)
	}
	return g
}

// Register wires deliveries into e: the handler and the sweep that
// re-enqueues due letters whose wake-up was lost (a Redis flush, a crash).
func (d *Delivery) Register(e *queue.Engine, sweep time.Duration) {
	if d.Engine == nil {
		d.Engine = e
	}
	if d.Hosts == nil {
		d.Hosts = e.Hosts()
	}
	e.Handle(TaskLetter, d.Deliver)
	if sweep <= 0 {
		sweep = 5 * time.Second
	}
	e.Every("letter-sweep", sweep, func(ctx context.Context) error {
		_, err := d.Sweep(ctx, 100)
		return err
	})
}

// Enqueue wakes the worker for a letter committed to PostgreSQL. Errors
// are only logged: the sweep finds any letter whose wake-up was lost.
func (d *Delivery) Enqueue(ctx context.Context, letterID int64) {
	if err := d.enqueue(ctx, letterID, 1, time.Time{}); err != nil {
		d.log().Warn("letter enqueue failed; the sweep will retry", "letter", letterID, "err", err)
	}
}

// enqueue keys the task by attempt, so a finished task kept in Redis for
// queue.Retention never hides the next attempt.
func (d *Delivery) enqueue(ctx context.Context, letterID int64, attempt int, at time.Time) error {
	return d.Engine.EnqueueKey(ctx, TaskLetter, letterID, strconv.Itoa(attempt), at)
}

// Sweep enqueues up to limit due letters and returns how many. Rows being
// claimed or recorded right now are skipped, not waited for.
func (d *Delivery) Sweep(ctx context.Context, limit int) (int, error) {
	rows, err := d.DB.Query(ctx, `SELECT id, attempts FROM kz_letters
		WHERE finished_at IS NULL AND (next_attempt_at IS NULL OR next_attempt_at <= $1)
		ORDER BY next_attempt_at NULLS FIRST LIMIT $2 FOR UPDATE SKIP LOCKED`, d.now(), limit)
	if err != nil {
		return 0, fmt.Errorf("kizuna: sweep: %w", err)
	}
	type due struct {
		id       int64
		attempts int
	}
	var list []due
	for rows.Next() {
		var x due
		if err := rows.Scan(&x.id, &x.attempts); err != nil {
			rows.Close()
			return 0, fmt.Errorf("kizuna: sweep: %w", err)
		}
		list = append(list, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("kizuna: sweep: %w", err)
	}
	var errs []error
	for _, x := range list {
		if err := d.enqueue(ctx, x.id, x.attempts+1, time.Time{}); err != nil {
			errs = append(errs, err)
		}
	}
	return len(list), errors.Join(errs...)
}

// letter is what one attempt needs.
type letter struct {
	id        int64
	taskID    string
	body      []byte
	n         int
	url       string
	secret    string
	invalid   string // why the target cannot receive, if it cannot
	exhausted bool   // six attempts were claimed; the last one's process died
}

// Deliver is the handler of TaskLetter: one attempt at letter id, if one
// is due.
func (d *Delivery) Deliver(ctx context.Context, id int64) error {
	// The host turn is taken before the attempt is claimed, so an attempt
	// deferred for want of a turn is not counted.
	var url string
	err := d.DB.QueryRow(ctx, `SELECT coalesce(a.webhook_url, '') FROM kz_letters l
		LEFT JOIN kz_agents a ON a.account_id = l.to_account
		WHERE l.id = $1 AND l.finished_at IS NULL AND (l.next_attempt_at IS NULL OR l.next_attempt_at <= $2)`, id, d.now()).Scan(&url)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // not due, or finished meanwhile
	}
	if err != nil {
		return fmt.Errorf("kizuna: letter %d: %w", id, err)
	}
	var turn *queue.Turn
	if url != "" {
		turn, err = d.Hosts.Take(ctx, url, d.timeout()+leaseMargin)
		var later *queue.Deferred
		if errors.As(err, &later) {
			return fmt.Errorf("kizuna: letter %d: %w", id, err)
		}
		if err != nil {
			d.log().Warn("letter delivery without a host turn", "letter", id, "err", err)
		}
	}
	defer turn.Done(ctx, queue.Unsent)

	l, ok, sealed, to, err := d.claim(ctx, id)
	if err != nil || !ok {
		return err
	}
	switch {
	case l.invalid != "":
		return d.finish(ctx, l.id, "invalid_target")
	case l.exhausted:
		return d.finish(ctx, l.id, "delivery_failed")
	}
	secret, err := d.Keys.Open(sealed, SecretPurpose(to))
	if err != nil {
		// Sealed under another server key: no attempt can be signed. The
		// claimed attempt says why, and the letter ends.
		d.log().Error("letter target's endpoint secret cannot be opened", "letter", id, "err", err)
		return d.record(ctx, l, attempt{err: "the target's endpoint secret cannot be opened"}, "invalid_target")
	}
	l.secret = string(secret)
	a := d.post(ctx, l, turn)
	return d.record(ctx, l, a, d.outcome(l, a))
}

// claimSQL takes the due attempt of a letter whose target can receive: it
// counts the attempt and leases the letter until the POST must have ended,
// so a duplicate task finds it not due and a process that dies mid-POST
// leaves it due again after the lease. The attempt row is written at once,
// so even a lost attempt shows. The row lock waits rather than skips: a
// task that skipped a row the sweep held for an instant would end, and its
// id, kept in Redis for queue.Retention, would stop the sweep from waking
// the letter again. A claim that waited re-reads the row, sees the lease
// and finds nothing due.
const claimSQL = `WITH c AS (
		UPDATE kz_letters l SET state = 'delivering', attempts = l.attempts + 1, next_attempt_at = $3
		FROM kz_agents a
		WHERE l.id = $1 AND l.finished_at IS NULL AND (l.next_attempt_at IS NULL OR l.next_attempt_at <= $2)
			AND l.attempts < ` + maxAttemptsSQL + `
			AND a.account_id = l.to_account AND a.enabled AND btrim(a.webhook_url) <> ''
		RETURNING l.id, l.attempts)
	INSERT INTO kz_attempts (letter_id, n, at, error)
	SELECT id, attempts, $2, 'no outcome recorded: the attempt was interrupted' FROM c`

const maxAttemptsSQL = "6" // MaxAttempts, spelled for SQL

// claim runs claimSQL and reads the letter in one round trip (a batch is
// one implicit transaction). When nothing was claimed, the read tells
// whether the letter is simply not due or can never be delivered.
func (d *Delivery) claim(ctx context.Context, id int64) (l letter, ok bool, sealed []byte, to int64, err error) {
	now := d.now()
	lease := now.Add(d.timeout() + leaseMargin)
	b := &pgx.Batch{}
	b.Queue(claimSQL, id, now, lease)
	b.Queue(`SELECT l.id, l.task_id, l.body::text, l.attempts, l.to_account, a.webhook_url, a.endpoint_secret, a.enabled,
			l.finished_at IS NULL AND (l.next_attempt_at IS NULL OR l.next_attempt_at <= $2)
		FROM kz_letters l LEFT JOIN kz_agents a ON a.account_id = l.to_account WHERE l.id = $1`, id, now)
	br := d.DB.SendBatch(ctx, b)
	defer br.Close()
	tag, err := br.Exec()
	if err != nil {
		return letter{}, false, nil, 0, fmt.Errorf("kizuna: claim letter %d: %w", id, err)
	}
	claimed := tag.RowsAffected() == 1
	var (
		toAcc   *int64
		url     *string
		enabled *bool
		due     bool
	)
	err = br.QueryRow().Scan(&l.id, &l.taskID, &l.body, &l.n, &toAcc, &url, &sealed, &enabled, &due)
	if errors.Is(err, pgx.ErrNoRows) {
		return letter{}, false, nil, 0, nil
	}
	if err == nil {
		err = br.Close()
	}
	if err != nil {
		return letter{}, false, nil, 0, fmt.Errorf("kizuna: claim letter %d: %w", id, err)
	}
	if claimed {
		l.url = DeliverURL(*url)
		return l, true, sealed, *toAcc, nil
	}
	if !due {
		return letter{}, false, nil, 0, nil
	}
	// Due but not claimable: the target cannot receive, or six attempts
	// were claimed already. finish re-checks under its own lock.
	switch {
	case toAcc == nil || url == nil:
		l.invalid = "unknown target"
	case enabled != nil && !*enabled:
		l.invalid = "target disabled"
	case strings.TrimSpace(*url) == "":
		l.invalid = "target has no webhook"
	default:
		l.exhausted = true
	}
	return l, true, nil, 0, nil
}

// attempt is how one POST went.
type attempt struct {
	status  int
	latency time.Duration
	err     string
	reply   string
	acked   bool
}

func (d *Delivery) post(ctx context.Context, l letter, turn *queue.Turn) attempt {
	ctx, cancel := context.WithTimeout(ctx, d.timeout())
	defer cancel()
	ts := strconv.FormatInt(time.Now().Unix(), 10) // the letterbox judges it by its own clock
	header := http.Header{
		"X-Kizuna-Task-Id":   {l.taskID},
		"X-Kizuna-Timestamp": {ts},
		"X-Kizuna-Attempt":   {strconv.Itoa(l.n)},
		"X-Kizuna-Signature": {signing.KizunaSignature(l.secret, ts, l.body)},
	}
	start := time.Now()
	req, err := queue.NewSignedPost(ctx, d.Keys, l.url, "letter_"+l.taskID, l.body, header)
	if err != nil {
		return attempt{err: err.Error()}
	}
	resp, err := d.Client.Do(req)
	if err != nil {
		ending := queue.Unsent
		if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			ending = queue.TimedOut
		}
		turn.Done(ctx, ending)
		return attempt{latency: time.Since(start), err: err.Error()}
	}
	defer resp.Body.Close()
	body, rerr := io.ReadAll(io.LimitReader(resp.Body, maxReply))
	turn.Done(ctx, queue.Answered)
	a := attempt{status: resp.StatusCode, latency: time.Since(start), reply: kungfu.Excerpt(body)}
	var ack struct {
		TaskID *string `json:"task_id"`
	}
	switch {
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		a.err = fmt.Sprintf("HTTP %d", resp.StatusCode)
	case rerr != nil:
		a.err = "reading the reply: " + rerr.Error()
	case json.Unmarshal(body, &ack) != nil:
		a.err = "the reply is not a JSON object with task_id"
	case ack.TaskID == nil:
		a.err = "the reply has no task_id"
	case *ack.TaskID != l.taskID:
		a.err = fmt.Sprintf("the reply acknowledges task_id %q, not %q", *ack.TaskID, l.taskID)
	default:
		a.acked = true
	}
	return a
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// DeliverURL is where letters to a letterbox at webhook go: the path
// gains /kizuna/deliver and a query, if any, stays a query.
func DeliverURL(webhook string) string {
	u, err := neturl.Parse(strings.TrimSpace(webhook))
	if err != nil {
		// Registration refuses such URLs; an old row fails at connect.
		return strings.TrimRight(webhook, "/") + "/kizuna/deliver"
	}
	u.Path = strings.TrimRight(u.Path, "/") + "/kizuna/deliver"
	u.RawPath = ""
	u.Fragment = ""
	return u.String()
}

// outcome is how the letter ends after attempt a, or "" when the ladder
// goes on.
func (d *Delivery) outcome(l letter, a attempt) string {
	switch {
	case a.acked:
		return "acked"
	case l.n >= MaxAttempts:
		return "delivery_failed"
	}
	return ""
}

// record writes attempt a's outcome and either finishes the letter with
// outcome or, when outcome is "", schedules the next attempt. It is one
// round trip: a batch runs as one implicit transaction.
func (d *Delivery) record(ctx context.Context, l letter, a attempt, outcome string) error {
	// The attempt ran; its outcome must be written even if the task's
	// context ended meanwhile (shutdown).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var status *int
	if a.status != 0 {
		status = &a.status
	}
	now := d.now()
	var next time.Time
	b := &pgx.Batch{}
	b.Queue(`UPDATE kz_attempts SET status = $3, latency_ms = $4, error = $5, reply = $6 WHERE letter_id = $1 AND n = $2`,
		l.id, l.n, status, a.latency.Milliseconds(), a.err, a.reply)
	// Only the attempt the letter still counts may move it: if the lease
	// ran out and another process took over, or an admin ended the letter,
	// the newer attempt or the admin decides.
	if outcome == "" {
		next = now.Add(d.Gap(l.n))
		b.Queue(`UPDATE kz_letters SET state = 'queued', next_attempt_at = $3
			WHERE id = $1 AND attempts = $2 AND finished_at IS NULL`, l.id, l.n, next)
	} else {
		queueFinish(b, l.id, now, outcome, l.n)
	}
	br := d.DB.SendBatch(ctx, b)
	var moved bool
	for i := range b.Len() {
		tag, err := br.Exec()
		if err != nil {
			br.Close()
			return fmt.Errorf("kizuna: record attempt %d of letter %d: %w", l.n, l.id, err)
		}
		if i == 1 {
			moved = tag.RowsAffected() == 1
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("kizuna: record attempt %d of letter %d: %w", l.n, l.id, err)
	}
	if moved && outcome == "" {
		if err := d.enqueue(ctx, l.id, l.n+1, next); err != nil {
			d.log().Warn("letter retry enqueue failed; the sweep will retry", "letter", l.id, "err", err)
		}
	}
	return nil
}

// finish ends a letter that needs no attempt (invalid target, six
// attempts already claimed).
func (d *Delivery) finish(ctx context.Context, id int64, outcome string) error {
	b := &pgx.Batch{}
	queueFinish(b, id, d.now(), outcome, -1)
	if err := d.DB.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("kizuna: finish letter %d as %s: %w", id, outcome, err)
	}
	return nil
}

// The two statements that dequeue a letter: its final state, then its one
// audit row with the whole attempt history. They always run in one
// transaction, so the final state and the audit are never apart. The
// audit row is written only when the first statement finished the letter
// now ($3): a letter that was already finished keeps the audit it has.
const (
	finishSQL = `UPDATE kz_letters SET state = $2, finished_at = $3, next_attempt_at = NULL,
			acked_at = CASE WHEN $2 = 'acked' THEN $3::timestamptz END
		WHERE id = $1 AND finished_at IS NULL AND ($4::int < 0 OR attempts = $4)`
	auditSQL = `INSERT INTO kz_audit (letter_id, task_id, outcome, attempts, at)
		SELECT l.id, l.task_id, $2,
			coalesce((SELECT json_agg(json_build_object(
				'n', a.n,
				'at', to_char(a.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
				'status', a.status,
				'latency_ms', a.latency_ms,
				'error', a.error,
				'reply', a.reply) ORDER BY a.n) FROM kz_attempts a WHERE a.letter_id = l.id), '[]'::json),
			$3
		FROM kz_letters l WHERE l.id = $1 AND l.state = $2 AND l.finished_at = $3
		ON CONFLICT (letter_id) DO NOTHING`
)

// queueFinish adds the dequeue of letter id to b; attempt >= 0 makes it
// conditional on the letter still counting that attempt.
func queueFinish(b *pgx.Batch, id int64, now time.Time, outcome string, attempt int) {
	b.Queue(finishSQL, id, outcome, now, attempt)
	b.Queue(auditSQL, id, outcome, now)
}

// finishTx dequeues letter id in the caller's transaction.
func finishTx(ctx context.Context, tx pgx.Tx, id int64, now time.Time, outcome string) error {
	b := &pgx.Batch{}
	queueFinish(b, id, now, outcome, -1)
	return tx.SendBatch(ctx, b).Close()
}

// Redeliver enqueues an attempt now under a key of its own: the keys of
// the ladder's wake-ups are taken by the scheduled (or finished) tasks.
func (d *Delivery) Redeliver(ctx context.Context, letterID int64) {
	key := "now-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := d.Engine.EnqueueKey(ctx, TaskLetter, letterID, key, time.Time{}); err != nil {
		d.log().Warn("letter redeliver enqueue failed; the sweep will retry", "letter", letterID, "err", err)
	}
}
