package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// benchLimits is what the Dojo under test needs in DOJO_RATE_LIMITS: the
// limits stay on (the Redis script runs on every call), with counts no
// client of the bench reaches.
const benchLimits = "register=1000/1h,get=100000000/1m,thread_write=100000000/1m,task_submit=100000000/1m"

// benchConfig is what `dojo bench` measures against.
type benchConfig struct {
	URL          string // the Dojo under test, limits on
	UnlimitedURL string // the same database served with DOJO_RATE_LIMITS=off
	DatabaseURL  string // the database both serve
	Duration     time.Duration
	Warmup       time.Duration
	Clients      int
	Markdown     bool
	// Only names the rows to measure (see benchRows); empty measures all.
	Only map[string]bool
	// Progress receives a line per phase; nil discards them.
	Progress io.Writer
}

// bench drives a running Dojo and prints the issue 11 ratio table. It
// starts nothing but a loopback receiver for the tasks it submits to.
func bench(ctx context.Context, w io.Writer, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(os.Stdout)
	c := benchConfig{Progress: os.Stderr}
	fs.StringVar(&c.URL, "url", "http://127.0.0.1:8080", "the Dojo under test, started with DOJO_RATE_LIMITS="+benchLimits+" and DOJO_ALLOW_TARGETS=127.0.0.1")
	fs.StringVar(&c.UnlimitedURL, "unlimited-url", "", "a second Dojo on the same database and Redis prefix, started with DOJO_RATE_LIMITS=off (the limits on/off row; skipped without it)")
	fs.StringVar(&c.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "the database of the Dojo under test: the raw INSERT baseline runs there on a scratch table, and the bench's publisher is funded there (default $DATABASE_URL)")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "measured time of each window")
	fs.DurationVar(&c.Warmup, "warmup", time.Second, "unmeasured load before each workload")
	fs.IntVar(&c.Clients, "c", 16, "concurrent clients (and PostgreSQL connections of the baseline)")
	fs.BoolVar(&c.Markdown, "markdown", false, "print Markdown (the top section of docs/performance.md)")
	only := fs.String("only", "", "measure only these rows, comma-separated: "+strings.Join(benchRows, ", ")+" (default all)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *only != "" {
		c.Only = map[string]bool{}
		for name := range strings.SplitSeq(*only, ",") {
			name = strings.TrimSpace(name)
			if !slices.Contains(benchRows, name) {
				return fmt.Errorf("bench: --only: unknown row %q (want %s)", name, strings.Join(benchRows, ", "))
			}
			c.Only[name] = true
		}
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected argument %q", fs.Arg(0))
	}
	rep, err := runBench(ctx, c)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return rep.write(w, c.Markdown)
}

func (c *benchConfig) check() error {
	for _, u := range []*string{&c.URL, &c.UnlimitedURL} {
		*u = strings.TrimRight(*u, "/")
		if *u == "" {
			continue
		}
		p, err := url.Parse(*u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("want an http(s) base URL such as http://127.0.0.1:8080, got %q", *u)
		}
	}
	switch {
	case c.URL == "":
		return errors.New("--url is required")
	case c.DatabaseURL == "":
		return errors.New("--database-url (or DATABASE_URL) is required: the database of the Dojo under test")
	case c.Duration < time.Millisecond || c.Duration > time.Hour:
		return fmt.Errorf("--duration: want 1ms to 1h, got %s", c.Duration)
	case c.Warmup < 0 || c.Warmup > time.Hour:
		return fmt.Errorf("--warmup: want 0 to 1h, got %s", c.Warmup)
	case c.Clients < 1 || c.Clients > 256:
		return fmt.Errorf("-c: want 1 to 256 clients, got %d", c.Clients)
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return nil
}

// window is one measured run of one workload.
type window struct {
	Ops      int
	Elapsed  time.Duration
	P50, P99 time.Duration
}

func (w window) rate() float64 {
	if w.Elapsed <= 0 {
		return 0
	}
	return float64(w.Ops) / w.Elapsed.Seconds()
}

// merge joins windows of one workload measured apart (the A/B halves).
func merge(ws ...window) window {
	var m window
	for _, w := range ws {
		m.Ops += w.Ops
		m.Elapsed += w.Elapsed
		// Percentiles do not add up; the slower half's are the honest ones.
		m.P50, m.P99 = max(m.P50, w.P50), max(m.P99, w.P99)
	}
	return m
}

// measure runs op from conc workers for d and times every call. The first
// error stops every worker: a window with failures measures something else.
func measure(ctx context.Context, conc int, d time.Duration, op func(ctx context.Context, worker int, i int64) error) (window, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		next atomic.Int64
		lats = make([][]time.Duration, conc)
		wg   sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(d)
	for w := range conc {
		wg.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(end) {
					return
				}
				if err := op(ctx, w, next.Add(1)); err != nil {
					cancel(err)
					return
				}
				lats[w] = append(lats[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := context.Cause(ctx); err != nil {
		return window{}, err
	}
	all := slices.Concat(lats...)
	if len(all) == 0 {
		return window{}, fmt.Errorf("no call finished within %s", d)
	}
	slices.Sort(all)
	return window{Ops: len(all), Elapsed: elapsed, P50: all[len(all)/2], P99: all[len(all)*99/100]}, nil
}

// benchAccount is one client: its key, the memory it reads, its room and
// the task it submits to.
type benchAccount struct {
	name, key, memory, room, task string
}

type benchRun struct {
	c        benchConfig
	id       string
	wire     *wireClient
	db       *pgxpool.Pool
	table    string
	clients  []benchAccount
	receiver *http.Server
	// work is the Dojo the workload rows run against: the limits-off one
	// when there is one, as the Go benchmarks run, so each row measures its
	// own path and the limits row alone measures the limit check.
	work string
}

// runBench sets up accounts, rooms and tasks through the public tools,
// then measures each workload between two baseline windows.
func runBench(ctx context.Context, c benchConfig) (*report, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	work := c.URL
	if c.UnlimitedURL != "" {
		work = c.UnlimitedURL
	}
	b := &benchRun{c: c, id: randomHex(4), work: work, wire: newWireClient()}
	defer b.wire.close()
	rep := &report{Date: time.Now().UTC(), Clients: c.Clients, Duration: c.Duration, Warmup: c.Warmup, LimitsOff: c.UnlimitedURL != "",
		GoVersion: runtime.Version(), CPUs: runtime.NumCPU(), CPU: cpuModel()}
	if err := b.openDatabase(ctx, rep); err != nil {
		return nil, err
	}
	defer b.close()
	for _, u := range []string{c.URL, c.UnlimitedURL} {
		if u == "" {
			continue
		}
		if err := b.ready(ctx, u); err != nil {
			return nil, err
		}
	}
	b.progress("setting up %d clients on %s (run %s)", c.Clients, c.URL, b.id)
	if err := b.setup(ctx); err != nil {
		return nil, err
	}
	if err := b.measureAll(ctx, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

func (b *benchRun) progress(format string, args ...any) {
	fmt.Fprintf(b.c.Progress, "dojo bench: "+format+"\n", args...)
}

// openDatabase connects the baseline's pool, every connection opened up
// front, and makes its scratch table. synchronous_commit is set on the
// connections so each INSERT waits for its WAL flush whatever the server's
// default.
func (b *benchRun) openDatabase(ctx context.Context, rep *report) error {
	cfg, err := pgxpool.ParseConfig(b.c.DatabaseURL)
	if err != nil {
		return fmt.Errorf("--database-url: %w", err)
	}
	n := int32(b.c.Clients)
	cfg.MaxConns, cfg.MinConns = n, n
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	if b.db, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return fmt.Errorf("--database-url: %w", err)
	}
	// Holding every connection at once opens them all before the first
	// window, so no window pays connection setup.
	conns := make([]*pgxpool.Conn, 0, n)
	var err2 error
	for range n {
		c, err := b.db.Acquire(ctx)
		if err != nil {
			err2 = err
			break
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	if err2 != nil {
		b.db.Close()
		return fmt.Errorf("--database-url: %w", err2)
	}
	if err := b.db.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync')`).Scan(&rep.Postgres, &rep.Fsync); err != nil {
		b.db.Close()
		return fmt.Errorf("--database-url: %w", err)
	}
	b.table = "dojo_bench_insert_" + b.id
	if _, err := b.db.Exec(ctx, `CREATE TABLE `+b.table+` (id bigserial PRIMARY KEY, body text NOT NULL, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		b.db.Close()
		return fmt.Errorf("scratch table: %w", err)
	}
	return nil
}

func (b *benchRun) close() {
	if b.receiver != nil {
		_ = b.receiver.Close()
	}
	// The scratch table goes; the accounts, rooms and tasks stay in Dojo's
	// database like any client's would.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.db.Exec(ctx, `DROP TABLE IF EXISTS `+b.table); err != nil {
		b.progress("could not drop the scratch table %s: %v", b.table, err)
	}
	b.db.Close()
}

func (b *benchRun) ready(ctx context.Context, base string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("no Dojo answers at %s: %w", base, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the Dojo at %s is not ready: /readyz answered %d", base, resp.StatusCode)
	}
	return nil
}

var errRateLimited = errors.New("Dojo answered RATE_LIMIT: start the Dojo under test with DOJO_RATE_LIMITS=" + benchLimits + " (docs/performance.md)")

// call posts one tool call over HTTP JSON on worker w's connection and
// returns the envelope's bytes, or an error unless it is ok.
func (b *benchRun) call(ctx context.Context, w int, base, key, tool string, body []byte) ([]byte, error) {
	raw, status, err := b.wire.post(ctx, w, base, "/api/v1/"+tool, key, body, false)
	if err != nil {
		return nil, err
	}
	return raw, verdict(tool, status, raw, `"ok":true`)
}

// mcpCall posts one JSON-RPC tools/call to /mcp on worker w's connection,
// as a stateless Streamable HTTP client does: no session, no initialize.
func (b *benchRun) mcpCall(ctx context.Context, w int, key string, body []byte) error {
	raw, status, err := b.wire.post(ctx, w, b.work, "/mcp", key, body, true)
	if err != nil {
		return err
	}
	return verdict("tools/call", status, raw, `"structuredContent":{"ok":true`)
}

func verdict(tool string, status int, raw []byte, want string) error {
	if status == http.StatusTooManyRequests || bytes.Contains(raw, []byte(`"RATE_LIMIT"`)) {
		return fmt.Errorf("%s: %w", tool, errRateLimited)
	}
	if status != http.StatusOK || !bytes.Contains(raw, []byte(want)) {
		return fmt.Errorf("%s: HTTP %d: %.300s", tool, status, raw)
	}
	return nil
}

// field reads one string of an envelope, or of the object under in.
func field(raw []byte, in, name string) string {
	var env map[string]any
	_ = json.Unmarshal(raw, &env)
	if in != "" {
		env, _ = env[in].(map[string]any)
	}
	s, _ := env[name].(string)
	return s
}

// setup registers the clients and a publisher, gives each client a memory,
// a room and a task of its own, and checks that the second server (if any)
// serves the same database.
func (b *benchRun) setup(ctx context.Context) error {
	recv, err := b.startReceiver()
	if err != nil {
		return err
	}
	pub, err := b.register(ctx, 0, "bench_"+b.id+"_pub")
	if err != nil {
		return err
	}
	// A task locks its budget from the publisher's balance; the signup
	// grant pays for a few dozen submissions, the bench makes thousands.
	const budget = 1_000_000
	if err := b.fund(ctx, pub.name, int64(b.c.Clients)*budget); err != nil {
		return err
	}
	b.clients = make([]benchAccount, b.c.Clients)
	errs := make([]error, b.c.Clients)
	var wg sync.WaitGroup
	for i := range b.clients {
		wg.Go(func() {
			a, err := b.register(ctx, i, fmt.Sprintf("bench_%s_%03d", b.id, i))
			if err != nil {
				errs[i] = err
				return
			}
			raw, err := b.call(ctx, i, b.c.URL, a.key, "memory_put", []byte(`{"title":"Field notes","tags":["bench"],"content":"`+strings.Repeat("lorem ipsum ", 7)+`"}`))
			if err != nil {
				errs[i] = err
				return
			}
			a.memory = field(raw, "", "code")
			if raw, err = b.call(ctx, i, b.c.URL, a.key, "thread_start", []byte(`{"subject":"bench"}`)); err != nil {
				errs[i] = err
				return
			}
			a.room = field(raw, "thread", "code")
			b.clients[i] = a
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// The tasks come one after another: task_create is the publisher's.
	for i := range b.clients {
		body, _ := json.Marshal(map[string]any{"budget": budget, "open": true, "contract": map[string]any{
			"title": "Bench", "requirements": "Accept everything.", "price": 1, "receiver": map[string]any{"url": recv}}})
		raw, err := b.call(ctx, 0, b.c.URL, pub.key, "task_create", body)
		if err != nil {
			return err
		}
		b.clients[i].task = field(raw, "", "code")
	}
	// One call of each kind, so a wrong setup fails here with its reason
	// instead of inside a window.
	a := b.clients[0]
	if err := b.submit(ctx, 0, -1); err != nil {
		if strings.Contains(err.Error(), "RECEIVER_UNREACHABLE") {
			return fmt.Errorf("%w\nthe Dojo under test must be allowed to reach the bench's loopback receiver: start it with DOJO_ALLOW_TARGETS=127.0.0.1", err)
		}
		return err
	}
	if err := b.mcpCall(ctx, 0, a.key, b.mcpGet(a, 0)); err != nil {
		return err
	}
	if b.c.UnlimitedURL != "" {
		if _, err := b.call(ctx, 0, b.c.UnlimitedURL, a.key, "memory_get", b.httpGet(a)); err != nil {
			return fmt.Errorf("--unlimited-url must serve the database of --url: %w", err)
		}
	}
	return nil
}

func (b *benchRun) register(ctx context.Context, w int, name string) (benchAccount, error) {
	body, _ := json.Marshal(map[string]string{"name": name, "password": "bench-" + b.id})
	raw, err := b.call(ctx, w, b.c.URL, "", "account_register", body)
	if err != nil {
		return benchAccount{}, err
	}
	return benchAccount{name: name, key: field(raw, "", "api_key")}, nil
}

// fund credits the publisher through the ledger, as a grant would, so
// `dojo check` still finds every balance equal to its ledger.
func (b *benchRun) fund(ctx context.Context, name string, amount int64) error {
	tag, err := b.db.Exec(ctx, `WITH a AS (
		UPDATE accounts SET balance = balance + $2, updated_at = now() WHERE name = $1 RETURNING id, balance)
		INSERT INTO ledger (account_id, type, amount, balance_after, ref_type, ref_id, created_at)
		SELECT id, 'bench_grant', $2, balance, 'bench', $3, now() FROM a`, name, amount, b.id)
	if err != nil {
		return fmt.Errorf("fund the publisher: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("account %s, just registered at %s, is not in --database-url: give the database of the Dojo under test", name, b.c.URL)
	}
	return nil
}

// startReceiver answers every submission 200, the receiver contract's
// "settled" (docs/receivers.md).
func (b *benchRun) startReceiver() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("receiver: %w", err)
	}
	b.receiver = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"accepted":true}`)
	})}
	go func() { _ = b.receiver.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/judge", nil
}

func (b *benchRun) httpGet(a benchAccount) []byte {
	return []byte(`{"code":"` + a.memory + `"}`)
}

func (b *benchRun) mcpGet(a benchAccount, i int64) []byte {
	return fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"memory_get","arguments":{"code":"%s"}}}`, i, a.memory)
}

func (b *benchRun) submit(ctx context.Context, w int, i int64) error {
	a := b.clients[w]
	body := fmt.Appendf(nil, `{"code":"%s","request_key":"%s-%d-%d","payload":{"n":%d}}`, a.task, b.id, w, i, i)
	raw, status, err := b.wire.post(ctx, w, b.work, "/api/v1/work_submit", a.key, body, false)
	if err != nil {
		return err
	}
	return verdict("work_submit", status, raw, `"state":"settled"`)
}

// benchRows are the names --only takes, one per row of the table.
var benchRows = []string{"get", "mcp", "thread_post", "work_submit", "limits"}

// wants says whether row is to be measured.
func (c *benchConfig) wants(row string) bool {
	return len(c.Only) == 0 || c.Only[row]
}

type workload struct {
	row    string
	name   string
	op     func(ctx context.Context, w int, i int64) error
	target float64 // minimum ratio to the baseline, or to the HTTP twin
}

// measureAll interleaves the workloads with baseline windows (B W B W …
// B), so each ratio compares windows a few seconds apart, then measures
// limits on against off in A B B A order to cancel drift.
func (b *benchRun) measureAll(ctx context.Context, rep *report) error {
	baseline := func(ctx context.Context, _ int, _ int64) error {
		_, err := b.db.Exec(ctx, `INSERT INTO `+b.table+` (body) VALUES ($1)`, "reference row")
		return err
	}
	get := func(base string) func(ctx context.Context, w int, _ int64) error {
		return func(ctx context.Context, w int, _ int64) error {
			_, err := b.call(ctx, w, base, b.clients[w].key, "memory_get", b.httpGet(b.clients[w]))
			return err
		}
	}
	mcpGet := func(ctx context.Context, w int, i int64) error {
		return b.mcpCall(ctx, w, b.clients[w].key, b.mcpGet(b.clients[w], i))
	}
	works := []workload{
		{"get", "memory_get HTTP JSON", get(b.work), 0.5},
		{"thread_post", "thread_post, own rooms", func(ctx context.Context, w int, i int64) error {
			a := b.clients[w]
			_, err := b.call(ctx, w, b.work, a.key, "thread_post", fmt.Appendf(nil, `{"thread":"%s","content":"status update number %d","ask":[]}`, a.room, i))
			return err
		}, 0.15},
		{"work_submit", "work_submit → settled, one task per client", b.submit, 0.08},
	}
	run := func(name string, op func(context.Context, int, int64) error, d time.Duration) (window, error) {
		if b.c.Warmup > 0 {
			if _, err := measure(ctx, b.c.Clients, b.c.Warmup, op); err != nil {
				return window{}, fmt.Errorf("%s (warm-up): %w", name, err)
			}
		}
		b.progress("measuring %s for %s", name, d)
		w, err := measure(ctx, b.c.Clients, d, op)
		if err != nil {
			return window{}, fmt.Errorf("%s: %w", name, err)
		}
		b.progress("  %.0f/s", w.rate())
		return w, nil
	}
	baseName := "raw INSERT (fsynced, one row)"
	first, err := run(baseName, baseline, b.c.Duration)
	if err != nil {
		return err
	}
	rep.Baselines = append(rep.Baselines, first)
	for _, wl := range works {
		if !b.c.wants(wl.row) {
			continue
		}
		w, err := run(wl.name, wl.op, b.c.Duration)
		if err != nil {
			return err
		}
		after, err := run(baseName, baseline, b.c.Duration)
		if err != nil {
			return err
		}
		before := rep.Baselines[len(rep.Baselines)-1]
		rep.Baselines = append(rep.Baselines, after)
		rep.Rows = append(rep.Rows, row{Name: wl.name, W: w, Baseline: (before.rate() + after.rate()) / 2, Target: wl.target})
	}
	// MCP is judged against its HTTP twin, measured beside it in HTTP,
	// MCP, MCP, HTTP order, half a window each, so drift cancels.
	half := max(b.c.Duration/2, time.Millisecond)
	if b.c.wants("mcp") {
		if err := b.measureMCP(rep, run, get(b.work), mcpGet, half); err != nil {
			return err
		}
	}
	rep.LimitsUnasked = !b.c.wants("limits")
	if b.c.UnlimitedURL == "" || rep.LimitsUnasked {
		return nil
	}
	on, off, err := abba(run, half, "memory_get HTTP JSON, limits on", get(b.c.URL), "memory_get HTTP JSON, limits off", get(b.c.UnlimitedURL))
	if err != nil {
		return err
	}
	rep.On, rep.Off = on, off
	rep.Limits = true
	return nil
}

type runFunc func(name string, op func(context.Context, int, int64) error, d time.Duration) (window, error)

// abba measures two workloads side by side in A, B, B, A order, half a
// window each, so that drift over the four halves cancels, and merges each
// one's halves.
func abba(run runFunc, half time.Duration, nameA string, opA func(context.Context, int, int64) error, nameB string, opB func(context.Context, int, int64) error) (a, b window, err error) {
	var as, bs []window
	for _, first := range []bool{true, false, false, true} {
		name, op, into := nameB, opB, &bs
		if first {
			name, op, into = nameA, opA, &as
		}
		w, err := run(name, op, half)
		if err != nil {
			return window{}, window{}, err
		}
		*into = append(*into, w)
	}
	return merge(as...), merge(bs...), nil
}

// measureMCP judges MCP against its HTTP twin, measured beside it in HTTP,
// MCP, MCP, HTTP order, half a window each, so drift cancels. Its row
// follows the HTTP row when there is one.
func (b *benchRun) measureMCP(rep *report, run runFunc, viaJSON, viaRPC func(context.Context, int, int64) error, half time.Duration) error {
	viaHTTP, viaMCP, err := abba(run, half, "memory_get HTTP JSON (MCP's twin)", viaJSON, "memory_get MCP tools/call", viaRPC)
	if err != nil {
		return err
	}
	twin := row{Name: "memory_get MCP tools/call", W: viaMCP, Twin: viaHTTP.rate(), Target: 0.85}
	at := 0
	if b.c.wants("get") {
		at = 1
	}
	rep.Rows = slices.Insert(rep.Rows, at, twin)
	return nil
}

// row is one workload's result: its window and the rates it is judged by.
type row struct {
	Name     string
	W        window
	Baseline float64 // mean of the baseline windows before and after
	Twin     float64 // the HTTP twin's rate, for the MCP row
	Target   float64
}

func (r row) ratio() float64 {
	ref := r.Baseline
	if r.Twin > 0 {
		ref = r.Twin
	}
	if ref == 0 {
		return 0
	}
	return r.W.rate() / ref
}

type report struct {
	Date             time.Time
	Clients          int
	Duration, Warmup time.Duration
	GoVersion, CPU   string
	CPUs             int
	Postgres, Fsync  string
	Baselines        []window
	Rows             []row
	Limits           bool
	// LimitsOff says the workload rows ran on the limits-off Dojo.
	LimitsOff bool
	On, Off   window
	// LimitsUnasked says --only left the limits row out.
	LimitsUnasked bool
}

// LimitsCost is the change in memory_get throughput from turning the rate
// limits on, as a fraction (negative: slower with limits).
func (r *report) LimitsCost() float64 {
	if !r.Limits || r.Off.rate() == 0 {
		return 0
	}
	return r.On.rate()/r.Off.rate() - 1
}

func (r *report) baseline() window {
	m := merge(r.Baselines...)
	return m
}

// table is the report as rows of cells, for both output forms.
func (r *report) table() [][]string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }
	yes := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "NO"
	}
	c := fmt.Sprintf(", c=%d", r.Clients)
	base := r.baseline()
	out := [][]string{
		{"workload", "ops/s", "p50 ms", "p99 ms", "ratio", "target", "met?"},
		{"raw INSERT, fsynced" + c + fmt.Sprintf(" (%d windows)", len(r.Baselines)), fmt.Sprintf("%.0f", base.rate()), ms(base.P50), ms(base.P99), "1.00×", "", ""},
	}
	for _, w := range r.Rows {
		ratio, target := fmt.Sprintf("%.3f×", w.ratio()), fmt.Sprintf("≥ %.2f×", w.Target)
		if w.Twin > 0 {
			ratio, target = ratio+" HTTP", target+" HTTP"
		}
		out = append(out, []string{w.Name + c, fmt.Sprintf("%.0f", w.W.rate()), ms(w.W.P50), ms(w.W.P99), ratio, target, yes(w.ratio() >= w.Target)})
	}
	if r.Limits {
		cost := r.LimitsCost()
		out = append(out,
			[]string{"memory_get HTTP JSON, limits off" + c, fmt.Sprintf("%.0f", r.Off.rate()), ms(r.Off.P50), ms(r.Off.P99), "", "", ""},
			[]string{"memory_get HTTP JSON, limits on" + c, fmt.Sprintf("%.0f", r.On.rate()), ms(r.On.P50), ms(r.On.P99), fmt.Sprintf("%+.1f %% vs off", 100*cost), "≥ -8 %", yes(cost >= -0.08)})
	} else {
		why := "skipped: no --unlimited-url"
		if r.LimitsUnasked {
			why = "skipped: not in --only"
		}
		out = append(out, []string{"memory_get HTTP JSON, limits on vs off" + c, "", "", "", why, "≥ -8 %", ""})
	}
	return out
}

func (r *report) write(w io.Writer, markdown bool) error {
	rates := make([]string, len(r.Baselines))
	for i, b := range r.Baselines {
		rates[i] = fmt.Sprintf("%.0f", b.rate())
	}
	about := fmt.Sprintf("%s UTC; %d CPUs (%s), %s; PostgreSQL %s (fsync %s, synchronous_commit on); %s per window, %s warm-up; baseline windows %s inserts/s; workload rows against %s.",
		r.Date.Format("2006-01-02 15:04"), r.CPUs, r.CPU, r.GoVersion, r.Postgres, r.Fsync, r.Duration, r.Warmup, strings.Join(rates, ", "), workTarget(r.LimitsOff))
	t := r.table()
	if markdown {
		var sb strings.Builder
		sb.WriteString(about + "\n\n")
		for i, cells := range t {
			sb.WriteString("| " + strings.Join(cells, " | ") + " |\n")
			if i == 0 {
				sb.WriteString("|---|---:|---:|---:|---:|---|---|\n")
			}
		}
		_, err := io.WriteString(w, sb.String())
		return err
	}
	if _, err := fmt.Fprintln(w, about); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, cells := range t {
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// cpuModel names the processor on Linux, where the figures are comparable
// only with the machine named.
func cpuModel() string {
	raw, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func workTarget(unlimited bool) string {
	if unlimited {
		return "--unlimited-url (no rate-limit check, as in the Go benchmarks)"
	}
	return "--url"
}
