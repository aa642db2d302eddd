package karmadue

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/credits"
)

// ChallengeTTL is how long a registration challenge can be spent.
const ChallengeTTL = 5 * time.Minute

// labelLock serializes every label reservation: a lookalike shares no key
// with the label it imitates, so no unique index can stop two of them
// landing at once.
const labelLock = 0x6b64_6c61_6265_6c00 // "kdlabel"

var (
	agentIDRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	handleRE  = regexp.MustCompile(`^kd_[0-9a-f]{12}$`)
)

// Service owns KarmaDue agents: their accounts, keys, labels and
// registration challenges.
type Service struct {
	DB  *pgxpool.Pool
	Now kungfu.Clock
}

// Agent is what a signed call needs to know about its signer.
type Agent struct {
	ID        string
	AccountID int64
	Name      string
	Keys      []ed25519.PublicKey
	// KeyIDs are the credential ids of Keys, index for index.
	KeyIDs []int64
}

// ErrUnknownAgent: no such agent, or it is revoked.
var ErrUnknownAgent = errors.New("karmadue: unknown agent")

// Agent returns a live agent with its live keys. A revoked agent, one whose
// account is not active, and one with no live key are all ErrUnknownAgent,
// so the door can answer every such case alike.
func (s *Service) Agent(ctx context.Context, agentID string) (Agent, error) {
	if !agentIDRE.MatchString(agentID) {
		return Agent{}, ErrUnknownAgent
	}
	rows, err := s.DB.Query(ctx,
		`SELECT a.account_id, acc.name, c.id, c.public_key
		 FROM kd_agents a
		 JOIN accounts acc ON acc.id = a.account_id
		 JOIN credentials c ON c.kind = 'ed25519' AND c.external_id = a.id::text AND c.revoked_at IS NULL
		 WHERE a.id = $1 AND a.status = 'active' AND acc.status = 'active'
		 ORDER BY c.id`, agentID)
	if err != nil {
		return Agent{}, fmt.Errorf("karmadue agent: %w", err)
	}
	ag := Agent{ID: agentID}
	for rows.Next() {
		var (
			key []byte
			id  int64
		)
		if err := rows.Scan(&ag.AccountID, &ag.Name, &id, &key); err != nil {
			return Agent{}, fmt.Errorf("karmadue agent: %w", err)
		}
		if len(key) == ed25519.PublicKeySize {
			ag.Keys = append(ag.Keys, ed25519.PublicKey(key))
			ag.KeyIDs = append(ag.KeyIDs, id)
		}
	}
	if err := rows.Err(); err != nil {
		return Agent{}, fmt.Errorf("karmadue agent: %w", err)
	}
	if len(ag.Keys) == 0 {
		return Agent{}, ErrUnknownAgent
	}
	return ag, nil
}

// AgentOf returns the live agent id of an account, or "" when it has none.
func (s *Service) AgentOf(ctx context.Context, accountID int64) (string, error) {
	var id string
	err := s.DB.QueryRow(ctx,
		`SELECT id::text FROM kd_agents WHERE account_id = $1 AND status = 'active'`, accountID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("karmadue agent of: %w", err)
	}
	return id, nil
}

// Challenge is one registration challenge: Payload is the exact text the
// new key signs.
type Challenge struct {
	ID        string
	Payload   string
	ExpiresAt time.Time
}

// NewChallenge stores a fresh single-use challenge. The payload names its
// purpose, id and expiry so a signature over it cannot be mistaken for a
// kd-mcp-v1 request signature, and carries fresh randomness so no two
// payloads are alike.
func (s *Service) NewChallenge(ctx context.Context) (Challenge, error) {
	now := s.Now()
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	c := Challenge{ID: newUUID(), ExpiresAt: now.Add(ChallengeTTL)}
	c.Payload = strings.Join([]string{"kd-register-v1", c.ID, strconv.FormatInt(c.ExpiresAt.Unix(), 10), hex.EncodeToString(nonce[:])}, "\n")
	// Expired challenges are swept a few at a time by their successors, so
	// the table stays as small as the last hour's traffic.
	if _, err := s.DB.Exec(ctx,
		`DELETE FROM kd_challenges WHERE id IN (SELECT id FROM kd_challenges WHERE expires_at < $1 LIMIT 20)`,
		now.Add(-time.Hour)); err != nil {
		return Challenge{}, fmt.Errorf("karmadue challenge: %w", err)
	}
	if _, err := s.DB.Exec(ctx,
		`INSERT INTO kd_challenges (id, payload, created_at, expires_at) VALUES ($1, $2, $3, $4)`,
		c.ID, c.Payload, now, c.ExpiresAt); err != nil {
		return Challenge{}, fmt.Errorf("karmadue challenge: %w", err)
	}
	return c, nil
}

// Proof is a new key's signature over a registration challenge.
type Proof struct {
	PublicKey   ed25519.PublicKey
	ChallengeID string
	Signature   []byte
}

func errChallenge() error {
	return kungfu.Invalid(kungfu.FieldError{Field: "challenge_id",
		Message: "unknown, used or expired challenge; call register_challenge for a new one"})
}

// spend uses up the challenge inside tx and checks the key signed it. A
// refusal rolls tx back, so a challenge is only ever spent by a call that
// succeeded.
func (s *Service) spend(ctx context.Context, tx pgx.Tx, p Proof, now time.Time) error {
	if !agentIDRE.MatchString(p.ChallengeID) {
		return errChallenge()
	}
	var payload string
	err := tx.QueryRow(ctx,
		`UPDATE kd_challenges SET used_at = $2 WHERE id = $1 AND used_at IS NULL AND expires_at > $2 RETURNING payload`,
		p.ChallengeID, now).Scan(&payload)
	if errors.Is(err, pgx.ErrNoRows) {
		return errChallenge()
	}
	if err != nil {
		return fmt.Errorf("spend challenge: %w", err)
	}
	if !ed25519.Verify(p.PublicKey, []byte(payload), p.Signature) {
		return kungfu.Errorf(kungfu.CodeBadSignature, "the signature does not verify the challenge payload with public_key")
	}
	return nil
}

// Registration asks for a new agent. Account is the Bearer caller that
// attaches the key to itself, or zero to create a key-only account.
type Registration struct {
	Label    string
	Platform string
	Proof
	Account int64
}

// Registered is a new agent; it never holds a secret.
type Registered struct {
	AgentID   string
	Handle    string
	Name      string
	Label     string
	Platform  string
	PublicKey string
	CreatedAt time.Time
	Attached  bool
}

// Register creates an agent, all in one transaction: the challenge is
// spent, the label reserved, the key stored and, for a key-only agent, an
// account named after the handle created with the signup grant.
func (s *Service) Register(ctx context.Context, r Registration) (Registered, error) {
	if err := checkLabel("name", r.Label); err != nil {
		return Registered{}, err
	}
	now := s.Now()
	var out Registered
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(labelLock)); err != nil {
			return err
		}
		if err := s.spend(ctx, tx, r.Proof, now); err != nil {
			return err
		}
		folded := fold(r.Label)
		holders, err := holdersOf(ctx, tx, folded)
		if err != nil {
			return err
		}
		if len(holders) > 0 {
			return s.labelRefusal(ctx, tx, holders, r)
		}
		if err := keyFree(ctx, tx, r.PublicKey); err != nil {
			return err
		}
		if r.Account != 0 {
			if id, err := liveAgentOf(ctx, tx, r.Account); err != nil {
				return err
			} else if id != "" {
				return kungfu.Errorf(kungfu.CodeInvalidState,
					"this account already has agent %s; use rotate_agent_key to change its key", id).
					WithDetails(map[string]any{"agent_id": id})
			}
		}
		out = Registered{AgentID: newUUID(), Label: r.Label, Platform: r.Platform,
			PublicKey: encodeKey(r.PublicKey), CreatedAt: now, Attached: r.Account != 0}
		if out.Handle, err = freeHandle(ctx, tx, out.AgentID); err != nil {
			return err
		}
		account := r.Account
		if account == 0 {
			// No password: a key-only account can never sign in at
			// /owner/key (no bcrypt hash matches ''), only sign.
			if err := tx.QueryRow(ctx,
				`INSERT INTO accounts (name, password_hash, created_at, updated_at) VALUES ($1, '', $2, $2) RETURNING id`,
				out.Handle, now).Scan(&account); err != nil {
				return err
			}
			if _, err := credits.Apply(ctx, tx, now, credits.Movement{
				AccountID: account, Type: credits.GrantSignup, Amount: credits.SignupGrant,
				RefType: "account", RefID: strconv.FormatInt(account, 10),
			}); err != nil {
				return err
			}
		}
		if err := tx.QueryRow(ctx, `SELECT name FROM accounts WHERE id = $1 AND status = 'active' FOR UPDATE`, account).Scan(&out.Name); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return kungfu.Errorf(kungfu.CodeUnauthorized, "the account is not active")
			}
			return err
		}
		if _, err := tx.Exec(ctx,
			`INSERT INTO kd_agents (id, account_id, handle, label, platform, created_at) VALUES ($1, $2, $3, $4, $5, $6)`,
			out.AgentID, account, out.Handle, r.Label, r.Platform, now); err != nil {
			return err
		}
		if err := insertKey(ctx, tx, account, out.AgentID, r.PublicKey, now); err != nil {
			return err
		}
		return reserve(ctx, tx, out.AgentID, folded)
	})
	if err != nil {
		if kungfu.AsError(err) != nil {
			return Registered{}, err
		}
		return Registered{}, fmt.Errorf("register agent: %w", err)
	}
	return out, nil
}

type holder struct {
	agentID   string
	accountID int64
	keys      [][]byte
}

// holdersOf lists the live agents whose label is the folded label or one
// edit away from it.
func holdersOf(ctx context.Context, tx pgx.Tx, folded string) ([]holder, error) {
	rows, err := tx.Query(ctx,
		`SELECT a.id::text, a.account_id,
		        coalesce((SELECT array_agg(c.public_key) FROM credentials c
		                  WHERE c.kind = 'ed25519' AND c.external_id = a.id::text AND c.revoked_at IS NULL), '{}')
		 FROM kd_agents a
		 WHERE a.status = 'active' AND a.id IN (SELECT agent_id FROM kd_label_keys WHERE key = ANY($1))
		 ORDER BY a.created_at, a.id`, probes(folded))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (holder, error) {
		var h holder
		err := r.Scan(&h.agentID, &h.accountID, &h.keys)
		return h, err
	})
}

// labelRefusal is label_yours when one of the holders is the caller's own
// agent (the same key, or the Bearer caller's account), else
// label_reserved with a free alternative that never names the holder.
func (s *Service) labelRefusal(ctx context.Context, tx pgx.Tx, holders []holder, r Registration) error {
	for _, h := range holders {
		mine := r.Account != 0 && h.accountID == r.Account
		for _, k := range h.keys {
			mine = mine || string(k) == string(r.PublicKey)
		}
		if mine {
			return kungfu.Errorf(kungfu.CodeLabelYours, "You already have an agent with this name.").
				WithDetails(map[string]any{"agent_id": h.agentID})
		}
	}
	e := kungfu.Errorf(kungfu.CodeLabelReserved, "label taken: exact or lookalike of an existing agent name")
	sug, err := suggest(ctx, tx, r.Label, r.Platform)
	if err != nil {
		return err
	}
	e.Suggestion = sug
	return e
}

// keyFree refuses a key that any agent holds or once held: a retired key
// stays retired, so whoever may have copied it can never sign again.
func keyFree(ctx context.Context, tx pgx.Tx, key ed25519.PublicKey) error {
	var (
		agentID string
		revoked bool
	)
	err := tx.QueryRow(ctx,
		`SELECT coalesce(external_id, ''), revoked_at IS NOT NULL FROM credentials WHERE kind = 'ed25519' AND public_key = $1`,
		[]byte(key)).Scan(&agentID, &revoked)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	e := kungfu.Invalid(kungfu.FieldError{Field: "public_key", Message: "this key was retired; sign with a new key"})
	if !revoked {
		// The caller proved it holds the key, so it may learn its agent.
		e = kungfu.Invalid(kungfu.FieldError{Field: "public_key", Message: "this key already belongs to agent " + agentID})
		e.Details.(map[string]any)["agent_id"] = agentID
	}
	return e
}

func liveAgentOf(ctx context.Context, tx pgx.Tx, accountID int64) (string, error) {
	var id string
	err := tx.QueryRow(ctx, `SELECT id::text FROM kd_agents WHERE account_id = $1 AND status = 'active'`, accountID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return id, err
}

// freeHandle derives the handle from the agent id and, in the unlikely case
// that it is taken (by a handle or, before kd_ was reserved, an account
// name), draws another. Registrations hold labelLock, so the check stands
// until commit.
func freeHandle(ctx context.Context, tx pgx.Tx, agentID string) (string, error) {
	h := "kd_" + strings.ReplaceAll(agentID, "-", "")[:12]
	for range 8 {
		var taken bool
		if err := tx.QueryRow(ctx,
			`SELECT EXISTS (SELECT 1 FROM kd_agents WHERE handle = $1) OR EXISTS (SELECT 1 FROM accounts WHERE lower(name) = $1)`,
			h).Scan(&taken); err != nil {
			return "", err
		}
		if !taken {
			return h, nil
		}
		var b [6]byte
		_, _ = rand.Read(b[:])
		h = "kd_" + hex.EncodeToString(b[:])
	}
	return "", errors.New("no free handle")
}

// insertKey stores key as the agent's live credential. keyFree checked it
// first, but a registration and a rotation hold different locks, so the
// same key can land twice at once; the unique index stops the second.
func insertKey(ctx context.Context, tx pgx.Tx, accountID int64, agentID string, key ed25519.PublicKey, now time.Time) error {
	enc := encodeKey(key)
	_, err := tx.Exec(ctx,
		`INSERT INTO credentials (account_id, kind, public_key, external_id, hint, created_at) VALUES ($1, 'ed25519', $2, $3, $4, $5)`,
		accountID, []byte(key), agentID, enc[:8], now)
	return keyTaken(err)
}

// keyTaken turns the unique violation of a key stored concurrently into
// the refusal keyFree gives; other errors pass unchanged.
func keyTaken(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "credentials_public_key" {
		return kungfu.Invalid(kungfu.FieldError{Field: "public_key", Message: "this key already belongs to an agent; sign with a new key"})
	}
	return err
}

func reserve(ctx context.Context, tx pgx.Tx, agentID, folded string) error {
	_, err := tx.Exec(ctx,
		`INSERT INTO kd_label_keys (agent_id, key) SELECT $1, unnest($2::text[])`, agentID, reservation(folded))
	return err
}

// Rotated is an agent's new key.
type Rotated struct {
	AgentID   string
	Handle    string
	PublicKey string
	RotatedAt time.Time
}

// Rotate replaces the agent's live keys with the one in p, in one
// transaction: from its commit on, only the new key verifies. keyID is the
// credential that verified the call; it must still be live once the agent
// is locked, or a call signed with a key another rotation just retired
// would replace that rotation's key.
func (s *Service) Rotate(ctx context.Context, agentID string, keyID int64, p Proof) (Rotated, error) {
	now := s.Now()
	out := Rotated{AgentID: agentID, PublicKey: encodeKey(p.PublicKey), RotatedAt: now}
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		var account int64
		// The account's key-share lock first (inserting the new key takes
		// it anyway), then the agent: Revoke locks the account before the
		// agent, and the same order keeps the two from deadlocking.
		err := tx.QueryRow(ctx,
			`SELECT acc.id FROM kd_agents a JOIN accounts acc ON acc.id = a.account_id
			 WHERE a.id = $1 FOR KEY SHARE OF acc`, agentID).Scan(&account)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrUnknownAgent
		}
		if err != nil {
			return err
		}
		err = tx.QueryRow(ctx,
			`SELECT account_id, handle FROM kd_agents WHERE id = $1 AND status = 'active' FOR UPDATE`, agentID).
			Scan(&account, &out.Handle)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrUnknownAgent
		}
		if err != nil {
			return err
		}
		if err := signingKeyLive(ctx, tx, agentID, keyID); err != nil {
			return err
		}
		if err := s.spend(ctx, tx, p, now); err != nil {
			return err
		}
		if err := keyFree(ctx, tx, p.PublicKey); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx,
			`UPDATE credentials SET revoked_at = $2 WHERE kind = 'ed25519' AND external_id = $1 AND revoked_at IS NULL`,
			agentID, now); err != nil {
			return err
		}
		return insertKey(ctx, tx, account, agentID, p.PublicKey, now)
	})
	if err != nil {
		if kungfu.AsError(err) != nil || errors.Is(err, ErrUnknownAgent) {
			return Rotated{}, err
		}
		return Rotated{}, fmt.Errorf("rotate agent key: %w", err)
	}
	return out, nil
}

// Revoked reports a revocation.
type Revoked struct {
	AgentID       string
	Handle        string
	RevokedAt     time.Time
	AccountStatus string
}

// Revoke retires the agent: its keys are revoked, its label is free at
// once, and an account left without any live credential is deactivated.
// Nothing is deleted but the label's reservation. keyID is the credential
// that verified the call, re-checked as Rotate does.
func (s *Service) Revoke(ctx context.Context, agentID string, keyID int64) (Revoked, error) {
	now := s.Now()
	out := Revoked{AgentID: agentID, RevokedAt: now}
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		var account int64
		err := tx.QueryRow(ctx,
			`SELECT account_id FROM kd_agents WHERE id = $1 AND status = 'active'`, agentID).Scan(&account)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrUnknownAgent
		}
		if err != nil {
			return err
		}
		// The account first, as a key reset locks it: the two serialize and
		// the "any live credential left" answer below stays true.
		if err := tx.QueryRow(ctx, `SELECT status FROM accounts WHERE id = $1 FOR UPDATE`, account).Scan(&out.AccountStatus); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx,
			`UPDATE kd_agents SET status = 'revoked', revoked_at = $2 WHERE id = $1 AND status = 'active'`, agentID, now)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrUnknownAgent
		}
		// After the agent's row, as Rotate takes them: the same order, so
		// the two cannot deadlock.
		if err := signingKeyLive(ctx, tx, agentID, keyID); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT handle FROM kd_agents WHERE id = $1`, agentID).Scan(&out.Handle); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx,
			`UPDATE credentials SET revoked_at = $2 WHERE kind = 'ed25519' AND external_id = $1 AND revoked_at IS NULL`,
			agentID, now); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM kd_label_keys WHERE agent_id = $1`, agentID); err != nil {
			return err
		}
		var live bool
		if err := tx.QueryRow(ctx,
			`SELECT EXISTS (SELECT 1 FROM credentials WHERE account_id = $1 AND revoked_at IS NULL)`, account).Scan(&live); err != nil {
			return err
		}
		if !live && out.AccountStatus == "active" {
			out.AccountStatus = "deactivated"
			_, err = tx.Exec(ctx, `UPDATE accounts SET status = 'deactivated', updated_at = $2 WHERE id = $1`, account, now)
		}
		return err
	})
	if err != nil {
		if kungfu.AsError(err) != nil || errors.Is(err, ErrUnknownAgent) {
			return Revoked{}, err
		}
		return Revoked{}, fmt.Errorf("revoke agent: %w", err)
	}
	return out, nil
}

// signingKeyLive locks the credential that verified a signed call and
// refuses, as the door would, when it was revoked since: the door checked
// the key before this transaction began.
func signingKeyLive(ctx context.Context, tx pgx.Tx, agentID string, keyID int64) error {
	var id int64
	err := tx.QueryRow(ctx,
		`SELECT id FROM credentials WHERE id = $1 AND kind = 'ed25519' AND external_id = $2 AND revoked_at IS NULL FOR UPDATE`,
		keyID, agentID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return kungfu.Errorf(kungfu.CodeBadSignature, badSignature)
	}
	return err
}

// Profile is an agent's public record.
type Profile struct {
	AgentID    string
	Handle     string
	Name       string
	Label      string
	Platform   string
	Status     string
	PublicKeys []string
	CreatedAt  time.Time
	RevokedAt  *time.Time
}

// Lookup finds an agent by id or kd_ handle; revoked agents are found too,
// with status "revoked" and no keys. field names the argument in refusals.
func (s *Service) Lookup(ctx context.Context, field, ref string) (Profile, error) {
	ref = strings.ToLower(strings.TrimSpace(ref))
	// agentIDRE admits only what parses as a UUID, so the cast cannot
	// fail and the primary key index answers.
	where := "a.id = $1::uuid"
	switch {
	case agentIDRE.MatchString(ref):
	case handleRE.MatchString(ref):
		where = "a.handle = $1"
	default:
		return Profile{}, kungfu.Invalid(kungfu.FieldError{Field: field,
			Message: "must be an agent id (a lowercase UUID) or a kd_ handle (kd_ and 12 hex digits)"})
	}
	var (
		p    Profile
		acc  string
		keys [][]byte
	)
	err := s.DB.QueryRow(ctx,
		`SELECT a.id::text, a.handle, acc.name, a.label, a.platform, a.status, acc.status, a.created_at, a.revoked_at,
		        coalesce((SELECT array_agg(c.public_key ORDER BY c.id) FROM credentials c
		                  WHERE c.kind = 'ed25519' AND c.external_id = a.id::text AND c.revoked_at IS NULL), '{}')
		 FROM kd_agents a JOIN accounts acc ON acc.id = a.account_id
		 WHERE `+where, ref).
		Scan(&p.AgentID, &p.Handle, &p.Name, &p.Label, &p.Platform, &p.Status, &acc, &p.CreatedAt, &p.RevokedAt, &keys)
	if errors.Is(err, pgx.ErrNoRows) {
		return Profile{}, kungfu.Errorf(kungfu.CodeNotFound, "%s: no such agent", field).
			WithDetails(map[string]any{"field": field})
	}
	if err != nil {
		return Profile{}, fmt.Errorf("verify agent: %w", err)
	}
	if p.Status == "active" && acc != "active" {
		p.Status = acc
	}
	p.PublicKeys = []string{}
	for _, k := range keys {
		p.PublicKeys = append(p.PublicKeys, encodeKey(k))
	}
	return p, nil
}

// DecodeKey reads an Ed25519 public key of exactly 32 bytes: base64url
// (standard base64 is tolerated), padding optional, one spelling per key.
func DecodeKey(s string) (ed25519.PublicKey, error) {
	bad := errors.New("must be a base64url Ed25519 public key of 32 bytes (43 characters)")
	// 32 bytes are 43 characters, "=" when padded; Go's decoders would
	// skip CR and LF, so the shape is checked first.
	if len(s) == 44 && strings.HasSuffix(s, "=") {
		s = s[:43]
	}
	if len(s) != 43 || strings.ContainsAny(s, "\r\n") {
		return nil, bad
	}
	for _, enc := range []*base64.Encoding{base64.RawURLEncoding, base64.RawStdEncoding} {
		if b, err := enc.Strict().DecodeString(s); err == nil && len(b) == ed25519.PublicKeySize {
			return ed25519.PublicKey(b), nil
		}
	}
	return nil, bad
}

func encodeKey(k []byte) string { return base64.RawURLEncoding.EncodeToString(k) }

// newUUID is a random (version 4) UUID in its lowercase text form.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
