package relay_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
)

func TestRegisterSuccess(t *testing.T) {
	t.Parallel()
	d := start(t)
	r := d.call(t, "", "account_register", map[string]any{"name": "Rin.Agent-01", "password": "s3cret pass"})
	if r.Status != http.StatusOK || !r.ok() {
		t.Fatalf("register: %s", r.Raw)
	}
	key := r.str("api_key")
	if len(key) != 72 || !strings.HasPrefix(key, "kf_live_") || strings.ToLower(key) != key {
		t.Fatalf("api_key %q is not kf_live_ + 64 lowercase hex", key)
	}
	for k, want := range map[string]string{
		"bot_name": "Rin.Agent-01", "mcp_endpoint": d.URL + "/mcp", "api_base": d.URL + "/api/v1/", "docs": d.URL + "/docs/",
	} {
		if got := r.str(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if r.str("key_recovery") == "" || r.str("message") == "" {
		t.Errorf("missing message or key_recovery: %s", r.Raw)
	}
	// Envelope fields come first and are all present.
	if !strings.HasPrefix(r.Raw, `{"ok":true,"error":null,"next_action":null,"next":[],"retry_after":null,"api_version":`) {
		t.Errorf("envelope head out of order: %s", r.Raw)
	}

	st := d.call(t, key, "account_status", map[string]any{})
	if !st.ok() || st.num("balance") != 66 || st.str("bot_name") != "Rin.Agent-01" || st.str("status") != "active" || st.num("bot_id") != r.num("bot_id") || r.num("bot_id") == 0 {
		t.Fatalf("account_status: %s", st.Raw)
	}
	// The key is stored only as a hash, and the grant is one ledger row.
	var stored int
	if err := d.App.DB.QueryRow(context.Background(),
		`SELECT count(*) FROM credentials WHERE secret_hash = sha256(convert_to($1, 'UTF8')) AND position($1 in hint) = 0`, key).Scan(&stored); err != nil || stored != 1 {
		t.Fatalf("stored key hash rows = %d, %v", stored, err)
	}
	var raw int
	_ = d.App.DB.QueryRow(context.Background(), `SELECT count(*) FROM credentials WHERE encode(secret_hash,'escape') LIKE '%kf_live%'`).Scan(&raw)
	if raw != 0 {
		t.Fatal("raw key found in storage")
	}
	var typ string
	var amount, after int64
	if err := d.App.DB.QueryRow(context.Background(), `SELECT type, amount, balance_after FROM ledger`).Scan(&typ, &amount, &after); err != nil || typ != "grant_signup" || amount != 66 || after != 66 {
		t.Fatalf("ledger: %s %d %d %v", typ, amount, after, err)
	}
	// The key authenticates whatever its letter case.
	if st := d.call(t, strings.ToUpper(key[:8])+strings.ToUpper(key[8:]), "account_status", map[string]any{}); !st.ok() {
		t.Fatalf("upper-case key refused: %s", st.Raw)
	}
}

func TestRegisterErrors(t *testing.T) {
	t.Parallel()
	d := start(t)
	d.call(t, "", "account_register", map[string]any{"name": "taken_name", "password": "secret1"})
	cases := []struct {
		name   string
		args   map[string]any
		status int
		code   string
	}{
		{"short name", map[string]any{"name": "abc12", "password": "secret1"}, 422, "INVALID_NAME"},
		{"long name", map[string]any{"name": strings.Repeat("a", 33), "password": "secret1"}, 422, "INVALID_NAME"},
		{"bad characters", map[string]any{"name": "hello world", "password": "secret1"}, 422, "INVALID_NAME"},
		{"reserved", map[string]any{"name": "System", "password": "secret1"}, 422, "RESERVED_NAME"},
		{"reserved short", map[string]any{"name": "admin", "password": "secret1"}, 422, "RESERVED_NAME"},
		{"short password", map[string]any{"name": "good_name1", "password": "12345"}, 422, "INVALID_PASSWORD"},
		{"long password", map[string]any{"name": "good_name1", "password": strings.Repeat("p", 73)}, 422, "INVALID_PASSWORD"},
		{"key in password", map[string]any{"name": "good_name1", "password": "x kf_live_" + strings.Repeat("ab", 32)[:60]}, 422, "INVALID_PASSWORD"},
		{"taken ignoring case", map[string]any{"name": "TAKEN_name", "password": "secret1"}, 409, "NAME_TAKEN"},
		{"missing password", map[string]any{"name": "good_name1"}, 400, "MISSING_FIELD"},
		{"unknown argument", map[string]any{"name": "good_name1", "password": "secret1", "email": "x"}, 422, "VALIDATION_FAILED"},
		{"wrong type", map[string]any{"name": 12345678, "password": "secret1"}, 422, "VALIDATION_FAILED"},
	}
	for _, c := range cases {
		r := d.call(t, "", "account_register", c.args)
		if r.Status != c.status || r.code() != c.code {
			t.Errorf("%s: want %d %s, got %d %s", c.name, c.status, c.code, r.Status, r.Raw)
		}
	}
	r := d.call(t, "", "account_register", map[string]any{"name": "taken_name", "password": "secret1"})
	details, _ := r.Body["error"].(map[string]any)["details"].(map[string]any)
	if s, _ := details["suggestion"].(string); !strings.HasPrefix(s, "taken_name_") {
		t.Errorf("NAME_TAKEN suggestion = %v", details)
	}
	r = d.call(t, "", "account_register", map[string]any{"name": "good_name1", "password": "secret1", "email": "x"})
	if !strings.Contains(r.Raw, `"field":"email"`) {
		t.Errorf("unknown argument not named: %s", r.Raw)
	}
	// Nothing was created by any refusal.
	var n int
	_ = d.App.DB.QueryRow(context.Background(), `SELECT count(*) FROM accounts`).Scan(&n)
	if n != 1 {
		t.Fatalf("accounts = %d after refusals, want 1", n)
	}
}

func TestRegisterRaceOneWinner(t *testing.T) {
	t.Parallel()
	d := start(t)
	var wg sync.WaitGroup
	results := make([]result, 20)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = d.call(t, "", "account_register", map[string]any{"name": "Contested", "password": "secret1"})
		}()
	}
	wg.Wait()
	won := 0
	for _, r := range results {
		switch {
		case r.ok():
			won++
		case r.code() != "NAME_TAKEN" || r.Status != 409:
			t.Errorf("loser got %d %s", r.Status, r.Raw)
		}
	}
	if won != 1 {
		t.Fatalf("%d registrations succeeded, want exactly 1", won)
	}
	var n int
	_ = d.App.DB.QueryRow(context.Background(), `SELECT count(*) FROM ledger`).Scan(&n)
	if n != 1 {
		t.Fatalf("ledger rows = %d, want 1", n)
	}
}

func TestUnauthorized(t *testing.T) {
	t.Parallel()
	d := start(t)
	for _, key := range []string{"", "kf_live_" + strings.Repeat("0", 64), "not-a-key"} {
		r := d.call(t, key, "account_status", map[string]any{})
		expect(t, r, 401, "UNAUTHORIZED")
		if !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("missing WWW-Authenticate: %v", r.Header)
		}
	}
	r := post(t, d.URL+"/api/v1/account_status", "", []byte(`{}`), "Authorization", "Basic abc")
	expect(t, r, 401, "UNAUTHORIZED")
}

func TestHTTPTransportErrors(t *testing.T) {
	t.Parallel()
	d := start(t)
	key, _ := d.register(t)
	expect(t, d.call(t, key, "no_such_tool", map[string]any{}), 404, "UNKNOWN_TOOL")
	expect(t, post(t, d.URL+"/api/v1/account_status", key, []byte(`{"broken`)), 422, "VALIDATION_FAILED")
	expect(t, post(t, d.URL+"/api/v1/account_status", key, []byte(`[1,2]`)), 422, "VALIDATION_FAILED")
	big := []byte(`{"title":"x","tags":["a"],"content":"` + strings.Repeat("a", 600*1024) + `"}`)
	expect(t, post(t, d.URL+"/api/v1/memory_put", key, big), 413, "PAYLOAD_TOO_LARGE")
	// An empty body is an empty object.
	if r := post(t, d.URL+"/api/v1/account_status", key, nil); !r.ok() {
		t.Fatalf("empty body: %s", r.Raw)
	}
	resp, err := http.Get(d.URL + "/api/v1/account_status")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET status %d", resp.StatusCode)
	}
	if r := post(t, d.URL+"/api/v1/account_status", key, nil); r.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("Cache-Control = %q", r.Header.Get("Cache-Control"))
	}
}

func TestOwnerKeyReset(t *testing.T) {
	t.Parallel()
	d := start(t)
	old := d.call(t, "", "account_register", map[string]any{"name": "owner_test", "password": "pw-123456"}).str("api_key")
	expect(t, post(t, d.URL+"/owner/key", "", []byte(`{"name":"owner_test","password":"wrong-pw"}`)), 401, "INVALID_CREDENTIALS")
	expect(t, post(t, d.URL+"/owner/key", "", []byte(`{"name":"nobody_here","password":"wrong-pw"}`)), 401, "INVALID_CREDENTIALS")
	expect(t, post(t, d.URL+"/owner/key", "", []byte(`{"name":"owner_test"}`)), 400, "MISSING_FIELD")
	if r := d.call(t, old, "account_status", map[string]any{}); !r.ok() {
		t.Fatal("a failed reset killed the old key")
	}
	r := post(t, d.URL+"/owner/key", "", []byte(`{"name":"OWNER_TEST","password":"pw-123456"}`))
	if !r.ok() || len(r.str("api_key")) != 72 || r.str("api_key") == old {
		t.Fatalf("reset: %s", r.Raw)
	}
	expect(t, d.call(t, old, "account_status", map[string]any{}), 401, "UNAUTHORIZED")
	if st := d.call(t, r.str("api_key"), "account_status", map[string]any{}); !st.ok() || st.str("bot_name") != "owner_test" {
		t.Fatalf("new key: %s", st.Raw)
	}
	// The form encoding the page may post works too.
	f := post(t, d.URL+"/owner/key", "", []byte("name=owner_test&password=pw-123456"), "Content-Type", "application/x-www-form-urlencoded")
	if !f.ok() {
		t.Fatalf("form reset: %s", f.Raw)
	}
	var live int
	_ = d.App.DB.QueryRow(context.Background(), `SELECT count(*) FROM credentials WHERE revoked_at IS NULL`).Scan(&live)
	if live != 1 {
		t.Fatalf("live keys = %d, want 1", live)
	}
	resp, err := http.Get(d.URL + "/owner/key")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /owner/key: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}
