package signing_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/dojo-relay/dojo/signing"
)

func pub(k *signing.ServerKey) ed25519.PublicKey { return k.Ed25519().Public().(ed25519.PublicKey) }

func TestWebhookHeaders(t *testing.T) {
	k, _ := newKey(t)
	body := []byte(`{"account":7,"kind":"reply","count":1}`)
	ts := time.Unix(1_767_225_600, 999_000_000) // sub-second part is dropped
	h := k.WebhookHeaders("notify_42", ts, body)

	if len(h) != 3 || h.Get("webhook-id") != "notify_42" || h.Get("webhook-timestamp") != "1767225600" {
		t.Fatalf("headers %v", h)
	}
	sig := h.Get("webhook-signature")
	if !regexp.MustCompile(`^v1a,[A-Za-z0-9+/]{86}==$`).MatchString(sig) {
		t.Fatalf("signature header %q", sig)
	}
	raw, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(sig, "v1a,"))
	if !ed25519.Verify(pub(k), []byte(`notify_42.1767225600.`+string(body)), raw) {
		t.Fatal("signature is not Ed25519 over id.timestamp.body")
	}

	for _, now := range []time.Time{ts, ts.Add(5 * time.Minute), ts.Add(-5 * time.Minute)} {
		if err := signing.VerifyWebhook(pub(k), h, body, 5*time.Minute, now); err != nil {
			t.Fatalf("verify at %v: %v", now.Sub(ts), err)
		}
	}
}

func TestVerifyWebhookRefuses(t *testing.T) {
	k, _ := newKey(t)
	other, _ := newKey(t)
	body := []byte(`{"submission_id":"1","payload":{}}`)
	now := time.Now()
	good := k.WebhookHeaders("submission_1", now, body)

	with := func(name, value string) http.Header {
		h := good.Clone()
		if value == "" {
			h.Del(name)
		} else {
			h.Set(name, value)
		}
		return h
	}
	sig := good.Get("webhook-signature")
	flipped := []byte(sig)
	flipped[10] ^= 1 // still base64, different bytes

	for _, tc := range []struct {
		name string
		pub  ed25519.PublicKey
		h    http.Header
		body []byte
		now  time.Time
		want string
	}{
		{"tampered body", pub(k), good, []byte(`{"submission_id":"2","payload":{}}`), now, "no v1a signature matches"},
		{"body with trailing newline", pub(k), good, append(bytes.Clone(body), '\n'), now, "no v1a signature matches"},
		{"wrong key", pub(other), good, body, now, "no v1a signature matches"},
		{"stale", pub(k), good, body, now.Add(5*time.Minute + time.Second), "tolerance"},
		{"from the future", pub(k), good, body, now.Add(-5*time.Minute - time.Second), "tolerance"},
		{"other id", pub(k), with("webhook-id", "submission_2"), body, now, "no v1a signature matches"},
		{"other timestamp", pub(k), with("webhook-timestamp", strconv.FormatInt(now.Unix()+1, 10)), body, now, "no v1a signature matches"},
		{"minimal timestamp", pub(k), with("webhook-timestamp", "-9223372036854775808"), body, now, "tolerance"},
		{"maximal timestamp", pub(k), with("webhook-timestamp", "9223372036854775807"), body, now, "tolerance"},
		{"timestamp not a number", pub(k), with("webhook-timestamp", "soon"), body, now, "not unix seconds"},
		{"no id", pub(k), with("webhook-id", ""), body, now, "missing"},
		{"no timestamp", pub(k), with("webhook-timestamp", ""), body, now, "missing"},
		{"no signature", pub(k), with("webhook-signature", ""), body, now, "no v1a signature"},
		{"symmetric scheme only", pub(k), with("webhook-signature", "v1,"+strings.TrimPrefix(sig, "v1a,")), body, now, "no v1a signature"},
		{"flipped bit", pub(k), with("webhook-signature", string(flipped)), body, now, "no v1a signature matches"},
		{"not base64", pub(k), with("webhook-signature", "v1a,***"), body, now, "no v1a signature matches"},
		{"short key", pub(k)[:31], good, body, now, "31 bytes"},
		{"no key", nil, good, body, now, "0 bytes"},
	} {
		err := signing.VerifyWebhook(tc.pub, tc.h, tc.body, 5*time.Minute, tc.now)
		if !errors.Is(err, signing.ErrWebhook) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrWebhook containing %q", tc.name, err, tc.want)
		}
	}
}

// A sender may offer several signatures (rotation); any valid v1a one is
// enough, and other schemes are skipped.
func TestVerifyWebhookSeveralSignatures(t *testing.T) {
	k, _ := newKey(t)
	other, _ := newKey(t)
	body := []byte(`{}`)
	now := time.Now()
	h := k.WebhookHeaders("msg_1", now, body)
	stale := other.WebhookHeaders("msg_1", now, body).Get("webhook-signature")
	h.Set("webhook-signature", "v1,bm90IGNoZWNrZWQ= "+stale+"  "+h.Get("webhook-signature"))
	if err := signing.VerifyWebhook(pub(k), h, body, time.Minute, now); err != nil {
		t.Fatalf("several signatures: %v", err)
	}
	if err := signing.VerifyWebhook(pub(other), h, body, time.Minute, now); err != nil {
		t.Fatalf("the other key's signature: %v", err)
	}
	third, _ := newKey(t)
	if err := signing.VerifyWebhook(pub(third), h, body, time.Minute, now); !errors.Is(err, signing.ErrWebhook) {
		t.Fatalf("a key that signed nothing: %v", err)
	}
}

// The JWKS is read here only with go-jose and crypto/ed25519, as a
// receiver would, and must verify what WebhookHeaders signed.
func TestJWKSVerifiesWebhook(t *testing.T) {
	k, _ := newKey(t)
	doc, err := k.JWKS()
	if err != nil {
		t.Fatal(err)
	}

	var raw struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal(doc, &raw); err != nil || len(raw.Keys) != 1 {
		t.Fatalf("jwks %s: %v", doc, err)
	}
	want := map[string]any{"kty": "OKP", "crv": "Ed25519", "kid": k.KeyID(), "alg": "EdDSA", "use": "sig",
		"x": base64.RawURLEncoding.EncodeToString(pub(k))}
	if len(raw.Keys[0]) != len(want) {
		t.Fatalf("jwk has fields %v, want exactly %v (no private part)", raw.Keys[0], want)
	}
	for f, v := range want {
		if raw.Keys[0][f] != v {
			t.Fatalf("jwk %s = %v, want %v", f, raw.Keys[0][f], v)
		}
	}

	var set jose.JSONWebKeySet
	if err := json.Unmarshal(doc, &set); err != nil {
		t.Fatal(err)
	}
	found := set.Key(k.KeyID())
	if len(found) != 1 || !found[0].Valid() || !found[0].IsPublic() {
		t.Fatalf("key %s in set: %+v", k.KeyID(), found)
	}
	edPub, ok := found[0].Key.(ed25519.PublicKey)
	if !ok {
		t.Fatalf("key type %T", found[0].Key)
	}

	body := []byte(`{"submission_id":"17","task_code":"t_abc","agent_ref":"0123456789abcdef","payload":{"n":1}}`)
	h := k.WebhookHeaders("submission_17", time.Now(), body)
	signed := h.Get("webhook-id") + "." + h.Get("webhook-timestamp") + "." + string(body)
	sig, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(h.Get("webhook-signature"), "v1a,"))
	if err != nil || !ed25519.Verify(edPub, []byte(signed), sig) {
		t.Fatalf("JWKS key does not verify the webhook signature: %v", err)
	}
	if ed25519.Verify(edPub, []byte(signed+" "), sig) {
		t.Fatal("signature verifies a different message")
	}
	other, _ := newKey(t)
	if len(set.Key(other.KeyID())) != 0 {
		t.Fatal("another key's kid is in the set")
	}
}

func TestMAC(t *testing.T) {
	k, seed := newKey(t)
	msg := []byte("agent-ref:t_abc:42")
	got := k.MAC("agent-ref", msg)

	key, _ := hkdf.Key(sha256.New, seed, nil, "dojo mac v1 agent-ref", 32)
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	if !hmac.Equal(got, m.Sum(nil)) {
		t.Fatal("MAC is not HMAC-SHA256 under HKDF(seed, \"dojo mac v1 agent-ref\")")
	}
	if ref := hex.EncodeToString(got)[:16]; !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(ref) {
		t.Fatalf("agent ref %q", ref)
	}
	if bytes.Equal(got, k.MAC("agent-ref2", msg)) || bytes.Equal(got, k.MAC("agent-ref", []byte("agent-ref:t_abc:43"))) {
		t.Fatal("MAC ignores its purpose or message")
	}
	other, _ := newKey(t)
	if bytes.Equal(got, other.MAC("agent-ref", msg)) {
		t.Fatal("two server keys give the same MAC")
	}
	// The MAC key is none of the other derived keys.
	sealKey, _ := hkdf.Key(sha256.New, seed, nil, "dojo seal v1", 32)
	if bytes.Equal(key, sealKey) {
		t.Fatal("MAC key equals the sealing key")
	}
}
