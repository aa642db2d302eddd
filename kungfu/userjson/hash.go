package userjson

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
)

// Hash is the one request hash of every idempotent tool: SHA-256 of the
// document re-encoded with object keys sorted, insignificant space dropped
// and strings escaped one way, numbers kept exactly as written. Numbers
// never pass through float64, where 9007199254740993 and
// 9007199254740992 are one value; and 1.0 and 1 stay different requests,
// as their bytes are. Top-level keys named in omit are left out (the
// idempotency key itself). A document that is not JSON hashes as its bytes.
//
// The encoding is encoding/json's, so hashes stored before this function
// existed still match: task submissions hashed exactly this form, and room
// writes matched it for every number written in its shortest form.
func Hash(doc []byte, omit ...string) []byte {
	var v any
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	canon := doc
	if dec.Decode(&v) == nil {
		if m, ok := v.(map[string]any); ok {
			for _, k := range omit {
				delete(m, k)
			}
		}
		if b, err := json.Marshal(v); err == nil {
			canon = b
		}
	}
	sum := sha256.Sum256(canon)
	return sum[:]
}
