package relay_test

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/bcrypt"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/relay"
)

func deploymentID(t *testing.T, dsn string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var id string
	if err := conn.QueryRow(ctx, `SELECT id FROM deployment`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// Reproduces issue 7 item 5: a fresh database on a Redis that served
// another one inherited its rate windows (the README walkthrough answered
// 429 on its first register), because every key sat under one fixed prefix.
// Both databases here are clones of one migrated template, so they also
// start with the same deployment row: Open must give each its own id.
func TestNamespaceLimitsDoNotLeak(t *testing.T) {
	t.Parallel()
	dsnA, dsnB := kungfutest.DatabaseURL(t), kungfutest.DatabaseURL(t)
	if a, b := deploymentID(t, dsnA), deploymentID(t, dsnB); a != b {
		t.Fatalf("template clones should carry the template's row before Open: %s, %s", a, b)
	}
	prefix := kungfutest.RedisPrefix(t) // the operator's one DOJO_REDIS_PREFIX
	a := startOn(t, dsnA, prefix, withLimits("register=1/1h"))
	b := startOn(t, dsnB, prefix, withLimits("register=1/1h"))
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(a.App.Deployment) || a.App.Deployment == b.App.Deployment {
		t.Fatalf("deployments %q and %q", a.App.Deployment, b.App.Deployment)
	}
	if got := deploymentID(t, dsnA); got != a.App.Deployment {
		t.Fatalf("stored id %s, Open uses %s", got, a.App.Deployment)
	}

	reg := func(d *dojo, name string) result {
		return d.call(t, "", "account_register", map[string]any{"name": name, "password": "correct horse"},
			"X-Forwarded-For", "198.51.100.23")
	}
	if r := reg(a, "ns_first"); !r.ok() {
		t.Fatalf("first register on A: %s", r.Raw)
	}
	expect(t, reg(a, "ns_second"), 429, "RATE_LIMIT")
	// B never saw this client: A's window must not follow it there.
	if r := reg(b, "ns_first"); !r.ok() {
		t.Fatalf("first register on a fresh database inherited another's window: %d %s", r.Status, r.Raw)
	}

	// A second process of A reads the same id and shares A's windows.
	a2 := startOn(t, dsnA, prefix, withLimits("register=1/1h"))
	if a2.App.Deployment != a.App.Deployment {
		t.Fatalf("second process of one database: %s, want %s", a2.App.Deployment, a.App.Deployment)
	}
	expect(t, reg(a2, "ns_third"), 429, "RATE_LIMIT")
}

// probes records which process ran a probe task on which row.
type probes struct {
	mu  sync.Mutex
	ran map[string][]int64
}

func (p *probes) add(who string, id int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ran[who] = append(p.ran[who], id)
}

func (p *probes) get(who string) []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int64(nil), p.ran[who]...)
}

// openEngine opens a process on dsn with base queue name q and a probe
// handler, and runs its engine (not the HTTP server) until t ends.
func openEngine(t *testing.T, dsn, prefix, q, who string, p *probes) *relay.App {
	t.Helper()
	app, err := relay.Open(context.Background(), relay.Options{
		DatabaseURL: dsn, RedisURL: kungfutest.RedisURL(), RedisPrefix: prefix, PublicURL: "http://127.0.0.1:1",
		Limits: map[string]relay.Rule{}, AllowTargets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		SecretKey: testKey(t), Queue: q, Sweep: time.Second, BcryptCost: bcrypt.MinCost,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	app.Engine.Handle("ns-probe", func(_ context.Context, id int64) error {
		p.add(who, id)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Engine.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("engine %s: %v", who, err)
		}
		app.Close()
	})
	return app
}

// Reproduces issue 7 item 5 for the queue: two deployments on one Redis
// and one DOJO_QUEUE shared asynq's task ids, so a task kept after it ran
// on A swallowed B's enqueue of the same (type, row id), and a task
// enqueued by one could be run by the other's workers.
func TestNamespaceQueuesApart(t *testing.T) {
	t.Parallel()
	prefix, q := kungfutest.RedisPrefix(t), kungfutest.Queue(t)
	p := &probes{ran: map[string][]int64{}}
	a := openEngine(t, kungfutest.DatabaseURL(t), prefix, q, "A", p)
	b := openEngine(t, kungfutest.DatabaseURL(t), prefix, q, "B", p)
	ctx := context.Background()
	waitRan := func(who string, want ...int64) {
		t.Helper()
		end := time.Now().Add(15 * time.Second)
		for {
			got := p.get(who)
			if len(got) >= len(want) {
				for i := range want {
					if got[i] != want[i] {
						t.Fatalf("%s ran %v, want %v", who, got, want)
					}
				}
				return
			}
			if time.Now().After(end) {
				t.Fatalf("%s ran %v after 15 s, want %v (A ran %v, B ran %v)", who, got, want, p.get("A"), p.get("B"))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// A runs row 7 and asynq keeps the finished task for a minute.
	if err := a.Engine.Enqueue(ctx, "ns-probe", 7, time.Time{}); err != nil {
		t.Fatal(err)
	}
	waitRan("A", 7)
	// B's row 7 is another row: it must run, on B.
	if err := b.Engine.Enqueue(ctx, "ns-probe", 7, time.Time{}); err != nil {
		t.Fatal(err)
	}
	waitRan("B", 7)

	// Row 8 enqueued on both at once: each runs its own, none steals.
	if err := a.Engine.Enqueue(ctx, "ns-probe", 8, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Engine.Enqueue(ctx, "ns-probe", 8, time.Time{}); err != nil {
		t.Fatal(err)
	}
	waitRan("A", 7, 8)
	waitRan("B", 7, 8)
	time.Sleep(500 * time.Millisecond)
	if ga, gb := p.get("A"), p.get("B"); len(ga) != 2 || len(gb) != 2 {
		t.Fatalf("A ran %v, B ran %v: want [7 8] each", ga, gb)
	}
	if a.Engine.Queue() == b.Engine.Queue() {
		t.Fatalf("both deployments use queue %q", a.Engine.Queue())
	}
}
