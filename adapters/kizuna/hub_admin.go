package kizuna

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5"

	"github.com/dojo-relay/dojo/kungfu/account"
)

// EnrollTTL is how long an enroll token can be spent.
const EnrollTTL = 3 * time.Hour

// mountAdmin registers the console's paths; Mount calls it.
func (h *Hub) mountAdmin(r *mux.Router) {
	r.HandleFunc("/api/v1/enroll-tokens", h.route(map[string]handler{http.MethodPost: h.mintEnroll}))
	r.HandleFunc("/api/v1/tasks/{id}/redeliver", h.route(map[string]handler{http.MethodPost: h.redeliver}))
	r.HandleFunc("/api/v1/tasks/{id}/cancel", h.route(map[string]handler{http.MethodPost: h.cancel}))
	r.HandleFunc("/api/v1/audit", h.auditList)
	r.HandleFunc("/api/v1/stats", h.route(map[string]handler{http.MethodGet: h.stats}))
}

// installPrompt is the contract's install prompt; HUB and ENROLL_TOKEN
// are filled in.
const installPrompt = `Install the Kizuna letterbox on this machine. Detect the OS, then run exactly one of:
  Linux:   curl -fsSL "HUB/install/linux.sh?token=ENROLL_TOKEN" | bash
  macOS:   curl -fsSL "HUB/install/macos.sh?token=ENROLL_TOKEN" | bash
  Windows: powershell -c "irm 'HUB/install/windows.ps1?token=ENROLL_TOKEN' | iex"
  Termux:  curl -fsSL "HUB/install/termux.sh?token=ENROLL_TOKEN" | bash
The token is single-use and expires in 3 hours. The script enrolls FIRST, so a slow
runtime install or download cannot burn the token; re-running the same command resumes
where it stopped (an existing config skips enrollment).
Then: GET http://127.0.0.1:7788/healthz (expect ok=true, non-empty agent_id),
confirm the boot-persistence unit is enabled, and report OS, agent_id,
webhook address, persistence method, and health result. On failure, stop after
3 attempts and report the cause. Unsupported platform: stop and say so.`

func (h *Hub) hubURL(r *http.Request) string {
	if h.URL != "" {
		return strings.TrimRight(h.URL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// mintEnroll issues a single-use enroll token and its install prompt. The
// four elements are checked like a registration so the console learns of
// a bad form now, not when the script runs, and stored with the token:
// they bind the registration (see fill), and the script registers with an
// empty body, so they become the agent.
func (h *Hub) mintEnroll(r *http.Request) (int, any, error) {
	if err := h.admin(r); err != nil {
		return 0, nil, err
	}
	var in agentInput
	if _, err := readBody(r, &in); err != nil {
		return 0, nil, err
	}
	if in.EnrollToken != nil {
		return 0, nil, invalid(field{"enroll_token", "is not accepted here"})
	}
	if bad := in.check(true); len(bad) > 0 {
		return 0, nil, invalid(bad...)
	}
	if in.AgentID != nil && *in.AgentID != "" {
		// Refused now, as registration would refuse it: a token bound to
		// an id that can never be an account could only ever fail.
		if account.CheckName(*in.AgentID) != nil {
			return 0, nil, refuse(http.StatusConflict, "AGENT_CONFLICT", "agent_id %q is not a valid Dojo name (6-32 letters, digits, '_', '.', '-'; not reserved)", *in.AgentID)
		}
		taken := false
		if err := h.DB.QueryRow(r.Context(), `SELECT EXISTS (SELECT 1 FROM accounts WHERE lower(name) = lower($1))`, *in.AgentID).Scan(&taken); err != nil {
			return 0, nil, fmt.Errorf("enroll token: %w", err)
		}
		if taken {
			return 0, nil, refuse(http.StatusConflict, "AGENT_CONFLICT", "agent id %q is taken", *in.AgentID)
		}
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return 0, nil, fmt.Errorf("enroll token: %w", err)
	}
	token := "kz_enroll_" + base64.RawURLEncoding.EncodeToString(raw[:])
	sum := sha256.Sum256([]byte(token))
	now := h.now()
	expires := now.Add(EnrollTTL)
	elems, err := json.Marshal(in.elements())
	if err != nil {
		return 0, nil, fmt.Errorf("enroll token: %w", err)
	}
	if _, err := h.DB.Exec(r.Context(), `INSERT INTO kz_enroll_tokens (token_hash, expires_at, created_at, elements) VALUES ($1, $2, $3, $4)`,
		sum[:], expires, now, string(elems)); err != nil {
		return 0, nil, fmt.Errorf("enroll token: %w", err)
	}
	// The box listens on the webhook's port (see boxPort), so that is
	// where the prompt's health check must look.
	prompt := strings.NewReplacer("HUB", h.hubURL(r), "ENROLL_TOKEN", token,
		"127.0.0.1:7788", "127.0.0.1:"+strconv.Itoa(webhookPort(in.WebhookURL))).Replace(installPrompt)
	return http.StatusCreated, map[string]any{"enroll_token": token, "expires_at": stamp(expires), "prompt": prompt}, nil
}

// letterStates are the states GET /api/v1/tasks filters on.
var letterStates = map[string]bool{"queued": true, "delivering": true, "acked": true,
	"delivery_failed": true, "invalid_target": true, "cancelled": true}

// listTasks is the admin's queue view, newest first.
func (h *Hub) listTasks(r *http.Request) (int, any, error) {
	if err := h.admin(r); err != nil {
		return 0, nil, err
	}
	limit, offset, err := page(r)
	if err != nil {
		return 0, nil, err
	}
	q := r.URL.Query()
	where, args := []string{"TRUE"}, []any{}
	arg := func(v any) string { args = append(args, v); return "$" + strconv.Itoa(len(args)) }
	if s := q.Get("status"); s != "" {
		if !letterStates[s] {
			return 0, nil, invalid(field{"status", "must be one of queued, delivering, acked, delivery_failed, invalid_target, cancelled"})
		}
		where = append(where, "l.state = "+arg(s))
	}
	for _, k := range []string{"from", "to"} {
		s, err := queryText(r, k, maxIDLen)
		if err != nil {
			return 0, nil, err
		}
		if s != "" {
			where = append(where, "lower("+k[:1]+".name) = lower("+arg(s)+")")
		}
	}
	from := ` FROM kz_letters l JOIN accounts f ON f.id = l.from_account LEFT JOIN accounts t ON t.id = l.to_account
		WHERE ` + strings.Join(where, " AND ")
	var total int
	if err := h.DB.QueryRow(r.Context(), `SELECT count(*)`+from, args...).Scan(&total); err != nil {
		return 0, nil, fmt.Errorf("list tasks: %w", err)
	}
	rows, err := h.DB.Query(r.Context(), `SELECT l.task_id, f.name, coalesce(t.name, ''), l.kind, l.reply_to, l.state, l.attempts,
			l.next_attempt_at, l.created_at, l.acked_at, l.finished_at`+from+
		` ORDER BY l.id DESC LIMIT `+arg(limit)+` OFFSET `+arg(offset), args...)
	if err != nil {
		return 0, nil, fmt.Errorf("list tasks: %w", err)
	}
	defer rows.Close()
	items := []map[string]any{}
	for rows.Next() {
		var l hubLetter
		if err := rows.Scan(&l.TaskID, &l.FromName, &l.ToName, &l.Kind, &l.ReplyTo, &l.State, &l.Attempts,
			&l.NextAt, &l.CreatedAt, &l.AckedAt, &l.FinishedAt); err != nil {
			return 0, nil, fmt.Errorf("list tasks: %w", err)
		}
		items = append(items, map[string]any{"task_id": l.TaskID, "from": l.FromName, "to": l.ToName, "kind": l.Kind,
			"reply_to": l.ReplyTo, "state": l.State, "attempts": l.Attempts, "next_attempt_at": stampPtr(l.NextAt),
			"created_at": stamp(l.CreatedAt), "acked_at": stampPtr(l.AckedAt), "finished_at": stampPtr(l.FinishedAt)})
	}
	if err := rows.Err(); err != nil {
		return 0, nil, fmt.Errorf("list tasks: %w", err)
	}
	return http.StatusOK, map[string]any{"items": items, "total": total, "limit": limit, "offset": offset}, nil
}

// gone refuses a change to a letter that already left the queue. The
// contract's list has no code for it; VALIDATION_FAILED names the state.
func gone(l hubLetter) *Error {
	return invalid(field{"state", "the letter already left the queue (" + l.State + ")"})
}

// pendingLetter runs change on the letter the path names, locked, when the
// admin asks and the letter is still in the queue.
func (h *Hub) pendingLetter(r *http.Request, change func(tx pgx.Tx, l *hubLetter) error) (hubLetter, error) {
	if err := h.admin(r); err != nil {
		return hubLetter{}, err
	}
	var l hubLetter
	err := pgx.BeginFunc(r.Context(), h.DB, func(tx pgx.Tx) error {
		var err error
		if l, err = h.findLetter(r.Context(), tx, mux.Vars(r)["id"], true); err != nil {
			return err
		}
		if l.FinishedAt != nil {
			return gone(l)
		}
		return change(tx, &l)
	})
	return l, err
}

// redeliver makes a queued letter due now. A letter being delivered
// right now is left alone: its attempt decides what comes next.
func (h *Hub) redeliver(r *http.Request) (int, any, error) {
	l, err := h.pendingLetter(r, func(tx pgx.Tx, l *hubLetter) error {
		if l.State != "queued" {
			return nil
		}
		now := h.now()
		l.NextAt = &now
		_, err := tx.Exec(r.Context(), `UPDATE kz_letters SET next_attempt_at = $2 WHERE id = $1`, l.ID, now)
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	if h.Deliver != nil {
		h.Deliver.Redeliver(r.Context(), l.ID)
	}
	return http.StatusAccepted, map[string]any{"task_id": l.TaskID, "state": l.State, "next_attempt_at": stampPtr(l.NextAt)}, nil
}

// cancel dequeues a letter with audit outcome cancelled, in the
// transaction that sets its final state. An attempt in flight still ends,
// but its outcome no longer counts: record sees the letter finished.
func (h *Hub) cancel(r *http.Request) (int, any, error) {
	l, err := h.pendingLetter(r, func(tx pgx.Tx, l *hubLetter) error {
		return finishTx(r.Context(), tx, l.ID, h.now(), "cancelled")
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, map[string]any{"task_id": l.TaskID, "state": "cancelled", "outcome": "cancelled"}, nil
}

var auditOutcomes = map[string]bool{"acked": true, "delivery_failed": true, "invalid_target": true, "cancelled": true}

// auditList serves GET /api/v1/audit: a page of JSON, or with
// ?format=jsonl every matching row, one object a line, streamed.
func (h *Hub) auditList(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.route(map[string]handler{http.MethodGet: nil})(w, r)
		return
	}
	where, args, err := h.auditFilter(r)
	if err != nil {
		h.write(w, r, 0, nil, err)
		return
	}
	q := r.URL.Query()
	switch q.Get("format") {
	case "", "json":
	case "jsonl":
		h.auditExport(w, r, where, args)
		return
	default:
		h.write(w, r, 0, nil, invalid(field{"format", "must be json or jsonl"}))
		return
	}
	limit, offset, err := page(r)
	if err != nil {
		h.write(w, r, 0, nil, err)
		return
	}
	var total int
	if err := h.DB.QueryRow(r.Context(), `SELECT count(*) FROM kz_audit a JOIN kz_letters l ON l.id = a.letter_id
		JOIN accounts f ON f.id = l.from_account LEFT JOIN accounts t ON t.id = l.to_account WHERE `+where, args...).Scan(&total); err != nil {
		h.write(w, r, 0, nil, fmt.Errorf("audit: %w", err))
		return
	}
	n := len(args)
	rows, err := h.DB.Query(r.Context(), auditSelect+where+` ORDER BY a.id DESC LIMIT $`+strconv.Itoa(n+1)+` OFFSET $`+strconv.Itoa(n+2),
		append(args, limit, offset)...)
	if err != nil {
		h.write(w, r, 0, nil, fmt.Errorf("audit: %w", err))
		return
	}
	defer rows.Close()
	items := []auditRow{}
	for rows.Next() {
		a, err := scanAudit(rows)
		if err != nil {
			h.write(w, r, 0, nil, err)
			return
		}
		items = append(items, a)
	}
	if err := rows.Err(); err != nil {
		h.write(w, r, 0, nil, fmt.Errorf("audit: %w", err))
		return
	}
	h.write(w, r, http.StatusOK, map[string]any{"items": items, "total": total, "limit": limit, "offset": offset}, nil)
}

const auditSelect = `SELECT a.id, a.task_id, f.name, coalesce(t.name, ''), a.outcome, a.attempts::text, a.at
	FROM kz_audit a JOIN kz_letters l ON l.id = a.letter_id
	JOIN accounts f ON f.id = l.from_account LEFT JOIN accounts t ON t.id = l.to_account WHERE `

type auditRow struct {
	ID       int64           `json:"id"`
	TaskID   string          `json:"task_id"`
	From     string          `json:"from"`
	To       string          `json:"to"`
	Outcome  string          `json:"outcome"`
	Attempts json.RawMessage `json:"attempts"`
	At       string          `json:"at"`
}

func scanAudit(rows pgx.Rows) (auditRow, error) {
	var (
		a        auditRow
		attempts string
		at       time.Time
	)
	if err := rows.Scan(&a.ID, &a.TaskID, &a.From, &a.To, &a.Outcome, &attempts, &at); err != nil {
		return a, fmt.Errorf("audit: %w", err)
	}
	a.Attempts, a.At = json.RawMessage(attempts), stamp(at)
	return a, nil
}

// auditFilter reads outcome (or status), task_id, from, to, since and
// until; the admin only.
func (h *Hub) auditFilter(r *http.Request) (string, []any, error) {
	if err := h.admin(r); err != nil {
		return "", nil, err
	}
	q := r.URL.Query()
	where, args := []string{"TRUE"}, []any{}
	arg := func(v any) string { args = append(args, v); return "$" + strconv.Itoa(len(args)) }
	outcome, name := q.Get("outcome"), "outcome"
	if outcome == "" {
		outcome, name = q.Get("status"), "status"
	}
	if outcome != "" {
		if !auditOutcomes[outcome] {
			return "", nil, invalid(field{name, "must be one of acked, delivery_failed, invalid_target, cancelled"})
		}
		where = append(where, "a.outcome = "+arg(outcome))
	}
	filter := map[string]string{}
	for _, k := range []string{"task_id", "from", "to"} {
		s, err := queryText(r, k, maxIDLen)
		if err != nil {
			return "", nil, err
		}
		filter[k] = s
	}
	if s := filter["task_id"]; s != "" {
		where = append(where, "a.task_id = "+arg(s))
	}
	if s := filter["from"]; s != "" {
		where = append(where, "lower(f.name) = lower("+arg(s)+")")
	}
	if s := filter["to"]; s != "" {
		where = append(where, "lower(t.name) = lower("+arg(s)+")")
	}
	for _, k := range []string{"since", "until"} {
		s := q.Get(k)
		if s == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return "", nil, invalid(field{k, "must be an ISO-8601 time"})
		}
		op := ">="
		if k == "until" {
			op = "<"
		}
		where = append(where, "a.at "+op+" "+arg(t))
	}
	return strings.Join(where, " AND "), args, nil
}

// auditExport streams every matching row oldest first; once the first
// line is out an error can only cut the stream short, so it is logged.
func (h *Hub) auditExport(w http.ResponseWriter, r *http.Request, where string, args []any) {
	rows, err := h.DB.Query(r.Context(), auditSelect+where+` ORDER BY a.id`, args...)
	if err != nil {
		h.write(w, r, 0, nil, fmt.Errorf("audit export: %w", err))
		return
	}
	defer rows.Close()
	// The query's errors surface with the first row: check it before the
	// 200 goes out, so a failed export is an error, not an empty file.
	more := rows.Next()
	if !more && rows.Err() != nil {
		h.write(w, r, 0, nil, fmt.Errorf("audit export: %w", rows.Err()))
		return
	}
	// A long export outlives the server's write timeout; it gets its own.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(exportTimeout))
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for ; more; more = rows.Next() {
		a, err := scanAudit(rows)
		if err == nil {
			err = enc.Encode(a)
		}
		if err != nil {
			h.abortExport(r, err)
		}
	}
	if err := rows.Err(); err != nil {
		h.abortExport(r, err)
	}
	_ = bw.Flush()
}

// exportTimeout bounds one JSONL audit export.
const exportTimeout = 10 * time.Minute

// abortExport breaks the connection of an export that failed after its
// 200 went out: the client sees a cut stream, not a clean end of file.
func (h *Hub) abortExport(r *http.Request, err error) {
	h.log().ErrorContext(r.Context(), "kizuna audit export", "err", err)
	panic(http.ErrAbortHandler)
}

// stats is the console's overview.
func (h *Hub) stats(r *http.Request) (int, any, error) {
	if err := h.admin(r); err != nil {
		return 0, nil, err
	}
	ctx := r.Context()
	now := h.now()
	states := map[string]int{}
	for s := range letterStates {
		states[s] = 0
	}
	outcomes := map[string]int{}
	for s := range auditOutcomes {
		outcomes[s] = 0
	}
	count := func(sql string, into map[string]int) error {
		rows, err := h.DB.Query(ctx, sql)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k string
			var n int
			if err := rows.Scan(&k, &n); err != nil {
				return err
			}
			into[k] = n
		}
		return rows.Err()
	}
	if err := count(`SELECT state, count(*) FROM kz_letters GROUP BY state`, states); err != nil {
		return 0, nil, fmt.Errorf("stats: %w", err)
	}
	if err := count(`SELECT outcome, count(*) FROM kz_audit GROUP BY outcome`, outcomes); err != nil {
		return 0, nil, fmt.Errorf("stats: %w", err)
	}
	var agents, online, disabled, retrying int
	err := h.DB.QueryRow(ctx, `SELECT count(*),
			count(*) FILTER (WHERE enabled AND last_seen_at > $1),
			count(*) FILTER (WHERE NOT enabled)
		FROM kz_agents WHERE deleted_at IS NULL`, now.Add(-Online)).Scan(&agents, &online, &disabled)
	if err == nil {
		err = h.DB.QueryRow(ctx, `SELECT count(*) FROM kz_letters WHERE finished_at IS NULL AND attempts > 0`).Scan(&retrying)
	}
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, nil, fmt.Errorf("stats: %w", err)
	}
	return http.StatusOK, map[string]any{
		"agents":      map[string]int{"total": agents, "online": online, "offline": agents - online - disabled, "disabled": disabled},
		"states":      states,
		"outcomes":    outcomes,
		"queue_depth": states["queued"] + states["delivering"],
		"retrying":    retrying,
		"at":          stamp(now),
	}, nil
}
