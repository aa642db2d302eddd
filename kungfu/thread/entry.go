package thread

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/credential"
	"github.com/dojo-relay/dojo/kungfu/memory"
)

// PostInput is one entry to speak.
type PostInput struct {
	Thread  string
	Content *string
	Memory  string
	Summary string
	ReplyTo int64
	// Ask nil means "apply the default rules"; an empty slice means
	// "notify only, nobody owes".
	Ask    []string
	Assign *AssignInput
}

// AssignInput creates an assignment riding the entry.
type AssignInput struct {
	To           string
	Requirements string
	OutputSchema json.RawMessage
	DeliverDue   int
	JudgeDue     int
}

// Posted is thread_post's result and replay snapshot.
type Posted struct {
	Thread    string     `json:"thread"`
	Entry     int64      `json:"entry"`
	Seq       int64      `json:"seq"`
	Memory    string     `json:"memory"`
	Revision  int        `json:"revision"`
	Asked     []string   `json:"asked"`
	Fulfilled bool       `json:"fulfilled"`
	Assign    *AssignRef `json:"assign,omitempty"`
	At        time.Time  `json:"at"`
}

// AssignRef names an assignment and its state.
type AssignRef struct {
	ID    int64  `json:"id"`
	State string `json:"state"`
}

type member struct {
	id   int64
	name string
	role string
}

// Post speaks one entry. It pins content (a new thread memory) or an
// existing memory version, freezes who must respond, fulfils the author's
// own receipt on the entry it replies to, and may create an assignment.
func (s *Service) Post(ctx context.Context, who kungfu.Caller, in PostInput, idem Idem) (any, error) {
	if (in.Content == nil) == (in.Memory == "") {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "content", Message: "give exactly one of content or memory"})
	}
	in.Summary = strings.TrimSpace(in.Summary)
	if utf8.RuneCountInString(in.Summary) > MaxSummary {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "summary", Message: fmt.Sprintf("at most %d characters", MaxSummary)})
	}
	if in.Content != nil {
		c := *in.Content
		switch {
		case strings.TrimSpace(c) == "":
			return nil, kungfu.Invalid(kungfu.FieldError{Field: "content", Message: "must not be empty"})
		case len(c) > MaxEntry:
			return nil, kungfu.Errorf(kungfu.CodeContentTooLarge, "content is larger than %d bytes", MaxEntry)
		case !utf8.ValidString(c):
			return nil, kungfu.Invalid(kungfu.FieldError{Field: "content", Message: "must be valid UTF-8"})
		case in.Summary == "" && utf8.RuneCountInString(c) > MaxSummary:
			return nil, kungfu.Errorf(kungfu.CodeSummaryRequired, "content over %d characters needs a summary", MaxSummary)
		}
	}
	for _, s := range []string{in.Summary, deref(in.Content)} {
		if credential.Find(s) != "" {
			return nil, kungfu.Errorf(kungfu.CodeSensitiveContent, "the entry contains a credential-shaped string; keep secrets out of rooms")
		}
	}
	if len(in.Ask) > MaxAsk {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "ask", Message: fmt.Sprintf("at most %d members", MaxAsk)})
	}
	var spec *assignSpec
	if in.Assign != nil {
		var err error
		if spec, err = checkAssign(*in.Assign); err != nil {
			return nil, err
		}
	}
	return s.run(ctx, who, "thread_post", idem, func(ctx context.Context, w *write) (any, error) {
		r, members, reply, err := w.lockMembers(ctx, in.Thread, in.ReplyTo)
		if err != nil {
			return nil, err
		}
		rl, err := roleOf(members, who.AccountID)
		if err != nil {
			return nil, err
		}
		if err := requireOpen(r); err != nil {
			return nil, err
		}
		if !canSpeak(rl) {
			return nil, kungfu.Errorf(kungfu.CodeReadOnly, "observers cannot speak in this room")
		}

		// The pinned version: new thread content, or an existing memory.
		var pin pinned
		var summary string
		if in.Content != nil {
			summary = in.Summary
			if summary == "" {
				summary = strings.TrimSpace(*in.Content)
			}
			pin = pinned{content: in.Content, title: truncate(firstLine(summary), 128), rev: 1}
		} else {
			h, err := memory.LookupHead(ctx, w.tx, in.Memory)
			if err != nil {
				return nil, err
			}
			own := h.OwnerID == who.AccountID
			switch {
			case h.Status != "active":
				return nil, kungfu.Errorf(kungfu.CodeNotFound, "memory %s is withdrawn", h.Code)
			case !own && h.Visibility != "public":
				return nil, kungfu.Errorf(kungfu.CodeInvalidTarget, "memory %s is someone else's private memory", h.Code)
			}
			pin = pinned{id: h.ID, code: h.Code, rev: h.Revision}
			summary = in.Summary
			if summary == "" {
				summary = h.Title
			}
		}

		// reply_to must be an entry of this room.
		if in.ReplyTo != 0 && reply == nil {
			return nil, kungfu.Errorf(kungfu.CodeInvalidTarget, "entry %d is not in this room", in.ReplyTo)
		}
		var replyAuthor int64
		var replyTo *int64
		if reply != nil {
			replyAuthor, replyTo = *reply, &in.ReplyTo
		}
		asked, err := responders(who.AccountID, in, members, replyAuthor)
		if err != nil {
			return nil, err
		}

		out := Posted{Thread: r.Code, Seq: r.NextSeq, Revision: pin.rev, Asked: []string{}, At: w.now}
		ids := make([]int64, len(asked))
		for i, m := range asked {
			ids[i] = m.id
			out.Asked = append(out.Asked, m.name)
		}
		var fulfilled int
		// Nothing follows a post that asks nobody and assigns nothing:
		// its entry goes with COMMIT.
		last := w.final && len(asked) == 0 && spec == nil
		if out.Entry, out.Memory, fulfilled, err = w.speak(ctx, r, pin, truncate(summary, MaxSummary), replyTo, ids, last); err != nil {
			return nil, err
		}
		out.Fulfilled = fulfilled == 1
		for _, m := range asked {
			if err := w.notify(ctx, m.id, "reply"); err != nil {
				return nil, err
			}
		}
		if spec != nil {
			to, err := findMember(members, spec.to)
			if err != nil {
				return nil, err
			}
			if !canSpeak(to.role) {
				return nil, kungfu.Errorf(kungfu.CodeInvalidTarget, "%s is an observer and cannot take assignments", to.name)
			}
			var id int64
			if err := w.tx.QueryRow(ctx, `INSERT INTO assigns (thread_id, entry_id, creator_id, assignee_id, requirements, output_schema,
				deliver_due_s, judge_due_s, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id`,
				r.ID, out.Entry, who.AccountID, to.id, spec.requirements, spec.schema, spec.deliverDue, spec.judgeDue, w.now).Scan(&id); err != nil {
				return nil, err
			}
			if err := w.notify(ctx, to.id, "assign"); err != nil {
				return nil, err
			}
			out.Assign = &AssignRef{ID: id, State: "open"}
		}
		return out, nil
	})
}

// pinned is the memory version an entry pins: new content to store as a
// thread memory at revision 1, or an existing memory's current revision.
type pinned struct {
	content *string
	title   string
	id      int64
	code    string
	rev     int
}

// speakTail writes an entry and everything riding it in one statement:
// the room's sequence moves on, the asked members' receipts are created,
// and the author's own receipt on the entry replied to is fulfilled. It
// follows a CTE m that yields the pinned memory's id; when m is empty,
// nothing is written and no row comes back.
const speakTail = `
	n AS (UPDATE threads SET next_seq = next_seq + 1 WHERE id = $1 AND EXISTS (SELECT 1 FROM m)),
	e AS (INSERT INTO thread_entries (thread_id, seq, author_id, memory_id, revision, summary, reply_to, created_at)
	      SELECT $1, $2, $3, m.id, $4, $5, $6, $7 FROM m RETURNING id),
	r AS (INSERT INTO thread_receipts (thread_id, entry_id, account_id, created_at)
	      SELECT $1, e.id, a, $7 FROM e, unnest($8::bigint[]) a),
	f AS (UPDATE thread_receipts SET state = 'fulfilled', resolution = 'reply', ended_at = $7
	      WHERE entry_id = $6 AND account_id = $3 AND state = 'pending' AND EXISTS (SELECT 1 FROM e) RETURNING 1)
	SELECT e.id, (SELECT count(*) FROM f) FROM e`

var (
	// speakPinned pins an existing memory: $9 is its id.
	speakPinned = `WITH m AS (SELECT $9::bigint AS id),` + speakTail
	// speakNew stores new content as a thread memory, from $9 on, and pins
	// it, in one statement: one executor start-up instead of two. The
	// entry's foreign keys are checked at the end of the statement, so they
	// see the memory written by its own CTEs. A taken code leaves m empty.
	speakNew = `WITH ` + memory.InsertItems(9) + `,` + speakTail
)

// drawMemory is memory.Prepare; a test swaps it to force a code collision.
var drawMemory = memory.Prepare

// speak writes the entry at the room's next seq and returns its id, the
// pinned memory's code and how many receipts the reply fulfilled. New
// content is stored as memory_put would store it, in the same statement.
// When last, the statement carries the transaction's COMMIT. A memory code
// that is taken writes nothing and answers errDrawAgain: run draws again
// in a new transaction, since this one may have committed.
func (w *write) speak(ctx context.Context, r room, pin pinned, summary string, replyTo *int64, asked []int64, last bool) (int64, string, int, error) {
	args := []any{r.ID, r.NextSeq, w.who.AccountID, pin.rev, summary, replyTo, w.now, asked}
	b := &pgx.Batch{}
	code := pin.code
	if pin.content == nil {
		b.Queue(speakPinned, append(args, pin.id)...)
	} else {
		m, margs := drawMemory(w.who.AccountID, "thread", memory.Draft{
			Title: pin.title, Tags: []string{"thread"}, Content: *pin.content,
		}, w.now)
		b.Queue(speakNew, append(args, margs...)...)
		code = m.Code
	}
	var br pgx.BatchResults
	if last {
		br = kungfu.SendFinal(ctx, w.tx, b)
	} else {
		br = w.tx.SendBatch(ctx, b)
	}
	var entry int64
	var fulfilled int
	err := br.QueryRow().Scan(&entry, &fulfilled)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, pgx.ErrNoRows) && pin.content != nil {
		return 0, "", 0, errDrawAgain
	}
	if err != nil {
		return 0, "", 0, err
	}
	return entry, code, fulfilled, nil
}

// lockMembers locks the room and reads its members (and the author of the
// entry replied to, when replyTo is set) in one round trip. The statements
// of a batch still run one after another, each on a fresh snapshot, so the
// reads see everything committed before the lock was granted, exactly as
// separate statements would.
func (w *write) lockMembers(ctx context.Context, code string, replyTo int64) (room, []member, *int64, error) {
	code, err := normalizeCode(code)
	if err != nil {
		return room{}, nil, nil, err
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT `+roomColumns+` FROM threads WHERE code = $1 FOR UPDATE`, code)
	b.Queue(`SELECT a.id, a.name, m.role FROM threads t JOIN thread_members m ON m.thread_id = t.id JOIN accounts a ON a.id = m.account_id
		WHERE t.code = $1 ORDER BY m.joined_at, a.id`, code)
	if replyTo != 0 {
		b.Queue(`SELECT e.author_id FROM thread_entries e JOIN threads t ON t.id = e.thread_id WHERE e.id = $1 AND t.code = $2`, replyTo, code)
	}
	br := w.tx.SendBatch(ctx, b)
	r, rerr := scanRoom(br.QueryRow())
	members, merr := collectMembers(br.Query())
	var reply *int64
	var perr error
	if replyTo != 0 {
		var author int64
		switch perr = br.QueryRow().Scan(&author); {
		case perr == nil:
			reply = &author
		case errors.Is(perr, pgx.ErrNoRows):
			perr = nil
		}
	}
	cerr := br.Close()
	switch {
	case errors.Is(rerr, pgx.ErrNoRows):
		return room{}, nil, nil, kungfu.Errorf(kungfu.CodeThreadNotFound, "no room %s", code)
	case rerr != nil:
		return room{}, nil, nil, rerr
	}
	if err := errors.Join(merr, perr, cerr); err != nil {
		return room{}, nil, nil, err
	}
	return r, members, reply, nil
}

// roleOf returns the caller's role from the room's members, or NOT_MEMBER.
func roleOf(members []member, accountID int64) (string, error) {
	for _, m := range members {
		if m.id == accountID {
			return m.role, nil
		}
	}
	return "", kungfu.Errorf(kungfu.CodeNotMember, "you are not a member of this room")
}

// responders applies the four rules, frozen at post time: an explicit ask;
// else the author of the entry replied to, if still speech-capable; else
// the other member of a two-speaker room; else nobody.
func responders(author int64, in PostInput, members []member, replyAuthor int64) ([]member, error) {
	if in.Ask != nil {
		seen := map[int64]bool{}
		var out []member
		for _, ref := range in.Ask {
			m, err := findMember(members, ref)
			if err != nil {
				return nil, err
			}
			switch {
			case m.id == author:
				return nil, kungfu.Errorf(kungfu.CodeInvalidTarget, "you cannot ask yourself")
			case !canSpeak(m.role):
				return nil, kungfu.Errorf(kungfu.CodeInvalidTarget, "%s is an observer and cannot be asked", m.name)
			case seen[m.id]:
				continue
			}
			seen[m.id] = true
			out = append(out, m)
		}
		return out, nil
	}
	if in.ReplyTo != 0 && replyAuthor != author {
		for _, m := range members {
			if m.id == replyAuthor && canSpeak(m.role) {
				return []member{m}, nil
			}
		}
		return nil, nil
	}
	var speakers []member
	for _, m := range members {
		if canSpeak(m.role) {
			speakers = append(speakers, m)
		}
	}
	if len(speakers) == 2 {
		for _, m := range speakers {
			if m.id != author {
				return []member{m}, nil
			}
		}
	}
	return nil, nil
}

func collectMembers(rows pgx.Rows, err error) ([]member, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (member, error) {
		var m member
		err := r.Scan(&m.id, &m.name, &m.role)
		return m, err
	})
}

// findMember resolves a member by name (any case) or account id.
func findMember(members []member, ref string) (member, error) {
	ref = strings.TrimSpace(ref)
	id, _ := strconv.ParseInt(ref, 10, 64)
	for _, m := range members {
		if strings.EqualFold(m.name, ref) || (id != 0 && m.id == id) {
			return m, nil
		}
	}
	return member{}, kungfu.Errorf(kungfu.CodeInvalidTarget, "%q is not a member of this room", ref)
}

// Handled is thread_handle's result.
type Handled struct {
	Thread  string `json:"thread"`
	Entry   int64  `json:"entry"`
	Handled bool   `json:"handled"`
}

// Handle ends the caller's pending receipt on an entry without speaking.
func (s *Service) Handle(ctx context.Context, who kungfu.Caller, code string, entry int64, note string, idem Idem) (any, error) {
	note = strings.TrimSpace(note)
	if utf8.RuneCountInString(note) > MaxNote {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "note", Message: fmt.Sprintf("at most %d characters", MaxNote)})
	}
	if credential.Find(note) != "" {
		return nil, kungfu.Errorf(kungfu.CodeSensitiveContent, "the note contains a credential-shaped string")
	}
	return s.run(ctx, who, "thread_handle", idem, func(ctx context.Context, w *write) (any, error) {
		r, err := w.lockRoom(ctx, code)
		if err != nil {
			return nil, err
		}
		if _, err := role(ctx, w.tx, r.ID, who.AccountID); err != nil {
			return nil, err
		}
		var n *string
		if note != "" {
			n = &note
		}
		tag, err := w.tx.Exec(ctx, `UPDATE thread_receipts SET state = 'fulfilled', resolution = 'handle', note = $4, ended_at = $5
			WHERE thread_id = $1 AND entry_id = $2 AND account_id = $3 AND state = 'pending'`, r.ID, entry, who.AccountID, n, w.now)
		if err != nil {
			return nil, err
		}
		if tag.RowsAffected() == 0 {
			return nil, kungfu.Errorf(kungfu.CodeInvalidTarget, "you have no pending receipt on entry %d", entry)
		}
		return Handled{Thread: r.Code, Entry: entry, Handled: true}, nil
	})
}

// Retracted is thread_retract's result.
type Retracted struct {
	Thread    string `json:"thread"`
	Entry     int64  `json:"entry"`
	Withdrawn int    `json:"withdrawn"`
}

// Retract lets an entry's author withdraw every request the entry still has
// pending.
func (s *Service) Retract(ctx context.Context, who kungfu.Caller, code string, entry int64, idem Idem) (any, error) {
	return s.run(ctx, who, "thread_retract", idem, func(ctx context.Context, w *write) (any, error) {
		r, err := w.lockRoom(ctx, code)
		if err != nil {
			return nil, err
		}
		if _, err := role(ctx, w.tx, r.ID, who.AccountID); err != nil {
			return nil, err
		}
		var author int64
		err = w.tx.QueryRow(ctx, `SELECT author_id FROM thread_entries WHERE id = $1 AND thread_id = $2`, entry, r.ID).Scan(&author)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, kungfu.Errorf(kungfu.CodeInvalidTarget, "entry %d is not in this room", entry)
		}
		if err != nil {
			return nil, err
		}
		if author != who.AccountID {
			return nil, kungfu.Errorf(kungfu.CodeNotYours, "only the entry's author can retract it")
		}
		n, err := w.withdraw(ctx, `entry_id = $1`, "retract", entry)
		return Retracted{Thread: r.Code, Entry: entry, Withdrawn: n}, err
	})
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if s = strings.TrimSpace(s); s == "" {
		return "entry"
	}
	return s
}

func truncate(s string, runes int) string {
	if utf8.RuneCountInString(s) <= runes {
		return s
	}
	r := []rune(s)
	return string(r[:runes])
}
