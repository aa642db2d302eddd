package kizuna

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/account"
)

// Bounds of an agent's directory entry.
const (
	maxName         = 200
	maxCapabilities = 4000
	maxTags         = 32
	maxTag          = 64
	maxURL          = 2048
	maxCard         = 64 * 1024
)

// idAlphabet mints agent ids: upper-case letters and digits without the
// ones read alike (0/O, 1/I).
const idAlphabet = "23456789ABCDEFGHJKLMNPQRSTUVWXYZ"

type agentInput struct {
	AgentID      *string         `json:"agent_id"`
	Name         *string         `json:"name"`
	Capabilities *string         `json:"capabilities"`
	Tags         *[]string       `json:"capability_tags"`
	WebhookURL   *string         `json:"webhook_url"`
	Enabled      *bool           `json:"enabled"`
	AgentCard    json.RawMessage `json:"agent_card"`
	EnrollToken  *string         `json:"enroll_token"`
}

// check validates the fields present; register also requires some.
func (in *agentInput) check(register bool) []field {
	var bad []field
	text := func(name string, v *string, max int, required bool) {
		switch {
		case v == nil && required:
			bad = append(bad, field{name, "is required"})
		case v == nil:
		case !utf8.ValidString(*v) || len(*v) > max:
			bad = append(bad, field{name, fmt.Sprintf("must be at most %d bytes of text", max)})
		case name == "name" && strings.TrimSpace(*v) == "":
			bad = append(bad, field{name, "must not be empty"})
		}
	}
	text("name", in.Name, maxName, register)
	text("capabilities", in.Capabilities, maxCapabilities, register)
	if in.Tags != nil {
		if len(*in.Tags) > maxTags {
			bad = append(bad, field{"capability_tags", fmt.Sprintf("at most %d tags", maxTags)})
		}
		for i, t := range *in.Tags {
			if strings.TrimSpace(t) == "" || len(t) > maxTag {
				bad = append(bad, field{fmt.Sprintf("capability_tags.%d", i), fmt.Sprintf("must be 1-%d bytes", maxTag)})
			}
		}
	}
	if in.WebhookURL != nil && *in.WebhookURL != "" {
		u, err := url.Parse(*in.WebhookURL)
		if err != nil || len(*in.WebhookURL) > maxURL || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Fragment != "" {
			bad = append(bad, field{"webhook_url", "must be an absolute http(s) URL without credentials or fragment"})
		}
	} else if register && in.WebhookURL == nil {
		bad = append(bad, field{"webhook_url", "is required"})
	}
	if !isNull(in.AgentCard) {
		var card map[string]json.RawMessage
		var name string
		switch {
		case len(in.AgentCard) > maxCard:
			bad = append(bad, field{"agent_card", "must be at most 64 KB"})
		case json.Unmarshal(in.AgentCard, &card) != nil:
			bad = append(bad, field{"agent_card", "must be an object"})
		case isNull(card["name"]) || json.Unmarshal(card["name"], &name) != nil || strings.TrimSpace(name) == "":
			bad = append(bad, field{"agent_card.name", "is required and must be a string"})
		}
	}
	return bad
}

// register creates an agent: an account, its Agent key and the directory
// row in one transaction, admitted by the admin token or a single-use
// enroll token that is spent in that same transaction.
func (h *Hub) register(r *http.Request) (int, any, error) {
	var in agentInput
	if _, err := readBody(r, &in); err != nil {
		return 0, nil, err
	}
	enroll := r.URL.Query().Get("token")
	if enroll == "" && in.EnrollToken != nil {
		enroll = *in.EnrollToken
	}
	useEnroll := !h.isAdmin(bearer(r))
	if useEnroll {
		if enroll == "" {
			return 0, nil, errUnauthorized
		}
		elems, err := h.enrollElements(r.Context(), enroll)
		if err != nil {
			return 0, nil, err
		}
		if err := in.fill(elems); err != nil {
			return 0, nil, err
		}
	}
	if bad := in.check(true); len(bad) > 0 {
		return 0, nil, invalid(bad...)
	}
	custom := in.AgentID != nil && *in.AgentID != ""
	if custom && account.CheckName(*in.AgentID) != nil {
		return 0, nil, refuse(http.StatusConflict, "AGENT_CONFLICT", "agent_id %q is not a valid Dojo name (6-32 letters, digits, '_', '.', '-'; not reserved)", *in.AgentID)
	}
	secret := newSecret()
	for try := 0; ; try++ {
		id := ""
		if custom {
			id = *in.AgentID
		} else {
			id = mintID(4 + try/4)
		}
		out, err := h.create(r.Context(), id, enroll, useEnroll, &in, secret)
		if e := kungfu.AsError(err); e != nil && e.Code == kungfu.CodeNameTaken {
			if custom || try > 12 {
				return 0, nil, refuse(http.StatusConflict, "AGENT_CONFLICT", "agent_id %q is taken", id)
			}
			continue
		}
		if err != nil {
			return 0, nil, err
		}
		return http.StatusCreated, out, nil
	}
}

func (h *Hub) create(ctx context.Context, id, enroll string, useEnroll bool, in *agentInput, secret string) (map[string]any, error) {
	now := h.now()
	var out map[string]any
	err := pgx.BeginFunc(ctx, h.DB, func(tx pgx.Tx) error {
		if useEnroll {
			if err := spendEnroll(ctx, tx, enroll, now); err != nil {
				return err
			}
		}
		iss, err := h.Accounts.CreateTx(ctx, tx, id)
		if err != nil {
			return err
		}
		sealed, err := h.Keys.Seal([]byte(secret), SecretPurpose(iss.AccountID))
		if err != nil {
			return err
		}
		tags := []string{}
		if in.Tags != nil {
			tags = *in.Tags
		}
		var card any
		if !isNull(in.AgentCard) {
			card = string(in.AgentCard)
		}
		webhook := ""
		if in.WebhookURL != nil {
			webhook = *in.WebhookURL
		}
		if _, err := tx.Exec(ctx, `INSERT INTO kz_agents (account_id, name, capabilities, tags, webhook_url, endpoint_secret, agent_card, enabled, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, TRUE, $8, $8)`,
			iss.AccountID, *in.Name, *in.Capabilities, tags, webhook, sealed, card, now); err != nil {
			return err
		}
		out = map[string]any{"agent_id": iss.Name, "agent_token": iss.APIKey, "endpoint_secret": secret}
		return nil
	})
	return out, err
}

// elements are the four elements (and the optional tags and card) an
// admin minted an enroll token with, stored with it as JSON.
type elements struct {
	AgentID      *string         `json:"agent_id,omitempty"`
	Name         *string         `json:"name,omitempty"`
	Capabilities *string         `json:"capabilities,omitempty"`
	Tags         *[]string       `json:"capability_tags,omitempty"`
	WebhookURL   *string         `json:"webhook_url,omitempty"`
	AgentCard    json.RawMessage `json:"agent_card,omitempty"`
}

func (in *agentInput) elements() elements {
	e := elements{AgentID: in.AgentID, Name: in.Name, Capabilities: in.Capabilities, Tags: in.Tags, WebhookURL: in.WebhookURL}
	if !isNull(in.AgentCard) {
		e.AgentCard = in.AgentCard
	}
	if e.AgentID != nil && *e.AgentID == "" {
		e.AgentID = nil
	}
	return e
}

// fill binds the body to the token's elements: a field the admin stored
// with the token comes from the token, and a body that gives it with
// another value is refused (422 naming each such field) before the token
// is spent. Only fields the admin left out may come from the body. The
// install script sends {}, so it registers exactly the agent the admin
// described; the token's holder cannot rename it, point its webhook
// elsewhere or change what it claims to do.
func (in *agentInput) fill(e elements) error {
	var bad []field
	bind := func(name string, same bool) {
		if !same {
			bad = append(bad, field{name, "differs from what this enroll token was issued with; leave it out"})
		}
	}
	if e.AgentID != nil {
		if in.AgentID != nil && *in.AgentID != "" {
			// Agent ids are account names, which ignore case.
			bind("agent_id", strings.EqualFold(*in.AgentID, *e.AgentID))
		}
		in.AgentID = e.AgentID
	}
	text := func(name string, body **string, token *string) {
		if token == nil {
			return
		}
		if *body != nil {
			bind(name, **body == *token)
		}
		*body = token
	}
	text("name", &in.Name, e.Name)
	text("capabilities", &in.Capabilities, e.Capabilities)
	text("webhook_url", &in.WebhookURL, e.WebhookURL)
	if e.Tags != nil {
		if in.Tags != nil {
			bind("capability_tags", slices.Equal(*in.Tags, *e.Tags))
		}
		in.Tags = e.Tags
	}
	if !isNull(e.AgentCard) {
		if !isNull(in.AgentCard) {
			bind("agent_card", sameJSON(in.AgentCard, e.AgentCard))
		}
		in.AgentCard = e.AgentCard
	}
	if len(bad) > 0 {
		return invalid(bad...)
	}
	return nil
}

// sameJSON reports whether a and b hold the same JSON value: the stored
// card went through PostgreSQL, which may reorder keys and drop spaces.
func sameJSON(a, b json.RawMessage) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// enrollElements reads a spendable enroll token's elements, refusing an
// unknown, used or expired token before the body is judged: a stale token
// is the caller's real problem. spendEnroll stays the authority; this
// read only gives the early, clear answer.
func (h *Hub) enrollElements(ctx context.Context, token string) (elements, error) {
	var (
		e       elements
		raw     *string
		used    *time.Time
		expires time.Time
	)
	sum := sha256.Sum256([]byte(token))
	err := h.DB.QueryRow(ctx, `SELECT elements::text, used_at, expires_at FROM kz_enroll_tokens WHERE token_hash = $1`, sum[:]).
		Scan(&raw, &used, &expires)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return e, errUnauthorized
	case err != nil:
		return e, fmt.Errorf("enroll token: %w", err)
	case used != nil:
		return e, errEnrollUsed
	case !expires.After(h.now()):
		return e, errEnrollExpired
	}
	if raw != nil {
		if err := json.Unmarshal([]byte(*raw), &e); err != nil {
			return e, fmt.Errorf("enroll token elements: %w", err)
		}
	}
	return e, nil
}

var (
	errEnrollUsed    = refuse(http.StatusGone, "ENROLL_TOKEN_USED", "this enroll token was already used")
	errEnrollExpired = refuse(http.StatusGone, "ENROLL_TOKEN_EXPIRED", "this enroll token has expired")
)

// spendEnroll marks an enroll token used; only its SHA-256 is stored.
func spendEnroll(ctx context.Context, tx pgx.Tx, token string, now time.Time) error {
	sum := sha256.Sum256([]byte(token))
	tag, err := tx.Exec(ctx, `UPDATE kz_enroll_tokens SET used_at = $2 WHERE token_hash = $1 AND used_at IS NULL AND expires_at > $2`, sum[:], now)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var used *time.Time
	err = tx.QueryRow(ctx, `SELECT used_at FROM kz_enroll_tokens WHERE token_hash = $1`, sum[:]).Scan(&used)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return errUnauthorized
	case err != nil:
		return err
	case used != nil:
		return errEnrollUsed
	}
	return errEnrollExpired
}

func mintID(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return "A-" + string(b)
}

func newSecret() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "kzs_" + hex.EncodeToString(b[:])
}

// agentView is a directory entry; secrets are never part of it.
type agentView struct {
	AgentID      string          `json:"agent_id"`
	Name         string          `json:"name"`
	Capabilities string          `json:"capabilities"`
	Tags         []string        `json:"capability_tags"`
	WebhookURL   string          `json:"webhook_url,omitempty"`
	Status       string          `json:"status"`
	Enabled      bool            `json:"enabled"`
	LastSeenAt   any             `json:"last_seen_at"`
	AgentCard    json.RawMessage `json:"agent_card"`
	CreatedAt    string          `json:"created_at"`
	UpdatedAt    string          `json:"updated_at"`
}

const agentCols = `a.name, k.name, k.capabilities, k.tags, k.webhook_url, k.enabled, k.last_seen_at, k.agent_card, k.created_at, k.updated_at`

func (h *Hub) scanAgent(row pgx.Row, now time.Time) (agentView, error) {
	var (
		v              agentView
		seen           *time.Time
		card           []byte
		created, updat time.Time
	)
	if err := row.Scan(&v.AgentID, &v.Name, &v.Capabilities, &v.Tags, &v.WebhookURL, &v.Enabled, &seen, &card, &created, &updat); err != nil {
		return v, err
	}
	v.LastSeenAt, v.CreatedAt, v.UpdatedAt = stampPtr(seen), stamp(created), stamp(updat)
	if len(card) > 0 {
		v.AgentCard = card
	} else {
		v.AgentCard = json.RawMessage("null")
	}
	if v.Tags == nil {
		v.Tags = []string{}
	}
	v.Status = status(v.Enabled, seen, now)
	return v, nil
}

func status(enabled bool, seen *time.Time, now time.Time) string {
	switch {
	case !enabled:
		return "disabled"
	case seen != nil && now.Sub(*seen) < Online:
		return "online"
	}
	return "offline"
}

func (h *Hub) getAgent(r *http.Request) (int, any, error) {
	c, err := h.auth(r)
	if err != nil {
		return 0, nil, err
	}
	now := h.now()
	if !textOK(mux.Vars(r)["id"], maxIDLen) {
		return 0, nil, agentNotFound(mux.Vars(r)["id"])
	}
	v, err := h.scanAgent(h.DB.QueryRow(r.Context(), `SELECT `+agentCols+` FROM kz_agents k JOIN accounts a ON a.id = k.account_id
		WHERE lower(a.name) = lower($1) AND k.deleted_at IS NULL`, mux.Vars(r)["id"]), now)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil, agentNotFound(mux.Vars(r)["id"])
	}
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, c.view(v), nil
}

// view hides a letterbox's address from other agents: it is where
// letters go, not part of the directory, and a sender needs only the id.
func (c caller) view(v agentView) agentView {
	if !c.Admin && !strings.EqualFold(c.AgentID, v.AgentID) {
		v.WebhookURL = ""
	}
	return v
}

func agentNotFound(id string) *Error {
	return refuse(http.StatusNotFound, "AGENT_NOT_FOUND", "no agent %q", id)
}

func (h *Hub) listAgents(r *http.Request) (int, any, error) {
	c, err := h.auth(r)
	if err != nil {
		return 0, nil, err
	}
	limit, offset, err := page(r)
	if err != nil {
		return 0, nil, err
	}
	q := r.URL.Query()
	now := h.now()
	where := []string{"k.deleted_at IS NULL"}
	args := []any{}
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	search, err := queryText(r, "q", maxQuery)
	if err != nil {
		return 0, nil, err
	}
	tag, err := queryText(r, "tag", maxTag)
	if err != nil {
		return 0, nil, err
	}
	if s := search; s != "" {
		p := arg("%" + likeEscape(s) + "%")
		where = append(where, "(a.name ILIKE "+p+" OR k.name ILIKE "+p+" OR k.capabilities ILIKE "+p+")")
	}
	if s := tag; s != "" {
		where = append(where, arg(s)+" = ANY (k.tags)")
	}
	switch s := q.Get("status"); s {
	case "":
	case "disabled":
		where = append(where, "NOT k.enabled")
	case "online":
		where = append(where, "k.enabled AND k.last_seen_at > "+arg(now.Add(-Online)))
	case "offline":
		where = append(where, "k.enabled AND (k.last_seen_at IS NULL OR k.last_seen_at <= "+arg(now.Add(-Online))+")")
	default:
		return 0, nil, invalid(field{"status", "must be online, offline or disabled"})
	}
	from := ` FROM kz_agents k JOIN accounts a ON a.id = k.account_id WHERE ` + strings.Join(where, " AND ")
	var total int
	if err := h.DB.QueryRow(r.Context(), `SELECT count(*)`+from, args...).Scan(&total); err != nil {
		return 0, nil, err
	}
	rows, err := h.DB.Query(r.Context(), `SELECT `+agentCols+from+` ORDER BY k.created_at, k.account_id LIMIT `+arg(limit)+` OFFSET `+arg(offset), args...)
	if err != nil {
		return 0, nil, err
	}
	defer rows.Close()
	items := []agentView{}
	for rows.Next() {
		v, err := h.scanAgent(rows, now)
		if err != nil {
			return 0, nil, err
		}
		items = append(items, c.view(v))
	}
	if err := rows.Err(); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, map[string]any{"items": items, "total": total, "limit": limit, "offset": offset}, nil
}

func likeEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

// lookup finds a live agent's account by id.
func (h *Hub) lookup(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, id string) (int64, string, bool, error) {
	var (
		acc     int64
		name    string
		enabled bool
	)
	if !textOK(id, maxIDLen) {
		return 0, "", false, agentNotFound(id)
	}
	err := q.QueryRow(ctx, `SELECT a.id, a.name, k.enabled FROM kz_agents k JOIN accounts a ON a.id = k.account_id
		WHERE lower(a.name) = lower($1) AND k.deleted_at IS NULL`, id).Scan(&acc, &name, &enabled)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "", false, agentNotFound(id)
	}
	return acc, name, enabled, err
}

func (h *Hub) patchAgent(r *http.Request) (int, any, error) {
	if err := h.admin(r); err != nil {
		return 0, nil, err
	}
	var in agentInput
	raw, err := readBody(r, &in)
	if err != nil {
		return 0, nil, err
	}
	if bad := in.check(false); len(bad) > 0 {
		return 0, nil, invalid(bad...)
	}
	if in.AgentID != nil || in.EnrollToken != nil {
		return 0, nil, invalid(field{"agent_id", "cannot be changed"})
	}
	var members map[string]json.RawMessage
	_ = json.Unmarshal(raw, &members)
	_, hasCard := members["agent_card"]
	acc, _, _, err := h.lookup(r.Context(), h.DB, mux.Vars(r)["id"])
	if err != nil {
		return 0, nil, err
	}
	now := h.now()
	var card any
	if !isNull(in.AgentCard) {
		card = string(in.AgentCard)
	}
	var tags any
	if in.Tags != nil {
		tags = *in.Tags
	}
	if _, err := h.DB.Exec(r.Context(), `UPDATE kz_agents SET
			name = coalesce($2, name), capabilities = coalesce($3, capabilities), tags = coalesce($4::text[], tags),
			webhook_url = coalesce($5, webhook_url), enabled = coalesce($6, enabled),
			agent_card = CASE WHEN $7 THEN $8::json ELSE agent_card END, updated_at = $9
		WHERE account_id = $1 AND deleted_at IS NULL`,
		acc, in.Name, in.Capabilities, tags, in.WebhookURL, in.Enabled, hasCard, card, now); err != nil {
		return 0, nil, err
	}
	v, err := h.scanAgent(h.DB.QueryRow(r.Context(), `SELECT `+agentCols+` FROM kz_agents k JOIN accounts a ON a.id = k.account_id WHERE k.account_id = $1`, acc), now)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, v, nil
}

// deleteAgent removes an agent from the directory and revokes its token.
// Letters already queued to or from it keep going: the rows stay.
func (h *Hub) deleteAgent(r *http.Request) (int, any, error) {
	if err := h.admin(r); err != nil {
		return 0, nil, err
	}
	acc, name, _, err := h.lookup(r.Context(), h.DB, mux.Vars(r)["id"])
	if err != nil {
		return 0, nil, err
	}
	now := h.now()
	err = pgx.BeginFunc(r.Context(), h.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(r.Context(), `UPDATE kz_agents SET deleted_at = $2, updated_at = $2 WHERE account_id = $1 AND deleted_at IS NULL`, acc, now); err != nil {
			return err
		}
		_, err := tx.Exec(r.Context(), `UPDATE credentials SET revoked_at = $2 WHERE account_id = $1 AND kind = 'agent_key' AND revoked_at IS NULL`, acc, now)
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, map[string]any{"agent_id": name, "deleted": true, "deleted_at": stamp(now)}, nil
}

func (h *Hub) heartbeat(r *http.Request) (int, any, error) {
	c, err := h.agent(r)
	if err != nil {
		return 0, nil, err
	}
	now := h.now()
	if _, err := h.DB.Exec(r.Context(), `UPDATE kz_agents SET last_seen_at = $2 WHERE account_id = $1`, c.AccountID, now); err != nil {
		return 0, nil, err
	}
	st := "online"
	if !c.Enabled {
		st = "disabled"
	}
	return http.StatusOK, map[string]any{"agent_id": c.AgentID, "status": st, "last_seen_at": stamp(now),
		"offline_after": stamp(now.Add(Online))}, nil
}
