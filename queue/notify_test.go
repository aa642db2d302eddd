package queue_test

import (
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
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

type push struct {
	body   []byte
	header http.Header
}

// endpoint is a real HTTPS receiver on loopback: it echoes verification
// challenges and answers pushes with pushStatus.
type endpoint struct {
	*httptest.Server
	pushStatus atomic.Int32
	mu         sync.Mutex
	pushes     []push
	probes     []push
}

func newEndpoint(t *testing.T, status int) *endpoint {
	ep := &endpoint{}
	ep.pushStatus.Store(int32(status))
	ep.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var probe struct{ Type, Challenge string }
		if json.Unmarshal(body, &probe) == nil && probe.Type == "verification" {
			ep.mu.Lock()
			ep.probes = append(ep.probes, push{body: body, header: r.Header.Clone()})
			ep.mu.Unlock()
			io.WriteString(w, `{"echo":"`+probe.Challenge+`"}`)
			return
		}
		ep.mu.Lock()
		ep.pushes = append(ep.pushes, push{body: body, header: r.Header.Clone()})
		ep.mu.Unlock()
		w.WriteHeader(int(ep.pushStatus.Load()))
	}))
	t.Cleanup(ep.Close)
	return ep
}

func (ep *endpoint) received() []push {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return append([]push(nil), ep.pushes...)
}

type stack struct {
	keys     *signing.ServerKey
	db       *pgxpool.Pool
	svc      *notify.Service
	notifier *queue.Notifier
	ep       *endpoint
	who      kungfu.Caller
	secret   string
}

// newStack wires PostgreSQL, a Redis engine on its own queue, the guarded
// client (allowing loopback, as DOJO_ALLOW_TARGETS does in tests) and a
// registered endpoint answering pushes with status.
func newStack(t *testing.T, status int, sweep time.Duration) *stack {
	t.Helper()
	db, _ := kungfutest.Pool(t)
	text, _ := signing.GenerateServerKey()
	keys, err := signing.ParseServerKey(text)
	if err != nil {
		t.Fatal(err)
	}
	ep := newEndpoint(t, status)
	allow, _ := queue.ParseAllow("127.0.0.0/8")
	client := queue.NewOutbound(allow, ep.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs)
	svc := &notify.Service{DB: db, Now: kungfu.SystemClock, Keys: keys,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond }}
	n := &queue.Notifier{Service: svc, Client: client, Keys: keys, Sweep: sweep}
	svc.Verifier = n
	e := newEngine(t)
	n.Register(e)
	if n.Engine != e {
		t.Fatal("Register did not set the engine")
	}

	who := kungfutest.Account(t, db, "notify_push")
	reg, err := svc.Register(context.Background(), who, ep.URL+"/kungfu")
	if err != nil {
		t.Fatal(err)
	}
	run(t, e)
	return &stack{keys: keys, db: db, svc: svc, notifier: n, ep: ep, who: who, secret: reg.Secret}
}

// emit writes a push in a committed "fact" transaction.
func (s *stack) emit(t *testing.T, kind string) int64 {
	t.Helper()
	var id int64
	err := pgx.BeginFunc(context.Background(), s.db, func(tx pgx.Tx) error {
		var (
			ok  bool
			err error
		)
		id, ok, err = s.svc.Emit(context.Background(), tx, s.who.AccountID, kind)
		if !ok && err == nil {
			t.Error("emit: no endpoint")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// checkSigned checks both signatures of the push of outbox row id: the
// Kungfu HMAC under the endpoint's secret, and the Standard Webhooks
// headers under the server key, one webhook-id per row.
func (s *stack) checkSigned(t *testing.T, id int64, p push) {
	t.Helper()
	m := hmac.New(sha256.New, []byte(s.secret))
	m.Write(p.body)
	want := "sha256=" + hex.EncodeToString(m.Sum(nil))
	if got := p.header.Get("X-Kungfu-Signature"); !hmac.Equal([]byte(got), []byte(want)) {
		t.Fatalf("signature %q, want %q", got, want)
	}
	if ct := p.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
	s.checkWebhook(t, p)
	if got, want := p.header.Get("webhook-id"), "notify_"+strconv.FormatInt(id, 10); got != want {
		t.Fatalf("webhook-id %q, want %q", got, want)
	}
}

func (s *stack) checkWebhook(t *testing.T, p push) {
	t.Helper()
	pub := s.keys.Ed25519().Public().(ed25519.PublicKey)
	if err := signing.VerifyWebhook(pub, p.header, p.body, 5*time.Minute, time.Now()); err != nil {
		t.Fatalf("webhook headers %v: %v", p.header, err)
	}
}

func TestPushEndToEnd(t *testing.T) {
	t.Parallel()
	s := newStack(t, http.StatusNoContent, time.Minute)
	id := s.emit(t, notify.KindReply)
	s.notifier.Enqueue(context.Background(), id)

	eventually(t, 10*time.Second, "the push", func() bool { return len(s.ep.received()) == 1 })
	p := s.ep.received()[0]
	if want := `{"account":` + strconv.FormatInt(s.who.AccountID, 10) + `,"kind":"reply","count":1}`; string(p.body) != want {
		t.Fatalf("body %s, want %s", p.body, want)
	}
	s.checkSigned(t, id, p)
	eventually(t, 5*time.Second, "sent_at", func() bool {
		var sent bool
		_ = s.db.QueryRow(context.Background(), `SELECT sent_at IS NOT NULL FROM notify_outbox WHERE id = $1`, id).Scan(&sent)
		return sent
	})
	// The registration probe was signed too, under an id of its own.
	s.ep.mu.Lock()
	probes := append([]push(nil), s.ep.probes...)
	s.ep.mu.Unlock()
	if len(probes) != 1 || !strings.HasPrefix(probes[0].header.Get("webhook-id"), "notify_verify_") {
		t.Fatalf("probes %+v", probes)
	}
	s.checkWebhook(t, probes[0])
	// Enqueuing a sent row again sends nothing.
	s.notifier.Enqueue(context.Background(), id)
	time.Sleep(time.Second)
	if n := len(s.ep.received()); n != 1 {
		t.Fatalf("%d pushes, want 1", n)
	}
}

func TestPushGivesUpAfterFiveTries(t *testing.T) {
	t.Parallel()
	s := newStack(t, http.StatusInternalServerError, 100*time.Millisecond)
	id := s.emit(t, notify.KindJudge)
	s.notifier.Enqueue(context.Background(), id)

	var (
		attempts, status int
		abandoned        *time.Time
		sent             *time.Time
	)
	eventually(t, 20*time.Second, "abandonment", func() bool {
		_ = s.db.QueryRow(context.Background(),
			`SELECT attempts, last_status, abandoned_at, sent_at FROM notify_outbox WHERE id = $1`, id).
			Scan(&attempts, &status, &abandoned, &sent)
		return abandoned != nil
	})
	time.Sleep(1500 * time.Millisecond) // room for any extra try, from asynq or the sweep
	got := s.ep.received()
	if len(got) != notify.MaxAttempts {
		t.Fatalf("%d tries, want %d", len(got), notify.MaxAttempts)
	}
	for _, p := range got {
		s.checkSigned(t, id, p)
	}
	if attempts != 5 || status != 500 || sent != nil {
		t.Fatalf("row: attempts %d, last_status %d, sent %v", attempts, status, sent)
	}
}

func TestSweepRecoversLostEnqueue(t *testing.T) {
	t.Parallel()
	s := newStack(t, http.StatusOK, 200*time.Millisecond)
	id := s.emit(t, notify.KindVerdict) // committed, never enqueued

	eventually(t, 10*time.Second, "the swept push", func() bool { return len(s.ep.received()) == 1 })
	p := s.ep.received()[0]
	if want := `{"account":` + strconv.FormatInt(s.who.AccountID, 10) + `,"kind":"verdict","count":1}`; string(p.body) != want {
		t.Fatalf("body %s", p.body)
	}
	s.checkSigned(t, id, p)
	eventually(t, 5*time.Second, "sent_at", func() bool {
		var sent bool
		_ = s.db.QueryRow(context.Background(), `SELECT sent_at IS NOT NULL FROM notify_outbox WHERE id = $1`, id).Scan(&sent)
		return sent
	})
	time.Sleep(600 * time.Millisecond) // several more sweeps
	if n := len(s.ep.received()); n != 1 {
		t.Fatalf("%d pushes, want 1", n)
	}
}
