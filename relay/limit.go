package relay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
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
//
// Checks from concurrent requests travel together: while one pipeline of
// checks is on its way to Redis, the next ones queue, and go as the next
// pipeline, judged by one script run. Every check still counts against
// Redis's one window, so limits stay exact across processes; what the
// queue saves is round trips and script runs. A pipeline out for longer
// than stalled lets another start beside it, so a slow connection or a
// Redis that went away does not hold every later check behind it.
type Limiter struct {
	Redis  redis.UniversalClient
	Prefix string
	Rules  map[string]Rule

	mu       sync.Mutex
	queue    []*Check
	senders  int
	lastSend time.Time
}

const (
	// stalled is how long a pipeline may be out before checks queued
	// behind it start one of their own, at most maxSenders in all.
	stalled    = 50 * time.Millisecond
	maxSenders = 8
	// checkTimeout bounds the wait for a verdict. Past it the call is
	// refused SERVICE_UNAVAILABLE, as when Redis cannot be reached.
	checkTimeout = 5 * time.Second
)

// The window is a list of hit times, newest first, in microseconds of
// Redis's own clock, so processes with skewed clocks still agree.
//
// A hit is pushed first and taken back if it is one too many, so an allowed
// hit, by far the common case, costs the push and the expiry. Hits that left
// the window are dropped from the old end when the count says the limit is
// reached, and every eighth push otherwise, sixteen at a time: a key never
// holds much more than its window, and a check costs the same however many
// hits that is. Should Redis's clock step back, a hit stays counted a little
// longer than its window: stricter, never looser.
//
// One run judges a whole batch, key by key in order, as if each check had
// come alone at the same instant: the script's fixed cost is paid once per
// batch. KEYS are the windows; ARGV holds each one's length in
// microseconds and its limit. It answers one wait per key, 0 for allowed.
// Every key of a batch is named, so a Redis Cluster would need a batch per
// slot; Dojo talks to one Redis node.
var slidingWindow = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local stamp = t[1] .. string.format('%06d', tonumber(t[2]))
-- trim drops up to 16 hits older than cut from the old end; it says how
-- many, and whether there may be more.
local function trim(key, cut)
  local tail = redis.call('LRANGE', key, -16, -1)
  local k = 0
  for j = #tail, 1, -1 do
    if tonumber(tail[j]) > cut then break end
    k = k + 1
  end
  if k > 0 then redis.call('LTRIM', key, 0, -(k + 1)) end
  return k, k > 0 and k == #tail
end
local out = {}
for i, key in ipairs(KEYS) do
  local window = tonumber(ARGV[2 * i - 1])
  local limit = tonumber(ARGV[2 * i])
  local n = redis.call('LPUSH', key, stamp)
  if n > limit or n % 8 == 0 then
    local k, more
    repeat
      k, more = trim(key, now - window)
      n = n - k
    until not (more and n > limit)
  end
  if n > limit then
    redis.call('LPOP', key)
    out[i] = tonumber(redis.call('LINDEX', key, -1)) + window - now
  else
    redis.call('PEXPIRE', key, math.ceil(window / 1000))
    out[i] = 0
  end
end
return out
`)

// maxScriptBatch bounds one script run: Redis serves nobody else meanwhile.
const maxScriptBatch = 128

// Check is one hit of an action on its way to Redis.
type Check struct {
	ctx    context.Context
	action string
	key    string
	rule   Rule
	done   chan struct{}
	wait   time.Duration
	err    error
	// refused, when set, runs as soon as the hit is refused or fails.
	refused func()
}

// Allow charges one hit of action to subject. It returns 0 when allowed,
// otherwise how long until the oldest hit leaves the window.
func (l *Limiter) Allow(ctx context.Context, action, subject string) (time.Duration, error) {
	return l.Start(ctx, action, subject, nil).Wait()
}

// Start sends one hit of action for subject on its way and returns at
// once; Wait gives the verdict. refused, if not nil, runs as soon as the
// hit is refused or cannot be judged, so work begun beside it can stop.
func (l *Limiter) Start(ctx context.Context, action, subject string, refused func()) *Check {
	c := &Check{ctx: ctx, action: action, done: make(chan struct{}), refused: refused}
	rule, ok := l.Rules[action]
	switch {
	case !ok || l.Redis == nil:
		close(c.done)
		return c
	case rule.Limit == 0:
		c.finish(rule.Window, nil)
		return c
	}
	c.key, c.rule = l.Prefix+"rlq:"+action+":"+subject, rule
	now := time.Now()
	l.mu.Lock()
	l.queue = append(l.queue, c)
	start := l.senders == 0 || (l.senders < maxSenders && now.Sub(l.lastSend) > stalled)
	if start {
		l.senders++
		l.lastSend = now
	}
	l.mu.Unlock()
	if start {
		go l.send()
	}
	return c
}

// Wait returns the verdict: 0 when allowed, otherwise the wait until the
// oldest hit leaves the window.
func (c *Check) Wait() (time.Duration, error) {
	select {
	case <-c.done:
		return c.wait, c.err
	default:
	}
	t := time.NewTimer(checkTimeout)
	defer t.Stop()
	select {
	case <-c.done:
		return c.wait, c.err
	case <-c.ctx.Done():
		return 0, fmt.Errorf("rate limit %s: %w: %w", c.action, errRedis, c.ctx.Err())
	case <-t.C:
		return 0, fmt.Errorf("rate limit %s: %w: no verdict within %s", c.action, errRedis, checkTimeout)
	}
}

func (c *Check) finish(wait time.Duration, err error) {
	c.wait, c.err = wait, err
	if (err != nil || wait > 0) && c.refused != nil {
		c.refused()
	}
	close(c.done)
}

// send empties the queue one pipeline at a time, and ends when it is empty.
func (l *Limiter) send() {
	for {
		// Let the requests that are ready to run start their checks first:
		// under load the batch grows (from about 2.5 checks to about 3 in
		// `dojo bench`), and Redis wakes once for more of them. Idle, this
		// returns at once: there is nothing else to run.
		runtime.Gosched()
		l.mu.Lock()
		batch := l.queue
		l.queue = nil
		if len(batch) == 0 {
			l.senders--
			l.mu.Unlock()
			return
		}
		l.lastSend = time.Now()
		l.mu.Unlock()
		l.run(batch)
	}
}

// run judges one batch of checks: a script run per maxScriptBatch checks,
// all in one pipeline. A check whose caller has gone is not sent, so it
// charges nothing. Runs answered NOSCRIPT (Redis restarted or flushed) had
// no effect; they go again once the script is loaded.
func (l *Limiter) run(batch []*Check) {
	// Nobody waits longer than checkTimeout for a verdict; past it go-redis
	// stops retrying too.
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	fail := func(cs []*Check, err error) {
		for _, c := range cs {
			c.finish(0, fmt.Errorf("rate limit %s: %w: %w", c.action, errRedis, err))
		}
	}
	// present drops the checks whose caller has gone, charging them nothing.
	present := func(cs []*Check) []*Check {
		live := cs[:0]
		for _, c := range cs {
			if err := c.ctx.Err(); err != nil {
				fail([]*Check{c}, err)
				continue
			}
			live = append(live, c)
		}
		return live
	}
	live := present(batch)
	for try := 0; len(live) > 0; try++ {
		pipe := l.Redis.Pipeline()
		chunks := slices.Collect(slices.Chunk(live, maxScriptBatch))
		runs := make([]*redis.Cmd, len(chunks))
		for n, chunk := range chunks {
			keys := make([]string, len(chunk))
			args := make([]any, 0, 2*len(chunk))
			for i, c := range chunk {
				keys[i] = c.key
				args = append(args, c.rule.Window.Microseconds(), c.rule.Limit)
			}
			runs[n] = slidingWindow.EvalSha(ctx, pipe, keys, args...)
		}
		_, _ = pipe.Exec(ctx) // each run carries its own error
		var again []*Check
		for i, chunk := range chunks {
			waits, err := runs[i].Int64Slice()
			switch {
			case err != nil && try == 0 && redis.HasErrorPrefix(err, "NOSCRIPT"):
				again = append(again, chunk...)
			case err != nil:
				fail(chunk, err)
			case len(waits) != len(chunk):
				fail(chunk, fmt.Errorf("script answered %d verdicts for %d checks", len(waits), len(chunk)))
			default:
				for j, c := range chunk {
					c.finish(time.Duration(waits[j])*time.Microsecond, nil)
				}
			}
		}
		if len(again) > 0 {
			if err := slidingWindow.Load(ctx, l.Redis).Err(); err != nil {
				fail(again, err)
				return
			}
		}
		live = present(again)
	}
}

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
