package relay_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/relay"
)

// receiver is a local TLS endpoint that echoes verification challenges and
// records pushes.
type receiver struct {
	srv     *httptest.Server
	mu      sync.Mutex
	pushes  []push
	pushRet int
}

type push struct {
	body []byte
	sig  string
}

func newReceiver(t *testing.T, pushStatus int) *receiver {
	r := &receiver{pushRet: pushStatus}
	r.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var probe struct{ Type, Challenge string }
		if json.Unmarshal(body, &probe) == nil && probe.Type == "verification" {
			_, _ = w.Write([]byte(`{"echo":"` + probe.Challenge + `"}`))
			return
		}
		r.mu.Lock()
		r.pushes = append(r.pushes, push{body, req.Header.Get("X-Kungfu-Signature")})
		r.mu.Unlock()
		w.WriteHeader(r.pushRet)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) got() []push {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]push(nil), r.pushes...)
}

func withRoots(p *x509.CertPool) option { return func(o *relay.Options) { o.RootCAs = p } }

func withNotifyBackoff(d time.Duration) option {
	return func(o *relay.Options) { o.NotifyBackoff = func(int) time.Duration { return d } }
}

func waitFor(t *testing.T, within time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(within)
	for !cond() {
		if time.Now().After(end) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func TestNotifyPushes(t *testing.T) {
	t.Parallel()
	ok := newReceiver(t, 200)
	failing := newReceiver(t, 500)
	pool := x509.NewCertPool()
	pool.AddCert(ok.srv.Certificate())
	pool.AddCert(failing.srv.Certificate())
	d := start(t, withRoots(pool), withNotifyBackoff(20*time.Millisecond))
	room, boss, worker, wname := pair(t, d)

	// Registration: https only, the challenge must come back, the secret is shown once.
	expect(t, d.call(t, worker, "notify_register", map[string]any{"url": "http://127.0.0.1/hook"}), 422, "VALIDATION_FAILED")
	silent := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer silent.Close()
	expect(t, d.call(t, worker, "notify_register", map[string]any{"url": silent.URL}), 422, "VALIDATION_FAILED")
	expect(t, d.call(t, worker, "notify_register", map[string]any{}), 400, "MISSING_FIELD")
	reg := d.must(t, worker, "notify_register", map[string]any{"url": ok.srv.URL + "/hook"})
	secret := reg.str("secret")
	if len(secret) != 64 || reg.Body["verified"] != true {
		t.Fatalf("notify_register: %s", reg.Raw)
	}
	bossReg := d.must(t, boss, "notify_register", map[string]any{"url": failing.srv.URL})

	// A room event for the worker becomes one signed, content-free push.
	post := d.must(t, boss, "thread_post", map[string]any{"thread": room, "content": "secret plans: launch at dawn"})
	waitFor(t, 5*time.Second, func() bool { return len(ok.got()) == 1 })
	p := ok.got()[0]
	var body map[string]any
	if err := json.Unmarshal(p.body, &body); err != nil || len(body) != 3 || body["kind"] != "reply" || body["count"] != float64(1) {
		t.Fatalf("push body %s", p.body)
	}
	if strings.Contains(string(p.body), "launch") || strings.Contains(string(p.body), room) {
		t.Fatalf("push leaked content: %s", p.body)
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(p.body)
	if p.sig != "sha256="+hex.EncodeToString(mac.Sum(nil)) {
		t.Fatalf("signature %q does not verify", p.sig)
	}

	// A failing endpoint is tried at most five times; the actions succeeded regardless.
	reply := d.call(t, worker, "thread_post", map[string]any{"thread": room, "content": "ack", "reply_to": post.num("entry")})
	if !reply.ok() || bossReg.str("secret") == "" {
		t.Fatalf("reply with a failing endpoint: %s", reply.Raw)
	}
	waitFor(t, 10*time.Second, func() bool { return len(failing.got()) >= 5 })
	time.Sleep(300 * time.Millisecond)
	if n := len(failing.got()); n != 5 {
		t.Fatalf("failing endpoint got %d tries, want 5", n)
	}
	var attempts int
	var abandoned bool
	if err := d.App.DB.QueryRow(context.Background(), `SELECT attempts, abandoned_at IS NOT NULL FROM notify_outbox o
		JOIN accounts a ON a.id = o.account_id WHERE a.name <> $1`, wname).Scan(&attempts, &abandoned); err != nil || attempts != 5 || !abandoned {
		t.Fatalf("outbox row: attempts %d abandoned %v (%v)", attempts, abandoned, err)
	}

	// notify_delete drops the endpoint; facts are unaffected.
	if r := d.must(t, worker, "notify_delete", map[string]any{}); r.Body["deleted"] != true {
		t.Fatalf("notify_delete: %s", r.Raw)
	}
	if r := d.must(t, worker, "notify_delete", map[string]any{}); r.Body["deleted"] != false {
		t.Fatalf("second notify_delete: %s", r.Raw)
	}
	again := d.must(t, boss, "thread_post", map[string]any{"thread": room, "content": "anyone there?"})
	if asked := again.Body["asked"].([]any); len(asked) != 1 || asked[0] != wname {
		t.Fatalf("the worker is still asked: %s", again.Raw)
	}
	time.Sleep(300 * time.Millisecond)
	if len(ok.got()) != 1 {
		t.Fatalf("a deleted endpoint still got pushes: %d", len(ok.got()))
	}
}
