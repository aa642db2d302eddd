package queue

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// asynqLog sends asynq's logs to slog. Its info lines (start, stop, and
// advice about signals that Dojo handles itself) are debug here.
//
// While Redis is down every asynq poller reports the same failure several
// times a second. A warning or error that repeats is held back: after it
// is logged it stays quiet for 1 s, then 2 s, 4 s … up to 5 min, and the
// line that ends a wait says how many were held back. A message unseen for
// a minute (Redis came back) starts over, so a new outage shows at once.
type asynqLog struct {
	log *slog.Logger
	r   *repeats
}

func newAsynqLog(log *slog.Logger, now func() time.Time) asynqLog {
	return asynqLog{log: log, r: &repeats{now: now, seen: map[string]*repeat{}}}
}

func (l asynqLog) Debug(args ...any) { l.log.Debug(fmt.Sprint(args...), "component", "asynq") }
func (l asynqLog) Info(args ...any)  { l.log.Debug(fmt.Sprint(args...), "component", "asynq") }
func (l asynqLog) Warn(args ...any)  { l.emit(slog.LevelWarn, args) }
func (l asynqLog) Error(args ...any) { l.emit(slog.LevelError, args) }

// Fatal is only logged: a library must not end the process.
func (l asynqLog) Fatal(args ...any) { l.emit(slog.LevelError, args) }

func (l asynqLog) emit(level slog.Level, args []any) {
	msg := fmt.Sprint(args...)
	ok, held := l.r.admit(msg)
	if !ok {
		return
	}
	attrs := []any{"component", "asynq"}
	if held > 0 {
		attrs = append(attrs, "held_back", held)
	}
	l.log.Log(context.Background(), level, msg, attrs...)
}

const (
	repeatFirst = time.Second
	repeatMax   = 5 * time.Minute
	repeatQuiet = time.Minute
	// repeatKeep bounds the messages remembered; messages that embed task
	// ids never repeat exactly and must not grow the map without end.
	repeatKeep = 256
)

// repeats decides which repeats of a message reach the log. Its state is
// per process, which is enough for a log.
type repeats struct {
	mu   sync.Mutex
	now  func() time.Time
	seen map[string]*repeat
}

type repeat struct {
	last time.Time     // last seen
	next time.Time     // logged again from then on
	wait time.Duration // the current hold
	held int           // repeats not logged since the last line
}

// admit reports whether msg is logged now and how many repeats of it were
// held back since its previous line.
func (r *repeats) admit(msg string) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	p := r.seen[msg]
	if p == nil || now.Sub(p.last) > repeatQuiet {
		if p == nil && len(r.seen) >= repeatKeep {
			// Forget only messages that went quiet: clearing everything
			// would let every steady repeater through again at once.
			for m, q := range r.seen {
				if now.Sub(q.last) > repeatQuiet {
					delete(r.seen, m)
				}
			}
			if len(r.seen) >= repeatKeep {
				return true, 0 // one of many distinct lines: logged, not tracked
			}
		}
		r.seen[msg] = &repeat{last: now, next: now.Add(repeatFirst), wait: repeatFirst}
		return true, 0
	}
	p.last = now
	if now.Before(p.next) {
		p.held++
		return false, 0
	}
	held := p.held
	p.held = 0
	p.wait = min(2*p.wait, repeatMax)
	p.next = now.Add(p.wait)
	return true, held
}
