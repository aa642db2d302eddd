// Package notify keeps each account's push endpoint and the outbox of
// pushes owed to it. Pushes only say that something awaits an account
// ({account, kind, count}); they are an accelerator, never a source of
// truth. The HTTP side lives in package queue.
package notify
