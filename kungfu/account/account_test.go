package account_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/account"
	"github.com/dojo-relay/dojo/kungfu/kungfutest"
)

func service(t *testing.T) *account.Service {
	db, _ := kungfutest.Pool(t)
	return &account.Service{DB: db, Now: kungfu.SystemClock, BcryptCost: bcrypt.MinCost}
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	s := service(t)
	ctx := context.Background()
	got, err := s.Register(ctx, "auth_agent", "password1")
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Authenticate(ctx, got.APIKey)
	if err != nil || c.AccountID != got.AccountID || c.Name != "auth_agent" {
		t.Fatalf("Authenticate: %+v %v", c, err)
	}
	for _, bad := range []string{"", got.APIKey[:71], got.APIKey + "0", "kf_live_" + strings.Repeat("g", 64), "kf_live_" + strings.Repeat("0", 64)} {
		if _, err := s.Authenticate(ctx, bad); kungfu.AsError(err) == nil || kungfu.AsError(err).Code != kungfu.CodeUnauthorized {
			t.Errorf("Authenticate(%q) = %v", bad, err)
		}
	}
	// A deactivated account cannot act.
	if _, err := s.DB.Exec(ctx, `UPDATE accounts SET status = 'deactivated'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, got.APIKey); kungfu.AsError(err) == nil {
		t.Fatal("deactivated account authenticated")
	}
	if _, err := s.ResetKey(ctx, "auth_agent", "password1"); kungfu.AsError(err) == nil || kungfu.AsError(err).Code != kungfu.CodeInvalidCredentials {
		t.Fatalf("deactivated reset: %v", err)
	}
	if _, err := s.Status(ctx, 424242); kungfu.AsError(err) == nil || kungfu.AsError(err).Code != kungfu.CodeNotFound {
		t.Fatalf("status of a missing account: %v", err)
	}
}

// Parallel resets serialize: exactly one key survives, and it is one of the
// keys handed out.
func TestConcurrentKeyResets(t *testing.T) {
	t.Parallel()
	s := service(t)
	ctx := context.Background()
	first, err := s.Register(ctx, "reset_race", "password1")
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 10)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := s.ResetKey(ctx, "reset_race", "password1")
			if err != nil {
				t.Errorf("reset: %v", err)
				return
			}
			keys[i] = got.APIKey
		}()
	}
	wg.Wait()
	working := 0
	for _, k := range append(keys, first.APIKey) {
		if _, err := s.Authenticate(ctx, k); err == nil {
			working++
		}
	}
	var live int
	_ = s.DB.QueryRow(ctx, `SELECT count(*) FROM credentials WHERE revoked_at IS NULL`).Scan(&live)
	if working != 1 || live != 1 {
		t.Fatalf("%d keys work, %d live rows; want exactly 1", working, live)
	}
}

// kd_ names are KarmaDue handles: before issue 8 a native account could
// register kd_0123456789ab and pass for an agent in every room.
func TestRegisterRefusesKarmaDuePrefix(t *testing.T) {
	t.Parallel()
	s := service(t)
	ctx := context.Background()
	for _, name := range []string{"kd_0123456789ab", "KD_agent_name", "kd_x12345"} {
		_, err := s.Register(ctx, name, "password1")
		if e := kungfu.AsError(err); e == nil || e.Code != kungfu.CodeReservedName {
			t.Errorf("Register(%q) = %v, want RESERVED_NAME", name, err)
		}
	}
	var n int
	if err := s.DB.QueryRow(ctx, `SELECT count(*) FROM accounts`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("accounts after refusals: %d %v", n, err)
	}
	if _, err := s.Register(ctx, "kdx_agent", "password1"); err != nil {
		t.Fatalf("a name merely starting with kd is fine: %v", err)
	}
}
