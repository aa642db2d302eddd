// Package queue is Dojo's background work: asynq on Redis carries wake-ups
// while PostgreSQL keeps the truth, so a lost task delays work and a sweep
// recovers it. It also owns the one outbound HTTP client, guarded against
// server-side request forgery, and the notify push worker.
package queue
