package signing_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/signing"
)

// The fact sheet's own vector (made-up values).
func TestKizunaSignatureVector(t *testing.T) {
	body := []byte(`{"task_id":"T-0001","from":"A-9X2M","to":"A-7K3P"}`)
	got := signing.KizunaSignature("es_test_secret", "1761724800", body)
	want := "sha256=c1ed1fd947cbb0fd9705bd8f15cc9bb8c2426f093db8b49010fc4db7b288db35"
	if got != want {
		t.Fatalf("signature %s, want %s", got, want)
	}
	// Independently: HMAC over timestamp "." body.
	m := hmac.New(sha256.New, []byte("es_test_secret"))
	m.Write([]byte("1761724800." + string(body)))
	if "sha256="+hex.EncodeToString(m.Sum(nil)) != want {
		t.Fatal("vector does not match crypto/hmac")
	}
}

func TestVerifyKizuna(t *testing.T) {
	body := []byte(`{"task_id":"T-0001"}`)
	now := time.Unix(1761724800, 0)
	sig := signing.KizunaSignature("s3cret", "1761724800", body)
	if err := signing.VerifyKizuna("s3cret", "1761724800", sig, body, signing.KizunaSkew, now.Add(299*time.Second)); err != nil {
		t.Fatalf("valid letter refused: %v", err)
	}
	cases := []struct {
		name, secret, ts, sig string
		body                  []byte
		now                   time.Time
		want                  error
	}{
		{"other secret", "other", "1761724800", sig, body, now, signing.ErrKizunaSignature},
		{"body changed", "s3cret", "1761724800", sig, []byte(`{"task_id":"T-0002"}`), now, signing.ErrKizunaSignature},
		{"timestamp changed", "s3cret", "1761724801", sig, body, now, signing.ErrKizunaSignature},
		{"no prefix", "s3cret", "1761724800", sig[len("sha256="):], body, now, signing.ErrKizunaSignature},
		{"not hex", "s3cret", "1761724800", "sha256=zz", body, now, signing.ErrKizunaSignature},
		{"empty", "s3cret", "1761724800", "", body, now, signing.ErrKizunaSignature},
		{"stale", "s3cret", "1761724800", sig, body, now.Add(301 * time.Second), signing.ErrKizunaTimestamp},
		{"future", "s3cret", "1761724800", sig, body, now.Add(-301 * time.Second), signing.ErrKizunaTimestamp},
		{"iso timestamp", "s3cret", "2025-10-29T08:00:00Z", signing.KizunaSignature("s3cret", "2025-10-29T08:00:00Z", body), body, now, signing.ErrKizunaTimestamp},
	}
	for _, c := range cases {
		if err := signing.VerifyKizuna(c.secret, c.ts, c.sig, c.body, signing.KizunaSkew, c.now); !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.want)
		}
	}
}
