package kungfu

import (
	"context"
	"time"
)

// Caller is who is acting. AccountID is zero for anonymous calls (only
// public tools accept those). IP is the client address used for per-IP
// limits such as registration.
type Caller struct {
	AccountID int64
	Name      string
	IP        string
	// Agent is the KarmaDue agent id whose Ed25519 signature authenticated
	// this call ("" for a Bearer key): tools that act on the signing key
	// itself (rotation, revocation) need to know which one.
	Agent string
	// AgentKey is the id of the credential whose key verified the
	// signature: rotation and revocation lock it, so a call signed with a
	// key retired meanwhile changes nothing.
	AgentKey int64
}

// Anonymous reports whether no account is acting.
func (c Caller) Anonymous() bool { return c.AccountID == 0 }

type callerKey struct{}

// WithCaller stores c in ctx; transports do this once authentication is done.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller stored in ctx (anonymous when none).
func CallerFrom(ctx context.Context) Caller {
	c, _ := ctx.Value(callerKey{}).(Caller)
	return c
}

// Clock is injected wherever time decides an outcome, so tests can move it.
type Clock func() time.Time

// SystemClock is the wall clock in UTC, truncated to microseconds so values
// round-trip through PostgreSQL unchanged.
func SystemClock() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// Version is Dojo's release; api_version in every envelope.
const Version = "v0.1.0"

// Gate is a condition that a read sent before its caller is known adds to
// its WHERE clause, so that the read finds nothing unless the caller's
// credential is good: a refused caller costs PostgreSQL no more than the
// lookup of its credential, and learns nothing from how long the answer
// took. The condition's one argument is arg, written $n.
type Gate func(n int) (cond string, arg any)
