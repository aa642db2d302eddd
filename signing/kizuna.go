package signing

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// KizunaSkew is how far a letter's X-Kizuna-Timestamp may be from the
// letterbox's clock, either way, per the Kizuna contract (±300 s).
const KizunaSkew = 300 * time.Second

// KizunaSignature is the X-Kizuna-Signature header value of a letter: the
// MAC covers the timestamp header exactly as sent, a dot and the raw body
// bytes, so neither side may re-encode either.
func KizunaSignature(secret, timestamp string, body []byte) string {
	return "sha256=" + hex.EncodeToString(kizunaMAC(secret, timestamp, body))
}

func kizunaMAC(secret, timestamp string, body []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(timestamp))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Errors of VerifyKizuna.
var (
	ErrKizunaSignature = errors.New("kizuna: bad or missing signature")
	ErrKizunaTimestamp = errors.New("kizuna: timestamp missing or outside the allowed skew")
)

// VerifyKizuna is the letterbox side: it accepts a delivery whose
// signature matches (compared in constant time) and whose timestamp, unix
// seconds, lies within skew of now. The signature is checked first so a
// forger learns nothing from the clock check.
func VerifyKizuna(secret, timestamp, signature string, body []byte, skew time.Duration, now time.Time) error {
	hexSig, ok := strings.CutPrefix(signature, "sha256=")
	if !ok {
		return ErrKizunaSignature
	}
	got, err := hex.DecodeString(hexSig)
	if err != nil || !hmac.Equal(got, kizunaMAC(secret, timestamp, body)) {
		return ErrKizunaSignature
	}
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return ErrKizunaTimestamp
	}
	if d := now.Sub(time.Unix(ts, 0)); d > skew || d < -skew {
		return ErrKizunaTimestamp
	}
	return nil
}
