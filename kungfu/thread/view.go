package thread

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/memory"
)

// Member is one row of a room's member list.
type Member struct {
	AccountID int64     `json:"account_id"`
	Account   string    `json:"account"`
	Role      string    `json:"role"`
	JoinedAt  time.Time `json:"joined_at"`
}

// KeyFacts describes the live key without revealing it.
type KeyFacts struct {
	Active      bool       `json:"active"`
	Role        string     `json:"role,omitempty"`
	IssuedAt    *time.Time `json:"issued_at,omitempty"`
	Fingerprint string     `json:"fingerprint,omitempty"`
}

// Receipt is one asked member's response state on an entry.
type Receipt struct {
	Account    string  `json:"account"`
	State      string  `json:"state"`
	Resolution *string `json:"resolution"`
	Note       *string `json:"note,omitempty"`
}

// Row is one timeline entry.
type Row struct {
	Entry    int64      `json:"entry"`
	Seq      int64      `json:"seq"`
	Author   string     `json:"author"`
	Summary  string     `json:"summary"`
	ReplyTo  *int64     `json:"reply_to,omitempty"`
	Asked    []string   `json:"asked"`
	Receipts []Receipt  `json:"receipts"`
	Assign   *AssignRef `json:"assign,omitempty"`
	At       time.Time  `json:"at"`
}

// Expanded is an entry's pinned memory version.
type Expanded struct {
	Entry    int64   `json:"entry"`
	Memory   string  `json:"memory"`
	Revision int     `json:"revision"`
	Title    string  `json:"title"`
	Checksum string  `json:"checksum"`
	Readable bool    `json:"readable"`
	Content  *string `json:"content"`
}

// AssignRow is the light digest row of an assignment.
type AssignRow struct {
	ID           int64      `json:"id"`
	Entry        int64      `json:"entry"`
	Creator      string     `json:"creator"`
	Assignee     string     `json:"assignee"`
	State        string     `json:"state"`
	CreatedAt    time.Time  `json:"created_at"`
	DeliverDueAt *time.Time `json:"deliver_due_at,omitempty"`
	JudgeDueAt   *time.Time `json:"judge_due_at,omitempty"`
	// Expanded on request only.
	Requirements *string         `json:"requirements,omitempty"`
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
	Payload      json.RawMessage `json:"payload,omitempty"`
	Memories     json.RawMessage `json:"memories,omitempty"`
	Verdict      *string         `json:"verdict,omitempty"`
	Reason       *string         `json:"reason,omitempty"`
	Forfeited    *bool           `json:"judge_forfeited,omitempty"`
}

// View is thread_get's working set.
type View struct {
	Thread            Ref         `json:"thread"`
	Role              string      `json:"role"`
	Members           []Member    `json:"members"`
	Key               KeyFacts    `json:"key"`
	Timeline          []Row       `json:"timeline"`
	NextCursor        *string     `json:"next_cursor"`
	Entries           []Expanded  `json:"entries"`
	Assignments       []AssignRow `json:"assignments"`
	AssignmentsCursor *string     `json:"assignments_cursor"`
	Todos             []Todo      `json:"todos"`
}

// GetInput selects what thread_get returns.
type GetInput struct {
	Thread            string
	Cursor            string
	Entries           []int64
	AssignmentsCursor string
	Assignments       []int64
	MineOpen          bool
}

// read runs fn in one read-only snapshot, so every part of a working set
// describes the same moment.
func (s *Service) read(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, s.DB, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

func cursorInt(field, c string) (int64, error) {
	if c == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(c, 10, 64)
	if err != nil || n <= 0 {
		return 0, kungfu.Invalid(kungfu.FieldError{Field: field, Message: "not a cursor this server issued"})
	}
	return n, nil
}

// Get returns the caller's working set for one room.
func (s *Service) Get(ctx context.Context, who kungfu.Caller, in GetInput) (View, error) {
	code, err := normalizeCode(in.Thread)
	if err != nil {
		return View{}, err
	}
	seqCursor, err := cursorInt("cursor", in.Cursor)
	if err != nil {
		return View{}, err
	}
	aCursor, err := cursorInt("assignments_cursor", in.AssignmentsCursor)
	if err != nil {
		return View{}, err
	}
	if len(in.Entries) > PageSize || len(in.Assignments) > PageSize {
		return View{}, kungfu.Invalid(kungfu.FieldError{Field: "entries", Message: fmt.Sprintf("expand at most %d at a time", PageSize)})
	}
	now := s.Now()
	var v View
	err = s.read(ctx, func(tx pgx.Tx) error {
		r, err := scanRoom(tx.QueryRow(ctx, `SELECT `+roomColumns+` FROM threads WHERE code = $1`, code))
		if errors.Is(err, pgx.ErrNoRows) {
			return kungfu.Errorf(kungfu.CodeThreadNotFound, "no room %s", code)
		}
		if err != nil {
			return err
		}
		if v.Role, err = role(ctx, tx, r.ID, who.AccountID); err != nil {
			return err
		}
		v.Thread = r.ref()
		if r.KeyHash != nil {
			v.Key = KeyFacts{Active: true, Role: *r.KeyRole, IssuedAt: r.KeyAt}
			if v.Role == "governor" {
				v.Key.Fingerprint = *r.KeyHint
			}
		}
		rows, err := tx.Query(ctx, `SELECT a.id, a.name, m.role, m.joined_at FROM thread_members m JOIN accounts a ON a.id = m.account_id
			WHERE m.thread_id = $1 ORDER BY m.joined_at, a.id`, r.ID)
		if err != nil {
			return err
		}
		if v.Members, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Member, error) {
			var m Member
			err := row.Scan(&m.AccountID, &m.Account, &m.Role, &m.JoinedAt)
			return m, err
		}); err != nil {
			return err
		}
		if err := timeline(ctx, tx, r.ID, who.AccountID, seqCursor, &v); err != nil {
			return err
		}
		if v.Entries, err = expand(ctx, tx, r.ID, who.AccountID, in.Entries); err != nil {
			return err
		}
		if err := digest(ctx, tx, r.ID, who.AccountID, aCursor, in, &v); err != nil {
			return err
		}
		v.Todos, _, err = todos(ctx, tx, who.AccountID, now, todoCursor{}, r.ID, PageSize)
		return err
	})
	return v, err
}

func timeline(ctx context.Context, tx pgx.Tx, roomID, me, cursor int64, v *View) error {
	q := `SELECT e.id, e.seq, a.name, e.author_id, e.summary, e.reply_to, e.created_at, s.id, s.state
		FROM thread_entries e JOIN accounts a ON a.id = e.author_id LEFT JOIN assigns s ON s.entry_id = e.id
		WHERE e.thread_id = $1 AND ($2::bigint = 0 OR e.seq < $2) ORDER BY e.seq DESC LIMIT $3`
	rows, err := tx.Query(ctx, q, roomID, cursor, PageSize+1)
	if err != nil {
		return err
	}
	authors := map[int64]int64{}
	v.Timeline = []Row{}
	for rows.Next() {
		var (
			row    Row
			author int64
			aid    *int64
			astate *string
		)
		if err := rows.Scan(&row.Entry, &row.Seq, &row.Author, &author, &row.Summary, &row.ReplyTo, &row.At, &aid, &astate); err != nil {
			return err
		}
		if aid != nil {
			row.Assign = &AssignRef{ID: *aid, State: *astate}
		}
		row.Asked, row.Receipts = []string{}, []Receipt{}
		authors[row.Entry] = author
		v.Timeline = append(v.Timeline, row)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(v.Timeline) > PageSize {
		v.Timeline = v.Timeline[:PageSize]
		c := strconv.FormatInt(v.Timeline[PageSize-1].Seq, 10)
		v.NextCursor = &c
	}
	if len(v.Timeline) == 0 {
		return nil
	}
	ids := make([]int64, len(v.Timeline))
	index := map[int64]int{}
	for i, r := range v.Timeline {
		ids[i], index[r.Entry] = r.Entry, i
	}
	rows, err = tx.Query(ctx, `SELECT r.entry_id, r.account_id, a.name, r.state, r.resolution, r.note
		FROM thread_receipts r JOIN accounts a ON a.id = r.account_id WHERE r.entry_id = ANY($1) ORDER BY r.id`, ids)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			entry, account int64
			rc             Receipt
		)
		if err := rows.Scan(&entry, &account, &rc.Account, &rc.State, &rc.Resolution, &rc.Note); err != nil {
			return err
		}
		// A handle note is between the entry's author and the responder.
		if me != account && me != authors[entry] {
			rc.Note = nil
		}
		row := &v.Timeline[index[entry]]
		row.Asked = append(row.Asked, rc.Account)
		row.Receipts = append(row.Receipts, rc)
	}
	return rows.Err()
}

// expand returns pinned versions. Room content (thread memories) is for
// the room's members; a pinned standalone memory shows its content to its
// author always and to others while it stays active and public.
func expand(ctx context.Context, tx pgx.Tx, roomID, me int64, ids []int64) ([]Expanded, error) {
	out := []Expanded{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := tx.Query(ctx, `SELECT e.id, e.memory_id, e.revision FROM thread_entries e WHERE e.thread_id = $1 AND e.id = ANY($2) ORDER BY e.seq`, roomID, ids)
	if err != nil {
		return nil, err
	}
	type pin struct {
		entry, mem int64
		rev        int
	}
	pins, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pin, error) {
		var p pin
		err := r.Scan(&p.entry, &p.mem, &p.rev)
		return p, err
	})
	if err != nil {
		return nil, err
	}
	for _, p := range pins {
		m, err := memory.Revision(ctx, tx, p.mem, p.rev)
		if err != nil {
			return nil, err
		}
		x := Expanded{Entry: p.entry, Memory: m.Code, Revision: m.Revision, Title: m.Title, Checksum: m.Checksum}
		x.Readable = m.Origin == "thread" || m.OwnerID == me || (m.Status == "active" && m.Visibility == "public")
		if x.Readable {
			c := m.Content
			x.Content = &c
		}
		out = append(out, x)
	}
	return out, nil
}

const assignColumns = `s.id, s.entry_id, c.name, t.name, s.state, s.created_at, s.deliver_due_at, s.judge_due_at`

func digest(ctx context.Context, tx pgx.Tx, roomID, me, cursor int64, in GetInput, v *View) error {
	q := `SELECT ` + assignColumns + ` FROM assigns s JOIN accounts c ON c.id = s.creator_id JOIN accounts t ON t.id = s.assignee_id
		WHERE s.thread_id = $1 AND ($2::bigint = 0 OR s.id < $2) AND (NOT $3 OR (s.assignee_id = $4 AND s.state = 'open'))
		ORDER BY s.id DESC LIMIT $5`
	rows, err := tx.Query(ctx, q, roomID, cursor, in.MineOpen, me, PageSize+1)
	if err != nil {
		return err
	}
	if v.Assignments, err = pgx.CollectRows(rows, scanAssignRow); err != nil {
		return err
	}
	if len(v.Assignments) > PageSize {
		v.Assignments = v.Assignments[:PageSize]
		c := strconv.FormatInt(v.Assignments[PageSize-1].ID, 10)
		v.AssignmentsCursor = &c
	}
	if len(in.Assignments) == 0 {
		return nil
	}
	rows, err = tx.Query(ctx, `SELECT `+assignColumns+`, s.requirements, s.output_schema, s.payload, s.memories, s.verdict, s.reason,
		s.judge_forfeited_at IS NOT NULL
		FROM assigns s JOIN accounts c ON c.id = s.creator_id JOIN accounts t ON t.id = s.assignee_id
		WHERE s.thread_id = $1 AND s.id = ANY($2) ORDER BY s.id DESC`, roomID, in.Assignments)
	if err != nil {
		return err
	}
	expanded, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AssignRow, error) {
		var a AssignRow
		var forfeited bool
		err := r.Scan(&a.ID, &a.Entry, &a.Creator, &a.Assignee, &a.State, &a.CreatedAt, &a.DeliverDueAt, &a.JudgeDueAt,
			&a.Requirements, &a.OutputSchema, &a.Payload, &a.Memories, &a.Verdict, &a.Reason, &forfeited)
		a.Forfeited = &forfeited
		return a, err
	})
	if err != nil {
		return err
	}
	// Expanded rows replace their light twins; others are appended.
	for _, x := range expanded {
		found := false
		for i := range v.Assignments {
			if v.Assignments[i].ID == x.ID {
				v.Assignments[i], found = x, true
			}
		}
		if !found {
			v.Assignments = append(v.Assignments, x)
		}
	}
	return nil
}

func scanAssignRow(r pgx.CollectableRow) (AssignRow, error) {
	var a AssignRow
	err := r.Scan(&a.ID, &a.Entry, &a.Creator, &a.Assignee, &a.State, &a.CreatedAt, &a.DeliverDueAt, &a.JudgeDueAt)
	return a, err
}

// ListRow is one room in thread_list.
type ListRow struct {
	Thread      Ref       `json:"thread"`
	Role        string    `json:"role"`
	JoinedAt    time.Time `json:"joined_at"`
	OpenItems   int       `json:"open_items"`
	OpenInvites int       `json:"open_invites"`
}

// Rooms is thread_list's result.
type Rooms struct {
	Threads    []ListRow `json:"threads"`
	NextCursor *string   `json:"next_cursor"`
}

// List returns the rooms the caller is in, newest first, 50 a page.
func (s *Service) List(ctx context.Context, who kungfu.Caller, status, cursor string) (Rooms, error) {
	status = strings.TrimSpace(status)
	if status != "" && status != "open" && status != "closed" {
		return Rooms{}, kungfu.Invalid(kungfu.FieldError{Field: "status", Message: "open or closed"})
	}
	after, err := cursorInt("cursor", cursor)
	if err != nil {
		return Rooms{}, err
	}
	now := s.Now()
	out := Rooms{Threads: []ListRow{}}
	err = s.read(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			SELECT t.id, t.code, t.subject, t.status, m.role, m.joined_at,
			  (SELECT count(*) FROM thread_receipts r WHERE r.thread_id = t.id AND r.account_id = $1 AND r.state = 'pending')
			+ (SELECT count(*) FROM assigns s WHERE s.thread_id = t.id AND s.assignee_id = $1 AND s.state = 'taken' AND s.deliver_due_at > $5)
			+ (SELECT count(*) FROM assigns s WHERE s.thread_id = t.id AND s.creator_id = $1 AND s.state = 'delivered'
			      AND s.judge_due_at > $5 AND s.judge_forfeited_at IS NULL),
			  (SELECT count(*) FROM assigns s WHERE s.thread_id = t.id AND s.assignee_id = $1 AND s.state = 'open')
			FROM thread_members m JOIN threads t ON t.id = m.thread_id
			WHERE m.account_id = $1 AND ($2 = '' OR t.status = $2) AND ($3::bigint = 0 OR t.id < $3)
			ORDER BY t.id DESC LIMIT $4`, who.AccountID, status, after, PageSize+1, now)
		if err != nil {
			return err
		}
		var ids []int64
		for rows.Next() {
			var (
				id  int64
				row ListRow
			)
			if err := rows.Scan(&id, &row.Thread.Code, &row.Thread.Subject, &row.Thread.Status, &row.Role, &row.JoinedAt, &row.OpenItems, &row.OpenInvites); err != nil {
				return err
			}
			ids = append(ids, id)
			out.Threads = append(out.Threads, row)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(out.Threads) > PageSize {
			out.Threads = out.Threads[:PageSize]
			c := strconv.FormatInt(ids[PageSize-1], 10)
			out.NextCursor = &c
		}
		return nil
	})
	return out, err
}

// PinnedMemory reads the exact version an assignment's delivery pinned, for
// a current member of its room, even if the memory is now private, revised
// or withdrawn.
func (s *Service) PinnedMemory(ctx context.Context, who kungfu.Caller, assignID int64, code string) (memory.Memory, error) {
	code, err := memory.NormalizeCode(code)
	if err != nil {
		return memory.Memory{}, err
	}
	var out memory.Memory
	err = s.read(ctx, func(tx pgx.Tx) error {
		var roomID int64
		var pins []Pin
		var raw []byte
		err := tx.QueryRow(ctx, `SELECT thread_id, memories FROM assigns WHERE id = $1`, assignID).Scan(&roomID, &raw)
		if errors.Is(err, pgx.ErrNoRows) {
			return kungfu.Errorf(kungfu.CodeAssignNotFound, "no assignment %d", assignID)
		}
		if err != nil {
			return err
		}
		if _, err := role(ctx, tx, roomID, who.AccountID); err != nil {
			return err
		}
		_ = json.Unmarshal(raw, &pins)
		for _, p := range pins {
			if p.Code != code {
				continue
			}
			var id int64
			if err := tx.QueryRow(ctx, `SELECT id FROM memories WHERE code = $1`, code).Scan(&id); err != nil {
				return err
			}
			out, err = memory.Revision(ctx, tx, id, p.Revision)
			return err
		}
		return kungfu.Errorf(kungfu.CodeNotFound, "assignment %d's delivery does not pin memory %s", assignID, code)
	})
	return out, err
}
