package task

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/credits"
	"github.com/dojo-relay/dojo/kungfu/kungfutest"
)

type wakeup struct {
	id      int64
	attempt int
	at      time.Time
}

type wakes struct{ list []wakeup }

func (w *wakes) EnqueueAttempt(_ context.Context, id int64, attempt int, at time.Time) error {
	w.list = append(w.list, wakeup{id, attempt, at})
	return nil
}

// fixture is a Service on a traced database with one open task (price 3,
// budget 30) and an executor. Its clock moves only when told to.
type fixture struct {
	s        *Service
	db       *pgxpool.Pool
	tr       *kungfutest.Trips
	wakes    *wakes
	base     time.Time
	now      time.Time
	exe, pub kungfu.Caller
	code     string
	taskID   int64
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{wakes: &wakes{}}
	f.db, f.tr = kungfutest.TracedPool(t, 0)
	f.base = time.Now().UTC().Truncate(time.Second)
	f.now = f.base
	f.s = &Service{DB: f.db, Now: func() time.Time { return f.now }, Wake: f.wakes}
	f.pub = kungfutest.Account(t, f.db, "publisher")
	f.exe = kungfutest.Account(t, f.db, "executor")
	if err := pgx.BeginFunc(ctx, f.db, func(tx pgx.Tx) error {
		_, err := credits.Apply(ctx, tx, f.now, credits.Movement{AccountID: f.pub.AccountID, Type: credits.GrantSignup, Amount: 66})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	v, err := f.s.Create(ctx, f.pub, Contract{Title: "T", Requirements: "do", Receiver: ReceiverSpec{URL: "https://example.org/r"}, Price: 3}, 30, true)
	if err != nil {
		t.Fatal(err)
	}
	f.code = v.Code
	if err := f.db.QueryRow(ctx, `SELECT id FROM tasks WHERE code = $1`, f.code).Scan(&f.taskID); err != nil {
		t.Fatal(err)
	}
	return f
}

// at names a time by its distance from the fixture's start.
func (f *fixture) at(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return "+" + t.Sub(f.base).String()
}

func str[T any](p *T) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

// submit takes a submission in without delivering it (no Receiver).
func (f *fixture) submit(t *testing.T, key string) int64 {
	t.Helper()
	res, err := f.s.Submit(context.Background(), f.exe, SubmitInput{Code: f.code, RequestKey: key, Payload: []byte(`{"n":1}`)})
	if err != nil || res.State != "delivering" {
		t.Fatalf("submit %s: %+v %v", key, res, err)
	}
	id, _ := strconv.ParseInt(res.SubmissionID, 10, 64)
	return id
}

// record runs record at the fixture's now, checks it took two round trips
// (the locks, then one last batch ending in COMMIT) and returns the SQL of
// the last batch, COMMIT left off.
func (f *fixture) record(t *testing.T, id int64, attempt int, o Outcome) (Result, []string, error) {
	t.Helper()
	f.tr.Take()
	res, err := f.s.record(context.Background(), id, attempt, o)
	sent := f.tr.Take()
	if err != nil {
		return res, nil, err
	}
	if len(sent) != 2 || len(sent[0]) != 4 || sent[0][0] != "begin" || sent[1][len(sent[1])-1] != "COMMIT" {
		t.Fatalf("record sent %q, want the locks then one batch ending in COMMIT", sent)
	}
	return res, sent[1][:len(sent[1])-1], nil
}

// rows renders everything record writes about a submission.
func (f *fixture) rows(t *testing.T, id int64) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	q := func(sql string, scan func(pgx.CollectableRow) (string, error), args ...any) {
		rows, _ := f.db.Query(ctx, sql, args...)
		list, err := pgx.CollectRows(rows, scan)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range list {
			b.WriteString(l + "\n")
		}
	}
	q(`SELECT attempt, started_at, status, latency_ms, reply, error, outcome FROM delivery_attempts WHERE submission_id = $1 ORDER BY id`,
		func(r pgx.CollectableRow) (string, error) {
			var n, latency int
			var started time.Time
			var status *int
			var reply, errText *string
			var outcome string
			err := r.Scan(&n, &started, &status, &latency, &reply, &errText, &outcome)
			return fmt.Sprintf("attempt %d at %s status %s latency %d reply %s error %s outcome %s",
				n, f.at(&started), str(status), latency, str(reply), str(errText), outcome), err
		}, id)
	q(`SELECT state, failure, response_code, response_body, payload IS NULL, attempts, next_attempt_at, uncertain_since, terminal_at
		FROM submissions WHERE id = $1`,
		func(r pgx.CollectableRow) (string, error) {
			var state string
			var failure, body *string
			var code *int
			var dropped bool
			var attempts int
			var next, since, terminal *time.Time
			err := r.Scan(&state, &failure, &code, &body, &dropped, &attempts, &next, &since, &terminal)
			return fmt.Sprintf("submission %s failure %s code %s body %s payload dropped %v attempts %d next %s since %s terminal %s",
				state, str(failure), str(code), str(body), dropped, attempts, f.at(next), f.at(since), f.at(terminal)), err
		}, id)
	q(`SELECT seq, from_state, to_state, cause, at FROM submission_events WHERE submission_id = $1 ORDER BY seq`,
		func(r pgx.CollectableRow) (string, error) {
			var seq int
			var from *string
			var to, cause string
			var at time.Time
			err := r.Scan(&seq, &from, &to, &cause, &at)
			return fmt.Sprintf("event %d %s>%s %s at %s", seq, str(from), to, cause, f.at(&at)), err
		}, id)
	q(`SELECT type, amount, balance_after, ref_type, ref_id, created_at FROM ledger WHERE ref_type = 'task_submission' AND ref_id = $1 ORDER BY id`,
		func(r pgx.CollectableRow) (string, error) {
			var typ, refType, refID string
			var amount, after int64
			var at time.Time
			err := r.Scan(&typ, &amount, &after, &refType, &refID, &at)
			return fmt.Sprintf("ledger %s %d after %d %s at %s", typ, amount, after, refType, f.at(&at)), err
		}, strconv.FormatInt(id, 10))
	return b.String()
}

// task renders the task's money and status.
func (f *fixture) task(t *testing.T) string {
	t.Helper()
	var reserved, settled int64
	var status string
	var reason *string
	var updated time.Time
	if err := f.db.QueryRow(context.Background(), `SELECT reserved, settled, status, paused_reason, updated_at FROM tasks WHERE id = $1`, f.taskID).
		Scan(&reserved, &settled, &status, &reason, &updated); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("reserved %d settled %d %s %s updated %s", reserved, settled, status, str(reason), f.at(&updated))
}

func (f *fixture) balance(t *testing.T) int64 {
	t.Helper()
	var n int64
	if err := f.db.QueryRow(context.Background(), `SELECT balance FROM accounts WHERE id = $1`, f.exe.AccountID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *fixture) healthy(t *testing.T) {
	t.Helper()
	if p, err := Check(context.Background(), f.db); err != nil || len(p) != 0 {
		t.Fatalf("task check: %v %v", p, err)
	}
	if d, err := credits.Check(context.Background(), f.db); err != nil || len(d) != 0 {
		t.Fatalf("credits check: %v %v", d, err)
	}
}

func wantRows(t *testing.T, got string, want ...string) {
	t.Helper()
	if w := strings.Join(want, "\n") + "\n"; got != w {
		t.Fatalf("rows:\n%s\nwant:\n%s", got, w)
	}
}

func wantSent(t *testing.T, sent []string, prefixes ...string) {
	t.Helper()
	ok := len(sent) == len(prefixes)
	for i := 0; ok && i < len(sent); i++ {
		ok = strings.HasPrefix(strings.Join(strings.Fields(sent[i]), " "), prefixes[i])
	}
	if !ok {
		t.Fatalf("last batch %q, want statements starting %q", sent, prefixes)
	}
}

const (
	sentAttempt = "INSERT INTO delivery_attempts"
	sentState   = "UPDATE submissions SET state = $2"
	sentEvent   = "INSERT INTO submission_events"
	sentSettle  = "UPDATE tasks SET reserved = reserved - $2, settled"
	sentRelease = "UPDATE tasks SET reserved = reserved - $2 WHERE"
	sentResult  = "SELECT state, amount"
	sentCredit  = "WITH u AS (UPDATE accounts"
	sentPause   = "UPDATE tasks SET status = 'paused'"
)

func TestRecordSettled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.submit(t, "s1")
	f.now = f.base.Add(time.Minute)
	res, sent, err := f.record(t, id, 1, Outcome{Status: 200, Body: []byte(`{"ok":true}`), Sent: true, Latency: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wantSent(t, sent, sentAttempt, sentState, sentEvent, sentSettle, sentResult, sentCredit)
	if res.State != "settled" || res.Paid != 3 || res.Amount != 3 || res.Reply == nil || *res.Reply != (Reply{200, `{"ok":true}`}) ||
		res.Failure != nil || res.TerminalAt == nil || !res.TerminalAt.Equal(f.now) || !res.CreatedAt.Equal(f.base) || res.ContractVersion != 1 {
		t.Fatalf("result %+v", res)
	}
	wantRows(t, f.rows(t, id),
		`attempt 1 at +59.75s status 200 latency 250 reply {"ok":true} error - outcome settled`,
		`submission settled failure - code 200 body {"ok":true} payload dropped true attempts 1 next - since - terminal +1m0s`,
		`event 1 ->delivering submitted at +0s`,
		`event 2 delivering>settled accepted at +1m0s`,
		`ledger earn_task 3 after 3 task_submission at +1m0s`)
	if got := f.task(t); got != "reserved 0 settled 3 open - updated +0s" {
		t.Fatalf("task %s", got)
	}
	if f.balance(t) != 3 {
		t.Fatalf("balance %d", f.balance(t))
	}

	// A second outcome for it stands aside: its attempt is kept, nothing
	// else moves, and the caller gets the settled result.
	f.now = f.base.Add(2 * time.Minute)
	again, sent, err := f.record(t, id, 2, Outcome{Status: 500, Body: []byte("late"), Sent: true})
	if err != nil {
		t.Fatal(err)
	}
	wantSent(t, sent, sentAttempt, sentResult)
	if again.State != "settled" || again.Paid != 3 || *again.Reply != *res.Reply || !again.TerminalAt.Equal(*res.TerminalAt) {
		t.Fatalf("second outcome changed the result: %+v", again)
	}
	wantRows(t, f.rows(t, id),
		`attempt 1 at +59.75s status 200 latency 250 reply {"ok":true} error - outcome settled`,
		`attempt 2 at +2m0s status 500 latency 0 reply late error - outcome failed`,
		`submission settled failure - code 200 body {"ok":true} payload dropped true attempts 1 next - since - terminal +1m0s`,
		`event 1 ->delivering submitted at +0s`,
		`event 2 delivering>settled accepted at +1m0s`,
		`ledger earn_task 3 after 3 task_submission at +1m0s`)
	if f.balance(t) != 3 {
		t.Fatalf("paid twice: balance %d", f.balance(t))
	}
	f.healthy(t)
}

// A credit that fails aborts the whole last batch: nothing of the outcome
// is written, and the error is the one credits.Apply gave.
func TestRecordCreditFails(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.submit(t, "c1")
	ctx := context.Background()
	if _, err := f.db.Exec(ctx, `UPDATE accounts SET balance = $2 WHERE id = $1`, f.exe.AccountID, int64(math.MaxInt64)); err != nil {
		t.Fatal(err)
	}
	f.now = f.base.Add(time.Minute)
	_, _, err := f.record(t, id, 1, Outcome{Status: 200, Sent: true})
	if err == nil || !strings.HasPrefix(err.Error(), "credits: move: ") {
		t.Fatalf("err %v, want the credit's", err)
	}
	wantRows(t, f.rows(t, id),
		`submission delivering failure - code - body - payload dropped false attempts 1 next +15s since - terminal -`,
		`event 1 ->delivering submitted at +0s`)
	if got := f.task(t); got != "reserved 3 settled 0 open - updated +0s" {
		t.Fatalf("task %s", got)
	}
	if _, err := f.db.Exec(ctx, `UPDATE accounts SET balance = 0 WHERE id = $1`, f.exe.AccountID); err != nil {
		t.Fatal(err)
	}
	if res, _, err := f.record(t, id, 1, Outcome{Status: 200, Sent: true}); err != nil || res.State != "settled" {
		t.Fatalf("after the fix: %+v %v", res, err)
	}
	f.healthy(t)
}

func TestRecordRejected(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.submit(t, "r1")
	f.now = f.base.Add(time.Minute)
	res, sent, err := f.record(t, id, 1, Outcome{Status: 422, Body: []byte("no source"), Sent: true, Latency: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wantSent(t, sent, sentAttempt, sentState, sentEvent, sentRelease, sentResult)
	if res.State != "rejected" || res.Paid != 0 || *res.Reply != (Reply{422, "no source"}) || res.Failure != nil {
		t.Fatalf("result %+v", res)
	}
	wantRows(t, f.rows(t, id),
		`attempt 1 at +59s status 422 latency 1000 reply no source error - outcome rejected`,
		`submission rejected failure - code 422 body no source payload dropped true attempts 1 next - since - terminal +1m0s`,
		`event 1 ->delivering submitted at +0s`,
		`event 2 delivering>rejected rejected at +1m0s`)
	if got := f.task(t); got != "reserved 0 settled 0 open - updated +0s" {
		t.Fatalf("task %s", got)
	}
	f.healthy(t)
}

// Five receiver failures in a row pause the task, in the same last batch.
func TestRecordFailedPauses(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	outcomes := []Outcome{
		{Status: 503, Body: []byte("down"), Sent: true},
		{Status: 302, Sent: true},
		{Err: errors.New("connection refused")},
		{Status: 500, Sent: true},
		{Status: 500, Sent: true},
	}
	for i, o := range outcomes {
		id := f.submit(t, fmt.Sprintf("f%d", i))
		f.now = f.base.Add(time.Duration(i+1) * time.Minute)
		res, sent, err := f.record(t, id, 1, o)
		if err != nil {
			t.Fatal(err)
		}
		wantSent(t, sent, sentAttempt, sentState, sentEvent, sentRelease, sentResult, sentPause)
		if res.State != "failed" || res.Failure == nil {
			t.Fatalf("result %+v", res)
		}
		want := "reserved 0 settled 0 open - updated +0s"
		if i == 4 {
			want = "reserved 0 settled 0 paused RECEIVER_FAULT updated +5m0s"
		}
		if got := f.task(t); got != want {
			t.Fatalf("after failure %d: task %s, want %s", i+1, got, want)
		}
		if i == 0 {
			wantRows(t, f.rows(t, id),
				`attempt 1 at +1m0s status 503 latency 0 reply down error - outcome failed`,
				`submission failed failure RECEIVER_FAULT code 503 body down payload dropped true attempts 1 next - since - terminal +1m0s`,
				`event 1 ->delivering submitted at +0s`,
				`event 2 delivering>failed receiver_fault at +1m0s`)
		}
		if i == 2 {
			wantRows(t, f.rows(t, id),
				`attempt 1 at +3m0s status - latency 0 reply - error connection refused outcome failed`,
				`submission failed failure RECEIVER_UNREACHABLE code - body - payload dropped true attempts 1 next - since - terminal +3m0s`,
				`event 1 ->delivering submitted at +2m0s`,
				`event 2 delivering>failed receiver_unreachable at +3m0s`)
		}
	}
	f.healthy(t)
}

// No answer: uncertain, the reservation held and a wake-up asked for; the
// ladder's end fails it DELIVERY_UNRESOLVED, which does not pause.
func TestRecordUncertain(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.submit(t, "u1")
	timeout := Outcome{Err: errors.New("timeout"), Sent: true, Latency: 30 * time.Second}
	f.now = f.base.Add(time.Minute)
	res, sent, err := f.record(t, id, 1, timeout)
	if err != nil {
		t.Fatal(err)
	}
	wantSent(t, sent, sentAttempt, "UPDATE submissions SET state = 'uncertain'", sentEvent, sentResult)
	if res.State != "uncertain" || res.Reply != nil || res.TerminalAt != nil {
		t.Fatalf("result %+v", res)
	}
	wantRows(t, f.rows(t, id),
		`attempt 1 at +30s status - latency 30000 reply - error timeout outcome uncertain`,
		`submission uncertain failure - code - body - payload dropped false attempts 1 next +4m0s since +1m0s terminal -`,
		`event 1 ->delivering submitted at +0s`,
		`event 2 delivering>uncertain no_answer at +1m0s`)
	if len(f.wakes.list) != 1 || f.wakes.list[0] != (wakeup{id, 2, f.base.Add(4 * time.Minute)}) {
		t.Fatalf("wake-ups %+v", f.wakes.list)
	}
	// Still no answer: no second event, the first uncertain time kept.
	f.now = f.base.Add(5 * time.Minute)
	if _, sent, err = f.record(t, id, 2, timeout); err != nil {
		t.Fatal(err)
	}
	wantSent(t, sent, sentAttempt, "UPDATE submissions SET state = 'uncertain'", sentResult)
	if got := f.task(t); got != "reserved 3 settled 0 open - updated +0s" {
		t.Fatalf("task %s", got)
	}
	f.now = f.base.Add(time.Hour)
	res, sent, err = f.record(t, id, len(Ladder)+1, timeout)
	if err != nil {
		t.Fatal(err)
	}
	wantSent(t, sent, sentAttempt, sentState, sentEvent, sentRelease, sentResult, sentPause)
	if res.State != "failed" || str(res.Failure) != "DELIVERY_UNRESOLVED" {
		t.Fatalf("result %+v", res)
	}
	wantRows(t, f.rows(t, id),
		`attempt 1 at +30s status - latency 30000 reply - error timeout outcome uncertain`,
		`attempt 2 at +4m30s status - latency 30000 reply - error timeout outcome uncertain`,
		`attempt 6 at +59m30s status - latency 30000 reply - error timeout outcome uncertain`,
		`submission failed failure DELIVERY_UNRESOLVED code - body - payload dropped true attempts 1 next - since +1m0s terminal +1h0m0s`,
		`event 1 ->delivering submitted at +0s`,
		`event 2 delivering>uncertain no_answer at +1m0s`,
		`event 3 uncertain>failed delivery_unresolved at +1h0m0s`)
	if got := f.task(t); got != "reserved 0 settled 0 open - updated +0s" {
		t.Fatalf("task %s", got)
	}
	f.healthy(t)
}

// Submit's transaction ends with its last statement: the intake's CTE, or
// a replay's read, carries COMMIT.
func TestSubmitLastStatementCommits(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	in := SubmitInput{Code: f.code, RequestKey: "k1", Payload: []byte(`{"n":1}`)}
	last := func(what string, want string) {
		t.Helper()
		sent := f.tr.Take()
		if len(sent) != 3 {
			t.Fatalf("%s sent %q, want the precheck, the locks, one last batch", what, sent)
		}
		final := sent[2]
		if len(final) != 2 || !strings.Contains(final[0], want) || final[1] != "COMMIT" {
			t.Fatalf("%s: last batch %q", what, final)
		}
	}
	f.tr.Take()
	first, err := f.s.Submit(ctx, f.exe, in)
	if err != nil {
		t.Fatal(err)
	}
	last("intake", "INSERT INTO submissions")
	again, err := f.s.Submit(ctx, f.exe, in)
	if err != nil {
		t.Fatal(err)
	}
	last("replay", "SELECT state, amount")
	if *again.retry != *first.retry {
		t.Fatalf("replay retry %d, first %d", *again.retry, *first.retry)
	}
	again.retry, first.retry = nil, nil
	if fmt.Sprint(again) != fmt.Sprint(first) {
		t.Fatalf("replay %+v, first %+v", again, first)
	}
	in.Payload = []byte(`{"n":2}`)
	if _, err := f.s.Submit(ctx, f.exe, in); kungfu.AsError(err) == nil || kungfu.AsError(err).Code != kungfu.CodeIdempotencyConflict {
		t.Fatalf("other payload: %v", err)
	}
	c, err := f.s.ClaimTask(ctx, f.exe, f.code)
	if err != nil {
		t.Fatal(err)
	}
	f.tr.Take()
	claimed, err := f.s.Submit(ctx, f.exe, SubmitInput{Code: f.code, RequestKey: "k2", Payload: []byte(`{"n":3}`), ClaimID: c.ClaimID})
	if err != nil || claimed.State != "delivering" {
		t.Fatalf("with a claim: %+v %v", claimed, err)
	}
	sent := f.tr.Take()
	if final := sent[len(sent)-1]; len(final) != 2 || !strings.Contains(final[0], "UPDATE claims SET status = 'used'") || final[1] != "COMMIT" {
		t.Fatalf("with a claim, last batch %q", final)
	}
	if got := f.task(t); got != "reserved 6 settled 0 open - updated +0s" {
		t.Fatalf("task %s", got)
	}
	f.healthy(t)
}
