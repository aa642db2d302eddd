package relay_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestKizunaEnrollTokens: the admin mints a single-use token whose prompt
// is the contract's, filled in; the token registers once, then is 410.
func TestKizunaEnrollTokens(t *testing.T) {
	t.Parallel()
	d := start(t, withAdmin)
	a := enroll(t, d, "Keeper")
	url := d.URL + "/api/v1/enroll-tokens"
	form := map[string]any{"name": "Box", "agent_id": "box-one", "capabilities": "spools letters", "webhook_url": "http://127.0.0.1:7788"}

	hubWant(t, hub(t, http.MethodPost, url, "", form), http.StatusUnauthorized, "UNAUTHORIZED")
	hubWant(t, hub(t, http.MethodPost, url, a.Token, form), http.StatusForbidden, "FORBIDDEN")
	hubWant(t, hub(t, http.MethodPost, url, kzAdmin, map[string]any{"capabilities": "x", "webhook_url": "ftp://x"}),
		http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	hubWant(t, hub(t, http.MethodPost, url, kzAdmin, map[string]any{"name": "Dup", "agent_id": a.ID, "capabilities": "x",
		"webhook_url": "http://127.0.0.1:7788"}), http.StatusConflict, "AGENT_CONFLICT")
	hubWant(t, hub(t, http.MethodGet, url, kzAdmin, nil), http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED")

	before := time.Now()
	r := hub(t, http.MethodPost, url, kzAdmin, form)
	if r.Status != http.StatusCreated {
		t.Fatalf("mint: %d %s", r.Status, r.Raw)
	}
	token := r.str("enroll_token")
	exp, err := time.Parse(time.RFC3339Nano, r.str("expires_at"))
	if token == "" || err != nil || exp.Sub(before) < 3*time.Hour-time.Minute || exp.Sub(before) > 3*time.Hour+time.Minute {
		t.Fatalf("mint: %s", r.Raw)
	}
	prompt := r.str("prompt")
	for _, want := range []string{
		`curl -fsSL "` + d.URL + `/install/linux.sh?token=` + token + `" | bash`,
		`irm '` + d.URL + `/install/windows.ps1?token=` + token + `' | iex`,
		"The token is single-use and expires in 3 hours.",
		"Unsupported platform: stop and say so.",
	} {
		if !strings.Contains(prompt, want) {
			t.Errorf("prompt lacks %q:\n%s", want, prompt)
		}
	}
	if strings.Contains(prompt, "$HUB") || strings.Contains(prompt, "$ENROLL_TOKEN") {
		t.Errorf("prompt not filled in:\n%s", prompt)
	}
	// Stored hashed: the plain token is nowhere in the table.
	sum := sha256.Sum256([]byte(token))
	var n int
	if err := d.App.DB.QueryRow(context.Background(), `SELECT count(*) FROM kz_enroll_tokens WHERE token_hash = $1 AND used_at IS NULL`, sum[:]).Scan(&n); err != nil || n != 1 {
		t.Fatalf("stored token: %d %v", n, err)
	}

	reg := hub(t, http.MethodPost, d.URL+"/api/v1/agents?token="+token, "", form)
	if reg.Status != http.StatusCreated || reg.str("agent_id") != "box-one" {
		t.Fatalf("enroll: %d %s", reg.Status, reg.Raw)
	}
	form["agent_id"] = "box-two"
	hubWant(t, hub(t, http.MethodPost, d.URL+"/api/v1/agents?token="+token, "", form), http.StatusGone, "ENROLL_TOKEN_USED")
}

// TestKizunaAdminQueue: the queue view filters, redeliver makes the next
// attempt at once instead of minutes later, and cancel dequeues with audit
// cancelled and stops all attempts.
func TestKizunaAdminQueue(t *testing.T) {
	t.Parallel()
	d := start(t, withAdmin, withLadder(1))
	a, b := enroll(t, d, "Sender"), enroll(t, d, "Down")
	b.Box.setFailing(true)
	send := hub(t, http.MethodPost, d.URL+"/api/v1/tasks", a.Token, map[string]any{"to": b.ID, "content": map[string]any{"title": "t", "body": "b"}})
	if send.Status != http.StatusAccepted {
		t.Fatalf("send: %d %s", send.Status, send.Raw)
	}
	id := send.str("task_id")
	waitFor(t, 20*time.Second, func() bool {
		r := hub(t, http.MethodGet, d.URL+"/api/v1/tasks/"+id, kzAdmin, nil)
		return len(b.Box.hits(id)) == 1 && r.str("state") == "queued"
	})

	list := d.URL + "/api/v1/tasks"
	hubWant(t, hub(t, http.MethodGet, list, "", nil), http.StatusUnauthorized, "UNAUTHORIZED")
	hubWant(t, hub(t, http.MethodGet, list, a.Token, nil), http.StatusForbidden, "FORBIDDEN")
	hubWant(t, hub(t, http.MethodGet, list+"?status=lost", kzAdmin, nil), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	r := hub(t, http.MethodGet, list+"?status=queued&from="+a.ID+"&to="+b.ID, kzAdmin, nil)
	items, _ := r.Body["items"].([]any)
	if r.Status != http.StatusOK || r.Body["total"] != float64(1) || len(items) != 1 || r.Body["limit"] != float64(50) {
		t.Fatalf("queue: %d %s", r.Status, r.Raw)
	}
	if it, _ := items[0].(map[string]any); it["task_id"] != id || it["attempts"] != float64(1) || it["next_attempt_at"] == nil {
		t.Fatalf("queue item: %v", it)
	}
	if r := hub(t, http.MethodGet, list+"?to="+a.ID, kzAdmin, nil); r.Body["total"] != float64(0) {
		t.Fatalf("filter to: %s", r.Raw)
	}

	// The ladder's next rung is 3 minutes away; redeliver brings it now.
	task := d.URL + "/api/v1/tasks/" + id
	hubWant(t, hub(t, http.MethodPost, task+"/redeliver", a.Token, nil), http.StatusForbidden, "FORBIDDEN")
	hubWant(t, hub(t, http.MethodPost, d.URL+"/api/v1/tasks/T-NOPE/redeliver", kzAdmin, nil), http.StatusNotFound, "TASK_NOT_FOUND")
	asked := time.Now()
	if r := hub(t, http.MethodPost, task+"/redeliver", kzAdmin, nil); r.Status != http.StatusAccepted {
		t.Fatalf("redeliver: %d %s", r.Status, r.Raw)
	}
	waitFor(t, 5*time.Second, func() bool { return len(b.Box.hits(id)) == 2 })
	if took := time.Since(asked); took > 1500*time.Millisecond {
		t.Errorf("redelivered attempt came after %v", took)
	}

	// Cancel: audit cancelled, and nothing more reaches the box even when
	// the letter would be due.
	waitFor(t, 5*time.Second, func() bool {
		return hub(t, http.MethodGet, task, kzAdmin, nil).str("state") == "queued"
	})
	hubWant(t, hub(t, http.MethodPost, task+"/cancel", b.Token, nil), http.StatusForbidden, "FORBIDDEN")
	hubWant(t, hub(t, http.MethodPost, d.URL+"/api/v1/tasks/T-NOPE/cancel", kzAdmin, nil), http.StatusNotFound, "TASK_NOT_FOUND")
	if r := hub(t, http.MethodPost, task+"/cancel", kzAdmin, nil); r.Status != http.StatusOK || r.str("outcome") != "cancelled" {
		t.Fatalf("cancel: %d %s", r.Status, r.Raw)
	}
	hits := len(b.Box.hits(id))
	hubWant(t, hub(t, http.MethodPost, task+"/cancel", kzAdmin, nil), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	hubWant(t, hub(t, http.MethodPost, task+"/redeliver", kzAdmin, nil), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	if _, err := d.App.DB.Exec(context.Background(), `UPDATE kz_letters SET next_attempt_at = now() - interval '1 hour' WHERE task_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	b.Box.setFailing(false)
	time.Sleep(2 * time.Second)
	if n := len(b.Box.hits(id)); n != hits {
		t.Fatalf("%d attempts after cancel (had %d)", n, hits)
	}
	view := hub(t, http.MethodGet, task, a.Token, nil)
	if view.str("state") != "cancelled" || view.str("outcome") != "cancelled" {
		t.Fatalf("view: %s", view.Raw)
	}
	var attempts int
	if err := d.App.DB.QueryRow(context.Background(), `SELECT json_array_length(attempts) FROM kz_audit WHERE task_id = $1 AND outcome = 'cancelled'`, id).Scan(&attempts); err != nil || attempts != hits {
		t.Fatalf("audit attempts %d (want %d): %v", attempts, hits, err)
	}
}

// TestKizunaAuditAndStats: the audit lists and exports one JSON object a
// line, stays append-only, and stats count states and outcomes.
func TestKizunaAuditAndStats(t *testing.T) {
	t.Parallel()
	d := start(t, withAdmin, withLadder(1))
	a, b := enroll(t, d, "Writer"), enroll(t, d, "Reader")
	ids := map[string]bool{}
	for i := 0; i < 3; i++ {
		s := hub(t, http.MethodPost, d.URL+"/api/v1/tasks", a.Token, map[string]any{"to": b.ID, "content": map[string]any{"title": "t", "body": "<b>"}})
		if s.Status != http.StatusAccepted {
			t.Fatalf("send: %s", s.Raw)
		}
		ids[s.str("task_id")] = true
		waitOutcome(t, d, a.Token, s.str("task_id"))
	}
	b.Box.setFailing(true)
	c := hub(t, http.MethodPost, d.URL+"/api/v1/tasks", a.Token, map[string]any{"to": b.ID, "content": map[string]any{"title": "t", "body": "x"}})
	cid := c.str("task_id")
	if r := hub(t, http.MethodPost, d.URL+"/api/v1/tasks/"+cid+"/cancel", kzAdmin, nil); r.Status != http.StatusOK {
		t.Fatalf("cancel: %s", r.Raw)
	}

	audit := d.URL + "/api/v1/audit"
	hubWant(t, hub(t, http.MethodGet, audit, "", nil), http.StatusUnauthorized, "UNAUTHORIZED")
	hubWant(t, hub(t, http.MethodGet, audit, a.Token, nil), http.StatusForbidden, "FORBIDDEN")
	hubWant(t, hub(t, http.MethodGet, audit+"?outcome=lost", kzAdmin, nil), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	hubWant(t, hub(t, http.MethodGet, audit+"?since=yesterday", kzAdmin, nil), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	hubWant(t, hub(t, http.MethodGet, audit+"?format=csv", kzAdmin, nil), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	hubWant(t, hub(t, http.MethodPost, audit, kzAdmin, nil), http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED")
	r := hub(t, http.MethodGet, audit+"?outcome=acked&limit=2", kzAdmin, nil)
	items, _ := r.Body["items"].([]any)
	if r.Status != http.StatusOK || r.Body["total"] != float64(3) || len(items) != 2 {
		t.Fatalf("audit: %d %s", r.Status, r.Raw)
	}
	r = hub(t, http.MethodGet, audit+"?task_id="+cid, kzAdmin, nil)
	if items, _ := r.Body["items"].([]any); len(items) != 1 || items[0].(map[string]any)["outcome"] != "cancelled" {
		t.Fatalf("audit by task: %s", r.Raw)
	}

	// The export: every line is one JSON object.
	req, _ := http.NewRequest(http.MethodGet, audit+"?format=jsonl", nil)
	req.Header.Set("Authorization", "Bearer "+kzAdmin)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("export: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	outcomes := map[string]int{}
	for sc.Scan() {
		var row struct {
			TaskID   string            `json:"task_id"`
			Outcome  string            `json:"outcome"`
			Attempts []json.RawMessage `json:"attempts"`
			At       string            `json:"at"`
		}
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil || row.TaskID == "" || row.At == "" {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if row.Outcome == "acked" && (!ids[row.TaskID] || len(row.Attempts) != 1) {
			t.Errorf("acked row %q", sc.Text())
		}
		outcomes[row.Outcome]++
	}
	if err := sc.Err(); err != nil || outcomes["acked"] != 3 || outcomes["cancelled"] != 1 || len(outcomes) != 2 {
		t.Fatalf("export outcomes %v: %v", outcomes, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)

	// Still append-only, whatever the admin paths do.
	for _, sql := range []string{`UPDATE kz_audit SET outcome = 'acked'`, `DELETE FROM kz_audit`} {
		if _, err := d.App.DB.Exec(context.Background(), sql); err == nil {
			t.Errorf("%s was allowed", sql)
		}
	}

	stats := d.URL + "/api/v1/stats"
	hubWant(t, hub(t, http.MethodGet, stats, "", nil), http.StatusUnauthorized, "UNAUTHORIZED")
	hubWant(t, hub(t, http.MethodGet, stats, b.Token, nil), http.StatusForbidden, "FORBIDDEN")
	if r := hub(t, http.MethodPost, d.URL+"/api/v1/heartbeat", a.Token, nil); r.Status >= 300 {
		t.Fatalf("heartbeat: %s", r.Raw)
	}
	s := hub(t, http.MethodGet, stats, kzAdmin, nil)
	states, _ := s.Body["states"].(map[string]any)
	outs, _ := s.Body["outcomes"].(map[string]any)
	agents, _ := s.Body["agents"].(map[string]any)
	if s.Status != http.StatusOK || states["acked"] != float64(3) || states["cancelled"] != float64(1) || states["queued"] != float64(0) ||
		outs["acked"] != float64(3) || outs["cancelled"] != float64(1) || outs["delivery_failed"] != float64(0) ||
		agents["total"] != float64(2) || agents["online"] != float64(1) || agents["offline"] != float64(1) {
		t.Fatalf("stats: %d %s", s.Status, s.Raw)
	}
}
