// Package signing is Dojo's cryptography without protocol state: the
// X-Kungfu-Signature HMAC; the kd-mcp-v1 text that KarmaDue-style agents
// sign, with its canonical arguments printed exactly as PostgreSQL prints
// jsonb; and the server key from which Dojo derives the key that seals
// stored secrets, purpose-bound MAC keys, and its Ed25519 identity, which
// signs outbound deliveries (Standard Webhooks "v1a") and is published as
// a JSON Web Key Set.
package signing
