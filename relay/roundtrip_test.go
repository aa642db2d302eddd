package relay_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/account"
	"github.com/dojo-relay/dojo/kungfu/memory"
	"github.com/dojo-relay/dojo/kungfu/thread"
	"github.com/dojo-relay/dojo/kungfu/tool"
	"github.com/dojo-relay/dojo/relay"
)

// statements records every statement a pool sends, and the round trip
// each went in. With pgx's statement cache a statement, or a batch of them,
// is one round trip once its connection has prepared it.
type statements struct {
	mu    sync.Mutex
	seen  []traced
	trips int
}

type traced struct {
	sql  string
	args []any
	trip int
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trips++
	s.seen = append(s.seen, traced{d.SQL, d.Args, s.trips})
	return ctx
}

func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *statements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trips++
	for _, q := range d.Batch.QueuedQueries {
		s.seen = append(s.seen, traced{q.SQL, q.Arguments, s.trips})
	}
	return ctx
}

func (s *statements) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (s *statements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// trips counts the round trips that carried got.
func trips(got []traced) int {
	n := map[int]bool{}
	for _, s := range got {
		n[s.trip] = true
	}
	return len(n)
}

func (s *statements) take() []traced {
	s.mu.Lock()
	defer s.mu.Unlock()
	got := s.seen
	s.seen = nil
	return got
}

// mirror serves the Kungfu tools of d's database through a pool of its own
// that traces every statement, with params set on each connection. It has
// no rate limits and no queue: only what reads need.
func mirror(t *testing.T, dsn string, params map[string]string) (string, *statements) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	// One connection: after the first call every statement is prepared,
	// so what is counted is what a warm server sends.
	cfg.MaxConns = 1
	tr := &statements{}
	cfg.ConnConfig.Tracer = tr
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	accounts := &account.Service{DB: pool, Now: kungfu.SystemClock}
	reg, err := tool.NewRegistry(tool.Kungfu(tool.Services{
		Accounts: accounts,
		Memories: &memory.Service{DB: pool, Now: kungfu.SystemClock},
		Threads:  &thread.Service{DB: pool, Now: kungfu.SystemClock},
	})...)
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) }))
	t.Cleanup(ts.Close)
	h = relay.New(relay.Config{PublicURL: ts.URL}, relay.Deps{DB: pool, Accounts: accounts, Tools: reg,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}).Handler()
	return ts.URL, tr
}

// TestMemoryGetRoundTrips pins the PostgreSQL round trips of one memory_get
// on a warm server, through both doors: one, carrying the key lookup and
// the memory with its revision. It was three (the head and the revision
// were read apart), then two (the key lookup went first).
func TestMemoryGetRoundTrips(t *testing.T) {
	t.Parallel()
	d := start(t)
	if mode := d.App.DB.Config().ConnConfig.DefaultQueryExecMode; mode != pgx.QueryExecModeCacheStatement {
		t.Fatalf("the server's pool sends statements in mode %v; hot queries rely on the statement cache", mode)
	}
	key, _ := d.register(t)
	code := d.must(t, key, "memory_put", putArgs()).str("code")
	url, tr := mirror(t, d.DSN, nil)
	args := `{"code":"` + code + `"}`
	doors := map[string]func() result{
		"api": func() result { return post(t, url+"/api/v1/memory_get", key, []byte(args)) },
		"mcp": func() result {
			r := post(t, url+"/mcp", key, mcpCall("memory_get", args), mcpAccept...)
			if strings.Contains(r.Raw, `"isError":true`) {
				r.Body = map[string]any{"ok": false}
			} else if r.Status == 200 {
				r.Body = map[string]any{"ok": true}
			}
			return r
		},
	}
	for name, send := range doors {
		send() // prepares every statement on the one connection
		tr.take()
		if r := send(); !r.ok() {
			t.Fatalf("%s memory_get: %d %s", name, r.Status, r.Raw)
		}
		if got := tr.take(); len(got) != 2 || trips(got) != 1 {
			t.Errorf("%s memory_get sent %d statements in %d round trips, want 2 (key lookup, memory) in 1:", name, len(got), trips(got))
			for _, s := range got {
				t.Logf("  %s", s.sql)
			}
		}
	}
}

// TestHotPlansUseIndexes explains the statements of memory_get as a server
// sends them, on a database of a few thousand accounts with revoked keys
// beside live ones, before and after ANALYZE: the key is found through the
// unique hash index and the account by primary key, never by scanning.
// Before, without statistics the key lookup walked every live key.
func TestHotPlansUseIndexes(t *testing.T) {
	t.Parallel()
	d := start(t)
	key, _ := d.register(t)
	code := d.must(t, key, "memory_put", putArgs()).str("code")
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO accounts (name, password_hash, created_at, updated_at)
		 SELECT 'seeded_' || g, 'x', now(), now() FROM generate_series(1, 3000) g`,
		`INSERT INTO credentials (account_id, kind, secret_hash, created_at, revoked_at)
		 SELECT a.id, 'agent_key', sha256(('seed-' || a.id || '-' || s)::bytea), now(), CASE WHEN s > 0 THEN now() END
		 FROM accounts a, generate_series(0, 2) s WHERE a.name LIKE 'seeded\_%'`,
		`INSERT INTO memories (code, account_id, revision, created_at, updated_at)
		 SELECT substr(md5(a.id::text), 1, 12), a.id, 1, now(), now() FROM accounts a WHERE a.name LIKE 'seeded\_%'`,
		`INSERT INTO memory_revisions (memory_id, revision, title, tags, content, checksum, created_at)
		 SELECT m.id, 1, 'seeded', '{seed}', 'seeded content', 'x', now() FROM memories m WHERE m.revision = 1
		 ON CONFLICT DO NOTHING`,
	} {
		if _, err := d.App.DB.Exec(ctx, q); err != nil {
			t.Fatalf("seed: %v\n%s", err, q)
		}
	}
	url, tr := mirror(t, d.DSN, nil)
	if r := post(t, url+"/api/v1/memory_get", key, []byte(`{"code":"`+code+`"}`)); !r.ok() {
		t.Fatalf("memory_get: %s", r.Raw)
	}
	got := tr.take()
	if len(got) != 2 {
		t.Fatalf("memory_get sent %d statements, want 2", len(got))
	}
	want := []struct{ table, index string }{{"credentials", "credentials_agent_key"}, {"memories", "memories_code_key"}}
	for _, stats := range []string{"without statistics", "after ANALYZE"} {
		if stats == "after ANALYZE" {
			if _, err := d.App.DB.Exec(ctx, `ANALYZE`); err != nil {
				t.Fatal(err)
			}
		}
		for i, s := range got {
			p := explain(t, d.App.DB, "EXPLAIN "+s.sql, s.args...)
			// The memory read carries the key's gate: it too must probe
			// the hash index, never the partial index of live keys.
			gated := i == 0 || strings.Contains(p, "credentials_agent_key") && !strings.Contains(p, "credentials_one_live_agent_key")
			if strings.Contains(p, "Seq Scan") || !strings.Contains(p, want[i].index) || !strings.Contains(p, "accounts_pkey") || !gated {
				t.Errorf("%s, the %s lookup should probe %s and accounts_pkey:\n%s\n%s", stats, want[i].table, want[i].index, s.sql, p)
			}
		}
	}
}

// TestReadOnlyTools runs the tools whose handler may start before its
// rate-limit verdict on connections that refuse every write: if one of
// them wrote, a refused call could still change something.
func TestReadOnlyTools(t *testing.T) {
	t.Parallel()
	d := start(t)
	key, _ := d.register(t)
	code := d.must(t, key, "memory_put", putArgs()).str("code")
	room := d.must(t, key, "thread_start", map[string]any{"subject": "read only"}).Body["thread"].(map[string]any)["code"].(string)
	d.must(t, key, "thread_post", map[string]any{"thread": room, "content": "an entry to read"})
	url, _ := mirror(t, d.DSN, map[string]string{"default_transaction_read_only": "on"})
	api := func(tool string, args string) result { return post(t, url+"/api/v1/"+tool, key, []byte(args)) }
	args := map[string]string{
		"memory_get":  `{"code":"` + code + `"}`,
		"memory_list": `{}`,
		"thread_get":  `{"thread":"` + room + `"}`,
		"thread_list": `{}`,
		"todo_list":   `{}`,
	}
	// Every tool marked ReadOnly in the registry is run: marking a new
	// one without arguments here fails the test.
	n := 0
	for _, tl := range tool.Kungfu(tool.Services{}) {
		if !tl.ReadOnly {
			continue
		}
		n++
		a, ok := args[tl.Name]
		if !ok {
			t.Errorf("%s is marked ReadOnly: give it arguments here", tl.Name)
			continue
		}
		if r := api(tl.Name, a); !r.ok() {
			t.Errorf("%s on a read-only database: %d %s", tl.Name, r.Status, r.Raw)
		}
	}
	if n != len(args) {
		t.Errorf("%d tools marked ReadOnly, %d tested", n, len(args))
	}
	// The harness does refuse writes.
	if r := api("memory_put", string(jsonBytes(t, putArgs()))); r.ok() || r.Status != 500 {
		t.Fatalf("memory_put on a read-only database: %d %s", r.Status, r.Raw)
	}
}

// TestLimitedReadAnswersLimited: a read that ran beside its verdict is
// still refused when the verdict refuses, and the window's count is exact.
func TestLimitedReadAnswersLimited(t *testing.T) {
	t.Parallel()
	d := start(t, withLimits("get=3/1h"))
	key, _ := d.register(t)
	code := d.must(t, key, "memory_put", putArgs()).str("code")
	for i := range 3 {
		if r := d.call(t, key, "memory_get", map[string]any{"code": code}); !r.ok() {
			t.Fatalf("get %d under the limit: %s", i, r.Raw)
		}
	}
	for range 2 {
		expect(t, d.call(t, key, "memory_get", map[string]any{"code": code}), 429, "RATE_LIMIT")
	}
	// A write waits for its own verdict: push is not get's window.
	if r := d.call(t, key, "memory_put", putArgs()); !r.ok() {
		t.Fatalf("memory_put: %s", r.Raw)
	}
}

// TestPrefetchJudgesAfterTheKey: memory_get's read travels with the key
// lookup, yet through both doors nothing of it reaches a caller whose key
// fails, another account's private memory stays private, and reads that
// cannot be prefetched (an assignment, a malformed code) answer as before.
func TestPrefetchJudgesAfterTheKey(t *testing.T) {
	t.Parallel()
	d := start(t)
	alice, _ := d.register(t)
	bob, _ := d.register(t)
	code := d.must(t, alice, "memory_put", putArgs()).str("code")
	d.must(t, alice, "memory_share", map[string]any{"code": code})
	private := d.must(t, alice, "memory_put", putArgs()).str("code")
	// A well-formed key of no account: its last hex digit changed.
	stranger := alice[:len(alice)-1] + map[bool]string{true: "1", false: "0"}[alice[len(alice)-1] == '0']

	type answer struct {
		status int
		code   string
		raw    string
	}
	doors := map[string]func(key, args string) answer{
		"api": func(key, args string) answer {
			r := post(t, d.URL+"/api/v1/memory_get", key, []byte(args))
			return answer{r.Status, r.code(), r.Raw}
		},
		"mcp": func(key, args string) answer {
			r := post(t, d.URL+"/mcp", key, mcpCall("memory_get", args), mcpAccept...)
			var rpc struct {
				Result struct {
					IsError    bool `json:"isError"`
					Structured struct {
						Error struct {
							Code string `json:"code"`
						} `json:"error"`
					} `json:"structuredContent"`
				} `json:"result"`
			}
			if err := json.Unmarshal([]byte(r.Raw), &rpc); err != nil || r.Status != 200 {
				return answer{r.Status, r.code(), r.Raw}
			}
			return answer{r.Status, rpc.Result.Structured.Error.Code, r.Raw}
		},
	}
	for door, get := range doors {
		arg := func(c string) string { return `{"code":"` + c + `"}` }
		if a := get(stranger, arg(code)); a.status != 401 || a.code != "UNAUTHORIZED" || strings.Contains(a.raw, "Field notes") {
			t.Errorf("%s: unknown key: %d %s %s", door, a.status, a.code, a.raw)
		}
		if a := get(bob, arg(private)); a.code != "PRIVATE_KUNGFU" || strings.Contains(a.raw, "Field notes") {
			t.Errorf("%s: another's private memory: %d %s %s", door, a.status, a.code, a.raw)
		}
		if a := get(bob, arg(code)); a.code != "" || !strings.Contains(a.raw, code) {
			t.Errorf("%s: a public memory: %d %s %s", door, a.status, a.code, a.raw)
		}
		if a := get(bob, `{"code":"`+code+`","assign":999999}`); a.code == "" || strings.Contains(a.raw, "Field notes") {
			t.Errorf("%s: an assignment that does not exist: %d %s %s", door, a.status, a.code, a.raw)
		}
		if a := get(bob, arg("not-a-code")); a.code != "INVALID_CODE" {
			t.Errorf("%s: a malformed code: %d %s %s", door, a.status, a.code, a.raw)
		}
	}
}

// TestPrefetchReadsNothingForABadKey: the memory statement sent beside the
// lookup of a key of nobody reads no memory at all (its scan never runs),
// so such a caller costs PostgreSQL one key probe and cannot time the
// read of a memory it may not see.
func TestPrefetchReadsNothingForABadKey(t *testing.T) {
	t.Parallel()
	d := start(t)
	alice, _ := d.register(t)
	code := d.must(t, alice, "memory_put", putArgs("content", content(50_000))).str("code")
	stranger := alice[:len(alice)-1] + map[bool]string{true: "1", false: "0"}[alice[len(alice)-1] == '0']
	url, tr := mirror(t, d.DSN, nil)
	expect(t, post(t, url+"/api/v1/memory_get", stranger, []byte(`{"code":"`+code+`"}`)), 401, "UNAUTHORIZED")
	got := tr.take()
	if len(got) != 2 || trips(got) != 1 {
		t.Fatalf("%d statements in %d round trips, want the key lookup and the gated read in 1", len(got), trips(got))
	}
	for key, want := range map[string]bool{stranger: false, alice: true} {
		args := slices.Clone(got[1].args)
		sum := sha256.Sum256([]byte(strings.ToLower(key))) // how keys are stored
		args[len(args)-1] = sum[:]
		p := explain(t, d.App.DB, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) "+got[1].sql, args...)
		read := !strings.Contains(p, "memories_code_key on memories m (never executed)") && strings.Contains(p, "memories_code_key")
		if read != want {
			t.Errorf("key of %s: memory read %v, want %v:\n%s", map[bool]string{true: "its author", false: "nobody"}[want], read, want, p)
		}
	}
}

// TestPrefetchedReadFails: a read that PostgreSQL refuses is the call's
// internal error, as before prefetching, never the caller's key: a good key
// is not told to stop, a bad one is still refused as such.
func TestPrefetchedReadFails(t *testing.T) {
	t.Parallel()
	d := start(t)
	key, _ := d.register(t)
	code := d.must(t, key, "memory_put", putArgs()).str("code")
	stranger := key[:len(key)-1] + map[bool]string{true: "1", false: "0"}[key[len(key)-1] == '0']
	// This test's own database: break the read, not the key lookup.
	if _, err := d.App.DB.Exec(t.Context(), `ALTER TABLE memory_revisions RENAME COLUMN content TO content_gone`); err != nil {
		t.Fatal(err)
	}
	args := `{"code":"` + code + `"}`
	expect(t, post(t, d.URL+"/api/v1/memory_get", key, []byte(args)), 500, "INTERNAL_ERROR")
	expect(t, post(t, d.URL+"/api/v1/memory_get", stranger, []byte(args)), 401, "UNAUTHORIZED")
	r := post(t, d.URL+"/mcp", key, mcpCall("memory_get", args), mcpAccept...)
	if r.Status != 200 || !strings.Contains(r.Raw, `"isError":true`) || !strings.Contains(r.Raw, "INTERNAL_ERROR") {
		t.Errorf("MCP with a good key: %d %s", r.Status, r.Raw)
	}
	if r := post(t, d.URL+"/mcp", stranger, mcpCall("memory_get", args), mcpAccept...); r.Status != 401 {
		t.Errorf("MCP with a key of nobody: %d %s", r.Status, r.Raw)
	}
}

// explain runs an EXPLAIN statement and returns its plan as text.
func explain(t *testing.T, db *pgxpool.Pool, sql string, args ...any) string {
	t.Helper()
	rows, err := db.Query(t.Context(), sql, args...)
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, sql)
	}
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return plan.String()
}
