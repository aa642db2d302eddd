package notify_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/kungfu/notify"
	"github.com/dojo-relay/dojo/queue"
	"github.com/dojo-relay/dojo/signing"
)

// receiver is a real HTTPS endpoint on loopback. It echoes verification
// challenges unless told not to, and records every request.
type receiver struct {
	*httptest.Server
	mu       sync.Mutex
	bodies   [][]byte
	headers  []http.Header
	noEcho   atomic.Bool
	verifyAs atomic.Int32 // status for verification probes; 0 = 200
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.bodies = append(r.bodies, body)
		r.headers = append(r.headers, req.Header.Clone())
		r.mu.Unlock()
		var probe struct{ Challenge string }
		_ = json.Unmarshal(body, &probe)
		if s := r.verifyAs.Load(); s != 0 {
			w.WriteHeader(int(s))
		}
		if r.noEcho.Load() {
			io.WriteString(w, `{"ok":true}`)
			return
		}
		io.WriteString(w, `{"echo":"`+probe.Challenge+`"}`)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) requests() ([][]byte, []http.Header) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.bodies...), append([]http.Header(nil), r.headers...)
}

// clock is a settable kungfu.Clock.
type clock struct{ now atomic.Int64 }

func (c *clock) Now() time.Time      { return time.Unix(0, c.now.Load()).UTC() }
func (c *clock) Add(d time.Duration) { c.now.Add(int64(d)) }

type fixture struct {
	db    *pgxpool.Pool
	svc   *notify.Service
	clock *clock
	recv  *receiver
}

func setup(t *testing.T) *fixture {
	t.Helper()
	db, _ := kungfutest.Pool(t)
	text, err := signing.GenerateServerKey()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := signing.ParseServerKey(text)
	if err != nil {
		t.Fatal(err)
	}
	recv := newReceiver(t)
	allow, _ := queue.ParseAllow("127.0.0.0/8")
	roots := recv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	c := &clock{}
	c.now.Store(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	svc := &notify.Service{DB: db, Now: c.Now, Keys: keys}
	svc.Verifier = &queue.Notifier{Service: svc, Client: queue.NewOutbound(allow, roots)}
	return &fixture{db: db, svc: svc, clock: c, recv: recv}
}

func (f *fixture) account(t *testing.T, name string) kungfu.Caller {
	t.Helper()
	return kungfutest.Account(t, f.db, name)
}

func (f *fixture) emit(t *testing.T, accountID int64, kind string) (int64, bool) {
	t.Helper()
	var (
		id int64
		ok bool
	)
	err := pgx.BeginFunc(context.Background(), f.db, func(tx pgx.Tx) error {
		var err error
		id, ok, err = f.svc.Emit(context.Background(), tx, accountID, kind)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return id, ok
}

func (f *fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRegister(t *testing.T) {
	t.Parallel()
	f := setup(t)
	who := f.account(t, "notify_one")
	ctx := context.Background()

	res, err := f.svc.Register(ctx, who, "  "+f.recv.URL+"/hook  ")
	if err != nil {
		t.Fatal(err)
	}
	if res.URL != f.recv.URL+"/hook" || !res.Verified || !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(res.Secret) {
		t.Fatalf("registered %+v", res)
	}
	bodies, headers := f.recv.requests()
	if len(bodies) != 1 {
		t.Fatalf("%d probes", len(bodies))
	}
	if want := `{"type":"verification","challenge":"` + res.Secret[:32] + `"}`; string(bodies[0]) != want {
		t.Fatalf("probe body %s, want %s", bodies[0], want)
	}
	if ct := headers[0].Get("Content-Type"); ct != "application/json" {
		t.Fatalf("probe content type %q", ct)
	}

	var (
		url    string
		sealed []byte
	)
	if err := f.db.QueryRow(ctx, `SELECT url, secret_sealed FROM notify_endpoints WHERE account_id = $1`, who.AccountID).Scan(&url, &sealed); err != nil {
		t.Fatal(err)
	}
	if url != res.URL || bytes.Contains(sealed, []byte(res.Secret)) || bytes.Contains(sealed, []byte(res.Secret[:32])) {
		t.Fatalf("stored url %q, sealed %x", url, sealed)
	}
	if _, err := f.svc.Keys.Open(sealed, "notify-secret:999"); err == nil {
		t.Fatal("sealed secret opens for another account")
	}

	// Registering again replaces the endpoint and the secret.
	again, err := f.svc.Register(ctx, who, f.recv.URL+"/other")
	if err != nil {
		t.Fatal(err)
	}
	if again.Secret == res.Secret {
		t.Fatal("secret reused")
	}
	if n := f.count(t, `SELECT count(*) FROM notify_endpoints WHERE account_id = $1 AND url = $2`, who.AccountID, f.recv.URL+"/other"); n != 1 {
		t.Fatalf("%d rows after re-register", n)
	}
	if n := f.count(t, `SELECT count(*) FROM notify_endpoints`); n != 1 {
		t.Fatalf("%d endpoints", n)
	}
}

func field(err error) string {
	e := kungfu.AsError(err)
	if e == nil || e.Code != kungfu.CodeValidationFailed {
		return ""
	}
	errs, _ := e.Details.(map[string]any)["errors"].([]kungfu.FieldError)
	if len(errs) != 1 {
		return ""
	}
	return errs[0].Field
}

func TestRegisterRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	who := f.account(t, "notify_two")
	ctx := context.Background()
	host := strings.TrimPrefix(f.recv.URL, "https://")

	for _, u := range []string{"", "   ", "http://" + host + "/hook", "ftp://" + host, "https://", "https:///x",
		"https:" + host, "//" + host, "https://" + host + "/" + strings.Repeat("a", 2048)} {
		if _, err := f.svc.Register(ctx, who, u); field(err) != "url" {
			t.Errorf("Register(%.40q): %v", u, err)
		}
	}
	if bodies, _ := f.recv.requests(); len(bodies) != 0 {
		t.Fatalf("invalid URLs were probed %d times", len(bodies))
	}

	f.recv.noEcho.Store(true)
	_, err := f.svc.Register(ctx, who, f.recv.URL)
	if field(err) != "url" || !strings.Contains(err.Error(), "challenge") {
		t.Fatalf("no echo: %v", err)
	}
	f.recv.noEcho.Store(false)
	f.recv.verifyAs.Store(500)
	if _, err := f.svc.Register(ctx, who, f.recv.URL); field(err) != "url" || !strings.Contains(err.Error(), "HTTP 500") {
		t.Fatalf("500 with echo: %v", err)
	}
	f.recv.verifyAs.Store(0)

	// The guard refuses loopback unless allowed; nothing is sent.
	roots := f.recv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	guarded := *f.svc
	guarded.Verifier = &queue.Notifier{Service: &guarded, Client: queue.NewOutbound(nil, roots)}
	before, _ := f.recv.requests()
	if _, err := guarded.Register(ctx, who, f.recv.URL); field(err) != "url" {
		t.Fatalf("guarded: %v", err)
	}
	if after, _ := f.recv.requests(); len(after) != len(before) {
		t.Fatal("guard let a probe through")
	}

	if _, err := f.svc.Register(ctx, kungfu.Caller{}, f.recv.URL); kungfu.AsError(err) == nil || kungfu.AsError(err).Code != kungfu.CodeUnauthorized {
		t.Fatalf("anonymous: %v", err)
	}
	if n := f.count(t, `SELECT count(*) FROM notify_endpoints`); n != 0 {
		t.Fatalf("refused registrations stored %d rows", n)
	}
}

func TestEmitAndDelete(t *testing.T) {
	t.Parallel()
	f := setup(t)
	who := f.account(t, "notify_three")
	other := f.account(t, "notify_other")
	ctx := context.Background()

	if id, ok := f.emit(t, who.AccountID, notify.KindReply); ok || id != 0 {
		t.Fatalf("emit without endpoint: %d %v", id, ok)
	}
	if n := f.count(t, `SELECT count(*) FROM notify_outbox`); n != 0 {
		t.Fatalf("%d rows without endpoint", n)
	}
	err := pgx.BeginFunc(ctx, f.db, func(tx pgx.Tx) error {
		_, _, err := f.svc.Emit(ctx, tx, who.AccountID, "gossip")
		return err
	})
	if err == nil {
		t.Fatal("unknown kind accepted")
	}

	if _, err := f.svc.Register(ctx, who, f.recv.URL); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Register(ctx, other, f.recv.URL); err != nil {
		t.Fatal(err)
	}
	sent, ok := f.emit(t, who.AccountID, notify.KindJudge)
	if !ok {
		t.Fatal("emit with endpoint: not ok")
	}
	if _, err := f.svc.Record(ctx, sent, 204, true); err != nil {
		t.Fatal(err)
	}
	f.emit(t, who.AccountID, notify.KindVerdict)
	f.emit(t, who.AccountID, notify.KindExit)
	f.emit(t, other.AccountID, notify.KindAssign)

	// A rolled-back fact owes nothing.
	_ = pgx.BeginFunc(ctx, f.db, func(tx pgx.Tx) error {
		if _, ok, err := f.svc.Emit(ctx, tx, who.AccountID, notify.KindReply); !ok || err != nil {
			t.Errorf("emit in rolled-back tx: %v %v", ok, err)
		}
		return errors.New("roll back")
	})
	if n := f.count(t, `SELECT count(*) FROM notify_outbox WHERE account_id = $1`, who.AccountID); n != 3 {
		t.Fatalf("%d rows for the account, want 3", n)
	}

	deleted, err := f.svc.Delete(ctx, who)
	if err != nil || !deleted {
		t.Fatalf("delete: %v %v", deleted, err)
	}
	if n := f.count(t, `SELECT count(*) FROM notify_endpoints WHERE account_id = $1`, who.AccountID); n != 0 {
		t.Fatal("endpoint survived delete")
	}
	if n := f.count(t, `SELECT count(*) FROM notify_outbox WHERE account_id = $1 AND sent_at IS NULL`, who.AccountID); n != 0 {
		t.Fatalf("%d unsent rows survived delete", n)
	}
	if n := f.count(t, `SELECT count(*) FROM notify_outbox WHERE id = $1 AND sent_at IS NOT NULL`, sent); n != 1 {
		t.Fatal("delete removed a sent row")
	}
	if n := f.count(t, `SELECT count(*) FROM notify_outbox WHERE account_id = $1`, other.AccountID); n != 1 {
		t.Fatal("delete touched another account")
	}
	if deleted, err := f.svc.Delete(ctx, who); err != nil || deleted {
		t.Fatalf("second delete: %v %v", deleted, err)
	}
	if id, ok := f.emit(t, who.AccountID, notify.KindReply); ok || id != 0 {
		t.Fatal("emit after delete inserted a row")
	}
}

func TestLoadRecordDue(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.svc.Backoff = func(n int) time.Duration { return time.Duration(n) * time.Minute }
	who := f.account(t, "notify_four")
	ctx := context.Background()
	reg, err := f.svc.Register(ctx, who, f.recv.URL+"/push")
	if err != nil {
		t.Fatal(err)
	}
	id, _ := f.emit(t, who.AccountID, notify.KindReply)

	p, ok, err := f.svc.Load(ctx, id)
	if err != nil || !ok {
		t.Fatalf("load: %v %v", ok, err)
	}
	want := `{"account":` + itoa(who.AccountID) + `,"kind":"reply","count":1}`
	if string(p.Body) != want || p.URL != reg.URL || p.Secret != reg.Secret || p.Attempts != 0 || p.ID != id {
		t.Fatalf("push %+v body %s", p, p.Body)
	}

	if due, err := f.svc.Due(ctx, 50); err != nil || len(due) != 1 || due[0] != id {
		t.Fatalf("due: %v %v", due, err)
	}
	if due, _ := f.svc.Due(ctx, 50); len(due) != 0 {
		t.Fatalf("leased row handed out again: %v", due)
	}

	for try := 1; try <= notify.MaxAttempts; try++ {
		giveUp, err := f.svc.Record(ctx, id, 503, false)
		if err != nil {
			t.Fatal(err)
		}
		if giveUp != (try == notify.MaxAttempts) {
			t.Fatalf("try %d: giveUp %v", try, giveUp)
		}
		if try < notify.MaxAttempts {
			// Not due before its backoff, due after it.
			f.clock.Add(time.Duration(try)*time.Minute - time.Second)
			if due, _ := f.svc.Due(ctx, 50); len(due) != 0 {
				t.Fatalf("try %d: due before backoff", try)
			}
			f.clock.Add(time.Second)
			if due, _ := f.svc.Due(ctx, 50); len(due) != 1 {
				t.Fatalf("try %d: not due after backoff", try)
			}
		}
	}
	var (
		attempts, status int
		abandoned        *time.Time
	)
	_ = f.db.QueryRow(ctx, `SELECT attempts, last_status, abandoned_at FROM notify_outbox WHERE id = $1`, id).Scan(&attempts, &status, &abandoned)
	if attempts != 5 || status != 503 || abandoned == nil {
		t.Fatalf("after five failures: attempts %d status %d abandoned %v", attempts, status, abandoned)
	}
	if _, ok, _ := f.svc.Load(ctx, id); ok {
		t.Fatal("abandoned row loaded")
	}
	f.clock.Add(time.Hour)
	if due, _ := f.svc.Due(ctx, 50); len(due) != 0 {
		t.Fatalf("abandoned row due: %v", due)
	}
	if giveUp, err := f.svc.Record(ctx, id, 503, false); err != nil || !giveUp {
		t.Fatalf("record on abandoned row: %v %v", giveUp, err)
	}

	// A sent row is never loaded, failed or resent.
	sent, _ := f.emit(t, who.AccountID, notify.KindAssign)
	if _, err := f.svc.Record(ctx, sent, 200, true); err != nil {
		t.Fatal(err)
	}
	if giveUp, err := f.svc.Record(ctx, sent, 500, false); err != nil || !giveUp {
		t.Fatalf("failure recorded on a sent row: %v %v", giveUp, err)
	}
	if _, ok, _ := f.svc.Load(ctx, sent); ok {
		t.Fatal("sent row loaded")
	}
	if n := f.count(t, `SELECT count(*) FROM notify_outbox WHERE id = $1 AND attempts = 0 AND last_status = 200 AND sent_at IS NOT NULL`, sent); n != 1 {
		t.Fatal("sent row changed by a late failure")
	}

	// A row whose endpoint vanished is abandoned on load.
	orphan, _ := f.emit(t, who.AccountID, notify.KindExit)
	if _, err := f.db.Exec(ctx, `DELETE FROM notify_endpoints`); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := f.svc.Load(ctx, orphan); ok || err != nil {
		t.Fatalf("orphan: %v %v", ok, err)
	}
	if n := f.count(t, `SELECT count(*) FROM notify_outbox WHERE id = $1 AND abandoned_at IS NOT NULL`, orphan); n != 1 {
		t.Fatal("orphan not abandoned")
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }
