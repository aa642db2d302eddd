package kizuna

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5"
)

// Letter kinds.
const (
	KindTask   = "kizuna.task"
	KindResult = "kizuna.task-result"
)

const maxTitle = 500

// A letter's result history is bounded: each report's result, and how
// many reports one letter keeps (a terminal one always fits).
const (
	maxResult  = 64 << 10
	maxResults = 100
)

var (
	formats    = map[string]bool{"text": true, "markdown": true, "html": true, "json": true}
	priorities = map[string]bool{"low": true, "normal": true, "high": true, "urgent": true}
	// categories maps each result state to its lifecycle category.
	categories = map[string]string{
		"working": "in_progress", "input-required": "interrupted",
		"completed": "terminal", "failed": "terminal", "canceled": "terminal",
	}
)

type sendInput struct {
	To      *string         `json:"to"`
	Content json.RawMessage `json:"content"`
}

type contentInput struct {
	Title    *string         `json:"title"`
	Body     json.RawMessage `json:"body"`
	Format   *string         `json:"format"`
	Priority *string         `json:"priority"`
	Deadline *string         `json:"deadline"`
}

// checkContent validates a letter's content; the bytes themselves are
// relayed as sent, so a JSON body keeps its key order and spacing.
func checkContent(raw json.RawMessage) []field {
	if isNull(raw) {
		return []field{{"content", "is required"}}
	}
	if firstByte(raw) != '{' {
		return []field{{"content", "must be an object"}}
	}
	var c contentInput
	if err := json.Unmarshal(raw, &c); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return []field{{"content." + te.Field, "must be a " + jsonKind(te.Type.Kind().String())}}
		}
		return []field{{"content", err.Error()}}
	}
	var bad []field
	switch {
	case c.Title == nil || strings.TrimSpace(*c.Title) == "":
		bad = append(bad, field{"content.title", "is required"})
	case utf8.RuneCountInString(*c.Title) > maxTitle:
		bad = append(bad, field{"content.title", fmt.Sprintf("must be at most %d characters", maxTitle)})
	}
	format := "text"
	if c.Format != nil {
		format = *c.Format
		if !formats[format] {
			bad = append(bad, field{"content.format", "must be text, markdown, html or json"})
		}
	}
	switch {
	case isNull(c.Body):
		bad = append(bad, field{"content.body", "is required"})
	case format != "json" && firstByte(c.Body) != '"':
		bad = append(bad, field{"content.body", `must be a string (an object needs "format":"json")`})
	}
	if c.Priority != nil && !priorities[*c.Priority] {
		bad = append(bad, field{"content.priority", "must be low, normal, high or urgent"})
	}
	if c.Deadline != nil {
		if _, err := time.Parse(time.RFC3339, *c.Deadline); err != nil {
			bad = append(bad, field{"content.deadline", "must be an ISO-8601 time (RFC 3339)"})
		}
	}
	return bad
}

// send queues a letter from the token's agent. The delivery body is built
// here once and stored; every attempt sends exactly those bytes.
func (h *Hub) send(r *http.Request) (int, any, error) {
	c, err := h.agent(r)
	if err != nil {
		return 0, nil, err
	}
	if !c.Enabled {
		return 0, nil, refuse(http.StatusForbidden, "FORBIDDEN", "a disabled agent cannot send letters")
	}
	var in sendInput
	if _, err := readBody(r, &in); err != nil {
		return 0, nil, err
	}
	var bad []field
	if in.To == nil || *in.To == "" {
		bad = append(bad, field{"to", "is required"})
	}
	bad = append(bad, checkContent(in.Content)...)
	if len(bad) > 0 {
		return 0, nil, invalid(bad...)
	}
	var (
		taskID string
		id     int64
	)
	err = pgx.BeginFunc(r.Context(), h.DB, func(tx pgx.Tx) error {
		to, toName, enabled, err := h.lookup(r.Context(), tx, *in.To)
		if err != nil {
			return err
		}
		if !enabled {
			return refuse(http.StatusUnprocessableEntity, "TARGET_DISABLED", "agent %q is disabled", toName)
		}
		if err := h.queueRoom(r.Context(), tx, c.AccountID, to, toName); err != nil {
			return err
		}
		taskID, id, err = h.insertLetter(r.Context(), tx, c.AccountID, c.AgentID, to, toName, KindTask, nil, in.Content)
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	h.enqueue(r.Context(), id)
	return http.StatusAccepted, map[string]any{"task_id": taskID, "status": "queued"}, nil
}

// DefaultMaxQueued bounds the unfinished letters of one sender, and those waiting
// for one recipient: a flood, or a letterbox that never answers, fills
// PostgreSQL no further. Result replies are not counted or refused; they
// are bounded by the letters they answer.
const DefaultMaxQueued = 1000

// queueRoom refuses a letter when its sender or its recipient has
// Hub.MaxQueued letters in the queue already.
func (h *Hub) queueRoom(ctx context.Context, tx pgx.Tx, from, to int64, toName string) error {
	max := h.MaxQueued
	if max <= 0 {
		max = DefaultMaxQueued
	}
	var fromN, toN int
	err := tx.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM (SELECT 1 FROM kz_letters WHERE from_account = $1 AND finished_at IS NULL LIMIT $3) f),
			(SELECT count(*) FROM (SELECT 1 FROM kz_letters WHERE to_account = $2 AND finished_at IS NULL LIMIT $3) t)`,
		from, to, max).Scan(&fromN, &toN)
	if err != nil {
		return fmt.Errorf("queue room: %w", err)
	}
	full := func(msg string) error {
		return &Error{Status: http.StatusTooManyRequests, Code: "RATE_LIMITED", Message: msg,
			Details: map[string]any{"action": "kz_queue", "max_queued": max, "retry_after": 60}}
	}
	switch {
	case fromN >= max:
		return full(fmt.Sprintf("you have %d letters in the queue already; wait until some are delivered", max))
	case toN >= max:
		return full(fmt.Sprintf("agent %q has %d letters waiting already; try again later", toName, max))
	}
	return nil
}

func (h *Hub) enqueue(ctx context.Context, id int64) {
	if h.Deliver != nil {
		h.Deliver.Enqueue(context.WithoutCancel(ctx), id)
	}
}

// insertLetter writes a queued letter whose body is the exact delivery
// document: {task_id, from, to, kind, reply_to, content, created_at}.
func (h *Hub) insertLetter(ctx context.Context, tx pgx.Tx, from int64, fromName string, to int64, toName, kind string, replyTo *string, content []byte) (string, int64, error) {
	now := h.now()
	for range 5 {
		taskID := newTaskID()
		var b bytes.Buffer
		b.WriteString(`{"task_id":`)
		b.Write(jsonString(taskID))
		b.WriteString(`,"from":`)
		b.Write(jsonString(fromName))
		b.WriteString(`,"to":`)
		b.Write(jsonString(toName))
		b.WriteString(`,"kind":`)
		b.Write(jsonString(kind))
		b.WriteString(`,"reply_to":`)
		if replyTo == nil {
			b.WriteString("null")
		} else {
			b.Write(jsonString(*replyTo))
		}
		b.WriteString(`,"content":`)
		b.Write(content)
		b.WriteString(`,"created_at":`)
		b.Write(jsonString(stamp(now)))
		b.WriteByte('}')
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO kz_letters (task_id, from_account, to_account, kind, reply_to, body, state, attempts, next_attempt_at, created_at)
			VALUES ($1, $2, $3, $4, $5, $6::json, 'queued', 0, $7, $7)
			ON CONFLICT (task_id) DO NOTHING RETURNING id`,
			taskID, from, to, kind, replyTo, b.String(), now).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // a task id collision: draw again
		}
		if err != nil {
			return "", 0, fmt.Errorf("insert letter: %w", err)
		}
		return taskID, id, nil
	}
	return "", 0, errors.New("insert letter: no free task id")
}

func newTaskID() string {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return "T-" + string(b)
}

// jsonString encodes s as a JSON string without HTML escaping.
func jsonString(s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// hubLetter is a letter's row as the task paths need it.
type hubLetter struct {
	ID         int64
	TaskID     string
	From, To   int64
	FromName   string
	ToName     string
	Kind       string
	ReplyTo    *string
	Body       []byte
	State      string
	Attempts   int
	NextAt     *time.Time
	CreatedAt  time.Time
	AckedAt    *time.Time
	FinishedAt *time.Time
}

func (h *Hub) findLetter(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, taskID string, lock bool) (hubLetter, error) {
	var l hubLetter
	if !validTaskID(taskID) {
		return l, refuse(http.StatusNotFound, "TASK_NOT_FOUND", "no task %q", taskID)
	}
	sql := `SELECT l.id, l.task_id, l.from_account, coalesce(l.to_account, 0), f.name, coalesce(t.name, ''), l.kind, l.reply_to, l.body::text,
			l.state, l.attempts, l.next_attempt_at, l.created_at, l.acked_at, l.finished_at
		FROM kz_letters l JOIN accounts f ON f.id = l.from_account LEFT JOIN accounts t ON t.id = l.to_account
		WHERE l.task_id = $1`
	if lock {
		sql += ` FOR UPDATE OF l`
	}
	var body string
	err := q.QueryRow(ctx, sql, taskID).Scan(&l.ID, &l.TaskID, &l.From, &l.To, &l.FromName, &l.ToName, &l.Kind, &l.ReplyTo, &body,
		&l.State, &l.Attempts, &l.NextAt, &l.CreatedAt, &l.AckedAt, &l.FinishedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, refuse(http.StatusNotFound, "TASK_NOT_FOUND", "no task %q", taskID)
	}
	l.Body = []byte(body)
	return l, err
}

// party admits the sender, the recipient and the admin.
func (c caller) party(l hubLetter) bool {
	return c.Admin || c.AccountID == l.From || c.AccountID == l.To
}

// partyLetter is the letter the path names, for its sender, its
// recipient or the admin; anyone else is refused.
func (h *Hub) partyLetter(r *http.Request) (hubLetter, error) {
	c, err := h.auth(r)
	if err != nil {
		return hubLetter{}, err
	}
	l, err := h.findLetter(r.Context(), h.DB, mux.Vars(r)["id"], false)
	if err != nil {
		return hubLetter{}, err
	}
	if !c.party(l) {
		return hubLetter{}, errForbidden
	}
	return l, nil
}

func (h *Hub) getTask(r *http.Request) (int, any, error) {
	l, err := h.partyLetter(r)
	if err != nil {
		return 0, nil, err
	}
	var doc struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(l.Body, &doc); err != nil {
		return 0, nil, fmt.Errorf("letter %s body: %w", l.TaskID, err)
	}
	// The outcome is read before the attempts: the last attempt's result
	// and the audit commit together, so a view that shows an outcome also
	// shows the attempt that decided it.
	var outcome *string
	err = h.DB.QueryRow(r.Context(), `SELECT outcome FROM kz_audit WHERE letter_id = $1 ORDER BY id LIMIT 1`, l.ID).Scan(&outcome)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, nil, err
	}
	attempts, err := h.attempts(r.Context(), l.ID)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, map[string]any{
		"task_id": l.TaskID, "from": l.FromName, "to": l.ToName, "kind": l.Kind, "reply_to": l.ReplyTo,
		"content": doc.Content, "state": l.State, "attempts": attempts, "outcome": outcome,
		"created_at": stamp(l.CreatedAt), "next_attempt_at": stampPtr(l.NextAt),
		"acked_at": stampPtr(l.AckedAt), "finished_at": stampPtr(l.FinishedAt),
	}, nil
}

type attemptView struct {
	N         int    `json:"n"`
	At        string `json:"at"`
	Status    *int   `json:"status"`
	LatencyMS int    `json:"latency_ms"`
	Error     string `json:"error"`
}

func (h *Hub) attempts(ctx context.Context, letterID int64) ([]attemptView, error) {
	rows, err := h.DB.Query(ctx, `SELECT n, at, status, latency_ms, error FROM kz_attempts WHERE letter_id = $1 ORDER BY n`, letterID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []attemptView{}
	for rows.Next() {
		var (
			a  attemptView
			at time.Time
		)
		if err := rows.Scan(&a.N, &at, &a.Status, &a.LatencyMS, &a.Error); err != nil {
			return nil, err
		}
		a.At = stamp(at)
		out = append(out, a)
	}
	return out, rows.Err()
}

type resultInput struct {
	State   *string         `json:"state"`
	Message *string         `json:"message"`
	Result  json.RawMessage `json:"result"`
}

// postResult records the recipient's report on a letter it ACKed. A
// terminal state answers the sender with a reply letter from the
// recipient, through the same queue as any letter.
func (h *Hub) postResult(r *http.Request) (int, any, error) {
	c, err := h.agent(r)
	if err != nil {
		return 0, nil, err
	}
	if !c.Enabled {
		return 0, nil, refuse(http.StatusForbidden, "FORBIDDEN", "a disabled agent cannot report results")
	}
	var in resultInput
	if _, err := readBody(r, &in); err != nil {
		return 0, nil, err
	}
	var bad []field
	category := ""
	switch {
	case in.State == nil:
		bad = append(bad, field{"state", "is required"})
	case categories[*in.State] == "":
		bad = append(bad, field{"state", "must be working, input-required, completed, failed or canceled"})
	default:
		category = categories[*in.State]
	}
	if in.Message != nil && len(*in.Message) > maxCapabilities {
		bad = append(bad, field{"message", fmt.Sprintf("must be at most %d bytes", maxCapabilities)})
	}
	if len(in.Result) > maxResult {
		bad = append(bad, field{"result", fmt.Sprintf("must be at most %d bytes", maxResult)})
	}
	if len(bad) > 0 {
		return 0, nil, invalid(bad...)
	}
	state := *in.State
	var (
		relayed bool
		replyID int64
		replyTo string
	)
	err = pgx.BeginFunc(r.Context(), h.DB, func(tx pgx.Tx) error {
		l, err := h.findLetter(r.Context(), tx, mux.Vars(r)["id"], true)
		if err != nil {
			return err
		}
		if c.AccountID != l.To {
			return refuse(http.StatusForbidden, "FORBIDDEN", "only the recipient reports a result")
		}
		if l.Kind == KindResult {
			// A reply carries a result already; reporting on it would
			// send a reply to the reply, and two automatic boxes would
			// answer each other for ever.
			return invalid(field{"state", "a result reply letter takes no result"})
		}
		if l.AckedAt == nil {
			return &Error{Status: http.StatusUnprocessableEntity, Code: "VALIDATION_FAILED",
				Message: "the letter is not acknowledged yet", Details: map[string]any{"fields": []field{{"state", "only after the ACK"}}}}
		}
		var (
			last  string
			count int
		)
		err = tx.QueryRow(r.Context(), `SELECT coalesce((SELECT state FROM kz_results WHERE letter_id = $1 ORDER BY id DESC LIMIT 1), ''),
			(SELECT count(*) FROM kz_results WHERE letter_id = $1)`, l.ID).Scan(&last, &count)
		if err != nil {
			return err
		}
		if categories[last] == "terminal" {
			if last == state {
				return nil // the same terminal report again: nothing new
			}
			return &Error{Status: http.StatusUnprocessableEntity, Code: "VALIDATION_FAILED",
				Message: fmt.Sprintf("the task already ended %s", last), Details: map[string]any{"fields": []field{{"state", "already terminal: " + last}}}}
		}
		if count >= maxResults-1 && category != "terminal" {
			// The last place is kept for the end.
			return invalid(field{"state", fmt.Sprintf("a letter keeps at most %d results; only a terminal state is accepted now", maxResults)})
		}
		var result any
		if !isNull(in.Result) {
			result = string(in.Result)
		}
		now := h.now()
		if _, err := tx.Exec(r.Context(), `INSERT INTO kz_results (letter_id, state, category, message, result, at) VALUES ($1, $2, $3, $4, $5::json, $6)`,
			l.ID, state, category, in.Message, result, now); err != nil {
			return err
		}
		if category != "terminal" {
			return nil
		}
		replyTo = l.TaskID
		content := resultContent(l, state, in.Message, in.Result)
		_, replyID, err = h.insertLetter(r.Context(), tx, l.To, l.ToName, l.From, l.FromName, KindResult, &replyTo, content)
		relayed = err == nil
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	if relayed {
		h.enqueue(r.Context(), replyID)
	}
	return http.StatusAccepted, map[string]any{"state": state, "category": category, "relayed": relayed}, nil
}

// resultContent is a reply letter's content: {title, format:"json", body:
// {task_id, state, message, result}}, the result's bytes as reported.
func resultContent(l hubLetter, state string, message *string, result json.RawMessage) []byte {
	var b bytes.Buffer
	b.WriteString(`{"title":`)
	b.Write(jsonString("Result of " + l.TaskID + ": " + state))
	b.WriteString(`,"format":"json","body":{"task_id":`)
	b.Write(jsonString(l.TaskID))
	b.WriteString(`,"state":`)
	b.Write(jsonString(state))
	b.WriteString(`,"message":`)
	if message == nil {
		b.WriteString("null")
	} else {
		b.Write(jsonString(*message))
	}
	b.WriteString(`,"result":`)
	if isNull(result) {
		b.WriteString("null")
	} else {
		b.Write(result)
	}
	b.WriteString(`}}`)
	return b.Bytes()
}

type resultView struct {
	State    string          `json:"state"`
	Category string          `json:"category"`
	Message  *string         `json:"message"`
	Result   json.RawMessage `json:"result"`
	At       string          `json:"at"`
}

// results is a letter's result history, oldest first.
func (h *Hub) results(r *http.Request) (int, any, error) {
	l, err := h.partyLetter(r)
	if err != nil {
		return 0, nil, err
	}
	limit, offset, err := page(r)
	if err != nil {
		return 0, nil, err
	}
	var total int
	if err := h.DB.QueryRow(r.Context(), `SELECT count(*) FROM kz_results WHERE letter_id = $1`, l.ID).Scan(&total); err != nil {
		return 0, nil, err
	}
	rows, err := h.DB.Query(r.Context(), `SELECT state, category, message, result::text, at FROM kz_results WHERE letter_id = $1
		ORDER BY id LIMIT $2 OFFSET $3`, l.ID, limit, offset)
	if err != nil {
		return 0, nil, err
	}
	defer rows.Close()
	items := []resultView{}
	for rows.Next() {
		var (
			v      resultView
			result *string
			at     time.Time
		)
		if err := rows.Scan(&v.State, &v.Category, &v.Message, &result, &at); err != nil {
			return 0, nil, err
		}
		v.Result = json.RawMessage("null")
		if result != nil {
			v.Result = json.RawMessage(*result)
		}
		v.At = stamp(at)
		items = append(items, v)
	}
	if err := rows.Err(); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, map[string]any{"task_id": l.TaskID, "items": items, "total": total, "limit": limit, "offset": offset}, nil
}
