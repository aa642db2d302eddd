package kizuna

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/account"
	"github.com/dojo-relay/dojo/kungfu/userjson"
	"github.com/dojo-relay/dojo/signing"
)

// Online is how long after its last heartbeat an agent counts as online.
const Online = 5 * time.Minute

// maxBody caps one request body; a letter's content is the bulk of it.
const maxBody = 1 << 20

// Deliverer sends committed letters on their way. It is called after the
// letter's row is durable; a lost call only delays the letter until the
// delivery sweep finds it.
type Deliverer interface {
	Enqueue(ctx context.Context, letterID int64)
	// Redeliver wakes a letter at once even when a wake-up for its next
	// rung is already scheduled (admin redeliver).
	Redeliver(ctx context.Context, letterID int64)
}

// Hub serves the Kizuna hub API.
type Hub struct {
	DB       *pgxpool.Pool
	Accounts *account.Service
	// Keys seals endpoint secrets (purpose SecretPurpose).
	Keys *signing.ServerKey
	// AdminToken grants the admin paths; empty disables them.
	AdminToken string
	// URL is the hub's public address, for install prompts; empty means
	// the request's own host.
	URL string
	// BoxDir holds letterbox binaries as <os>-<arch>/dojo-box (dojo-box.exe
	// on windows) for GET /install/dojo-box/{os}/{arch}; empty holds none.
	BoxDir string
	// Self is an executable that acts as dojo-box on the host's own
	// platform, served when BoxDir has no binary for it; empty means none.
	Self    string
	Deliver Deliverer
	// MaxQueued bounds the unfinished letters per sender and per
	// recipient; zero means DefaultMaxQueued.
	MaxQueued int
	// Limits is the shared rate limiter (hub_card.go); nil limits nothing.
	Limits Limiter
	// ClientIP names the request's client address and whether per-address
	// limits are lifted for it.
	ClientIP func(*http.Request) (ip string, unlimited bool)
	Now      kungfu.Clock
	Log      *slog.Logger
}

// SecretPurpose is the sealing purpose of an agent's endpoint secret.
func SecretPurpose(accountID int64) string {
	return "kizuna-secret:" + strconv.FormatInt(accountID, 10)
}

// Mount registers the hub's routes. They must come before the relay's
// /api/v1/{tool}: methods are checked here, so a wrong method on a hub
// path is the hub's 405, never a tool lookup.
func (h *Hub) Mount(r *mux.Router) {
	r.HandleFunc("/api/v1/agents", h.limit(http.MethodPost, LimitRegister, byIPUnlessAdmin, h.route(map[string]handler{
		http.MethodPost: h.register, http.MethodGet: h.listAgents})))
	r.HandleFunc("/api/v1/agents/{id}", h.route(map[string]handler{
		http.MethodGet: h.getAgent, http.MethodPatch: h.patchAgent, http.MethodDelete: h.deleteAgent}))
	r.HandleFunc("/api/v1/agents/{id}/agent-card.json", h.limit(http.MethodGet, LimitCard, byIP, h.serveCard))
	r.HandleFunc("/.well-known/agent-card.json", h.limit(http.MethodGet, LimitCard, byIP, h.serveCard))
	r.HandleFunc("/api/v1/heartbeat", h.limit(http.MethodPost, LimitHeartbeat, byToken, h.route(map[string]handler{http.MethodPost: h.heartbeat})))
	r.HandleFunc("/api/v1/tasks", h.limit(http.MethodPost, LimitSend, byToken, h.route(map[string]handler{http.MethodPost: h.send, http.MethodGet: h.listTasks})))
	r.HandleFunc("/api/v1/tasks/{id}", h.route(map[string]handler{http.MethodGet: h.getTask}))
	results := h.limit(http.MethodPost, LimitResult, byToken, h.route(map[string]handler{http.MethodPost: h.postResult, http.MethodGet: h.results}))
	r.HandleFunc("/api/v1/tasks/{id}/result", results)
	r.HandleFunc("/api/v1/tasks/{id}/results", results)
	r.HandleFunc("/install/dojo-box/{os}/{arch}", h.limit(http.MethodGet, LimitCard, byIP, h.serveBox))
	r.HandleFunc("/install/{script}", h.limit(http.MethodGet, LimitCard, byIP, h.serveScript))
	h.mountAdmin(r)
}

// handler answers with a status and a JSON value, or an error.
type handler func(r *http.Request) (int, any, error)

func (h *Hub) route(m map[string]handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f, ok := m[r.Method]
		if !ok && r.Method == http.MethodHead {
			f, ok = m[http.MethodGet]
		}
		if !ok {
			allow := make([]string, 0, len(m))
			for k := range m {
				allow = append(allow, k)
			}
			w.Header().Set("Allow", strings.Join(allow, ", "))
			h.write(w, r, 0, nil, &Error{Status: http.StatusMethodNotAllowed, Code: "METHOD_NOT_ALLOWED",
				Message: r.Method + " is not allowed here"})
			return
		}
		status, v, err := f(r)
		h.write(w, r, status, v, err)
	}
}

func (h *Hub) write(w http.ResponseWriter, r *http.Request, status int, v any, err error) {
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			h.log().ErrorContext(r.Context(), "kizuna", "path", r.URL.Path, "err", err)
			e = &Error{Status: http.StatusInternalServerError, Code: "INTERNAL", Message: "internal error"}
		}
		status, v = e.Status, map[string]any{"error": e}
		if d, ok := e.Details.(map[string]any); ok && w.Header().Get("Retry-After") == "" {
			if secs, ok := d["retry_after"].(int); ok {
				w.Header().Set("Retry-After", strconv.Itoa(secs))
			}
		}
	}
	// Titles and bodies are agents' text: "<" stays "<", not \u003c.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	merr := enc.Encode(v)
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if merr != nil {
		h.log().ErrorContext(r.Context(), "kizuna encode", "err", merr)
		status, b = http.StatusInternalServerError, []byte(`{"error":{"code":"INTERNAL","message":"internal error"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func (h *Hub) log() *slog.Logger {
	if h.Log == nil {
		return slog.Default()
	}
	return h.Log
}

func (h *Hub) now() time.Time {
	if h.Now == nil {
		return kungfu.SystemClock()
	}
	return h.Now()
}

// Error is a refusal in the contract's shape.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Details any    `json:"details,omitempty"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

func refuse(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// field is one VALIDATION_FAILED entry.
type field struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

func invalid(fields ...field) *Error {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.Field
	}
	return &Error{Status: http.StatusUnprocessableEntity, Code: "VALIDATION_FAILED",
		Message: "invalid " + strings.Join(names, ", "), Details: map[string]any{"fields": fields}}
}

var (
	errUnauthorized = refuse(http.StatusUnauthorized, "UNAUTHORIZED", "missing or invalid token")
	errForbidden    = refuse(http.StatusForbidden, "FORBIDDEN", "not allowed for this token")
)

// caller is who a request acts as: the admin, or an agent.
type caller struct {
	Admin     bool
	AccountID int64
	AgentID   string
	Enabled   bool
}

func bearer(r *http.Request) string {
	scheme, token, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

func (h *Hub) isAdmin(token string) bool {
	return h.AdminToken != "" && subtle.ConstantTimeCompare([]byte(token), []byte(h.AdminToken)) == 1
}

// auth resolves the Bearer token to the admin or a live Kizuna agent. An
// Agent key of an account that is no Kizuna agent is refused like any
// unknown token.
func (h *Hub) auth(r *http.Request) (caller, error) {
	token := bearer(r)
	if token == "" {
		return caller{}, errUnauthorized
	}
	if h.isAdmin(token) {
		return caller{Admin: true}, nil
	}
	c, err := h.Accounts.Authenticate(r.Context(), token)
	if err != nil {
		if e := kungfu.AsError(err); e != nil {
			return caller{}, errUnauthorized
		}
		return caller{}, err
	}
	var enabled bool
	err = h.DB.QueryRow(r.Context(), `SELECT enabled FROM kz_agents WHERE account_id = $1 AND deleted_at IS NULL`, c.AccountID).Scan(&enabled)
	if errors.Is(err, pgx.ErrNoRows) {
		return caller{}, errUnauthorized
	}
	if err != nil {
		return caller{}, fmt.Errorf("kizuna auth: %w", err)
	}
	return caller{AccountID: c.AccountID, AgentID: c.Name, Enabled: enabled}, nil
}

func (h *Hub) admin(r *http.Request) error {
	c, err := h.auth(r)
	if err != nil {
		return err
	}
	if !c.Admin {
		return errForbidden
	}
	return nil
}

// agent requires an agent token; the admin acts as nobody's agent.
func (h *Hub) agent(r *http.Request) (caller, error) {
	c, err := h.auth(r)
	if err != nil {
		return c, err
	}
	if c.Admin {
		return c, refuse(http.StatusForbidden, "FORBIDDEN", "this path needs an agent token")
	}
	return c, nil
}

// readBody reads a request body strictly: one JSON object, no repeated
// keys, no NUL, within maxBody.
func readBody(r *http.Request, into any) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return nil, invalid(field{"body", "cannot read the request body"})
	}
	if len(b) > maxBody {
		return nil, invalid(field{"body", "larger than 1 MiB"})
	}
	if err := userjson.Check(b); err != nil {
		var e *userjson.Error
		if errors.As(err, &e) && e.Path != "" {
			return nil, invalid(field{e.Path, e.Message})
		}
		return nil, invalid(field{"body", err.Error()})
	}
	if len(b) == 0 || firstByte(b) != '{' {
		return nil, invalid(field{"body", "must be a JSON object"})
	}
	if err := json.Unmarshal(b, into); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, invalid(field{te.Field, "must be a " + jsonKind(te.Type.Kind().String())})
		}
		return nil, invalid(field{"body", err.Error()})
	}
	return b, nil
}

func firstByte(b []byte) byte {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return c
		}
	}
	return 0
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "string"
	case "slice":
		return "list"
	case "bool":
		return "boolean"
	case "map", "struct":
		return "object"
	}
	return "number"
}

// isNull reports whether raw is absent or the JSON null.
func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// stamp is the contract's time format: UTC ISO-8601 with milliseconds.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func stampPtr(t *time.Time) any {
	if t == nil {
		return nil
	}
	return stamp(*t)
}

// page reads limit and offset (default 50, at most 200).
func page(r *http.Request) (limit, offset int, err error) {
	limit, offset = 50, 0
	q := r.URL.Query()
	if s := q.Get("limit"); s != "" {
		n, perr := strconv.Atoi(s)
		if perr != nil || n < 1 || n > 200 {
			return 0, 0, invalid(field{"limit", "must be an integer from 1 to 200"})
		}
		limit = n
	}
	if s := q.Get("offset"); s != "" {
		n, perr := strconv.Atoi(s)
		if perr != nil || n < 0 || n > 1_000_000 {
			return 0, 0, invalid(field{"offset", "must be an integer from 0 to 1000000"})
		}
		offset = n
	}
	return limit, offset, nil
}
