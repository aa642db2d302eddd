package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/dojo-relay/dojo/kungfu/credits"
	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/kungfu/task"
	"github.com/dojo-relay/dojo/relay"
	"github.com/dojo-relay/dojo/signing"
)

// dojo is one real server on a random loopback port, on its own database
// and Redis prefix.
type dojo struct {
	URL    string
	App    *relay.App
	DSN    string
	Prefix string
}

type option func(*relay.Options)

func withLimits(spec string) option {
	return func(o *relay.Options) {
		l, err := relay.ParseLimits(spec)
		if err != nil {
			panic(err)
		}
		o.Limits = l
	}
}

func start(t testing.TB, opts ...option) *dojo {
	t.Helper()
	dsn := kungfutest.DatabaseURL(t)
	return startOn(t, dsn, kungfutest.RedisPrefix(t), opts...)
}

func startOn(t testing.TB, dsn, prefix string, opts ...option) *dojo {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	o := relay.Options{
		DatabaseURL: dsn, RedisURL: kungfutest.RedisURL(), RedisPrefix: prefix, PublicURL: url,
		Limits:         map[string]relay.Rule{},
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		AllowTargets:   []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		SecretKey:      testKey(t),
		Queue:          kungfutest.Queue(t),
		Sweep:          200 * time.Millisecond,
		BcryptCost:     bcrypt.MinCost,
		Log:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if _, bench := t.(*testing.B); !bench {
		// Many servers share one PostgreSQL during a parallel test run;
		// benchmarks keep the production sizing.
		o.DBMaxConns = 4
	}
	for _, f := range opts {
		f(&o)
	}
	app, err := relay.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Serve(ctx, ln) }()
	t.Cleanup(func() {
		// Ledger and balances must agree after every scenario.
		if drift, err := credits.Check(context.Background(), app.DB); err != nil || len(drift) > 0 {
			t.Errorf("credits.Check: drift %+v, err %v", drift, err)
		}
		if problems, err := task.Check(context.Background(), app.DB); err != nil || len(problems) > 0 {
			t.Errorf("task.Check: %+v, err %v", problems, err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		app.Close()
	})
	return &dojo{URL: url, App: app, DSN: dsn, Prefix: prefix}
}

// result is a decoded envelope with its HTTP status.
type result struct {
	Status int
	Header http.Header
	Body   map[string]any
	Raw    string
}

func (r result) ok() bool { return r.Body["ok"] == true }

func (r result) code() string {
	e, _ := r.Body["error"].(map[string]any)
	if e == nil {
		return ""
	}
	s, _ := e["code"].(string)
	return s
}

func (r result) str(k string) string { s, _ := r.Body[k].(string); return s }

func (r result) num(k string) int64 { f, _ := r.Body[k].(float64); return int64(f) }

func testKey(t testing.TB) *signing.ServerKey {
	t.Helper()
	s, err := signing.GenerateServerKey()
	if err != nil {
		t.Fatal(err)
	}
	k, err := signing.ParseServerKey(s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var client = &http.Client{Timeout: 30 * time.Second}

// post sends raw bytes to a path with optional headers.
func post(t testing.TB, url, key string, body []byte, header ...string) result {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	// A name's first pair replaces the default; repeating it adds a line.
	seen := map[string]bool{}
	for i := 0; i+1 < len(header); i += 2 {
		if seen[header[i]] {
			req.Header.Add(header[i], header[i+1])
		} else {
			req.Header.Set(header[i], header[i+1])
		}
		seen[header[i]] = true
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := result{Status: resp.StatusCode, Header: resp.Header, Raw: string(raw)}
	_ = json.Unmarshal(raw, &r.Body)
	return r
}

// call invokes a tool over HTTP JSON.
func (d *dojo) call(t testing.TB, key, tool string, args any, header ...string) result {
	t.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	return post(t, d.URL+"/api/v1/"+tool, key, b, header...)
}

var seq atomic.Int64

// register creates an account and returns its key and name.
func (d *dojo) register(t testing.TB) (key, name string) {
	t.Helper()
	name = "agent_" + itoa(seq.Add(1))
	r := d.call(t, "", "account_register", map[string]any{"name": name, "password": "correct horse"})
	if !r.ok() {
		t.Fatalf("register %s: %s", name, r.Raw)
	}
	return r.str("api_key"), name
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// expect asserts a refusal's code and HTTP status.
func expect(t testing.TB, r result, status int, code string) {
	t.Helper()
	if r.Status != status || r.code() != code || r.ok() {
		t.Fatalf("want %d %s, got %d %s", status, code, r.Status, r.Raw)
	}
}

func content(n int) string { return strings.Repeat("lorem ipsum ", n/12+1)[:n] }
