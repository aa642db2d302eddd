package kizuna

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5"

	"github.com/dojo-relay/dojo/kungfu"
)

// Limiter charges one hit of action to subject and answers how long to
// wait, zero when the hit is allowed. The relay's shared Redis limiter
// satisfies it, so every process of a deployment counts together.
type Limiter interface {
	Allow(ctx context.Context, action, subject string) (time.Duration, error)
}

// The hub's rate-limit actions, configured with the relay's other limits.
const (
	// LimitRegister counts registrations per client address; the admin
	// token is not counted, it is the operator's own tool.
	LimitRegister = "kz_register"
	// LimitSend counts letters per sending agent token.
	LimitSend = "kz_send"
	// LimitResult counts result reports per agent token.
	LimitResult = "kz_result"
	// LimitHeartbeat counts heartbeats per agent token.
	LimitHeartbeat = "kz_heartbeat"
	// LimitCard counts public card reads per client address.
	LimitCard = "kz_card"
)

// limitRetry is the Retry-After, in seconds, when Redis cannot judge a
// request: the caller comes back once it is likely up again.
const limitRetry = 5

// subject names who a hit is charged to; ok false exempts the request.
type subject func(h *Hub, r *http.Request) (string, bool)

// byIP charges the client address, unless the relay lifts limits for it.
func byIP(h *Hub, r *http.Request) (string, bool) {
	if h.ClientIP == nil {
		return "", false
	}
	ip, unlimited := h.ClientIP(r)
	return "ip" + ip, !unlimited
}

// byToken charges the Bearer token. Hashing it avoids a database lookup
// before the limit and keeps the secret out of Redis; an agent has one
// token, so this is per agent. The admin is not limited.
func byToken(h *Hub, r *http.Request) (string, bool) {
	t := bearer(r)
	if t == "" || h.isAdmin(t) {
		return "", false
	}
	sum := sha256.Sum256([]byte(t))
	return "t" + hex.EncodeToString(sum[:12]), true
}

// byIPUnlessAdmin is byIP for paths the admin token also opens.
func byIPUnlessAdmin(h *Hub, r *http.Request) (string, bool) {
	if h.isAdmin(bearer(r)) {
		return "", false
	}
	return byIP(h, r)
}

// limit charges action to the request's subject before next runs, but
// only for the given method: a GET on the same path is not a send.
func (h *Hub) limit(method, action string, who subject, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// HEAD does a GET's work, so it pays a GET's limit.
		m := r.Method
		if m == http.MethodHead {
			m = http.MethodGet
		}
		if h.Limits == nil || m != method {
			next(w, r)
			return
		}
		s, ok := who(h, r)
		if !ok {
			next(w, r)
			return
		}
		wait, err := h.Limits.Allow(r.Context(), action, s)
		if err != nil {
			h.log().WarnContext(r.Context(), "kizuna: rate limit unavailable", "action", action, "err", err)
			w.Header().Set("Retry-After", strconv.Itoa(limitRetry))
			h.write(w, r, 0, nil, &Error{Status: http.StatusServiceUnavailable, Code: "SERVICE_UNAVAILABLE",
				Message: "the hub is briefly unavailable; retry later", Details: map[string]any{"retry_after": limitRetry}})
			return
		}
		if wait > 0 {
			secs := max(1, int(math.Ceil(wait.Seconds())))
			w.Header().Set("Retry-After", strconv.Itoa(secs))
			h.write(w, r, 0, nil, &Error{Status: http.StatusTooManyRequests, Code: "RATE_LIMITED",
				Message: fmt.Sprintf("too many requests; retry after %ds", secs),
				Details: map[string]any{"action": action, "retry_after": secs}})
			return
		}
		next(w, r)
	}
}

// hubCard is the hub's own A2A Agent Card. It carries both the v0.3 shape
// (url, protocolVersion, preferredTransport) and v1.0's
// supportedInterfaces, so clients of either draft read it; the top-level
// kizuna member tells Kizuna clients where the hub's own paths are.
func (h *Hub) hubCard(r *http.Request) map[string]any {
	base := h.hubURL(r)
	text := []string{"text/plain", "application/json"}
	return map[string]any{
		"name":               "Dojo Kizuna hub",
		"description":        "A letterbox hub: registered agents send each other letters, delivered signed to each agent's letterbox until acknowledged, and report results back.",
		"url":                base + "/api/v1/tasks",
		"version":            kungfu.Version,
		"protocolVersion":    "0.3.0",
		"preferredTransport": "HTTP+JSON",
		"supportedInterfaces": []any{map[string]any{
			"url": base + "/api/v1/tasks", "protocolBinding": "HTTP+JSON", "protocolVersion": "0.3.0"}},
		"provider":           map[string]any{"organization": "Dojo", "url": base},
		"documentationUrl":   base + "/docs/kizuna.md",
		"capabilities":       map[string]any{"streaming": false, "pushNotifications": true, "stateTransitionHistory": true},
		"defaultInputModes":  text,
		"defaultOutputModes": text,
		"securitySchemes": map[string]any{"agent_token": map[string]any{
			"type": "http", "scheme": "bearer", "description": "the agent_token returned at registration"}},
		"security": []any{map[string]any{"agent_token": []string{}}},
		"skills": []any{
			map[string]any{"id": "send-letter", "name": "Send a letter",
				"description": "Queue a letter to another registered agent; it is delivered to that agent's letterbox until acknowledged.",
				"tags":        []string{"kizuna", "messaging"}},
			map[string]any{"id": "directory", "name": "Agent directory",
				"description": "Look up registered agents by text, capability tag or status, and read their published cards.",
				"tags":        []string{"kizuna", "directory"}},
			map[string]any{"id": "report-result", "name": "Report a result",
				"description": "The recipient of a letter reports working, input-required, completed, failed or canceled; a terminal state is sent back to the sender as a reply letter.",
				"tags":        []string{"kizuna", "result"}},
		},
		"kizuna": map[string]any{
			"version":    "0.2",
			"enqueue":    base + "/api/v1/tasks",
			"directory":  base + "/api/v1/agents",
			"result":     base + "/api/v1/tasks/{task_id}/result",
			"task":       base + "/api/v1/tasks/{task_id}",
			"heartbeat":  base + "/api/v1/heartbeat",
			"agent_card": base + "/.well-known/agent-card.json?agent={agent_id}",
		},
	}
}

// serveCard answers the public card paths: the hub's own card, or with
// ?agent= (or the /api/v1/agents/{id}/agent-card.json alias) an agent's
// published card, served as the bytes it was published with.
func (h *Hub) serveCard(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		h.write(w, r, 0, nil, &Error{Status: http.StatusMethodNotAllowed, Code: "METHOD_NOT_ALLOWED",
			Message: r.Method + " is not allowed here"})
		return
	}
	// Discovery is public and read from browsers too.
	w.Header().Set("Access-Control-Allow-Origin", "*")
	id, alias := mux.Vars(r)["id"]
	if !alias {
		if !r.URL.Query().Has("agent") {
			h.write(w, r, http.StatusOK, h.hubCard(r), nil)
			return
		}
		id = r.URL.Query().Get("agent")
	}
	card, err := h.agentCard(r.Context(), id)
	if err != nil {
		h.write(w, r, 0, nil, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(card)
	}
}

// agentCard reads a live agent's published card. An unknown, deleted or
// card-less agent is the same 404: the path says nothing about which.
func (h *Hub) agentCard(ctx context.Context, id string) ([]byte, error) {
	notFound := &Error{Status: http.StatusNotFound, Code: "AGENT_CARD_NOT_FOUND",
		Message: fmt.Sprintf("agent %q has no published card", id), Details: map[string]any{"agent_id": id}}
	if id == "" || !textOK(id, maxIDLen) {
		return nil, notFound
	}
	var card []byte
	err := h.DB.QueryRow(ctx, `SELECT k.agent_card::text FROM kz_agents k JOIN accounts a ON a.id = k.account_id
		WHERE lower(a.name) = lower($1) AND k.deleted_at IS NULL`, id).Scan(&card)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && len(card) == 0) {
		return nil, notFound
	}
	if err != nil {
		return nil, fmt.Errorf("kizuna card: %w", err)
	}
	return card, nil
}
