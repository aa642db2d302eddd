package thread

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/kungfu"
)

// Limits from the protocol.
const (
	MaxMembers     = 50
	MaxOpenRooms   = 100
	MaxSubject     = 200    // runes
	MaxSummary     = 500    // runes
	MaxNote        = 1000   // runes
	MaxEntry       = 102400 // bytes
	MaxAsk         = 50
	MaxRequirement = 16384  // bytes
	MaxPayload     = 262144 // bytes
	MaxReason      = 4000   // runes
	MaxPins        = 10
	PageSize       = 50
	MinDue         = 60
	MaxDue         = 604800
	DefaultDue     = 86400
)

// Notifier writes notify pushes into the fact's transaction and hands them
// to the queue after commit. Losing a push is harmless: todo_list is truth.
type Notifier interface {
	Emit(ctx context.Context, tx pgx.Tx, accountID int64, kind string) (int64, bool, error)
	Enqueue(ctx context.Context, ids ...int64)
}

// Waker schedules a wake-up for an assignment deadline. PostgreSQL's sweep
// catches any wake-up Redis loses.
type Waker interface {
	EnqueueKey(ctx context.Context, taskType string, id int64, key string, at time.Time) error
}

// TaskDeadline is the queue task type of assignment deadline wake-ups.
const TaskDeadline = "assign-deadline"

// Service owns rooms and assignments.
type Service struct {
	DB     *pgxpool.Pool
	Now    kungfu.Clock
	Notify Notifier
	Wake   Waker
}

// Idem is an optional idempotency key with the hash of the request it
// guards.
type Idem struct {
	Key  string
	Hash []byte
}

// Snapshotter lets a result store something other than itself for replay,
// e.g. a key result that must never replay the raw key.
type Snapshotter interface {
	Snapshot() any
}

// write is one room transaction plus what to do after it commits.
type write struct {
	tx  pgx.Tx
	now time.Time
	who kungfu.Caller
	// final says nothing is written after fn: no idempotency record
	// follows, so fn's last statement may carry the COMMIT.
	final bool
	notes []int64
	wakes []wake
	s     *Service
}

type wake struct {
	id  int64
	key string
	at  time.Time
}

func (w *write) notify(ctx context.Context, accountID int64, kind string) error {
	if w.s.Notify == nil {
		return nil
	}
	id, ok, err := w.s.Notify.Emit(ctx, w.tx, accountID, kind)
	if err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	if ok {
		w.notes = append(w.notes, id)
	}
	return nil
}

// wakeAt schedules the assignment's deadline check; key names the clock
// (deliver or judge) so each gets its own wake-up.
func (w *write) wakeAt(id int64, key string, at time.Time) {
	w.wakes = append(w.wakes, wake{id, key, at})
}

// committed is a refusal whose transaction must still commit: a deadline
// that beat the action is recorded even though the action is refused.
type committed struct{ err error }

func (c committed) Error() string { return c.err.Error() }
func (c committed) Unwrap() error { return c.err }

// run executes fn in one transaction. With an idempotency key, a stored
// result for the same request is replayed verbatim, a different request
// under the same key is IDEMPOTENCY_CONFLICT, and the first success is
// stored in the same transaction as its facts; concurrent duplicates meet
// at the primary key and the loser replays the winner.
func (s *Service) run(ctx context.Context, who kungfu.Caller, tool string, idem Idem, fn func(context.Context, *write) (any, error)) (any, error) {
	draws, replayed := 0, false
	for {
		var (
			result  any
			w       *write
			refusal error
		)
		err := kungfu.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
			w = &write{tx: tx, now: s.Now(), who: who, s: s, final: idem.Key == ""}
			if idem.Key != "" {
				var hash []byte
				var snap json.RawMessage
				err := tx.QueryRow(ctx, `SELECT request_hash, snapshot FROM thread_idempotency
					WHERE account_id = $1 AND tool = $2 AND key = $3`, who.AccountID, tool, idem.Key).Scan(&hash, &snap)
				switch {
				case err == nil && string(hash) == string(idem.Hash):
					result = snap
					return nil
				case err == nil:
					return kungfu.Errorf(kungfu.CodeIdempotencyConflict, "idempotency_key %q was used for a different request", idem.Key)
				case !errors.Is(err, pgx.ErrNoRows):
					return err
				}
			}
			var err error
			if result, err = fn(ctx, w); err != nil {
				var c committed
				if errors.As(err, &c) {
					refusal = c.err
					return nil
				}
				return err
			}
			if idem.Key == "" {
				return nil
			}
			stored := result
			if sn, ok := result.(Snapshotter); ok {
				stored = sn.Snapshot()
			}
			snap, err := json.Marshal(stored)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO thread_idempotency (account_id, tool, key, request_hash, snapshot, created_at)
				VALUES ($1, $2, $3, $4, $5, $6)`, who.AccountID, tool, idem.Key, idem.Hash, snap, w.now)
			return err
		})
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "thread_idempotency_pkey" && !replayed {
			replayed = true
			continue // a concurrent duplicate won; replay its result
		}
		if errors.Is(err, errDrawAgain) {
			if draws++; draws < maxDraws {
				continue
			}
			err = errors.New("create memory: could not draw a free code")
		}
		if err != nil {
			if kungfu.AsError(err) != nil {
				return nil, err
			}
			return nil, fmt.Errorf("%s: %w", tool, err)
		}
		s.after(ctx, w)
		if refusal != nil {
			return nil, refusal
		}
		return result, nil
	}
}

// errDrawAgain says a new memory's code was taken: nothing was written,
// and the transaction runs again with a new code.
var errDrawAgain = errors.New("memory code taken")

// maxDraws bounds the codes one write draws; 48 random bits make a second
// draw already a rarity.
const maxDraws = 5

// after hands committed pushes and wake-ups to the queue. Failures only
// delay work: the sweeps find anything that was not enqueued.
func (s *Service) after(ctx context.Context, w *write) {
	if w == nil {
		return
	}
	if s.Notify != nil && len(w.notes) > 0 {
		s.Notify.Enqueue(ctx, w.notes...)
	}
	if s.Wake != nil {
		for _, wk := range w.wakes {
			_ = s.Wake.EnqueueKey(ctx, TaskDeadline, wk.id, wk.key, wk.at)
		}
	}
}

// room is a locked room row.
type room struct {
	ID      int64
	Code    string
	Subject string
	Status  string
	KeyHash []byte
	KeyRole *string
	KeyAt   *time.Time
	KeyHint *string
	NextSeq int64
}

func (r room) ref() Ref { return Ref{Code: r.Code, Subject: r.Subject, Status: r.Status} }

// Ref is how results name a room.
type Ref struct {
	Code    string `json:"code"`
	Subject string `json:"subject"`
	Status  string `json:"status"`
}

const roomColumns = `id, code, subject, status, key_hash, key_role, key_issued_at, key_hint, next_seq`

func scanRoom(row pgx.Row) (room, error) {
	var r room
	err := row.Scan(&r.ID, &r.Code, &r.Subject, &r.Status, &r.KeyHash, &r.KeyRole, &r.KeyAt, &r.KeyHint, &r.NextSeq)
	return r, err
}

// lockRoom locks the room by code. Every room write starts here.
func (w *write) lockRoom(ctx context.Context, code string) (room, error) {
	code, err := normalizeCode(code)
	if err != nil {
		return room{}, err
	}
	r, err := scanRoom(w.tx.QueryRow(ctx, `SELECT `+roomColumns+` FROM threads WHERE code = $1 FOR UPDATE`, code))
	if errors.Is(err, pgx.ErrNoRows) {
		return room{}, kungfu.Errorf(kungfu.CodeThreadNotFound, "no room %s", code)
	}
	return r, err
}

// role returns the caller's role in the room, or NOT_MEMBER.
func role(ctx context.Context, q pgx.Tx, roomID, accountID int64) (string, error) {
	var role string
	err := q.QueryRow(ctx, `SELECT role FROM thread_members WHERE thread_id = $1 AND account_id = $2`, roomID, accountID).Scan(&role)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", kungfu.Errorf(kungfu.CodeNotMember, "you are not a member of this room")
	}
	return role, err
}

func canSpeak(role string) bool { return role == "governor" || role == "speaker" }

// requireOpen refuses writes to a closed room.
func requireOpen(r room) error {
	if r.Status != "open" {
		return kungfu.Errorf(kungfu.CodeThreadClosed, "room %s is closed", r.Code)
	}
	return nil
}

// governedRoom locks the room for a governance action: the caller must be
// a governor of the open room.
func (w *write) governedRoom(ctx context.Context, code string) (room, error) {
	r, err := w.lockRoom(ctx, code)
	if err != nil {
		return room{}, err
	}
	rl, err := role(ctx, w.tx, r.ID, w.who.AccountID)
	if err != nil {
		return room{}, err
	}
	if err := requireOpen(r); err != nil {
		return room{}, err
	}
	if rl != "governor" {
		return room{}, kungfu.Errorf(kungfu.CodeNotGovernor, "only a governor can do this")
	}
	return r, nil
}

func newCode() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}
