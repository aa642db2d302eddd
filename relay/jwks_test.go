package relay_test

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/dojo-relay/dojo/relay"
	"github.com/dojo-relay/dojo/signing"
)

func withServerKey(k *signing.ServerKey) option { return func(o *relay.Options) { o.SecretKey = k } }

// fetchJWKS reads the served key set the way a receiver would and returns
// the key named kid.
func fetchJWKS(t *testing.T, d *dojo, kid string) ed25519.PublicKey {
	t.Helper()
	resp, err := client.Get(d.URL + "/.well-known/jwks.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("jwks: %d %s", resp.StatusCode, raw)
	}
	if ct, cc := resp.Header.Get("Content-Type"), resp.Header.Get("Cache-Control"); ct != "application/json" || cc != "public, max-age=300" {
		t.Fatalf("jwks Content-Type %q, Cache-Control %q", ct, cc)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(raw, &set); err != nil {
		t.Fatalf("jwks %s: %v", raw, err)
	}
	keys := set.Key(kid)
	if len(set.Keys) != 1 || len(keys) != 1 || !keys[0].IsPublic() || keys[0].Algorithm != "EdDSA" || keys[0].Use != "sig" {
		t.Fatalf("jwks %s has no single public EdDSA signing key %q", raw, kid)
	}
	pub, ok := keys[0].Key.(ed25519.PublicKey)
	if !ok {
		t.Fatalf("jwks key type %T", keys[0].Key)
	}
	return pub
}

func TestJWKS(t *testing.T) {
	t.Parallel()
	key := testKey(t)
	d := start(t, withServerKey(key))
	pub := fetchJWKS(t, d, key.KeyID())

	body := []byte(`{"submission_id":"1","task_code":"t_demo","agent_ref":"0123456789abcdef","payload":{}}`)
	h := key.WebhookHeaders("submission_1", time.Now(), body)
	if err := signing.VerifyWebhook(pub, h, body, 5*time.Minute, time.Now()); err != nil {
		t.Fatalf("the served key does not verify the server's signature: %v", err)
	}
	other := testKey(t).WebhookHeaders("submission_1", time.Now(), body)
	if err := signing.VerifyWebhook(pub, other, body, 5*time.Minute, time.Now()); err == nil {
		t.Fatal("the served key verifies another key's signature")
	}

	if resp, err := client.Head(d.URL + "/.well-known/jwks.json"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("HEAD jwks: %v %v", resp, err)
	}
	if r := post(t, d.URL+"/.well-known/jwks.json", "", []byte(`{}`)); r.Status != http.StatusMethodNotAllowed {
		t.Fatalf("POST jwks: %d", r.Status)
	}
}

// A notify push sent by the running server verifies against the JWKS the
// same server publishes: what a receiver actually does.
func TestPushVerifiesWithServedJWKS(t *testing.T) {
	t.Parallel()
	var (
		mu     sync.Mutex
		pushes []push
		heads  []http.Header
	)
	ep := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var probe struct{ Type, Challenge string }
		if json.Unmarshal(body, &probe) == nil && probe.Type == "verification" {
			_, _ = w.Write([]byte(`{"echo":"` + probe.Challenge + `"}`))
			return
		}
		mu.Lock()
		pushes = append(pushes, push{body: body})
		heads = append(heads, req.Header.Clone())
		mu.Unlock()
	}))
	t.Cleanup(ep.Close)
	roots := x509.NewCertPool()
	roots.AddCert(ep.Certificate())
	key := testKey(t)
	d := start(t, withServerKey(key), withRoots(roots))
	room, boss, worker, _ := pair(t, d)
	d.must(t, worker, "notify_register", map[string]any{"url": ep.URL + "/hook"})
	d.must(t, boss, "thread_post", map[string]any{"thread": room, "content": "ping"})
	waitFor(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(pushes) == 1 })

	mu.Lock()
	p, h := pushes[0], heads[0]
	mu.Unlock()
	pub := fetchJWKS(t, d, key.KeyID())
	if !strings.HasPrefix(h.Get("webhook-id"), "notify_") {
		t.Fatalf("webhook-id %q", h.Get("webhook-id"))
	}
	if err := signing.VerifyWebhook(pub, h, p.body, 5*time.Minute, time.Now()); err != nil {
		t.Fatalf("push headers %v do not verify with the served JWKS: %v", h, err)
	}
}
