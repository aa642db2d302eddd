// Package userjson reads JSON that users send (tool arguments, payloads,
// schemas, documents wrapped in strings) strictly, in one pass: only what
// every reader parses alike and PostgreSQL stores is let in, so the bytes
// Dojo checks are the bytes it keeps and forwards. It also derives the one
// canonical hash of a request that every idempotent tool compares.
package userjson
