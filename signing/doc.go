// Package signing is Dojo's cryptography without protocol state: the
// X-Kungfu-Signature HMAC, and the server key from which Dojo derives the
// key that seals stored secrets, purpose-bound MAC keys, and its Ed25519
// identity, which signs outbound deliveries (Standard Webhooks "v1a") and
// is published as a JSON Web Key Set.
package signing
