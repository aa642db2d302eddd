package signing_test

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/dojo-relay/dojo/signing"
)

func TestKungfuSignature(t *testing.T) {
	body := []byte(`{"account":7,"kind":"reply","count":1}`)
	secret := strings.Repeat("ab", 32)
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	want := "sha256=" + hex.EncodeToString(m.Sum(nil))
	if got := signing.KungfuSignature(secret, body); got != want {
		t.Fatalf("signature %q, want %q", got, want)
	}
	// RFC 4231 test case 2, to pin the scheme to plain HMAC-SHA256.
	if got := signing.KungfuSignature("Jefe", []byte("what do ya want for nothing?")); got != "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843" {
		t.Fatalf("RFC 4231 case 2: %s", got)
	}
}

func newKey(t *testing.T) (*signing.ServerKey, []byte) {
	t.Helper()
	text, err := signing.GenerateServerKey()
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^dojo-sk-[A-Za-z0-9_-]{43}$`).MatchString(text) {
		t.Fatalf("key text %q", text)
	}
	k, err := signing.ParseServerKey(text)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(text, "dojo-sk-"))
	return k, seed
}

func TestSealOpen(t *testing.T) {
	k, seed := newKey(t)
	secret := []byte("0123456789abcdef")
	sealed, err := k.Seal(secret, "notify-secret:1")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, secret) || len(sealed) != 12+len(secret)+16 {
		t.Fatalf("sealed %x", sealed)
	}
	again, _ := k.Seal(secret, "notify-secret:1")
	if bytes.Equal(sealed, again) {
		t.Fatal("two seals of the same secret are equal: nonce reused")
	}
	got, err := k.Open(sealed, "notify-secret:1")
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("open: %q %v", got, err)
	}

	// The layout is nonce || AES-256-GCM(HKDF(seed, "dojo seal v1")), AAD = purpose.
	aesKey, _ := hkdf.Key(sha256.New, seed, nil, "dojo seal v1", 32)
	block, _ := aes.NewCipher(aesKey)
	gcm, _ := cipher.NewGCM(block)
	if got, err := gcm.Open(nil, sealed[:12], sealed[12:], []byte("notify-secret:1")); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("independent open: %q %v", got, err)
	}

	if _, err := k.Open(sealed, "notify-secret:2"); !errors.Is(err, signing.ErrOpen) {
		t.Fatalf("wrong purpose: %v", err)
	}
	for i := range sealed {
		bad := bytes.Clone(sealed)
		bad[i] ^= 1
		if _, err := k.Open(bad, "notify-secret:1"); !errors.Is(err, signing.ErrOpen) {
			t.Fatalf("tampered byte %d opened: %v", i, err)
		}
	}
	if _, err := k.Open(sealed[:20], "notify-secret:1"); !errors.Is(err, signing.ErrOpen) {
		t.Fatalf("short: %v", err)
	}
	other, _ := newKey(t)
	if _, err := other.Open(sealed, "notify-secret:1"); !errors.Is(err, signing.ErrOpen) {
		t.Fatalf("other key: %v", err)
	}
}

func TestEd25519(t *testing.T) {
	k, seed := newKey(t)
	edSeed, _ := hkdf.Key(sha256.New, seed, nil, "dojo ed25519 v1", 32)
	want := ed25519.NewKeyFromSeed(edSeed)
	if !want.Equal(k.Ed25519()) {
		t.Fatal("Ed25519 key is not HKDF(seed, \"dojo ed25519 v1\")")
	}
	sum := sha256.Sum256(want.Public().(ed25519.PublicKey))
	if k.KeyID() != hex.EncodeToString(sum[:8]) {
		t.Fatalf("kid %s", k.KeyID())
	}
	text := "dojo-sk-" + base64.RawURLEncoding.EncodeToString(seed)
	same, err := signing.ParseServerKey(" " + text + "\n")
	if err != nil || !same.Ed25519().Equal(k.Ed25519()) || same.KeyID() != k.KeyID() {
		t.Fatalf("reparse: %v", err)
	}
	msg := []byte("head")
	if !ed25519.Verify(k.Ed25519().Public().(ed25519.PublicKey), msg, ed25519.Sign(k.Ed25519(), msg)) {
		t.Fatal("signature does not verify")
	}
	for _, s := range []string{fmt.Sprint(k), fmt.Sprintf("%v %+v %#v %s", k, k, k, k)} {
		if strings.Contains(s, text[8:]) || !strings.Contains(s, k.KeyID()) {
			t.Fatalf("formatted key %q", s)
		}
	}
}

func TestParseServerKeyErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "must start with"},
		{"sk-" + strings.Repeat("A", 43), "must start with"},
		{"dojo-sk-" + strings.Repeat("A", 42), "31 bytes, want 32"},
		{"dojo-sk-" + strings.Repeat("A", 42) + "B", "base64url"}, // non-zero trailing bits
		{"dojo-sk-" + strings.Repeat("A", 42) + "=", "base64url"},
		{"dojo-sk-" + strings.Repeat("+", 43), "base64url"},
		{"dojo-sk-" + base64.RawURLEncoding.EncodeToString(make([]byte, 31)), "31 bytes, want 32"},
		{"dojo-sk-" + base64.RawURLEncoding.EncodeToString(make([]byte, 33)), "33 bytes, want 32"},
	} {
		if _, err := signing.ParseServerKey(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseServerKey(%q) = %v, want error containing %q", tc.in, err, tc.want)
		}
	}
}
