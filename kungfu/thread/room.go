package thread

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

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/credential"
)

var (
	codeRE    = regexp.MustCompile(`^(?i)[0-9a-f]{12}$`)
	roomKeyRE = regexp.MustCompile(`^kf_[0-9a-f]{32}$`)
)

func normalizeCode(code string) (string, error) {
	code = strings.TrimSpace(code)
	if !codeRE.MatchString(code) {
		return "", kungfu.Errorf(kungfu.CodeInvalidCode, "a room code is 12 hex characters")
	}
	return strings.ToLower(code), nil
}

// normalizeRole accepts the protocol's role names; "read" is the key role
// alias for observer.
func normalizeRole(role string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(role)) {
	case "", "speaker":
		return "speaker", nil
	case "governor":
		return "governor", nil
	case "observer", "read":
		return "observer", nil
	}
	return "", kungfu.Invalid(kungfu.FieldError{Field: "role", Message: "one of governor, speaker, observer"})
}

// Key is a freshly signed room key. Raw is shown in the issuing response
// only; replays carry the fingerprint.
type Key struct {
	Key         string    `json:"key"`
	Fingerprint string    `json:"key_fingerprint"`
	Role        string    `json:"key_role"`
	IssuedAt    time.Time `json:"key_issued_at"`
}

func newRoomKey() (raw string, hash []byte, hint string) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	h := hex.EncodeToString(b[:])
	raw = "kf_" + h
	sum := sha256.Sum256([]byte(raw))
	return raw, sum[:], "kf_" + h[:4] + "…" + h[28:]
}

// issueKey replaces the room's key (voiding the old one) in the open tx.
func (w *write) issueKey(ctx context.Context, r room, role string) (Key, error) {
	raw, hash, hint := newRoomKey()
	if _, err := w.tx.Exec(ctx, `UPDATE threads SET key_hash = $2, key_role = $3, key_issued_at = $4, key_hint = $5 WHERE id = $1`,
		r.ID, hash, role, w.now, hint); err != nil {
		return Key{}, err
	}
	return Key{Key: raw, Fingerprint: hint, Role: role, IssuedAt: w.now}, nil
}

// Started is thread_start's result.
type Started struct {
	Thread Ref    `json:"thread"`
	Role   string `json:"role"`
	*Key
}

// Snapshot never stores the raw key.
func (s Started) Snapshot() any {
	if s.Key != nil {
		k := *s.Key
		k.Key = ""
		s.Key = &k
	}
	return s
}

// Start opens a room with the caller as governor, optionally signing the
// first key in the same transaction.
func (s *Service) Start(ctx context.Context, who kungfu.Caller, subject string, withKey bool, keyRole string, idem Idem) (any, error) {
	subject = strings.TrimSpace(subject)
	if utf8.RuneCountInString(subject) > MaxSubject {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "subject", Message: fmt.Sprintf("at most %d characters", MaxSubject)})
	}
	if credential.Find(subject) != "" {
		return nil, kungfu.Errorf(kungfu.CodeSensitiveContent, "the subject contains a credential-shaped string")
	}
	keyRole, err := normalizeRole(keyRole)
	if err != nil {
		return nil, err
	}
	return s.run(ctx, who, "thread_start", idem, func(ctx context.Context, w *write) (any, error) {
		if err := w.roomLimit(ctx, who.AccountID); err != nil {
			return nil, err
		}
		var r room
		var err error
		for range 5 {
			r, err = scanRoom(w.tx.QueryRow(ctx, `INSERT INTO threads (code, subject, created_by, created_at)
				VALUES ($1, $2, $3, $4) ON CONFLICT (code) DO NOTHING RETURNING `+roomColumns, newCode(), subject, who.AccountID, w.now))
			if !errors.Is(err, pgx.ErrNoRows) {
				break
			}
		}
		if err != nil {
			return nil, err
		}
		if _, err := w.tx.Exec(ctx, `INSERT INTO thread_members (thread_id, account_id, role, joined_at) VALUES ($1, $2, 'governor', $3)`,
			r.ID, who.AccountID, w.now); err != nil {
			return nil, err
		}
		out := Started{Thread: r.ref(), Role: "governor"}
		if withKey {
			k, err := w.issueKey(ctx, r, keyRole)
			if err != nil {
				return nil, err
			}
			out.Key = &k
		}
		return out, nil
	})
}

// roomLimit refuses a membership beyond the per-account cap of open rooms.
func (w *write) roomLimit(ctx context.Context, accountID int64) error {
	// Serialize an account's concurrent starts and joins so the cap holds.
	if _, err := w.tx.Exec(ctx, `SELECT pg_advisory_xact_lock(2, $1::int)`, accountID%2147483647); err != nil {
		return err
	}
	var n int
	if err := w.tx.QueryRow(ctx, `SELECT count(*) FROM thread_members m JOIN threads t ON t.id = m.thread_id
		WHERE m.account_id = $1 AND t.status = 'open'`, accountID).Scan(&n); err != nil {
		return err
	}
	if n >= MaxOpenRooms {
		return kungfu.Errorf(kungfu.CodeRoomLimit, "you are in %d open rooms, the maximum", MaxOpenRooms)
	}
	return nil
}

// KeyIssued is thread_key's result.
type KeyIssued struct {
	Thread Ref `json:"thread"`
	Key
}

// Snapshot never stores the raw key.
func (k KeyIssued) Snapshot() any { k.Key.Key = ""; return k }

// IssueKey signs a new key for the room, voiding the old one.
func (s *Service) IssueKey(ctx context.Context, who kungfu.Caller, code, keyRole string, idem Idem) (any, error) {
	keyRole, err := normalizeRole(keyRole)
	if err != nil {
		return nil, err
	}
	return s.run(ctx, who, "thread_key", idem, func(ctx context.Context, w *write) (any, error) {
		r, err := w.governedRoom(ctx, code)
		if err != nil {
			return nil, err
		}
		k, err := w.issueKey(ctx, r, keyRole)
		if err != nil {
			return nil, err
		}
		return KeyIssued{Thread: r.ref(), Key: k}, nil
	})
}

// Revoked is thread_key_revoke's result.
type Revoked struct {
	Thread  Ref  `json:"thread"`
	Revoked bool `json:"revoked"`
}

// RevokeKey voids the live key without issuing another.
func (s *Service) RevokeKey(ctx context.Context, who kungfu.Caller, code string, idem Idem) (any, error) {
	return s.run(ctx, who, "thread_key_revoke", idem, func(ctx context.Context, w *write) (any, error) {
		r, err := w.governedRoom(ctx, code)
		if err != nil {
			return nil, err
		}
		if _, err := w.tx.Exec(ctx, `UPDATE threads SET key_hash = NULL, key_role = NULL, key_issued_at = NULL, key_hint = NULL WHERE id = $1`, r.ID); err != nil {
			return nil, err
		}
		return Revoked{Thread: r.ref(), Revoked: r.KeyHash != nil}, nil
	})
}

// Joined is thread_join's result.
type Joined struct {
	Thread        Ref       `json:"thread"`
	Role          string    `json:"role"`
	JoinedAt      time.Time `json:"joined_at"`
	AlreadyMember bool      `json:"already_member"`
}

// Join admits the caller with the room's live key. Every way a key can be
// wrong (unknown, superseded, revoked, room closed) is the same KEY_INVALID.
func (s *Service) Join(ctx context.Context, who kungfu.Caller, key string, idem Idem) (any, error) {
	invalid := kungfu.Errorf(kungfu.CodeKeyInvalid, "this room key is not valid (wrong, replaced, revoked or the room is closed)")
	key = strings.TrimSpace(key)
	if !roomKeyRE.MatchString(key) {
		return nil, invalid
	}
	sum := sha256.Sum256([]byte(key))
	return s.run(ctx, who, "thread_join", idem, func(ctx context.Context, w *write) (any, error) {
		var code string
		err := w.tx.QueryRow(ctx, `SELECT code FROM threads WHERE key_hash = $1 AND status = 'open'`, sum[:]).Scan(&code)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, invalid
		}
		if err != nil {
			return nil, err
		}
		r, err := w.lockRoom(ctx, code)
		if err != nil {
			return nil, err
		}
		// Re-check under the room lock: a reissue or close may have won.
		if r.Status != "open" || r.KeyHash == nil || string(r.KeyHash) != string(sum[:]) {
			return nil, invalid
		}
		var existing Joined
		err = w.tx.QueryRow(ctx, `SELECT role, joined_at FROM thread_members WHERE thread_id = $1 AND account_id = $2`,
			r.ID, who.AccountID).Scan(&existing.Role, &existing.JoinedAt)
		if err == nil {
			existing.Thread, existing.AlreadyMember = r.ref(), true
			return existing, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, err
		}
		var members int
		if err := w.tx.QueryRow(ctx, `SELECT count(*) FROM thread_members WHERE thread_id = $1`, r.ID).Scan(&members); err != nil {
			return nil, err
		}
		if members >= MaxMembers {
			return nil, kungfu.Errorf(kungfu.CodeMemberLimit, "room %s has %d members, the maximum", r.Code, MaxMembers)
		}
		if err := w.roomLimit(ctx, who.AccountID); err != nil {
			return nil, err
		}
		if _, err := w.tx.Exec(ctx, `INSERT INTO thread_members (thread_id, account_id, role, joined_via_key_hash, joined_at)
			VALUES ($1, $2, $3, $4, $5)`, r.ID, who.AccountID, *r.KeyRole, sum[:], w.now); err != nil {
			return nil, err
		}
		return Joined{Thread: r.ref(), Role: *r.KeyRole, JoinedAt: w.now}, nil
	})
}

// Ended reports what a membership end or close cascaded into.
type Ended struct {
	Thread    Ref    `json:"thread"`
	Account   string `json:"account,omitempty"`
	Withdrawn int    `json:"withdrawn"`
	Voided    int    `json:"voided"`
	Forfeited int    `json:"forfeited"`
}

// Leave ends the caller's membership. An open room keeps its last governor.
func (s *Service) Leave(ctx context.Context, who kungfu.Caller, code string, idem Idem) (any, error) {
	return s.run(ctx, who, "thread_leave", idem, func(ctx context.Context, w *write) (any, error) {
		r, err := w.lockRoom(ctx, code)
		if err != nil {
			return nil, err
		}
		rl, err := role(ctx, w.tx, r.ID, who.AccountID)
		if err != nil {
			return nil, err
		}
		if err := w.keepGovernor(ctx, r, rl); err != nil {
			return nil, err
		}
		out, err := w.endMembership(ctx, r, who.AccountID, "leave")
		out.Account = who.Name
		return out, err
	})
}

// Remove ends another member's membership (governors only).
func (s *Service) Remove(ctx context.Context, who kungfu.Caller, code, target string, idem Idem) (any, error) {
	return s.run(ctx, who, "thread_remove", idem, func(ctx context.Context, w *write) (any, error) {
		r, err := w.governedRoom(ctx, code)
		if err != nil {
			return nil, err
		}
		id, name, rl, err := w.memberByRef(ctx, r, target)
		if err != nil {
			return nil, err
		}
		if err := w.keepGovernor(ctx, r, rl); err != nil {
			return nil, err
		}
		out, err := w.endMembership(ctx, r, id, "remove")
		out.Account = name
		return out, err
	})
}

// RoleSet is thread_set_role's result.
type RoleSet struct {
	Thread    Ref    `json:"thread"`
	Account   string `json:"account"`
	Role      string `json:"role"`
	Withdrawn int    `json:"withdrawn"`
}

// SetRole changes a member's role. Demotion to observer withdraws what the
// member was asked to answer but keeps its assignment rights.
func (s *Service) SetRole(ctx context.Context, who kungfu.Caller, code, target, newRole string, idem Idem) (any, error) {
	newRole, err := normalizeRole(newRole)
	if err != nil {
		return nil, err
	}
	return s.run(ctx, who, "thread_set_role", idem, func(ctx context.Context, w *write) (any, error) {
		r, err := w.governedRoom(ctx, code)
		if err != nil {
			return nil, err
		}
		id, name, rl, err := w.memberByRef(ctx, r, target)
		if err != nil {
			return nil, err
		}
		if rl == newRole {
			return nil, kungfu.Errorf(kungfu.CodeInvalidTarget, "%s is already %s", name, newRole)
		}
		if newRole != "governor" {
			if err := w.keepGovernor(ctx, r, rl); err != nil {
				return nil, err
			}
		}
		if _, err := w.tx.Exec(ctx, `UPDATE thread_members SET role = $3 WHERE thread_id = $1 AND account_id = $2`, r.ID, id, newRole); err != nil {
			return nil, err
		}
		out := RoleSet{Thread: r.ref(), Account: name, Role: newRole}
		if newRole == "observer" {
			out.Withdrawn, err = w.withdraw(ctx, `thread_id = $1 AND account_id = $2`, "role_change", r.ID, id)
		}
		return out, err
	})
}

// Close ends the room for good: receipts withdrawn, undelivered work voided,
// the key cleared. Delivered work stays judgeable until its deadline, and
// members keep read access.
func (s *Service) Close(ctx context.Context, who kungfu.Caller, code string, idem Idem) (any, error) {
	return s.run(ctx, who, "thread_close", idem, func(ctx context.Context, w *write) (any, error) {
		r, err := w.governedRoom(ctx, code)
		if err != nil {
			return nil, err
		}
		if _, err := w.tx.Exec(ctx, `UPDATE threads SET status = 'closed', closed_at = $2,
			key_hash = NULL, key_role = NULL, key_issued_at = NULL, key_hint = NULL WHERE id = $1`, r.ID, w.now); err != nil {
			return nil, err
		}
		out := Ended{}
		if out.Withdrawn, err = w.withdraw(ctx, `thread_id = $1`, "close", r.ID); err != nil {
			return nil, err
		}
		if out.Voided, err = w.void(ctx, `thread_id = $1 AND state IN ('open', 'taken')`, "close", 0, r.ID); err != nil {
			return nil, err
		}
		r.Status = "closed"
		out.Thread = r.ref()
		return out, nil
	})
}

// keepGovernor refuses to remove or demote the last governor of an open room.
func (w *write) keepGovernor(ctx context.Context, r room, currentRole string) error {
	if currentRole != "governor" || r.Status != "open" {
		return nil
	}
	var n int
	if err := w.tx.QueryRow(ctx, `SELECT count(*) FROM thread_members WHERE thread_id = $1 AND role = 'governor'`, r.ID).Scan(&n); err != nil {
		return err
	}
	if n <= 1 {
		return kungfu.Errorf(kungfu.CodeLastManager, "an open room keeps at least one governor: promote another member first")
	}
	return nil
}

// endMembership deletes the membership and cascades: the member's pending
// receipts are withdrawn, undelivered assignments it took or created are
// voided, and delivered ones it created lose their judge for good.
func (w *write) endMembership(ctx context.Context, r room, accountID int64, cause string) (Ended, error) {
	out := Ended{Thread: r.ref()}
	if _, err := w.tx.Exec(ctx, `DELETE FROM thread_members WHERE thread_id = $1 AND account_id = $2`, r.ID, accountID); err != nil {
		return out, err
	}
	var err error
	if out.Withdrawn, err = w.withdraw(ctx, `thread_id = $1 AND account_id = $2`, cause, r.ID, accountID); err != nil {
		return out, err
	}
	if out.Voided, err = w.void(ctx, `thread_id = $1 AND state IN ('open', 'taken') AND (creator_id = $2 OR assignee_id = $2)`, cause, accountID, r.ID, accountID); err != nil {
		return out, err
	}
	tag, err := w.tx.Exec(ctx, `UPDATE assigns SET judge_forfeited_at = $3
		WHERE thread_id = $1 AND creator_id = $2 AND state = 'delivered' AND judge_forfeited_at IS NULL`, r.ID, accountID, w.now)
	out.Forfeited = int(tag.RowsAffected())
	return out, err
}

// withdraw ends pending receipts matching where with the given cause.
func (w *write) withdraw(ctx context.Context, where, cause string, args ...any) (int, error) {
	n := len(args)
	tag, err := w.tx.Exec(ctx, `UPDATE thread_receipts SET state = 'withdrawn', resolution = $`+strconv.Itoa(n+1)+
		`, ended_at = $`+strconv.Itoa(n+2)+` WHERE state = 'pending' AND `+where, append(args, cause, w.now)...)
	return int(tag.RowsAffected()), err
}

// void ends undelivered assignments matching where and tells the party
// other than actor (0 = tell both) that the work is gone.
func (w *write) void(ctx context.Context, where, cause string, actor int64, args ...any) (int, error) {
	n := len(args)
	rows, err := w.tx.Query(ctx, `UPDATE assigns SET state = 'voided', ended_at = $`+strconv.Itoa(n+1)+`, end_cause = $`+strconv.Itoa(n+2)+
		` WHERE `+where+` RETURNING creator_id, assignee_id, (taken_at IS NOT NULL)`, append(args, w.now, cause)...)
	if err != nil {
		return 0, err
	}
	type party struct {
		creator, assignee int64
		taken             bool
	}
	parties, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (party, error) {
		var p party
		err := r.Scan(&p.creator, &p.assignee, &p.taken)
		return p, err
	})
	if err != nil {
		return 0, err
	}
	for _, p := range parties {
		for _, id := range []int64{p.creator, p.assignee} {
			if id != actor && (p.taken || id == p.assignee) {
				if err := w.notify(ctx, id, "exit"); err != nil {
					return 0, err
				}
			}
		}
	}
	return len(parties), nil
}

// memberByRef resolves a member given by account name or id.
func (w *write) memberByRef(ctx context.Context, r room, ref string) (id int64, name, role string, err error) {
	ref = strings.TrimSpace(ref)
	q := `SELECT a.id, a.name, m.role FROM thread_members m JOIN accounts a ON a.id = m.account_id
		WHERE m.thread_id = $1 AND lower(a.name) = lower($2)`
	if n, perr := strconv.ParseInt(ref, 10, 64); perr == nil {
		q = `SELECT a.id, a.name, m.role FROM thread_members m JOIN accounts a ON a.id = m.account_id
			WHERE m.thread_id = $1 AND (lower(a.name) = lower($2) OR a.id = ` + strconv.FormatInt(n, 10) + `)`
	}
	err = w.tx.QueryRow(ctx, q, r.ID, ref).Scan(&id, &name, &role)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "", "", kungfu.Errorf(kungfu.CodeInvalidTarget, "%q is not a member of this room", ref)
	}
	return id, name, role, err
}
