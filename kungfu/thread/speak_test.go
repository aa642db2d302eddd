package thread

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/kungfu/memory"
)

// speakRoom is a room with a governor (alice), a speaker (bob) and an
// observer (carol), and dave who is not a member.
type speakRoom struct {
	db                      *pgxpool.Pool
	s                       *Service
	alice, bob, carol, dave kungfu.Caller
	code                    string
	id                      int64
}

func newSpeakRoom(t *testing.T) *speakRoom {
	t.Helper()
	db, _ := kungfutest.Pool(t)
	ctx := context.Background()
	f := &speakRoom{db: db, s: &Service{DB: db, Now: kungfu.SystemClock}}
	for _, c := range []*kungfu.Caller{&f.alice, &f.bob, &f.carol, &f.dave} {
		c.Name = "speak_" + newCode()
		if err := db.QueryRow(ctx, `INSERT INTO accounts (name, password_hash, created_at, updated_at)
			VALUES ($1, 'x', now(), now()) RETURNING id`, c.Name).Scan(&c.AccountID); err != nil {
			t.Fatal(err)
		}
	}
	st, err := f.s.Start(ctx, f.alice, "speak", false, "", Idem{})
	if err != nil {
		t.Fatal(err)
	}
	f.code = st.(Started).Thread.Code
	if err := db.QueryRow(ctx, `SELECT id FROM threads WHERE code = $1`, f.code).Scan(&f.id); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO thread_members (thread_id, account_id, role, joined_at)
		VALUES ($1, $2, 'speaker', now()), ($1, $3, 'observer', now())`, f.id, f.bob.AccountID, f.carol.AccountID); err != nil {
		t.Fatal(err)
	}
	return f
}

// tally is what a post can write, counted across the database.
type tally struct {
	memories, revisions, entries, receipts, fulfilled, nextSeq int64
}

func (f *speakRoom) tally(t *testing.T) tally {
	t.Helper()
	var c tally
	if err := f.db.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM memories), (SELECT count(*) FROM memory_revisions),
		(SELECT count(*) FROM thread_entries), (SELECT count(*) FROM thread_receipts),
		(SELECT count(*) FROM thread_receipts WHERE state = 'fulfilled'),
		(SELECT sum(next_seq) FROM threads)`).
		Scan(&c.memories, &c.revisions, &c.entries, &c.receipts, &c.fulfilled, &c.nextSeq); err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *speakRoom) post(t *testing.T, who kungfu.Caller, in PostInput) Posted {
	t.Helper()
	in.Thread = f.code
	out, err := f.s.Post(context.Background(), who, in, Idem{})
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	return out.(Posted)
}

// A post with new content writes exactly a memory head, its revision 1 (as
// memory_put writes them), the entry pinning it, the asked members'
// receipts, and moves the room's sequence on; a refused post writes
// nothing.
func TestPostNewContentRows(t *testing.T) {
	t.Parallel()
	f := newSpeakRoom(t)
	ctx := context.Background()
	text := "First line\nand the rest of what alice has to say"

	before := f.tally(t)
	p := f.post(t, f.alice, PostInput{Content: &text, Ask: []string{f.bob.Name}})
	if got, want := f.tally(t), (tally{before.memories + 1, before.revisions + 1, before.entries + 1, before.receipts + 1,
		before.fulfilled, before.nextSeq + 1}); got != want {
		t.Fatalf("after a post: %+v, want %+v", got, want)
	}
	if p.Seq != 1 || p.Revision != 1 || len(p.Memory) != 12 || p.Fulfilled || !slices.Equal(p.Asked, []string{f.bob.Name}) {
		t.Fatalf("posted %+v", p)
	}

	var (
		m struct {
			account                    int64
			origin, visibility, status string
			revision                   int
			created, updated           time.Time
			deleted                    *time.Time
		}
		r struct {
			revision                              int
			title, description, content, checksum string
			tags                                  []string
			created                               time.Time
		}
		e struct {
			thread, seq, author, memory int64
			revision                    int
			summary                     string
			replyTo                     *int64
			created                     time.Time
		}
		memID int64
	)
	if err := f.db.QueryRow(ctx, `SELECT id, account_id, origin, visibility, status, revision, created_at, updated_at, deleted_at
		FROM memories WHERE code = $1`, p.Memory).
		Scan(&memID, &m.account, &m.origin, &m.visibility, &m.status, &m.revision, &m.created, &m.updated, &m.deleted); err != nil {
		t.Fatal(err)
	}
	if err := f.db.QueryRow(ctx, `SELECT revision, title, tags, description, content, checksum, created_at
		FROM memory_revisions WHERE memory_id = $1`, memID).
		Scan(&r.revision, &r.title, &r.tags, &r.description, &r.content, &r.checksum, &r.created); err != nil {
		t.Fatal(err)
	}
	if err := f.db.QueryRow(ctx, `SELECT thread_id, seq, author_id, memory_id, revision, summary, reply_to, created_at
		FROM thread_entries WHERE id = $1`, p.Entry).
		Scan(&e.thread, &e.seq, &e.author, &e.memory, &e.revision, &e.summary, &e.replyTo, &e.created); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(text))
	at := p.At
	if m.account != f.alice.AccountID || m.origin != "thread" || m.visibility != "private" || m.status != "active" ||
		m.revision != 1 || !m.created.Equal(at) || !m.updated.Equal(at) || m.deleted != nil {
		t.Errorf("memory head %+v (posted at %v)", m, at)
	}
	if r.revision != 1 || r.title != "First line" || !slices.Equal(r.tags, []string{"thread"}) || r.description != "" ||
		r.content != text || r.checksum != hex.EncodeToString(sum[:]) || !r.created.Equal(at) {
		t.Errorf("memory revision %+v", r)
	}
	if e.thread != f.id || e.seq != 1 || e.author != f.alice.AccountID || e.memory != memID || e.revision != 1 ||
		e.summary != text || e.replyTo != nil || !e.created.Equal(at) {
		t.Errorf("entry %+v", e)
	}

	// Bob's reply fulfils his receipt; it asks alice back.
	reply := "noted"
	before = f.tally(t)
	p2 := f.post(t, f.bob, PostInput{Content: &reply, ReplyTo: p.Entry})
	if got, want := f.tally(t), (tally{before.memories + 1, before.revisions + 1, before.entries + 1, before.receipts + 1,
		before.fulfilled + 1, before.nextSeq + 1}); got != want || !p2.Fulfilled || p2.Seq != 2 {
		t.Fatalf("after a reply: %+v, want %+v; posted %+v", got, want, p2)
	}

	// Refusals write nothing.
	before = f.tally(t)
	for _, c := range []struct {
		who  kungfu.Caller
		in   PostInput
		code string
	}{
		{f.carol, PostInput{Content: &text}, kungfu.CodeReadOnly},
		{f.dave, PostInput{Content: &text}, kungfu.CodeNotMember},
		{f.alice, PostInput{Content: &text, ReplyTo: p.Entry + 1000}, kungfu.CodeInvalidTarget},
		{f.alice, PostInput{Content: &text, Ask: []string{f.dave.Name}}, kungfu.CodeInvalidTarget},
	} {
		c.in.Thread = f.code
		_, err := f.s.Post(ctx, c.who, c.in, Idem{})
		if e := kungfu.AsError(err); e == nil || e.Code != c.code {
			t.Errorf("%s posting %+v: %v, want %s", c.who.Name, c.in, err, c.code)
		}
	}
	if got := f.tally(t); got != before {
		t.Fatalf("refused posts wrote: %+v, want %+v", got, before)
	}
}

// Pinning an existing memory writes no memory rows.
func TestPostPinnedRows(t *testing.T) {
	t.Parallel()
	f := newSpeakRoom(t)
	var m memory.Memory
	err := pgx.BeginFunc(context.Background(), f.db, func(tx pgx.Tx) error {
		var err error
		m, err = memory.Insert(context.Background(), tx, f.alice.AccountID, "standalone",
			memory.Draft{Title: "pinned", Tags: []string{"x"}, Content: "some content"}, kungfu.SystemClock())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	before := f.tally(t)
	p := f.post(t, f.alice, PostInput{Memory: m.Code, Ask: []string{}})
	if got, want := f.tally(t), (tally{before.memories, before.revisions, before.entries + 1, before.receipts,
		before.fulfilled, before.nextSeq + 1}); got != want || p.Memory != m.Code || p.Revision != 1 {
		t.Fatalf("after pinning: %+v, want %+v; posted %+v", got, want, p)
	}
}

// A drawn memory code that is taken writes nothing at all (no memory, no
// entry, no sequence step) and the post draws again, at most five times.
// Not parallel: it swaps drawMemory.
func TestPostCodeCollision(t *testing.T) {
	f := newSpeakRoom(t)
	ctx := context.Background()
	text := "first"
	taken := f.post(t, f.alice, PostInput{Content: &text, Ask: []string{}})

	collide := func(n int) *int {
		draws := 0
		drawMemory = func(accountID int64, origin string, d memory.Draft, now time.Time) (memory.Memory, []any) {
			m, args := memory.Prepare(accountID, origin, d, now)
			if draws++; draws <= n {
				m.Code, args[0] = taken.Memory, taken.Memory
			}
			return m, args
		}
		return &draws
	}
	t.Cleanup(func() { drawMemory = memory.Prepare })

	before := f.tally(t)
	draws := collide(2)
	again := "second"
	p := f.post(t, f.alice, PostInput{Content: &again, Ask: []string{}})
	if *draws != 3 || p.Memory == taken.Memory || p.Seq != taken.Seq+1 {
		t.Fatalf("%d draws, posted %+v after %+v", *draws, p, taken)
	}
	if got, want := f.tally(t), (tally{before.memories + 1, before.revisions + 1, before.entries + 1, before.receipts,
		before.fulfilled, before.nextSeq + 1}); got != want {
		t.Fatalf("after a post that collided twice: %+v, want %+v", got, want)
	}
	var content string
	if err := f.db.QueryRow(ctx, `SELECT r.content FROM memories m JOIN memory_revisions r ON r.memory_id = m.id
		JOIN thread_entries e ON e.memory_id = m.id WHERE m.code = $1 AND e.id = $2`, p.Memory, p.Entry).Scan(&content); err != nil || content != again {
		t.Fatalf("the entry pins %q, err %v", content, err)
	}
	if err := f.db.QueryRow(ctx, `SELECT r.content FROM memories m JOIN memory_revisions r ON r.memory_id = m.id
		WHERE m.code = $1`, taken.Memory).Scan(&content); err != nil || content != text {
		t.Fatalf("the taken memory holds %q, err %v", content, err)
	}

	// With an idempotency key the entry is not the transaction's last
	// write (the key's record follows): the draws still start over.
	before = f.tally(t)
	draws = collide(1)
	third := "third"
	idem := Idem{Key: "collide-1", Hash: []byte("h1")}
	raw, err := f.s.Post(ctx, f.alice, PostInput{Thread: f.code, Content: &third, Ask: []string{}}, idem)
	if err != nil || *draws != 2 {
		t.Fatalf("keyed post after a collision: %v after %d draws", err, *draws)
	}
	if got, want := f.tally(t), (tally{before.memories + 1, before.revisions + 1, before.entries + 1, before.receipts,
		before.fulfilled, before.nextSeq + 1}); got != want {
		t.Fatalf("after a keyed post that collided once: %+v, want %+v", got, want)
	}
	// The key's record is the one of the post that went through.
	again2, err := f.s.Post(ctx, f.alice, PostInput{Thread: f.code, Content: &third, Ask: []string{}}, idem)
	if err != nil || string(mustJSON(t, again2)) != string(mustJSON(t, raw)) {
		t.Fatalf("replay %s (err %v), want %s", mustJSON(t, again2), err, mustJSON(t, raw))
	}

	before = f.tally(t)
	draws = collide(5)
	_, err = f.s.Post(ctx, f.alice, PostInput{Thread: f.code, Content: &again, Ask: []string{}}, Idem{})
	if err == nil || *draws != 5 {
		t.Fatalf("five collisions: %v after %d draws", err, *draws)
	}
	if got := f.tally(t); got != before {
		t.Fatalf("a post that never drew a free code wrote: %+v, want %+v", got, before)
	}
}

// The entry's foreign keys are checked at the end of speakNew and see the
// memory revision its own CTEs wrote: a revision it did not write is
// refused, the one it wrote is accepted. An entry naming no memory at all
// is refused by the (memory_id, revision) key alone.
func TestSpeakNewForeignKeys(t *testing.T) {
	t.Parallel()
	f := newSpeakRoom(t)
	ctx := context.Background()
	now := kungfu.SystemClock()
	exec := func(rev int) error {
		_, margs := memory.Prepare(f.alice.AccountID, "thread", memory.Draft{Title: "t", Tags: []string{"thread"}, Content: "c"}, now)
		args := append([]any{f.id, int64(1), f.alice.AccountID, rev, "s", (*int64)(nil), now, []int64{}}, margs...)
		var entry int64
		var fulfilled int
		return pgx.BeginFunc(ctx, f.db, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, speakNew, args...).Scan(&entry, &fulfilled)
		})
	}
	var pgErr *pgconn.PgError
	if err := exec(2); !errors.As(err, &pgErr) || pgErr.Code != "23503" || pgErr.ConstraintName != "thread_entries_memory_id_revision_fkey" {
		t.Fatalf("an entry pinning an unwritten revision: %v", err)
	}
	if err := exec(1); err != nil {
		t.Fatalf("an entry pinning the revision its statement wrote: %v", err)
	}
	_, err := f.db.Exec(ctx, `INSERT INTO thread_entries (thread_id, seq, author_id, memory_id, revision, created_at)
		VALUES ($1, 99, $2, -1, 1, now())`, f.id, f.alice.AccountID)
	if !errors.As(err, &pgErr) || pgErr.Code != "23503" || pgErr.ConstraintName != "thread_entries_memory_id_revision_fkey" {
		t.Fatalf("an entry pinning no memory: %v", err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	if raw, ok := v.(json.RawMessage); ok {
		return raw
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
