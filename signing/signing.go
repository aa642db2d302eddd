package signing

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"golang.org/x/crypto/hkdf"
)

// KungfuSignature is the X-Kungfu-Signature header value for body.
func KungfuSignature(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// ServerKeyPrefix starts the text form of a server key.
const ServerKeyPrefix = "dojo-sk-"

const nonceSize = 12

// ServerKey is Dojo's key material. Every key it uses is derived from one
// 32-byte seed with HKDF under its own label, so one secret to back up
// yields independent keys for sealing and for signing.
type ServerKey struct {
	seed []byte // kept to derive purpose-bound MAC keys on demand
	aead cipher.AEAD
	ed   ed25519.PrivateKey
	kid  string
}

// GenerateServerKey returns a new server key in its text form.
func GenerateServerKey() (string, error) {
	var seed [32]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return "", fmt.Errorf("signing: generate server key: %w", err)
	}
	return ServerKeyPrefix + base64.RawURLEncoding.EncodeToString(seed[:]), nil
}

// ParseServerKey reads a key written by GenerateServerKey. Surrounding
// white space is ignored, since keys often come from files.
func ParseServerKey(s string) (*ServerKey, error) {
	s = strings.TrimSpace(s)
	rest, ok := strings.CutPrefix(s, ServerKeyPrefix)
	if !ok {
		return nil, fmt.Errorf("signing: server key must start with %q (generate one with `dojo keygen`)", ServerKeyPrefix)
	}
	seed, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	if err != nil {
		return nil, fmt.Errorf("signing: server key is not unpadded base64url: %w", err)
	}
	if len(seed) != 32 {
		return nil, fmt.Errorf("signing: server key holds %d bytes, want 32", len(seed))
	}
	return newServerKey(seed)
}

func newServerKey(seed []byte) (*ServerKey, error) {
	block, err := aes.NewCipher(derive(seed, "dojo seal v1"))
	if err != nil {
		return nil, fmt.Errorf("signing: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("signing: %w", err)
	}
	ed := ed25519.NewKeyFromSeed(derive(seed, "dojo ed25519 v1"))
	sum := sha256.Sum256(ed.Public().(ed25519.PublicKey))
	return &ServerKey{seed: seed, aead: aead, ed: ed, kid: hex.EncodeToString(sum[:])[:16]}, nil
}

func derive(seed []byte, info string) []byte {
	out := make([]byte, 32)
	if _, err := io.ReadFull(hkdf.New(sha256.New, seed, nil, []byte(info)), out); err != nil {
		panic(err) // HKDF-SHA256 can expand far beyond 32 bytes
	}
	return out
}

// Seal encrypts plaintext for storage. purpose is authenticated but not
// stored: a secret sealed for one purpose (say, one account's endpoint)
// cannot be opened as another's.
func (k *ServerKey) Seal(plaintext []byte, purpose string) ([]byte, error) {
	nonce := make([]byte, nonceSize, nonceSize+len(plaintext)+k.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("signing: seal: %w", err)
	}
	return k.aead.Seal(nonce, nonce, plaintext, []byte(purpose)), nil
}

// ErrOpen is returned when sealed data was tampered with, sealed under
// another key or for another purpose.
var ErrOpen = errors.New("signing: cannot open sealed data")

// Open decrypts what Seal produced for the same purpose.
func (k *ServerKey) Open(sealed []byte, purpose string) ([]byte, error) {
	if len(sealed) < nonceSize+k.aead.Overhead() {
		return nil, fmt.Errorf("%w: too short", ErrOpen)
	}
	out, err := k.aead.Open(nil, sealed[:nonceSize], sealed[nonceSize:], []byte(purpose))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOpen, err)
	}
	return out, nil
}

// Ed25519 is the server's signing key, the same for every process holding
// this server key.
func (k *ServerKey) Ed25519() ed25519.PrivateKey { return k.ed }

// KeyID names the Ed25519 public key (JWKS "kid"): the first 16 hex digits
// of its SHA-256.
func (k *ServerKey) KeyID() string { return k.kid }

// String never shows key material, so a key that reaches a log is harmless.
func (k *ServerKey) String() string { return "ServerKey(" + k.kid + ")" }

// GoString keeps %#v as quiet as %v.
func (k *ServerKey) GoString() string { return k.String() }
