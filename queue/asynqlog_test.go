package queue

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Reproduces issue 7 item 9: while Redis was down asynq's pollers logged
// the same dial error every 200 ms for as long as the outage lasted.
func TestAsynqLogHoldsBackRepeats(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newAsynqLog(slog.New(slog.NewTextHandler(&buf, nil)), func() time.Time { return now })
	lines := func() []string {
		s := strings.TrimSpace(buf.String())
		buf.Reset()
		if s == "" {
			return nil
		}
		return strings.Split(s, "\n")
	}
	const refused = "Failed to forward scheduled tasks: dial tcp 127.0.0.1:6379: connect: connection refused"

	// Ten minutes of an outage, polled every 200 ms: 3000 failures.
	for range 3000 {
		l.Error(refused)
		now = now.Add(200 * time.Millisecond)
	}
	got := lines()
	// Logged at 0, 1, 3, 7, 15, 31, 63, 127, 255 s, then every 5 min.
	if len(got) < 9 || len(got) > 11 {
		t.Fatalf("%d lines for 3000 repeats over 10 min:\n%s", len(got), strings.Join(got, "\n"))
	}
	if strings.Contains(got[0], "held_back") || !strings.Contains(got[1], "held_back=4") || !strings.Contains(got[0], "level=ERROR") {
		t.Fatalf("first lines: %q, %q", got[0], got[1])
	}

	// Another message is judged on its own, and a warning stays a warning.
	l.Warn("Dequeue error: EOF")
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "level=WARN") {
		t.Fatalf("a new message was held back: %q", got)
	}

	// Redis is back for a minute; the next outage shows at once.
	now = now.Add(repeatQuiet + time.Second)
	l.Error(refused)
	if got := lines(); len(got) != 1 || strings.Contains(got[0], "held_back") {
		t.Fatalf("a new outage after a quiet minute: %q", got)
	}

	// Messages that never repeat (they name task ids) cannot grow the state
	// without end.
	for i := range 10 * repeatKeep {
		l.Warn("Failed to extend lease for task ", i)
	}
	if n := len(l.r.seen); n > repeatKeep {
		t.Fatalf("%d messages remembered", n)
	}
	if got := lines(); len(got) != 10*repeatKeep {
		t.Fatalf("distinct messages were held back: %d lines", len(got))
	}

	// Debug and info lines pass through at debug level.
	l.Info("Starting processing")
	if got := lines(); len(got) != 0 {
		t.Fatalf("info at the default level: %q", got)
	}
}
