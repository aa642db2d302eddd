package credits_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/credits"
	"github.com/dojo-relay/dojo/kungfu/kungfutest"
)

type ledgerRow struct {
	Account, Amount, After int64
	Type, RefType, RefID   string
	At                     time.Time
}

func ledgerOf(t *testing.T, db *pgxpool.Pool, account int64) []ledgerRow {
	t.Helper()
	rows, _ := db.Query(context.Background(), `SELECT account_id, type, amount, balance_after, ref_type, ref_id, created_at
		FROM ledger WHERE account_id = $1 ORDER BY id`, account)
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ledgerRow, error) {
		var l ledgerRow
		err := r.Scan(&l.Account, &l.Type, &l.Amount, &l.After, &l.RefType, &l.RefID, &l.At)
		l.At = l.At.UTC()
		return l, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return list
}

func accountOf(t *testing.T, db *pgxpool.Pool, id int64) (int64, time.Time) {
	t.Helper()
	var balance int64
	var at time.Time
	if err := db.QueryRow(context.Background(), `SELECT balance, updated_at FROM accounts WHERE id = $1`, id).Scan(&balance, &at); err != nil {
		t.Fatal(err)
	}
	return balance, at.UTC()
}

// wantRefusal checks err is Apply's INSUFFICIENT_CREDITS for balance and
// required.
func wantRefusal(t *testing.T, err error, balance, required int64) {
	t.Helper()
	e := kungfu.AsError(err)
	if e == nil || e.Code != kungfu.CodeInsufficientCredits {
		t.Fatalf("err %v, want INSUFFICIENT_CREDITS", err)
	}
	msg := fmt.Sprintf("balance %d is below the required %d", balance, required)
	if e.Message != msg || !reflect.DeepEqual(e.Details, map[string]any{"balance": balance, "required": required}) {
		t.Fatalf("refusal %q %v, want %q balance %d required %d", e.Message, e.Details, msg, balance, required)
	}
}

// Apply is one statement: it moves the balance, writes the ledger row
// exactly, and returns the balance after; a refusal changes nothing and
// leaves the transaction usable.
func TestApplyOneStatement(t *testing.T) {
	t.Parallel()
	db, tr := kungfutest.TracedPool(t, 0)
	ctx := context.Background()
	id := account(t, db, "one_statement")
	now := time.Now().UTC().Truncate(time.Microsecond)
	var after int64
	tr.Take()
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		tr.Take() // BEGIN
		var err error
		after, err = credits.Apply(ctx, tx, now, credits.Movement{AccountID: id, Type: credits.GrantSignup, Amount: 66, RefType: "account", RefID: "r1"})
		if got := tr.Take(); len(got) != 1 || len(got[0]) != 1 {
			t.Errorf("Apply sent %q, want one statement", got)
		}
		return err
	})
	if err != nil || after != 66 {
		t.Fatalf("grant: %d %v", after, err)
	}
	later := now.Add(time.Second)
	if after, err = move(db, credits.Movement{AccountID: id, Type: credits.LockTask, Amount: -60, RefType: "task", RefID: "t1"}); err != nil || after != 6 {
		t.Fatalf("debit: %d %v", after, err)
	}
	want := []ledgerRow{{id, 66, 66, credits.GrantSignup, "account", "r1", now}}
	if got := ledgerOf(t, db, id); len(got) != 2 || got[0] != want[0] || got[1].Amount != -60 || got[1].After != 6 ||
		got[1].Type != credits.LockTask || got[1].RefType != "task" || got[1].RefID != "t1" {
		t.Fatalf("ledger %+v", got)
	}
	balance, at := accountOf(t, db, id)
	if balance != 6 || at.Equal(now) {
		t.Fatalf("account: balance %d updated %v", balance, at)
	}

	// Refused: nothing changes, and the transaction goes on.
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		_, err := credits.Apply(ctx, tx, later, credits.Movement{AccountID: id, Type: credits.LockTask, Amount: -7})
		wantRefusal(t, err, 6, 7)
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE account_id = $1`, id).Scan(&n); err != nil || n != 2 {
			t.Fatalf("after the refusal, in the transaction: %d rows, %v", n, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if b, at2 := accountOf(t, db, id); b != 6 || !at2.Equal(at) || len(ledgerOf(t, db, id)) != 2 {
		t.Fatalf("a refusal changed the account: %d %v", b, at2)
	}
	// Exactly to zero is allowed.
	if after, err := move(db, credits.Movement{AccountID: id, Type: credits.LockTask, Amount: -6}); err != nil || after != 0 {
		t.Fatalf("to zero: %d %v", after, err)
	}
	// No such account, and no movement: the errors callers always had.
	if _, err := move(db, credits.Movement{AccountID: id + 1000, Type: credits.GrantSignup, Amount: 5}); !errors.Is(err, pgx.ErrNoRows) ||
		!strings.HasPrefix(err.Error(), "credits: read balance: ") {
		t.Fatalf("missing account: %v", err)
	}
	if _, err := move(db, credits.Movement{AccountID: id, Type: "x", Amount: 0}); err == nil || err.Error() != "credits: zero movement" {
		t.Fatalf("zero movement: %v", err)
	}
	if drift, err := credits.Check(ctx, db); err != nil || len(drift) != 0 {
		t.Fatalf("drift %v %v", drift, err)
	}
}

// final runs fn's batch as the last of a kungfu.BeginFunc transaction,
// behind an insert of a marker account, and reports whether it committed.
func final(db *pgxpool.Pool, marker string, fn func(b *pgx.Batch) error) (bool, error) {
	ctx := context.Background()
	err := kungfu.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO accounts (name, password_hash, created_at, updated_at) VALUES ($1, 'x', now(), now())`, marker)
		if err := fn(b); err != nil {
			return err
		}
		return kungfu.SendFinal(ctx, tx, b).Close()
	})
	var n int
	if qerr := db.QueryRow(ctx, `SELECT count(*) FROM accounts WHERE name = $1`, marker).Scan(&n); qerr != nil {
		return false, qerr
	}
	return n == 1, err
}

// Queue moves in a batch; a movement that cannot apply fails the batch,
// COMMIT included, with Apply's error.
func TestQueue(t *testing.T) {
	t.Parallel()
	db, _ := kungfutest.TracedPool(t, 0)
	id := account(t, db, "queued")
	now := time.Now().UTC().Truncate(time.Microsecond)
	committed, err := final(db, "q1", func(b *pgx.Batch) error {
		return credits.Queue(b, now, credits.Movement{AccountID: id, Type: credits.EarnTask, Amount: 9, RefType: "task_submission", RefID: "42"})
	})
	if err != nil || !committed {
		t.Fatalf("credit: committed %v, %v", committed, err)
	}
	if got := ledgerOf(t, db, id); len(got) != 1 || got[0] != (ledgerRow{id, 9, 9, credits.EarnTask, "task_submission", "42", now}) {
		t.Fatalf("ledger %+v", got)
	}
	if b, at := accountOf(t, db, id); b != 9 || !at.Equal(now) {
		t.Fatalf("account %d %v", b, at)
	}

	// A debit can be refused with a balance to show: Apply's, not Queue's.
	b := &pgx.Batch{}
	if err := credits.Queue(b, now, credits.Movement{AccountID: id, Type: credits.LockTask, Amount: -10}); err == nil || b.Len() != 0 {
		t.Fatalf("a queued debit: %v, %d queued", err, b.Len())
	}

	committed, err = final(db, "q3", func(b *pgx.Batch) error {
		return credits.Queue(b, now, credits.Movement{AccountID: id + 1000, Type: credits.EarnTask, Amount: 1})
	})
	if committed || !errors.Is(err, pgx.ErrNoRows) || !strings.HasPrefix(err.Error(), "credits: read balance: ") {
		t.Fatalf("missing account: committed %v, %v", committed, err)
	}
	// A failure of the statement itself keeps its old wording.
	if _, err := db.Exec(context.Background(), `UPDATE accounts SET balance = $2 WHERE id = $1`, id, int64(1<<63-1)); err != nil {
		t.Fatal(err)
	}
	committed, err = final(db, "q4", func(b *pgx.Batch) error {
		return credits.Queue(b, now, credits.Movement{AccountID: id, Type: credits.EarnTask, Amount: 1})
	})
	if committed || err == nil || !strings.HasPrefix(err.Error(), "credits: move: ") {
		t.Fatalf("overflow: committed %v, %v", committed, err)
	}
	b = &pgx.Batch{}
	if err := credits.Queue(b, now, credits.Movement{AccountID: id, Type: "x"}); err == nil || err.Error() != "credits: zero movement" || b.Len() != 0 {
		t.Fatalf("zero movement: %v, %d queued", err, b.Len())
	}
}

// A refusal reports the balance as it is once the debit it waited for
// committed, not as the statement's snapshot saw it.
func TestRefusalAfterConcurrentDebit(t *testing.T) {
	t.Parallel()
	db, _ := kungfutest.TracedPool(t, 0)
	ctx := context.Background()
	{
		id := account(t, db, "raced")
		if _, err := move(db, credits.Movement{AccountID: id, Type: credits.GrantSignup, Amount: 66}); err != nil {
			t.Fatal(err)
		}
		first, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := credits.Apply(ctx, first, time.Now(), credits.Movement{AccountID: id, Type: credits.LockTask, Amount: -60}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := move(db, credits.Movement{AccountID: id, Type: credits.LockTask, Amount: -10})
			done <- err
		}()
		for waiting := 0; waiting == 0; time.Sleep(10 * time.Millisecond) {
			if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
		}
		if err := first.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		wantRefusal(t, <-done, 6, 10)
	}
}
