package memory

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/credential"
)

// Limits from the protocol.
const (
	MaxTitle       = 128    // runes
	MaxTags        = 10     // tags per memory
	MaxTag         = 32     // runes per tag
	MaxDescription = 500    // runes
	MinContent     = 50     // runes, after trimming
	MaxContent     = 102400 // bytes
	DefaultList    = 50
	MaxList        = 100
	MaxOffset      = 10000
)

var codeRE = regexp.MustCompile(`^(?i)[0-9a-f]{12}$`)

// Service owns memories.
type Service struct {
	DB  *pgxpool.Pool
	Now kungfu.Clock
}

// Draft is the content of one revision as a caller submits it.
type Draft struct {
	Title       string
	Tags        []string
	Description string
	Content     string
}

// Memory is one revision of a memory with its head facts.
type Memory struct {
	ID          int64
	Code        string
	Owner       string
	OwnerID     int64
	Title       string
	Tags        []string
	Description string
	Content     string
	Checksum    string
	Revision    int
	Current     int
	Visibility  string
	Status      string
	Origin      string
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// Put creates a memory (code == "") or writes a new revision of the caller's
// memory. It returns the stored revision and whether it was created.
func (s *Service) Put(ctx context.Context, who kungfu.Caller, code string, d Draft) (Memory, bool, error) {
	if code != "" {
		var err error
		if code, err = NormalizeCode(code); err != nil {
			return Memory{}, false, err
		}
	}
	d, err := check(d)
	if err != nil {
		return Memory{}, false, err
	}
	if code == "" {
		m, err := s.create(ctx, who, d, "standalone")
		return m, true, err
	}
	m, err := s.update(ctx, who, code, d)
	return m, false, err
}

func (s *Service) create(ctx context.Context, who kungfu.Caller, d Draft, origin string) (Memory, error) {
	var m Memory
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		var err error
		m, err = Insert(ctx, tx, who.AccountID, origin, d, s.Now())
		return err
	})
	if err != nil {
		return Memory{}, fmt.Errorf("create memory: %w", err)
	}
	m.Owner = who.Name
	return m, nil
}

// insertSQL writes a new memory's head and revision 1 in one statement
// and yields its id. A code collision yields no row (ON CONFLICT) instead
// of an error, so the caller's transaction stays usable for another draw
// without a savepoint.
const insertSQL = `WITH ` + insertItems + ` SELECT id FROM m`

// insertItems is the single source of what a new memory's rows hold, for
// insertSQL and for statements that go on to use the memory (InsertItems).
const insertItems = `m AS (INSERT INTO memories (code, account_id, origin, revision, created_at, updated_at)
	      VALUES ($1, $2, $3, 1, $4, $4) ON CONFLICT (code) DO NOTHING RETURNING id),
	 v AS (INSERT INTO memory_revisions (memory_id, revision, title, tags, description, content, checksum, created_at)
	      SELECT id, 1, $5, $6, $7, $8, $9, $4 FROM m)`

var placeholder = regexp.MustCompile(`\$[0-9]+`)

// InsertItems returns insertSQL's WITH items, m and v, with placeholders
// numbered from $first, so a caller can write a new memory and what pins
// it in one statement (and pay one executor start-up, not two). m yields
// the new id, or no row when the code was taken: then v writes nothing,
// and neither should anything the caller derives from m; the caller draws
// again. Prepare gives the arguments.
func InsertItems(first int) string {
	return placeholder.ReplaceAllStringFunc(insertItems, func(p string) string {
		n, _ := strconv.Atoi(p[1:])
		return "$" + strconv.Itoa(n+first-1)
	})
}

// Prepare draws a fresh code for a new memory at revision 1 and returns
// the memory as it will be, with insertSQL's (and InsertItems') arguments.
func Prepare(accountID int64, origin string, d Draft, now time.Time) (Memory, []any) {
	sum := sha256.Sum256([]byte(d.Content))
	m := Memory{
		Code: newCode(), OwnerID: accountID, Current: 1, Visibility: "private", Status: "active", Origin: origin,
		Title: d.Title, Tags: d.Tags, Description: d.Description, Content: d.Content,
		Checksum: hex.EncodeToString(sum[:]), Revision: 1, CreatedAt: now, UpdatedAt: now,
	}
	return m, []any{m.Code, accountID, origin, now, m.Title, m.Tags, m.Description, m.Content, m.Checksum}
}

// Insert stores a new memory at revision 1 inside tx. Rooms store entry
// content with origin "thread" through InsertItems instead, in the
// statement that writes the entry.
func Insert(ctx context.Context, tx pgx.Tx, accountID int64, origin string, d Draft, now time.Time) (Memory, error) {
	for range 5 {
		m, args := Prepare(accountID, origin, d, now)
		err := tx.QueryRow(ctx, insertSQL, args...).Scan(&m.ID)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // code collision: draw again
		}
		if err != nil {
			return Memory{}, err
		}
		return m, nil
	}
	return Memory{}, errors.New("create memory: could not draw a free code")
}

// Head is a memory's current facts, for pinning.
type Head struct {
	ID         int64
	Code       string
	OwnerID    int64
	Revision   int
	Visibility string
	Status     string
	Origin     string
	Title      string
	Checksum   string
}

// LookupHead reads a memory's current facts inside tx, locking the head row
// against a concurrent update or withdrawal while the caller pins it.
func LookupHead(ctx context.Context, tx pgx.Tx, code string) (Head, error) {
	code, err := NormalizeCode(code)
	if err != nil {
		return Head{}, err
	}
	var h Head
	err = tx.QueryRow(ctx,
		`SELECT m.id, m.code, m.account_id, m.revision, m.visibility, m.status, m.origin, r.title, r.checksum
		 FROM memories m JOIN memory_revisions r ON r.memory_id = m.id AND r.revision = m.revision
		 WHERE m.code = $1 FOR SHARE OF m`, code).
		Scan(&h.ID, &h.Code, &h.OwnerID, &h.Revision, &h.Visibility, &h.Status, &h.Origin, &h.Title, &h.Checksum)
	if errors.Is(err, pgx.ErrNoRows) {
		return Head{}, kungfu.Errorf(kungfu.CodeNotFound, "no memory %s", code)
	}
	return h, err
}

// Revision reads one stored revision by memory id, whatever the memory's
// status: callers decide readability.
func Revision(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, id int64, rev int) (Memory, error) {
	var m Memory
	err := q.QueryRow(ctx,
		`SELECT m.code, m.account_id, a.name, m.revision, m.visibility, m.status, m.origin, m.created_at, m.updated_at,
		        r.revision, r.title, r.tags, r.description, r.content, r.checksum
		 FROM memories m JOIN accounts a ON a.id = m.account_id
		 JOIN memory_revisions r ON r.memory_id = m.id AND r.revision = $2
		 WHERE m.id = $1`, id, rev).
		Scan(&m.Code, &m.OwnerID, &m.Owner, &m.Current, &m.Visibility, &m.Status, &m.Origin, &m.CreatedAt, &m.UpdatedAt,
			&m.Revision, &m.Title, &m.Tags, &m.Description, &m.Content, &m.Checksum)
	if errors.Is(err, pgx.ErrNoRows) {
		return Memory{}, kungfu.Errorf(kungfu.CodeNotFound, "no such memory revision")
	}
	m.ID = id
	return m, err
}

func (s *Service) update(ctx context.Context, who kungfu.Caller, code string, d Draft) (Memory, error) {
	now := s.Now()
	var m Memory
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		var (
			id int64
			h  head
		)
		// The row lock serializes concurrent updates, so revisions are
		// consecutive with no gap and no duplicate.
		err := tx.QueryRow(ctx,
			`SELECT id, account_id, status, visibility, origin, revision, created_at
			 FROM memories WHERE code = $1 FOR UPDATE`, code).
			Scan(&id, &h.ownerID, &h.status, &h.visibility, &h.origin, &h.revision, &h.createdAt)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && h.status != "active") {
			return kungfu.Errorf(kungfu.CodeNotFound, "no memory %s", code)
		}
		if err != nil {
			return err
		}
		if h.ownerID != who.AccountID {
			return kungfu.Errorf(kungfu.CodeNotOwner, "only the author can update this memory")
		}
		if h.origin != "standalone" {
			// A room entry is immutable: corrections are new entries.
			return kungfu.Errorf(kungfu.CodeNotOwner, "room entry content cannot be revised; post a new entry")
		}
		rev := h.revision + 1
		if _, err := tx.Exec(ctx, `UPDATE memories SET revision = $2, updated_at = $3 WHERE id = $1`, id, rev, now); err != nil {
			return err
		}
		m, err = insertRevision(ctx, tx, id, rev, d, now)
		m.Current, m.Visibility, m.Status, m.Origin, m.CreatedAt = rev, h.visibility, h.status, h.origin, h.createdAt
		return err
	})
	if err != nil {
		if kungfu.AsError(err) != nil {
			return Memory{}, err
		}
		return Memory{}, fmt.Errorf("update memory: %w", err)
	}
	m.Code, m.Owner, m.OwnerID, m.UpdatedAt = code, who.Name, who.AccountID, now
	return m, nil
}

type head struct {
	ownerID    int64
	status     string
	visibility string
	origin     string
	revision   int
	createdAt  time.Time
}

func insertRevision(ctx context.Context, tx pgx.Tx, id int64, rev int, d Draft, now time.Time) (Memory, error) {
	sum := sha256.Sum256([]byte(d.Content))
	m := Memory{
		Title: d.Title, Tags: d.Tags, Description: d.Description, Content: d.Content,
		Checksum: hex.EncodeToString(sum[:]), Revision: rev,
	}
	_, err := tx.Exec(ctx,
		`INSERT INTO memory_revisions (memory_id, revision, title, tags, description, content, checksum, created_at)
		 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		id, rev, m.Title, m.Tags, m.Description, m.Content, m.Checksum, now)
	return m, err
}

// Get reads a memory. Without revision it is the current version: the
// author's always, anyone else's only while active and public. With
// revision only the author may read (any version, even after withdrawal);
// others may name the current revision of an active public memory.
//
// One statement reads the head and the wanted revision together: the
// rules below need only the head, so reading both before judging saves a
// round trip, and a refused caller is given nothing of what was read.
func (s *Service) Get(ctx context.Context, who kungfu.Caller, code string, revision int) (Memory, error) {
	b := &pgx.Batch{}
	finish := QueueGet(b, nil, code, revision)
	if b.Len() > 0 {
		// A batch of one is sent as a plain query: one round trip.
		if err := s.DB.SendBatch(ctx, b).Close(); err != nil {
			return Memory{}, fmt.Errorf("get memory: %w", err)
		}
	}
	return finish(who)
}

// The revision is joined outer so that a memory without the wanted
// revision is told apart from no memory at all.
const getSQL = `SELECT m.id, m.account_id, a.name, m.revision, m.visibility, m.status, m.origin, m.created_at, m.updated_at,
        r.memory_id IS NOT NULL, coalesce(r.revision, 0), coalesce(r.title, ''), coalesce(r.tags, '{}'),
        coalesce(r.description, ''), coalesce(r.content, ''), coalesce(r.checksum, '')
 FROM memories m JOIN accounts a ON a.id = m.account_id
 LEFT JOIN memory_revisions r ON r.memory_id = m.id
      AND r.revision = CASE WHEN $2::bigint > 0 THEN $2::bigint ELSE m.revision END
 WHERE m.code = $1`

// QueueGet adds Get's read to b, so a caller can send it in the round trip
// that authenticates the reader (relay does), and returns what judges the
// read once b has been sent and closed: Get's answer for who. With a gate
// the read finds nothing unless the gate holds. A code that cannot be one
// queues nothing; its refusal comes from finish.
func QueueGet(b *pgx.Batch, gate kungfu.Gate, code string, revision int) (finish func(who kungfu.Caller) (Memory, error)) {
	code, err := NormalizeCode(code)
	if err != nil {
		return func(kungfu.Caller) (Memory, error) { return Memory{}, err }
	}
	var (
		m                Memory
		found, ran, read bool
		qerr             error
	)
	sql, args := getSQL, []any{code, int64(revision)}
	if gate != nil {
		cond, arg := gate(3)
		sql, args = getSQL+" AND "+cond, append(args, arg)
	}
	// Errors are kept, not returned: see account.QueueAuthenticate.
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		ran = true
		switch err := row.Scan(&m.ID, &m.OwnerID, &m.Owner, &m.Current, &m.Visibility, &m.Status, &m.Origin, &m.CreatedAt, &m.UpdatedAt,
			&found, &m.Revision, &m.Title, &m.Tags, &m.Description, &m.Content, &m.Checksum); {
		case err == nil:
			read = true
		case !errors.Is(err, pgx.ErrNoRows):
			qerr = err
		}
		return nil
	})
	return func(who kungfu.Caller) (Memory, error) {
		switch {
		case qerr != nil:
			return Memory{}, fmt.Errorf("get memory: %w", qerr)
		case !ran:
			return Memory{}, errors.New("get memory: the read was not sent")
		}
		return judgeGet(who, code, revision, m, found, read)
	}
}

// judgeGet applies Get's rules to what its statement read: read is false
// when no memory has the code.
func judgeGet(who kungfu.Caller, code string, revision int, m Memory, found, read bool) (Memory, error) {
	notFound := kungfu.Errorf(kungfu.CodeNotFound, "no memory %s", code)
	if !read {
		return Memory{}, notFound
	}
	owner := m.OwnerID == who.AccountID
	switch {
	case revision < 0:
		return Memory{}, kungfu.Invalid(kungfu.FieldError{Field: "revision", Message: "must be a positive integer"})
	case owner && revision > 0:
		// The author reads any version, withdrawn or not.
	case m.Status != "active":
		return Memory{}, notFound
	case owner:
	case m.Visibility != "public":
		return Memory{}, kungfu.Errorf(kungfu.CodePrivateKungfu, "this memory is private")
	case revision > 0 && revision != m.Current:
		return Memory{}, kungfu.Errorf(kungfu.CodeNotOwner, "only the author can read earlier revisions")
	}
	if !found {
		if revision == 0 {
			revision = m.Current
		}
		return Memory{}, kungfu.Errorf(kungfu.CodeNotFound, "memory %s has no revision %d", code, revision)
	}
	m.Code = code
	return m, nil
}

// Page is one page of the caller's memories.
type Page struct {
	Memories []Memory
	Total    int
	Offset   int
}

// List returns the caller's active standalone memories, most recently
// updated first. Out-of-range paging values are clamped, not refused.
func (s *Service) List(ctx context.Context, who kungfu.Caller, limit, offset int) (Page, error) {
	if limit <= 0 {
		limit = DefaultList
	}
	limit = min(limit, MaxList)
	offset = max(0, min(offset, MaxOffset))
	p := Page{Offset: offset, Memories: []Memory{}}
	const where = `m.account_id = $1 AND m.status = 'active' AND m.origin = 'standalone'`
	if err := s.DB.QueryRow(ctx, `SELECT count(*) FROM memories m WHERE `+where, who.AccountID).Scan(&p.Total); err != nil {
		return Page{}, fmt.Errorf("count memories: %w", err)
	}
	rows, err := s.DB.Query(ctx,
		`SELECT m.code, m.revision, m.visibility, m.status, m.origin, m.created_at, m.updated_at,
		        r.title, r.tags, r.description, r.checksum
		 FROM memories m JOIN memory_revisions r ON r.memory_id = m.id AND r.revision = m.revision
		 WHERE `+where+` ORDER BY m.updated_at DESC, m.id DESC LIMIT $2 OFFSET $3`,
		who.AccountID, limit, offset)
	if err != nil {
		return Page{}, fmt.Errorf("list memories: %w", err)
	}
	p.Memories, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Memory, error) {
		m := Memory{Owner: who.Name, OwnerID: who.AccountID}
		err := r.Scan(&m.Code, &m.Revision, &m.Visibility, &m.Status, &m.Origin, &m.CreatedAt, &m.UpdatedAt,
			&m.Title, &m.Tags, &m.Description, &m.Checksum)
		m.Current = m.Revision
		return m, err
	})
	if err != nil {
		return Page{}, fmt.Errorf("list memories: %w", err)
	}
	return p, nil
}

// SetVisibility makes the caller's active memory public or private. It is
// idempotent: changed reports whether anything moved.
func (s *Service) SetVisibility(ctx context.Context, who kungfu.Caller, code, visibility string) (changed bool, err error) {
	err = s.own(ctx, who, code, func(tx pgx.Tx, id int64, h head) error {
		if h.visibility == visibility {
			return nil
		}
		changed = true
		_, err := tx.Exec(ctx, `UPDATE memories SET visibility = $2, updated_at = $3 WHERE id = $1`, id, visibility, s.Now())
		return err
	})
	return changed, err
}

// Delete withdraws the caller's memory. Withdrawal is terminal: no new
// revisions, pins or listings, while existing pins keep their readability.
func (s *Service) Delete(ctx context.Context, who kungfu.Caller, code string) (title string, err error) {
	err = s.own(ctx, who, code, func(tx pgx.Tx, id int64, h head) error {
		if err := tx.QueryRow(ctx, `SELECT title FROM memory_revisions WHERE memory_id = $1 AND revision = $2`, id, h.revision).Scan(&title); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE memories SET status = 'deleted', deleted_at = $2 WHERE id = $1`, id, s.Now())
		return err
	})
	return title, err
}

// own runs fn on the caller's active memory under a row lock.
func (s *Service) own(ctx context.Context, who kungfu.Caller, code string, fn func(pgx.Tx, int64, head) error) error {
	code, err := NormalizeCode(code)
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		var (
			id int64
			h  head
		)
		err := tx.QueryRow(ctx,
			`SELECT id, account_id, status, visibility, origin, revision FROM memories WHERE code = $1 FOR UPDATE`, code).
			Scan(&id, &h.ownerID, &h.status, &h.visibility, &h.origin, &h.revision)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && h.status != "active") {
			return kungfu.Errorf(kungfu.CodeNotFound, "no memory %s", code)
		}
		if err != nil {
			return err
		}
		if h.ownerID != who.AccountID {
			return kungfu.Errorf(kungfu.CodeNotOwner, "only the author can change this memory")
		}
		return fn(tx, id, h)
	})
	if err != nil && kungfu.AsError(err) == nil {
		return fmt.Errorf("memory %s: %w", code, err)
	}
	return err
}

// NormalizeCode checks a memory code's shape and lowercases it.
func NormalizeCode(code string) (string, error) {
	code = strings.TrimSpace(code)
	if !codeRE.MatchString(code) {
		return "", kungfu.Errorf(kungfu.CodeInvalidCode, "a memory code is 12 hex characters")
	}
	return strings.ToLower(code), nil
}

func newCode() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// check applies the protocol's content rules in the reference's order and
// returns the normalised draft.
func check(d Draft) (Draft, error) {
	d.Title = strings.TrimSpace(d.Title)
	d.Description = strings.TrimSpace(d.Description)
	switch {
	case d.Title == "":
		return d, kungfu.Errorf(kungfu.CodeMissingField, "title is required")
	case utf8.RuneCountInString(d.Title) > MaxTitle:
		return d, kungfu.Errorf(kungfu.CodeTitleTooLong, "title is longer than %d characters", MaxTitle)
	case len(d.Tags) == 0:
		return d, kungfu.Errorf(kungfu.CodeInvalidTags, "give 1 to %d tags", MaxTags)
	case len(d.Tags) > MaxTags:
		return d, kungfu.Errorf(kungfu.CodeTooManyTags, "at most %d tags", MaxTags)
	}
	tags := make([]string, len(d.Tags))
	for i, t := range d.Tags {
		t = strings.TrimSpace(t)
		switch {
		case t == "":
			return d, kungfu.Errorf(kungfu.CodeInvalidTags, "tag %d is empty", i+1)
		case utf8.RuneCountInString(t) > MaxTag:
			return d, kungfu.Errorf(kungfu.CodeTagTooLong, "tag %d is longer than %d characters", i+1, MaxTag)
		}
		tags[i] = t
	}
	d.Tags = tags
	switch {
	case utf8.RuneCountInString(d.Description) > MaxDescription:
		return d, kungfu.Errorf(kungfu.CodeDescriptionTooLong, "description is longer than %d characters", MaxDescription)
	case len(d.Content) > MaxContent:
		return d, kungfu.Errorf(kungfu.CodeContentTooLarge, "content is larger than %d bytes", MaxContent)
	case utf8.RuneCountInString(strings.TrimSpace(d.Content)) < MinContent:
		return d, kungfu.Errorf(kungfu.CodeContentTooShort, "content needs at least %d characters", MinContent)
	case !utf8.ValidString(d.Content):
		return d, kungfu.Invalid(kungfu.FieldError{Field: "content", Message: "must be valid UTF-8"})
	}
	for _, s := range append([]string{d.Title, d.Description, d.Content}, d.Tags...) {
		if kind := credential.Find(s); kind != "" {
			return d, kungfu.Errorf(kungfu.CodeSensitiveContent, "the memory contains a credential-shaped string (%s); keep secrets out of shared material", kind)
		}
	}
	return d, nil
}
