// Package signing is Dojo's cryptography without protocol state: the
// X-Kungfu-Signature HMAC, and the server key from which Dojo derives the
// key that seals stored secrets and its Ed25519 identity.
package signing
