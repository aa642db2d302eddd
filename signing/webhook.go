package signing

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Standard Webhooks header names. http.Header canonicalizes them
// (Webhook-Id, …); header names are case-insensitive on the wire.
const (
	HeaderWebhookID        = "webhook-id"
	HeaderWebhookTimestamp = "webhook-timestamp"
	HeaderWebhookSignature = "webhook-signature"
)

// webhookScheme is the Standard Webhooks asymmetric (Ed25519) scheme. The
// symmetric "v1" needs a secret shared with every receiver; "v1a" lets
// anyone verify Dojo from its published JWKS.
const webhookScheme = "v1a"

// WebhookHeaders signs one outbound POST the Standard Webhooks way with the
// server's Ed25519 key: webhook-signature is "v1a," and the standard base64
// of the signature over id + "." + unix seconds + "." + body. id should be
// stable across retries of one message (receivers dedupe on it) and must
// not contain ".", so the signed string splits one way only; ts should be
// the time of this try, so a retry late on a ladder is still fresh.
func (k *ServerKey) WebhookHeaders(id string, ts time.Time, body []byte) http.Header {
	unix := strconv.FormatInt(ts.Unix(), 10)
	sig := ed25519.Sign(k.ed, webhookContent(id, unix, body))
	h := make(http.Header, 3)
	h.Set(HeaderWebhookID, id)
	h.Set(HeaderWebhookTimestamp, unix)
	h.Set(HeaderWebhookSignature, webhookScheme+","+base64.StdEncoding.EncodeToString(sig))
	return h
}

func webhookContent(id, unix string, body []byte) []byte {
	b := make([]byte, 0, len(id)+len(unix)+len(body)+2)
	b = append(b, id...)
	b = append(b, '.')
	b = append(b, unix...)
	b = append(b, '.')
	return append(b, body...)
}

// ErrWebhook is returned, wrapped with the reason, by VerifyWebhook.
var ErrWebhook = errors.New("signing: webhook does not verify")

// VerifyWebhook checks a Standard Webhooks request signed with the "v1a"
// scheme: the timestamp must lie within tolerance of now (either side, so
// neither old captures nor far-future ones replay), and any one of the
// space-separated v1a signatures must verify under pub. Signatures of
// other schemes are skipped, as the standard asks, so a sender may offer
// several during a key or scheme rotation.
func VerifyWebhook(pub ed25519.PublicKey, h http.Header, body []byte, tolerance time.Duration, now time.Time) error {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: public key holds %d bytes, want %d", ErrWebhook, len(pub), ed25519.PublicKeySize)
	}
	id, unix := h.Get(HeaderWebhookID), h.Get(HeaderWebhookTimestamp)
	if id == "" || unix == "" {
		return fmt.Errorf("%w: missing %s or %s", ErrWebhook, HeaderWebhookID, HeaderWebhookTimestamp)
	}
	secs, err := strconv.ParseInt(unix, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s %q is not unix seconds", ErrWebhook, HeaderWebhookTimestamp, unix)
	}
	// Whole seconds on both sides, as the header carries; Sub saturates, so
	// absurd timestamps cannot wrap around into the window.
	if skew := now.Truncate(time.Second).Sub(time.Unix(secs, 0)).Abs(); skew > tolerance {
		return fmt.Errorf("%w: timestamp is %s away from now, tolerance %s", ErrWebhook, skew, tolerance)
	}
	content := webhookContent(id, unix, body)
	found := false
	for _, f := range strings.Fields(strings.Join(h.Values(HeaderWebhookSignature), " ")) {
		scheme, enc, ok := strings.Cut(f, ",")
		if !ok || scheme != webhookScheme {
			continue
		}
		found = true
		sig, err := base64.StdEncoding.DecodeString(enc)
		if err == nil && ed25519.Verify(pub, content, sig) {
			return nil
		}
	}
	if !found {
		return fmt.Errorf("%w: no %s signature", ErrWebhook, webhookScheme)
	}
	return fmt.Errorf("%w: no %s signature matches the key", ErrWebhook, webhookScheme)
}

// JWKS is the JSON Web Key Set served at /.well-known/jwks.json: the one
// Ed25519 public key (kid = KeyID) that verifies Dojo's webhook signatures
// and signed log heads.
func (k *ServerKey) JWKS() ([]byte, error) {
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{
		Key:       k.ed.Public(),
		KeyID:     k.kid,
		Algorithm: string(jose.EdDSA),
		Use:       "sig",
	}}}
	b, err := json.Marshal(set)
	if err != nil {
		return nil, fmt.Errorf("signing: jwks: %w", err)
	}
	return b, nil
}

// MAC is HMAC-SHA256 of msg under a key derived from the seed with HKDF
// info "dojo mac v1 " + purpose. Each purpose gets its own key, so a MAC
// made for one use (say, agent references) can never stand for another,
// and none reveals anything about the sealing or signing keys.
func (k *ServerKey) MAC(purpose string, msg []byte) []byte {
	m := hmac.New(sha256.New, derive(k.seed, "dojo mac v1 "+purpose))
	m.Write(msg)
	return m.Sum(nil)
}
