package credits_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/credits"
	"github.com/dojo-relay/dojo/kungfu/kungfutest"
)

func account(t *testing.T, db *pgxpool.Pool, name string) int64 {
	t.Helper()
	return kungfutest.Account(t, db, name).AccountID
}

func move(db *pgxpool.Pool, m credits.Movement) (int64, error) {
	var after int64
	err := pgx.BeginFunc(context.Background(), db, func(tx pgx.Tx) error {
		var err error
		after, err = credits.Apply(context.Background(), tx, time.Now(), m)
		return err
	})
	return after, err
}

func TestApplyAndCheck(t *testing.T) {
	t.Parallel()
	db, _ := kungfutest.Pool(t)
	id := account(t, db, "ledger_one")
	if after, err := move(db, credits.Movement{AccountID: id, Type: credits.GrantSignup, Amount: 66}); err != nil || after != 66 {
		t.Fatalf("grant: %d %v", after, err)
	}
	if after, err := move(db, credits.Movement{AccountID: id, Type: credits.LockTask, Amount: -60, RefType: "task", RefID: "t1"}); err != nil || after != 6 {
		t.Fatalf("debit: %d %v", after, err)
	}
	_, err := move(db, credits.Movement{AccountID: id, Type: credits.LockTask, Amount: -7})
	if e := kungfu.AsError(err); e == nil || e.Code != kungfu.CodeInsufficientCredits {
		t.Fatalf("overdraft: %v", err)
	}
	var balance int64
	var rows int
	_ = db.QueryRow(context.Background(), `SELECT balance, (SELECT count(*) FROM ledger) FROM accounts WHERE id = $1`, id).Scan(&balance, &rows)
	if balance != 6 || rows != 2 {
		t.Fatalf("after refused debit: balance %d, %d ledger rows", balance, rows)
	}
	if _, err := move(db, credits.Movement{AccountID: id, Type: "x", Amount: 0}); err == nil {
		t.Fatal("zero movement accepted")
	}
	if drift, err := credits.Check(context.Background(), db); err != nil || len(drift) != 0 {
		t.Fatalf("healthy ledger reported drift %v %v", drift, err)
	}
	// A balance written behind the ledger's back is caught.
	if _, err := db.Exec(context.Background(), `UPDATE accounts SET balance = 999 WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if drift, _ := credits.Check(context.Background(), db); len(drift) != 1 || drift[0].Balance != 999 || drift[0].Ledger != 6 {
		t.Fatalf("drift not detected: %v", drift)
	}
	// The ledger is append-only.
	if _, err := db.Exec(context.Background(), `DELETE FROM ledger`); err == nil {
		t.Fatal("ledger accepted a DELETE")
	}
}

// Parallel debits never take a balance below zero: exactly as many succeed
// as the balance covers.
func TestConcurrentDebitsNeverOverdraw(t *testing.T) {
	t.Parallel()
	db, _ := kungfutest.Pool(t)
	id := account(t, db, "ledger_two")
	if _, err := move(db, credits.Movement{AccountID: id, Type: credits.GrantSignup, Amount: 66}); err != nil {
		t.Fatal(err)
	}
	var (
		wg sync.WaitGroup
		mu sync.Mutex
		ok int
	)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := move(db, credits.Movement{AccountID: id, Type: credits.LockTask, Amount: -10}); err == nil {
				mu.Lock()
				ok++
				mu.Unlock()
			} else if e := kungfu.AsError(err); e == nil || e.Code != kungfu.CodeInsufficientCredits {
				t.Errorf("debit: %v", err)
			}
		}()
	}
	wg.Wait()
	var balance int64
	_ = db.QueryRow(context.Background(), `SELECT balance FROM accounts WHERE id = $1`, id).Scan(&balance)
	if ok != 6 || balance != 6 {
		t.Fatalf("%d debits succeeded, balance %d; want 6 and 6", ok, balance)
	}
	if drift, err := credits.Check(context.Background(), db); err != nil || len(drift) != 0 {
		t.Fatalf("drift %v %v", drift, err)
	}
}
