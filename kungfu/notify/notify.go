package notify

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/signing"
)

// Push kinds (the protocol's notify kinds).
const (
	KindReply   = "reply"   // an entry asked the account
	KindJudge   = "judge"   // a delivery awaits its judgment
	KindVerdict = "verdict" // its delivery was judged
	KindExit    = "exit"    // the other party dropped, voided, timed out
	KindAssign  = "assign"  // an assignment was created for it
)

var kinds = map[string]bool{KindReply: true, KindJudge: true, KindVerdict: true, KindExit: true, KindAssign: true}

// MaxAttempts bounds the tries of one push, counted in PostgreSQL.
const MaxAttempts = 5

// MaxURL is the longest endpoint URL accepted, in characters.
const MaxURL = 2048

// Verifier POSTs body to url and returns the reply. It is the caller's
// outbound client (package queue), so this package stays free of HTTP.
type Verifier interface {
	Verify(ctx context.Context, url string, body []byte) (status int, respBody []byte, err error)
}

// Service owns notify endpoints and the notify outbox.
type Service struct {
	DB       *pgxpool.Pool
	Now      kungfu.Clock
	Keys     *signing.ServerKey
	Verifier Verifier
	// Backoff is the wait after the attempts-th failed try (1 to 4); nil
	// means DefaultBackoff. Tests shorten it.
	Backoff func(attempts int) time.Duration
}

// DefaultBackoff waits 15 s, 30 s, 1 min, 2 min between the five tries.
func DefaultBackoff(attempts int) time.Duration {
	return 15 * time.Second << min(max(attempts-1, 0), 8)
}

// RetryDelay is the wait after the attempts-th failed try.
func (s *Service) RetryDelay(attempts int) time.Duration {
	if s.Backoff != nil {
		return s.Backoff(attempts)
	}
	return DefaultBackoff(attempts)
}

// Registered is the result of Register. Secret is shown only here.
type Registered struct {
	URL      string
	Verified bool
	Secret   string
}

// VerificationBody is the probe POSTed to a new endpoint.
func VerificationBody(challenge string) []byte {
	return []byte(`{"type":"verification","challenge":"` + challenge + `"}`)
}

func purpose(accountID int64) string { return "notify-secret:" + strconv.FormatInt(accountID, 10) }

// Register sets the caller's one endpoint after proving the URL answers
// for it: the endpoint must echo a challenge that is half of the new
// secret. The probe runs before any write, so a failed one stores nothing.
func (s *Service) Register(ctx context.Context, who kungfu.Caller, rawURL string) (Registered, error) {
	if who.Anonymous() {
		return Registered{}, kungfu.Errorf(kungfu.CodeUnauthorized, "notify_register needs an account")
	}
	u, err := checkURL(rawURL)
	if err != nil {
		return Registered{}, err
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return Registered{}, fmt.Errorf("notify: secret: %w", err)
	}
	secret := hex.EncodeToString(raw[:])
	challenge := secret[:32]

	status, reply, err := s.Verifier.Verify(ctx, u, VerificationBody(challenge))
	switch {
	case err != nil:
		return Registered{}, kungfu.Invalid(kungfu.FieldError{Field: "url",
			Message: "the endpoint could not be reached (it must be a public https address that answers within 10 s)"})
	case status < 200 || status > 299:
		return Registered{}, kungfu.Invalid(kungfu.FieldError{Field: "url",
			Message: fmt.Sprintf("the endpoint answered the verification POST with HTTP %d; it must answer 2xx with the challenge in the body", status)})
	case !bytes.Contains(reply, []byte(challenge)):
		return Registered{}, kungfu.Invalid(kungfu.FieldError{Field: "url",
			Message: `the endpoint's reply did not contain the challenge; answer the verification POST with a body that includes it, e.g. {"echo":"<challenge>"}`})
	}

	sealed, err := s.Keys.Seal([]byte(secret), purpose(who.AccountID))
	if err != nil {
		return Registered{}, fmt.Errorf("notify: seal secret: %w", err)
	}
	now := s.Now()
	if _, err := s.DB.Exec(ctx,
		`INSERT INTO notify_endpoints (account_id, url, secret_sealed, verified_at, created_at, updated_at)
		 VALUES ($1, $2, $3, $4, $4, $4)
		 ON CONFLICT (account_id) DO UPDATE
		 SET url = EXCLUDED.url, secret_sealed = EXCLUDED.secret_sealed,
		     verified_at = EXCLUDED.verified_at, updated_at = EXCLUDED.updated_at`,
		who.AccountID, u, sealed, now); err != nil {
		return Registered{}, fmt.Errorf("notify: store endpoint: %w", err)
	}
	return Registered{URL: u, Verified: true, Secret: secret}, nil
}

func checkURL(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	bad := func(msg string) error { return kungfu.Invalid(kungfu.FieldError{Field: "url", Message: msg}) }
	if raw == "" {
		return "", bad("must be an https:// URL")
	}
	if utf8.RuneCountInString(raw) > MaxURL {
		return "", bad(fmt.Sprintf("must be at most %d characters", MaxURL))
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" || u.Opaque != "" {
		return "", bad("must be an https:// URL with a host")
	}
	return raw, nil
}

// Delete removes the caller's endpoint and the pushes still owed to it.
// The facts those pushes pointed at are untouched.
func (s *Service) Delete(ctx context.Context, who kungfu.Caller) (bool, error) {
	if who.Anonymous() {
		return false, kungfu.Errorf(kungfu.CodeUnauthorized, "notify_delete needs an account")
	}
	var deleted bool
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM notify_endpoints WHERE account_id = $1`, who.AccountID)
		if err != nil {
			return err
		}
		deleted = tag.RowsAffected() > 0
		_, err = tx.Exec(ctx, `DELETE FROM notify_outbox WHERE account_id = $1 AND sent_at IS NULL`, who.AccountID)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("notify: delete: %w", err)
	}
	return deleted, nil
}

// Emit owes accountID a push of kind, inside the fact's transaction tx, if
// it has a verified endpoint; ok is false when it has none. The insert runs
// under a savepoint, so even an error leaves tx usable: callers may log it
// and go on, since a push must never fail the action. After commit, hand id
// to the queue (queue.Notifier.Enqueue).
func (s *Service) Emit(ctx context.Context, tx pgx.Tx, accountID int64, kind string) (id int64, ok bool, err error) {
	if !kinds[kind] {
		return 0, false, fmt.Errorf("notify: unknown kind %q", kind)
	}
	err = pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
		return sp.QueryRow(ctx,
			`INSERT INTO notify_outbox (account_id, kind, next_attempt_at, created_at)
			 SELECT $1, $2, $3, $3
			 WHERE EXISTS (SELECT 1 FROM notify_endpoints WHERE account_id = $1)
			 RETURNING id`, accountID, kind, s.Now()).Scan(&id)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("notify: emit: %w", err)
	}
	return id, true, nil
}

// Push is one owed push, ready to send.
type Push struct {
	ID       int64
	URL      string
	Secret   string
	Body     []byte
	Attempts int
}

// Load returns outbox row id if it is still to be tried. ok is false when
// there is nothing to send: sent, abandoned, out of attempts, or its
// endpoint is gone (then the row is abandoned, so it is never tried again).
func (s *Service) Load(ctx context.Context, id int64) (Push, bool, error) {
	var (
		p         = Push{ID: id}
		accountID int64
		kind      string
		count     int
		endpoint  *string
		sealed    []byte
	)
	err := s.DB.QueryRow(ctx,
		`SELECT o.account_id, o.kind, o.count, o.attempts, e.url, e.secret_sealed
		 FROM notify_outbox o LEFT JOIN notify_endpoints e ON e.account_id = o.account_id
		 WHERE o.id = $1 AND o.sent_at IS NULL AND o.abandoned_at IS NULL AND o.attempts < $2`,
		id, MaxAttempts).Scan(&accountID, &kind, &count, &p.Attempts, &endpoint, &sealed)
	if errors.Is(err, pgx.ErrNoRows) {
		return Push{}, false, nil
	}
	if err != nil {
		return Push{}, false, fmt.Errorf("notify: load %d: %w", id, err)
	}
	if endpoint == nil {
		return Push{}, false, s.abandon(ctx, id)
	}
	secret, err := s.Keys.Open(sealed, purpose(accountID))
	if err != nil {
		// Sealed under another server key: retrying cannot help.
		if aerr := s.abandon(ctx, id); aerr != nil {
			return Push{}, false, aerr
		}
		return Push{}, false, fmt.Errorf("notify: secret of account %d: %w", accountID, err)
	}
	p.URL, p.Secret = *endpoint, string(secret)
	p.Body = fmt.Appendf(nil, `{"account":%d,"kind":%q,"count":%d}`, accountID, kind, count)
	return p, true, nil
}

func (s *Service) abandon(ctx context.Context, id int64) error {
	if _, err := s.DB.Exec(ctx,
		`UPDATE notify_outbox SET abandoned_at = $2
		 WHERE id = $1 AND sent_at IS NULL AND abandoned_at IS NULL`, id, s.Now()); err != nil {
		return fmt.Errorf("notify: abandon %d: %w", id, err)
	}
	return nil
}

// Record notes the outcome of one try of push id: status is the HTTP
// status (0 when no response came). After a failed try, giveUp reports
// that the row will not be tried again: this was try MaxAttempts (the row
// is now abandoned), or another worker already settled it. Every update is
// conditional on the row still being open, so a sent row stays sent.
func (s *Service) Record(ctx context.Context, id int64, status int, sent bool) (giveUp bool, err error) {
	now := s.Now()
	var last *int
	if status != 0 {
		last = &status
	}
	if sent {
		_, err := s.DB.Exec(ctx,
			`UPDATE notify_outbox SET sent_at = $2, last_status = $3
			 WHERE id = $1 AND sent_at IS NULL AND abandoned_at IS NULL`, id, now, last)
		if err != nil {
			return false, fmt.Errorf("notify: record %d sent: %w", id, err)
		}
		return false, nil
	}
	err = pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		var attempts int
		err := tx.QueryRow(ctx,
			`SELECT attempts FROM notify_outbox
			 WHERE id = $1 AND sent_at IS NULL AND abandoned_at IS NULL AND attempts < $2
			 FOR UPDATE`, id, MaxAttempts).Scan(&attempts)
		if errors.Is(err, pgx.ErrNoRows) {
			giveUp = true
			return nil
		}
		if err != nil {
			return err
		}
		attempts++
		var abandoned *time.Time
		if attempts >= MaxAttempts {
			abandoned, giveUp = &now, true
		}
		_, err = tx.Exec(ctx,
			`UPDATE notify_outbox
			 SET attempts = $2, last_status = $3, next_attempt_at = $4, abandoned_at = $5
			 WHERE id = $1`, id, attempts, last, now.Add(s.RetryDelay(attempts)), abandoned)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("notify: record %d failed try: %w", id, err)
	}
	return giveUp, nil
}

// Lease is how long Due holds back a row it hands out, so sweeps in other
// processes do not enqueue it again meanwhile. If that enqueue is lost
// too, the row is due again after Lease.
const Lease = 30 * time.Second

// Due returns up to limit rows whose next try is due, for the sweep to
// enqueue. Rows locked by another sweep are skipped.
func (s *Service) Due(ctx context.Context, limit int) ([]int64, error) {
	now := s.Now()
	rows, err := s.DB.Query(ctx,
		`UPDATE notify_outbox SET next_attempt_at = $3
		 WHERE id IN (
		     SELECT id FROM notify_outbox
		     WHERE sent_at IS NULL AND abandoned_at IS NULL AND attempts < $4 AND next_attempt_at <= $1
		     ORDER BY next_attempt_at
		     LIMIT $2
		     FOR UPDATE SKIP LOCKED)
		 RETURNING id`, now, limit, now.Add(Lease), MaxAttempts)
	if err != nil {
		return nil, fmt.Errorf("notify: due: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("notify: due: %w", err)
	}
	return ids, nil
}
