package relay_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
)

// wire counts what a Dojo process sends PostgreSQL. It sits on the
// connection itself rather than inside pgx so the count covers every
// statement of every package (BEGIN and COMMIT included) and needs no hook
// in the server: statements are Execute and simple Query messages, round
// trips are the Syncs that end executed work plus simple Queries. A Sync
// that only prepares a statement is pgx's per-connection cache warming up
// and is left out, so counts do not depend on which pooled connection
// served a call.
type wire struct {
	ln        net.Listener
	upstream  string
	stmts     atomic.Int64
	trips     atomic.Int64
	mu        sync.Mutex
	conns     []net.Conn
	closeOnce sync.Once
}

// count is a snapshot of a wire's counters.
type count struct{ stmts, trips int64 }

func (c count) sub(d count) count { return count{c.stmts - d.stmts, c.trips - d.trips} }

func (c count) String() string {
	return fmt.Sprintf("%d statements in %d round trips", c.stmts, c.trips)
}

// newWire returns a DSN that reaches dsn's server through a counting
// proxy on loopback.
func newWire(t testing.TB, dsn string) (*wire, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &wire{ln: ln, upstream: u.Host}
	go w.accept()
	t.Cleanup(w.close)
	u.Host = ln.Addr().String()
	return w, u.String()
}

func (w *wire) snap() count { return count{w.stmts.Load(), w.trips.Load()} }

func (w *wire) close() {
	w.closeOnce.Do(func() {
		w.ln.Close()
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, c := range w.conns {
			c.Close()
		}
	})
}

func (w *wire) accept() {
	for {
		c, err := w.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", w.upstream)
		if err != nil {
			c.Close()
			continue
		}
		w.mu.Lock()
		w.conns = append(w.conns, c, up)
		w.mu.Unlock()
		go func() {
			_, _ = io.Copy(c, up)
			c.Close()
		}()
		go func() {
			_ = w.relay(c, up)
			up.Close()
		}()
	}
}

// relay forwards the frontend stream message by message, counting.
func (w *wire) relay(client io.Reader, up io.Writer) error {
	r := bufio.NewReader(client)
	// Startup phase: untyped messages until one that is not an SSL, GSS
	// or cancel request.
	for {
		msg, err := untyped(r)
		if err != nil {
			return err
		}
		if _, err := up.Write(msg); err != nil {
			return err
		}
		code := binary.BigEndian.Uint32(msg[4:8])
		if code != 80877103 && code != 80877104 && code != 80877102 {
			break
		}
	}
	executed := false
	hdr := make([]byte, 5)
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			return err
		}
		n := int(binary.BigEndian.Uint32(hdr[1:])) - 4
		if n < 0 || n > 64<<20 {
			return fmt.Errorf("wire: frontend message of %d bytes", n)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return err
		}
		switch hdr[0] {
		case 'Q':
			// pgxpool pings a connection idle for a while: not the call's work.
			if strings.TrimRight(string(body), "\x00") != "-- ping" {
				w.stmts.Add(1)
				w.trips.Add(1)
			}
		case 'E':
			w.stmts.Add(1)
			executed = true
		case 'S':
			if executed {
				w.trips.Add(1)
			}
			executed = false
		}
		if _, err := up.Write(append(hdr, body...)); err != nil {
			return err
		}
	}
}

func untyped(r *bufio.Reader) ([]byte, error) {
	var l [4]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(l[:]))
	if n < 8 || n > 10000 {
		return nil, fmt.Errorf("wire: startup message of %d bytes", n)
	}
	msg := make([]byte, n)
	copy(msg, l[:])
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

// least runs op three times and returns the smallest count, so a
// background sweep that lands in one run does not count against the call.
func (w *wire) least(t *testing.T, op func(i int)) count {
	t.Helper()
	var best count
	for i := range 3 {
		before := w.snap()
		op(i)
		c := w.snap().sub(before)
		if i == 0 || c.stmts < best.stmts || (c.stmts == best.stmts && c.trips < best.trips) {
			best = c
		}
	}
	return best
}

// TestStatementsPerCall pins how many statements and round trips the write
// tools send PostgreSQL, beyond authenticating the caller, so a change
// that adds one shows up here. Auth is measured on its own (a call refused
// by input validation, before any handler runs) and subtracted: it belongs
// to the transport and is counted by its own tests.
func TestStatementsPerCall(t *testing.T) {
	t.Parallel()
	w, dsn := newWire(t, kungfutest.DatabaseURL(t))
	// Sweeps every hour: nothing in the background while we count.
	d := startOn(t, dsn, kungfutest.RedisPrefix(t), withSweep(time.Hour))

	alice, _ := d.register(t)
	bob, bobName := d.register(t)
	own := d.must(t, alice, "thread_start", map[string]any{"subject": "counting"}).Body["thread"].(map[string]any)["code"].(string)
	st := d.must(t, alice, "thread_start", map[string]any{"subject": "pair", "key": true})
	pair := st.Body["thread"].(map[string]any)["code"].(string)
	d.must(t, bob, "thread_join", map[string]any{"key": st.str("key")})

	auth := w.least(t, func(int) {
		expect(t, d.call(t, alice, "thread_post", map[string]any{"thread": 1}), 422, "VALIDATION_FAILED")
	})

	// The receiver snapshots the counter when the POST arrives, which
	// splits work_submit into its intake and its settle.
	var atPost atomic.Pointer[count]
	recv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		c := w.snap()
		atPost.Store(&c)
		_, _ = io.WriteString(rw, `{"accepted":true}`)
	}))
	t.Cleanup(recv.Close)
	pub, _ := d.register(t)
	code := newTask(t, d, pub, recv.URL, 1, 20, nil)
	d.must(t, alice, "work_submit", map[string]any{"code": code, "request_key": "warm", "payload": map[string]any{"n": 0}})

	type want struct {
		name      string
		got, want count
	}
	var checks []want
	post := w.least(t, func(i int) {
		d.must(t, alice, "thread_post", map[string]any{"thread": own, "content": fmt.Sprintf("note %d", i), "ask": []any{}})
	})
	checks = append(checks, want{"thread_post own room, nobody asked", post.sub(auth), count{5, 2}})
	asked := w.least(t, func(i int) {
		r := d.must(t, alice, "thread_post", map[string]any{"thread": pair, "content": fmt.Sprintf("question %d", i)})
		if a := r.Body["asked"].([]any); len(a) != 1 || a[0] != bobName {
			t.Fatalf("asked %v, want [%s]", a, bobName)
		}
	})
	checks = append(checks, want{"thread_post asking one member", asked.sub(auth), count{8, 6}})

	var intake, settle count
	submit := w.least(t, func(i int) {
		atPost.Store(nil)
		before := w.snap()
		r := d.must(t, bob, "work_submit", map[string]any{"code": code, "request_key": fmt.Sprintf("k%d", i), "payload": map[string]any{"n": i}})
		if r.str("state") != "settled" {
			t.Fatalf("work_submit: %s", r.Raw)
		}
		mid := atPost.Load()
		if mid == nil {
			t.Fatal("the receiver saw no POST")
		}
		after := w.snap()
		in, se := mid.sub(before).sub(auth), after.sub(*mid)
		if i == 0 || in.stmts+se.stmts < intake.stmts+settle.stmts {
			intake, settle = in, se
		}
	})
	checks = append(checks,
		want{"work_submit -> settled", submit.sub(auth), count{18, 5}},
		want{"work_submit intake (before the POST)", intake, count{7, 3}},
		want{"work_submit settle (after the POST)", settle, count{11, 2}},
	)
	t.Logf("auth: %s", auth)
	for _, c := range checks {
		t.Logf("%s: %s", c.name, c.got)
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %s, want %s", c.name, c.got, c.want)
		}
	}
}

// TestThreadPostMemoryRow checks that the memory an entry's content becomes
// is stored exactly as memory_put stores one (thread_post writes it in its
// own statement): same checksum, defaults and revision shape.
func TestThreadPostMemoryRow(t *testing.T) {
	t.Parallel()
	d := start(t)
	key, _ := d.register(t)
	room := d.must(t, key, "thread_start", map[string]any{"subject": "rows"}).Body["thread"].(map[string]any)["code"].(string)
	text := "First line of the entry\n" + content(300)
	p := d.must(t, key, "thread_post", map[string]any{"thread": room, "content": text, "summary": "a summary", "ask": []any{}})
	put := d.must(t, key, "memory_put", putArgs("content", text))
	if p.num("revision") != 1 || len(p.str("memory")) != 12 {
		t.Fatalf("thread_post: %s", p.Raw)
	}
	type stored struct {
		origin, visibility, status, title, description, checksum string
		tags                                                     []string
		revision                                                 int
	}
	read := func(code string) stored {
		var s stored
		err := d.App.DB.QueryRow(context.Background(), `SELECT m.origin, m.visibility, m.status, m.revision, r.title, r.tags, r.description, r.checksum
			FROM memories m JOIN memory_revisions r ON r.memory_id = m.id AND r.revision = m.revision WHERE m.code = $1`, code).
			Scan(&s.origin, &s.visibility, &s.status, &s.revision, &s.title, &s.tags, &s.description, &s.checksum)
		if err != nil {
			t.Fatalf("read %s: %v", code, err)
		}
		return s
	}
	got, ref := read(p.str("memory")), read(put.str("code"))
	if got.origin != "thread" || got.title != "a summary" || len(got.tags) != 1 || got.tags[0] != "thread" {
		t.Fatalf("thread memory %+v", got)
	}
	if got.checksum != ref.checksum || got.visibility != ref.visibility || got.status != ref.status ||
		got.revision != ref.revision || got.description != ref.description {
		t.Fatalf("thread memory %+v differs from memory_put's %+v", got, ref)
	}
	// The entry pins it, and the room's sequence moved on.
	var pinned string
	var next int64
	if err := d.App.DB.QueryRow(context.Background(), `SELECT m.code, t.next_seq FROM thread_entries e JOIN memories m ON m.id = e.memory_id
		JOIN threads t ON t.id = e.thread_id WHERE e.id = $1`, p.num("entry")).Scan(&pinned, &next); err != nil || pinned != p.str("memory") || next != p.num("seq")+1 {
		t.Fatalf("entry pins %s (next seq %d), err %v; posted %s", pinned, next, err, p.Raw)
	}
}
