package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dojo-relay/dojo/kungfu"
)

// Rule allows Limit calls per Window.
type Rule struct {
	Limit  int
	Window time.Duration
}

// DefaultLimits are the protocol's published limits.
func DefaultLimits() map[string]Rule {
	return map[string]Rule{
		"register":    {5, time.Hour},
		"owner_login": {20, 15 * time.Minute},
		"push":        {60, time.Hour},
		"get":         {300, time.Minute},
		"list":        {120, time.Minute},
		// Rooms: every room and assignment write, starts, and reads.
		"thread_write":    {120, time.Minute},
		"thread_start":    {30, time.Hour},
		"thread_read":     {600, time.Minute},
		"notify_register": {5, time.Hour},
		// Tasks.
		"task_submit": {120, time.Minute},
		"task_create": {20, time.Hour},
		// The Kizuna hub (adapters/kizuna): registrations per address,
		// letters, results and heartbeats per agent token, card reads per
		// address.
		"kz_register":  {20, time.Hour},
		"kz_send":      {120, time.Minute},
		"kz_result":    {120, time.Minute},
		"kz_heartbeat": {30, time.Minute},
		"kz_card":      {300, time.Minute},
	}
}

// ParseLimits reads "action=N/window,..." (e.g. "push=60/1h,get=300/1m")
// over the defaults. "off" disables every limit.
func ParseLimits(s string) (map[string]Rule, error) {
	rules := DefaultLimits()
	s = strings.TrimSpace(s)
	if s == "" {
		return rules, nil
	}
	if s == "off" {
		return map[string]Rule{}, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		name, spec, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, w, ok2 := strings.Cut(spec, "/")
		if !ok || !ok2 {
			return nil, fmt.Errorf("rate limit %q: want action=N/window", part)
		}
		limit, err := strconv.Atoi(n)
		if err != nil || limit < 0 {
			return nil, fmt.Errorf("rate limit %q: bad count", part)
		}
		window, err := time.ParseDuration(w)
		if err != nil || window <= 0 {
			return nil, fmt.Errorf("rate limit %q: bad window", part)
		}
		rules[name] = Rule{limit, window}
	}
	return rules, nil
}

// Limiter keeps sliding windows in Redis, so every dojo process shares them.
type Limiter struct {
	Redis  redis.UniversalClient
	Prefix string
	Rules  map[string]Rule
}

// The window is a sorted set of hit timestamps. Redis's own clock decides,
// so processes with skewed clocks still agree.
var slidingWindow = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) < limit then
  redis.call('ZADD', KEYS[1], now, now .. '-' .. ARGV[3])
  redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
  return 0
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return tonumber(oldest[2]) + window - now
`)

// Allow charges one hit of action to subject. It returns 0 when allowed,
// otherwise how long until the oldest hit leaves the window.
func (l *Limiter) Allow(ctx context.Context, action, subject string) (time.Duration, error) {
	rule, ok := l.Rules[action]
	if !ok || l.Redis == nil {
		return 0, nil
	}
	if rule.Limit == 0 {
		return rule.Window, nil
	}
	key := l.Prefix + "rl:" + action + ":" + subject
	wait, err := slidingWindow.Run(ctx, l.Redis, []string{key},
		rule.Window.Microseconds(), rule.Limit, hitID()).Int64()
	if err != nil {
		return 0, fmt.Errorf("rate limit %s: %w: %w", action, errRedis, err)
	}
	return time.Duration(wait) * time.Microsecond, nil
}

// hitID tells apart two hits stamped in the same microsecond: a random
// name for this process and a counter, so no call pays for randomness.
func hitID() string {
	return process + strconv.FormatUint(hits.Add(1), 36)
}

var (
	process = func() string {
		var b [6]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:]) + "."
	}()
	hits atomic.Uint64
)

// errRedis marks a limit that could not be read because Redis failed. The
// request cannot be judged, which is neither the caller's fault nor a bug:
// it is refused as SERVICE_UNAVAILABLE and the caller comes back later.
var errRedis = errors.New("redis unavailable")

// unavailableRetry is the retry_after, in seconds, of SERVICE_UNAVAILABLE:
// long enough not to hammer a Redis that is restarting, short enough that
// agents resume soon after it is back.
const unavailableRetry = 5

// unavailable refuses a call Redis could not judge. The real error stays in
// the log; the caller learns only that it should wait.
func (s *Server) unavailable(ctx context.Context, name string, err error) envelope {
	s.log.WarnContext(ctx, "refused: redis unavailable", "tool", name, "err", err)
	secs := unavailableRetry
	return refusal(&kungfu.Error{Code: kungfu.CodeServiceUnavailable,
		Message: "the service is briefly unavailable; retry after " + itoa(int64(secs)) + "s",
		Details: map[string]any{"retry_after": secs}, RetryAfter: &secs})
}

// seconds rounds a wait up to whole seconds, at least 1.
func seconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

// JoinGuard counts failed room joins per account in a fixed Redis window:
// after MaxFailures in Window every join answers KEY_INVALID, so keys
// cannot be guessed by any number of processes together.
type JoinGuard struct {
	Redis       redis.UniversalClient
	Prefix      string
	MaxFailures int64
	Window      time.Duration
}

func (g *JoinGuard) key(accountID int64) string {
	return g.Prefix + "joinfail:" + strconv.FormatInt(accountID, 10)
}

// Blocked reports whether the account used up its failures.
func (g *JoinGuard) Blocked(ctx context.Context, accountID int64) (bool, error) {
	n, err := g.Redis.Get(ctx, g.key(accountID)).Int64()
	if err == redis.Nil {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("join guard: %w: %w", errRedis, err)
	}
	return n >= g.MaxFailures, nil
}

// Failed records one failed join.
func (g *JoinGuard) Failed(ctx context.Context, accountID int64) error {
	k := g.key(accountID)
	pipe := g.Redis.TxPipeline()
	pipe.Incr(ctx, k)
	pipe.ExpireNX(ctx, k, g.Window)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("join guard: %w: %w", errRedis, err)
	}
	return nil
}
