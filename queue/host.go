package queue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of Hosts.
const (
	DefaultHostLimit   = 4
	DefaultTrip        = 3
	DefaultCooldown    = 5 * time.Second
	DefaultMaxCooldown = 5 * time.Minute
	DefaultBusy        = time.Second
	// streakMemory is how long a host's run of timeouts is remembered
	// when nothing more is sent to it.
	streakMemory = time.Hour
)

// Hosts hands out turns at target hosts, so that no host can hold more
// than Limit delivery workers at once, whichever account or kind of work
// sends to it. A background delivery takes a turn at its URL's host (name
// and port) before it connects, or is deferred, and gives it back when it
// ends; a delivery made in a caller's request joins instead (Join). Turns
// are leases in Redis, shared by every process of a deployment and
// expiring on their own when a process dies mid-request; the Redis clock
// judges them, so the processes' clocks need not agree (Redis 5 or newer).
//
// A host that times out Trip times in a row is closed for Cooldown,
// doubled by every further timeout up to MaxCooldown: deliveries to it are
// deferred without being made. Once the pause is over one delivery at a
// time probes it, until an answer (any HTTP status) opens it again. Fast
// failures (connection refused, no such host) neither grow nor end the
// run: they do not hold workers.
//
// Set the fields before the first use; zero means the default.
type Hosts struct {
	rdb    *redis.Client
	prefix string

	Limit       int
	Trip        int
	Cooldown    time.Duration
	MaxCooldown time.Duration
	// Busy is the base wait before a delivery deferred at a full host
	// asks again; jitter of up to as much again spreads the askers.
	Busy time.Duration
}

func newHosts(rdb *redis.Client, base string) *Hosts {
	return &Hosts{rdb: rdb, prefix: base + ":host:"}
}

func orDefault[T int | time.Duration](v, d T) T {
	if v > 0 {
		return v
	}
	return d
}

// hostOf is the host a delivery to raw connects to, with the scheme's
// port made explicit so that two spellings of one host share its turns.
func hostOf(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("queue: no host in %q", raw)
	}
	port := u.Port()
	if port == "" {
		port = "443"
		if u.Scheme == "http" {
			port = "80"
		}
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port), nil
}

// keys are the host's leases and its timeout streak, hash-tagged together
// so one script may touch both in a cluster.
func (h *Hosts) keys(host string) []string {
	tag := "{" + strings.NewReplacer("{", "%7B", "}", "%7D").Replace(host) + "}"
	return []string{h.prefix + tag + ":turns", h.prefix + tag + ":streak"}
}

// take returns 0 when the lease was added, -1 when the host is full, or
// the milliseconds it stays closed. A limit of 0 is no limit, except while
// one probe tests a host that was closed.
var take = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('HMGET', KEYS[2], 'n', 'until')
local n = tonumber(s[1]) or 0
local closed = tonumber(s[2]) or 0
if closed > now then
	return closed - now
end
local limit = tonumber(ARGV[1])
if n >= tonumber(ARGV[4]) then
	limit = 1
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if limit > 0 and redis.call('ZCARD', KEYS[1]) >= limit then
	return -1
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], math.ceil(tonumber(last[2])))
return 0
`)

// give removes the lease and notes how the delivery ended.
var give = redis.NewScript(`
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] == 'answered' then
	redis.call('DEL', KEYS[2])
	return 0
end
if ARGV[2] ~= 'timeout' then
	return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = redis.call('HINCRBY', KEYS[2], 'n', 1)
local trip = tonumber(ARGV[3])
if n >= trip then
	local pause = math.min(tonumber(ARGV[4]) * 2 ^ math.min(n - trip, 30), tonumber(ARGV[5]))
	redis.call('HSET', KEYS[2], 'until', string.format('%d', now + pause))
end
redis.call('PEXPIRE', KEYS[2], ARGV[6])
return n
`)

// Take takes a turn at raw's host for at most hold (the lease then
// expires). When the host is full or closed it returns a *Deferred saying
// when to ask again; any other error means Redis could not be asked, and
// the caller should deliver without a turn rather than not at all. A nil
// Hosts gives nil turns.
func (h *Hosts) Take(ctx context.Context, raw string, hold time.Duration) (*Turn, error) {
	if h == nil {
		return nil, nil
	}
	return h.take(ctx, raw, hold, orDefault(h.Limit, DefaultHostLimit))
}

// Join is Take for a caller that waits anyway and holds no worker (a
// submission's first POST, made in the agent's request). It is let in at
// a full host, where it counts among the deliveries in flight, so that
// background ones defer to it; it is refused at once while the host is
// closed after timeouts. While one probe tests a host that was closed it
// waits up to within for a turn.
func (h *Hosts) Join(ctx context.Context, raw string, hold, within time.Duration) (*Turn, error) {
	end := time.Now().Add(within)
	for {
		t, err := h.take(ctx, raw, hold, 0)
		d, ok := deferred(err)
		if !ok || d.closed {
			return t, err
		}
		left := time.Until(end)
		if left <= 0 {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(min(50*time.Millisecond+rand.N(100*time.Millisecond), left)):
		}
	}
}

func (h *Hosts) take(ctx context.Context, raw string, hold time.Duration, limit int) (*Turn, error) {
	if h == nil {
		return nil, nil
	}
	host, err := hostOf(raw)
	if err != nil {
		return nil, err
	}
	keys := h.keys(host)
	lease := fmt.Sprintf("%x", rand.Uint64())
	trip := orDefault(h.Trip, DefaultTrip)
	wait, err := take.Run(ctx, h.rdb, keys, limit, max(hold.Milliseconds(), 1), lease, trip).Int64()
	if err != nil {
		return nil, fmt.Errorf("queue: turn at %s: %w", host, err)
	}
	busy := orDefault(h.Busy, DefaultBusy)
	jitter := rand.N(busy)
	switch {
	case wait == 0:
		return &Turn{h: h, keys: keys, lease: lease}, nil
	case wait < 0:
		return nil, &Deferred{After: busy + jitter, Why: fmt.Sprintf("host %s is busy (its turns are all taken)", host)}
	}
	return nil, &Deferred{After: time.Duration(wait)*time.Millisecond + jitter, closed: true,
		Why: fmt.Sprintf("host %s keeps timing out; it is closed for %v", host, time.Duration(wait)*time.Millisecond)}
}

// Ending is how a delivery made in a turn ended.
type Ending int

const (
	// Unsent: not made, or failed fast; the host's streak stands.
	Unsent Ending = iota
	// Answered: any HTTP response; the streak ends.
	Answered
	// TimedOut: no answer in time; the streak grows.
	TimedOut
)

// endingOf judges a request's result.
func endingOf(resp *http.Response, err error) Ending {
	var ne net.Error
	switch {
	case err == nil && resp != nil:
		return Answered
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return TimedOut
	}
	return Unsent
}

// Turn is a held turn at a host.
type Turn struct {
	h     *Hosts
	keys  []string
	lease string
	once  sync.Once
}

// Done gives the turn back and notes how the delivery ended. Only the
// first call counts; a nil turn does nothing. It runs even after ctx has
// ended, so a cancelled delivery still frees its turn.
func (t *Turn) Done(ctx context.Context, e Ending) {
	if t == nil {
		return
	}
	t.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		how := map[Ending]string{Unsent: "unsent", Answered: "answered", TimedOut: "timeout"}[e]
		h := t.h
		// A failure here only leaves the lease to expire and a timeout
		// uncounted.
		_ = give.Run(ctx, h.rdb, t.keys, t.lease, how, orDefault(h.Trip, DefaultTrip),
			orDefault(h.Cooldown, DefaultCooldown).Milliseconds(), orDefault(h.MaxCooldown, DefaultMaxCooldown).Milliseconds(),
			streakMemory.Milliseconds()).Err()
	})
}

// turnKey carries a turn taken before the domain counted an attempt (see
// Receivers.Paced) down to the delivery that uses it.
type turnKey struct{}

func withTurn(ctx context.Context, t *Turn) context.Context {
	return context.WithValue(ctx, turnKey{}, t)
}

func heldTurn(ctx context.Context) (*Turn, bool) {
	t, ok := ctx.Value(turnKey{}).(*Turn)
	return t, ok
}
