package account

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/credits"
)

// KeyPrefix starts every Agent key.
const KeyPrefix = "kf_live_"

// ReservedPrefix starts the account names of KarmaDue agents (their kd_
// handles); native registration refuses it.
const ReservedPrefix = "kd_"

var (
	nameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{6,32}$`)
	keyRE  = regexp.MustCompile(`^(?i)kf_live_[0-9a-f]{64}$`)
	// Reserved names, compared case-insensitively before any other rule so
	// that short ones like "admin" are refused for what they are.
	reserved = map[string]bool{
		"admin": true, "root": true, "system": true, "api": true, "web": true,
		"administrator": true, "dojo": true, "kungfu": true, "karmadue": true,
		"kizuna": true, "owner": true, "support": true, "operator": true,
		"anonymous": true, "letterbox": true, "postmaster": true, "security": true,
	}
)

// Service owns accounts and their Agent keys.
type Service struct {
	DB  *pgxpool.Pool
	Now kungfu.Clock
	// BcryptCost defaults to bcrypt.DefaultCost; tests lower it.
	BcryptCost int
}

// Issued is the result of creating an account or resetting its key. APIKey
// is the raw key: callers show it once and never store it.
type Issued struct {
	AccountID int64
	Name      string
	APIKey    string
}

// Status is an account's identity and balance.
type Status struct {
	AccountID int64
	Name      string
	Balance   int64
	Status    string
}

func (s *Service) cost() int {
	if s.BcryptCost == 0 {
		return bcrypt.DefaultCost
	}
	return s.BcryptCost
}

// Register creates an active account with a fresh Agent key and the signup
// grant, all in one transaction.
func (s *Service) Register(ctx context.Context, name, password string) (Issued, error) {
	if err := checkName(name); err != nil {
		return Issued{}, err
	}
	if err := checkPassword(password); err != nil {
		return Issued{}, err
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), s.cost())
	if err != nil {
		return Issued{}, fmt.Errorf("hash password: %w", err)
	}
	key, keyHash := newKey()
	now := s.Now()
	var id int64
	err = pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx,
			`INSERT INTO accounts (name, password_hash, created_at, updated_at)
			 VALUES ($1, $2, $3, $3) RETURNING id`, name, string(hash), now).Scan(&id)
		if err != nil {
			return err
		}
		if err := insertKey(ctx, tx, id, keyHash, key, now); err != nil {
			return err
		}
		_, err = credits.Apply(ctx, tx, now, credits.Movement{
			AccountID: id, Type: credits.GrantSignup, Amount: credits.SignupGrant,
			RefType: "account", RefID: fmt.Sprint(id),
		})
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "accounts_name_key" {
		return Issued{}, s.nameTaken(ctx, name)
	}
	if err != nil {
		return Issued{}, fmt.Errorf("register: %w", err)
	}
	return Issued{AccountID: id, Name: name, APIKey: key}, nil
}

func (s *Service) nameTaken(ctx context.Context, name string) error {
	e := kungfu.Errorf(kungfu.CodeNameTaken, "the name %q is taken", name)
	base := name
	if len(base) > 27 {
		base = base[:27]
	}
	for range 5 {
		n, _ := rand.Int(rand.Reader, big.NewInt(9000))
		candidate := fmt.Sprintf("%s_%d", base, 1000+n.Int64())
		var taken bool
		if err := s.DB.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM accounts WHERE lower(name) = lower($1))`, candidate).Scan(&taken); err == nil && !taken {
			return e.WithDetails(map[string]any{"suggestion": candidate})
		}
	}
	return e
}

// Authenticate resolves a raw Agent key to its active account. Every
// failure is the same UNAUTHORIZED so a caller learns nothing about why.
//
// It reads PostgreSQL on every call, so a reset or a deactivation on any
// process stops the old key on the next call everywhere. The query names
// only the key's hash: a predicate on revoked_at would also match the
// one-live-key-per-account index, which a planner without statistics (a
// fresh deployment) scans whole instead of probing the hash. The unique
// hash index yields at most one row; revocation and status are checked
// here.
func (s *Service) Authenticate(ctx context.Context, raw string) (kungfu.Caller, error) {
	b := &pgx.Batch{}
	finish := QueueAuthenticate(b, raw)
	if b.Len() > 0 {
		if err := s.DB.SendBatch(ctx, b).Close(); err != nil {
			return kungfu.Caller{}, fmt.Errorf("authenticate: %w", err)
		}
	}
	return finish()
}

// QueueAuthenticate adds the key lookup of Authenticate to b, so that a
// tool's first read can travel in the same round trip, and returns what
// gives Authenticate's answer once b has been sent and closed. A string
// that cannot be a key queues nothing.
func QueueAuthenticate(b *pgx.Batch, raw string) (finish func() (kungfu.Caller, error)) {
	unauthorized := kungfu.Errorf(kungfu.CodeUnauthorized, "missing or invalid Agent key")
	if !keyRE.MatchString(raw) {
		return func() (kungfu.Caller, error) { return kungfu.Caller{}, unauthorized }
	}
	sum := hashKey(raw)
	var (
		c         kungfu.Caller
		stored    []byte
		live      bool
		status    string
		ran, read bool
		qerr      error
	)
	// Errors are kept, not returned, so that the statements queued after
	// this one still run and report their own.
	b.Queue(`SELECT a.id, a.name, a.status, c.secret_hash, c.revoked_at IS NULL
		 FROM credentials c JOIN accounts a ON a.id = c.account_id
		 WHERE c.kind = 'agent_key' AND c.secret_hash = $1`, sum[:]).QueryRow(func(row pgx.Row) error {
		ran = true
		switch err := row.Scan(&c.AccountID, &c.Name, &status, &stored, &live); {
		case err == nil:
			read = true
		case !errors.Is(err, pgx.ErrNoRows):
			qerr = err
		}
		return nil
	})
	return func() (kungfu.Caller, error) {
		switch {
		case qerr != nil:
			return kungfu.Caller{}, fmt.Errorf("authenticate: %w", qerr)
		case !ran:
			return kungfu.Caller{}, ErrNotSent
		case !read || subtle.ConstantTimeCompare(stored, sum[:]) != 1 || !live || status != "active":
			return kungfu.Caller{}, unauthorized
		}
		return c, nil
	}
}

// ErrNotSent is QueueAuthenticate's answer when its batch failed before the
// key lookup ran, for instance because a statement queued with it could not
// be prepared.
var ErrNotSent = errors.New("authenticate: the key lookup was not sent")

// KeyGate is the Gate of a raw Agent key: it holds when the key is an
// active account's live key. A string that cannot be a key gives nil.
// Revocation is tested in a form that does not match the partial index of
// live keys, so the planner probes the hash index, as Authenticate does.
func KeyGate(raw string) kungfu.Gate {
	if !keyRE.MatchString(raw) {
		return nil
	}
	sum := hashKey(raw)
	return func(n int) (string, any) {
		return `EXISTS (SELECT 1 FROM credentials c JOIN accounts a ON a.id = c.account_id
		 WHERE c.kind = 'agent_key' AND c.secret_hash = $` + strconv.Itoa(n) + `
		   AND coalesce(c.revoked_at, 'infinity') = 'infinity' AND a.status = 'active')`, sum[:]
	}
}

// Status reads one account.
func (s *Service) Status(ctx context.Context, id int64) (Status, error) {
	var st Status
	err := s.DB.QueryRow(ctx, `SELECT id, name, balance, status FROM accounts WHERE id = $1`, id).
		Scan(&st.AccountID, &st.Name, &st.Balance, &st.Status)
	if errors.Is(err, pgx.ErrNoRows) {
		return Status{}, kungfu.Errorf(kungfu.CodeNotFound, "no such account")
	}
	if err != nil {
		return Status{}, fmt.Errorf("account status: %w", err)
	}
	return st, nil
}

// dummyHash keeps a failed login with an unknown name as slow as one with a
// wrong password, so timing does not reveal which names exist.
var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("dojo-timing-equaliser"), bcrypt.DefaultCost)

// ResetKey verifies the owner's name and password, revokes the live Agent
// key and issues a new one in one transaction.
func (s *Service) ResetKey(ctx context.Context, name, password string) (Issued, error) {
	bad := kungfu.Errorf(kungfu.CodeInvalidCredentials, "name or password is wrong")
	var (
		id     int64
		stored string
		status string
		real   string
	)
	err := s.DB.QueryRow(ctx, `SELECT id, name, password_hash, status FROM accounts WHERE lower(name) = lower($1)`, name).
		Scan(&id, &real, &stored, &status)
	if errors.Is(err, pgx.ErrNoRows) {
		_ = bcrypt.CompareHashAndPassword(dummyHash, []byte(password))
		return Issued{}, bad
	}
	if err != nil {
		return Issued{}, fmt.Errorf("reset key: %w", err)
	}
	if bcrypt.CompareHashAndPassword([]byte(stored), []byte(password)) != nil || status != "active" {
		return Issued{}, bad
	}
	key, keyHash := newKey()
	now := s.Now()
	err = pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		// Lock the account so two resets serialize and exactly one key survives.
		if _, err := tx.Exec(ctx, `SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE`, id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx,
			`UPDATE credentials SET revoked_at = $2 WHERE account_id = $1 AND kind = 'agent_key' AND revoked_at IS NULL`,
			id, now); err != nil {
			return err
		}
		return insertKey(ctx, tx, id, keyHash, key, now)
	})
	if err != nil {
		return Issued{}, fmt.Errorf("reset key: %w", err)
	}
	return Issued{AccountID: id, Name: real, APIKey: key}, nil
}

func insertKey(ctx context.Context, tx pgx.Tx, accountID int64, hash [32]byte, raw string, now any) error {
	_, err := tx.Exec(ctx,
		`INSERT INTO credentials (account_id, kind, secret_hash, hint, created_at)
		 VALUES ($1, 'agent_key', $2, $3, $4)`, accountID, hash[:], raw[len(raw)-4:], now)
	return err
}

func newKey() (string, [32]byte) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	raw := KeyPrefix + hex.EncodeToString(b[:])
	return raw, hashKey(raw)
}

func hashKey(raw string) [32]byte { return sha256.Sum256([]byte(strings.ToLower(raw))) }

// LooksLikeKey reports whether s has the shape of an Agent key.
func LooksLikeKey(s string) bool { return keyRE.MatchString(s) }

func checkName(name string) error {
	if reserved[strings.ToLower(name)] {
		return kungfu.Errorf(kungfu.CodeReservedName, "the name %q is reserved", name)
	}
	// kd_ names belong to KarmaDue agents: their handle is their account
	// name, and a native account must never pass for one.
	if strings.HasPrefix(strings.ToLower(name), ReservedPrefix) {
		return kungfu.Errorf(kungfu.CodeReservedName, "names starting with %q are reserved for KarmaDue agents", ReservedPrefix)
	}
	if !nameRE.MatchString(name) {
		return kungfu.Errorf(kungfu.CodeInvalidName, "name must be 6-32 characters of letters, digits, '_', '.' or '-'")
	}
	return nil
}

func checkPassword(p string) error {
	if len(p) < 6 || len(p) > 72 {
		return kungfu.Errorf(kungfu.CodeInvalidPassword, "password must be 6-72 bytes")
	}
	if strings.Contains(strings.ToLower(p), KeyPrefix) {
		return kungfu.Errorf(kungfu.CodeInvalidPassword, "a password must not contain an Agent key")
	}
	return nil
}

// CreateTx creates a password-less account named name with a fresh Agent
// key and the signup grant inside tx. Doors whose agents never log in as an
// owner (Kizuna) create the account in the transaction that writes their
// own row, so neither exists without the other. A taken name is
// NAME_TAKEN; tx is then aborted and must be rolled back.
func (s *Service) CreateTx(ctx context.Context, tx pgx.Tx, name string) (Issued, error) {
	if err := checkName(name); err != nil {
		return Issued{}, err
	}
	key, keyHash := newKey()
	now := s.Now()
	var id int64
	err := tx.QueryRow(ctx,
		`INSERT INTO accounts (name, password_hash, created_at, updated_at)
		 VALUES ($1, '', $2, $2) RETURNING id`, name, now).Scan(&id)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "accounts_name_key" {
		return Issued{}, kungfu.Errorf(kungfu.CodeNameTaken, "the name %q is taken", name)
	}
	if err != nil {
		return Issued{}, fmt.Errorf("create account: %w", err)
	}
	if err := insertKey(ctx, tx, id, keyHash, key, now); err != nil {
		return Issued{}, fmt.Errorf("create account: %w", err)
	}
	if _, err := credits.Apply(ctx, tx, now, credits.Movement{
		AccountID: id, Type: credits.GrantSignup, Amount: credits.SignupGrant,
		RefType: "account", RefID: fmt.Sprint(id),
	}); err != nil {
		return Issued{}, fmt.Errorf("create account: %w", err)
	}
	return Issued{AccountID: id, Name: name, APIKey: key}, nil
}

// CheckName reports why name cannot be an account name, or nil.
func CheckName(name string) error { return checkName(name) }
