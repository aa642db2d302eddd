package kizuna_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/dojo-relay/dojo/adapters/kizuna"
)

// Odd bytes in a path id or a query filter reach no SQL: each answer is a
// 4xx in the hub's shape, never a 500, whoever asks.
func TestHubOddBytesAreRefused(t *testing.T) {
	f := newHub(t)
	a := f.agent(t, "odd_sender", nil)
	for _, tc := range []struct {
		method, path, token string
		status              int
	}{
		{http.MethodGet, "/.well-known/agent-card.json?agent=%00", "", http.StatusNotFound},
		{http.MethodGet, "/.well-known/agent-card.json?agent=%FF", "", http.StatusNotFound},
		{http.MethodGet, "/api/v1/agents/%FF/agent-card.json", "", http.StatusNotFound},
		{http.MethodGet, "/api/v1/agents/%00", a.token, http.StatusNotFound},
		{http.MethodGet, "/api/v1/agents/%C3", a.token, http.StatusNotFound},
		{http.MethodGet, "/api/v1/agents?q=%00", a.token, http.StatusUnprocessableEntity},
		{http.MethodGet, "/api/v1/agents?q=%FF", a.token, http.StatusUnprocessableEntity},
		{http.MethodGet, "/api/v1/agents?tag=%00", a.token, http.StatusUnprocessableEntity},
		{http.MethodGet, "/api/v1/agents?q=" + strings.Repeat("a", 201), a.token, http.StatusUnprocessableEntity},
		{http.MethodGet, "/api/v1/agents?tag=" + strings.Repeat("a", 65), a.token, http.StatusUnprocessableEntity},
		{http.MethodGet, "/api/v1/tasks/%00", a.token, http.StatusNotFound},
		{http.MethodGet, "/api/v1/tasks/%FF/result", a.token, http.StatusNotFound},
		{http.MethodPost, "/api/v1/tasks/%FF/result", a.token, http.StatusNotFound},
		{http.MethodGet, "/api/v1/tasks?from=%00", hubAdmin, http.StatusUnprocessableEntity},
		{http.MethodGet, "/api/v1/tasks?to=%FF", hubAdmin, http.StatusUnprocessableEntity},
		{http.MethodGet, "/api/v1/audit?task_id=%FF", hubAdmin, http.StatusUnprocessableEntity},
		{http.MethodGet, "/api/v1/audit?to=%00&format=jsonl", hubAdmin, http.StatusUnprocessableEntity},
		{http.MethodPatch, "/api/v1/agents/%00", hubAdmin, http.StatusNotFound},
		{http.MethodDelete, "/api/v1/agents/%00", hubAdmin, http.StatusNotFound},
		{http.MethodPost, "/api/v1/tasks/%00/cancel", hubAdmin, http.StatusNotFound},
	} {
		var body any
		switch tc.method {
		case http.MethodPost:
			body = map[string]any{"state": "working"}
		case http.MethodPatch:
			body = map[string]any{"name": "x"}
		}
		r := f.do(t, tc.method, tc.path, tc.token, body)
		if r.status != tc.status || r.code() == "" || r.code() == "INTERNAL" {
			t.Errorf("%s %s: got %d %s, want %d", tc.method, tc.path, r.status, r.raw, tc.status)
		}
	}
}

// A result report is bounded: a disabled recipient, a reply letter, an
// oversized result and a history past its cap are each refused and
// change nothing; the history reads in pages.
func TestHubResultBounds(t *testing.T) {
	f := newHub(t)
	a := f.agent(t, "bound_sender", nil)
	b := f.agent(t, "bound_worker", nil)
	send := func() string {
		r := f.do(t, http.MethodPost, "/api/v1/tasks", a.token, map[string]any{"to": "bound_worker", "content": map[string]any{"title": "t", "body": "b"}})
		hubExpect(t, r, http.StatusAccepted, "")
		return r.str("task_id")
	}
	results := func(task string) int {
		var n int
		if err := f.db.QueryRow(context.Background(), `SELECT count(*) FROM kz_results r JOIN kz_letters l ON l.id = r.letter_id WHERE l.task_id = $1`, task).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	task := send()
	f.ack(t, task)
	path := "/api/v1/tasks/" + task + "/result"

	big := map[string]any{"state": "working", "result": strings.Repeat("x", 64<<10)}
	r := f.do(t, http.MethodPost, path, b.token, big)
	hubExpect(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	if got := hubFields(r); len(got) != 1 || got[0] != "result" {
		t.Fatalf("fields %v", got)
	}

	for i := range 99 {
		hubExpect(t, f.do(t, http.MethodPost, path, b.token, map[string]any{"state": "working", "message": fmt.Sprint(i)}), http.StatusAccepted, "")
	}
	hubExpect(t, f.do(t, http.MethodPost, path, b.token, map[string]any{"state": "input-required"}), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	if n := results(task); n != 99 {
		t.Fatalf("%d results after the cap, want 99", n)
	}
	page := f.do(t, http.MethodGet, path+"?limit=10&offset=90", a.token, nil)
	hubExpect(t, page, http.StatusOK, "")
	items, _ := page.body["items"].([]any)
	if page.body["total"] != float64(99) || page.body["limit"] != float64(10) || page.body["offset"] != float64(90) || len(items) != 9 {
		t.Fatalf("page: %s", page.raw)
	}
	// The last place is the end's.
	r = f.do(t, http.MethodPost, path, b.token, map[string]any{"state": "completed"})
	hubExpect(t, r, http.StatusAccepted, "")
	if r.body["relayed"] != true {
		t.Fatalf("completed: %s", r.raw)
	}

	// A reply letter takes no result: two boxes would answer each other.
	var reply string
	if err := f.db.QueryRow(context.Background(), `SELECT task_id FROM kz_letters WHERE reply_to = $1`, task).Scan(&reply); err != nil {
		t.Fatal(err)
	}
	f.ack(t, reply)
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/tasks/"+reply+"/result", a.token, map[string]any{"state": "completed"}),
		http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	if n := results(reply); n != 0 {
		t.Fatalf("reply letter has %d results", n)
	}

	// A disabled recipient reports nothing.
	task2 := send()
	f.ack(t, task2)
	hubExpect(t, f.do(t, http.MethodPatch, "/api/v1/agents/bound_worker", hubAdmin, map[string]any{"enabled": false}), http.StatusOK, "")
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/tasks/"+task2+"/result", b.token, map[string]any{"state": "completed"}),
		http.StatusForbidden, "FORBIDDEN")
	if n := results(task2); n != 0 {
		t.Fatalf("disabled agent's report was kept: %d", n)
	}
}

// The queue bound: a sender with MaxQueued unfinished letters, or a
// recipient with as many waiting, gets 429 RATE_LIMITED with Retry-After,
// and no letter is written.
func TestHubQueueBound(t *testing.T) {
	f := newHub(t, func(h *kizuna.Hub) { h.MaxQueued = 3 })
	a := f.agent(t, "flood_sender", nil)
	c := f.agent(t, "other_sender", nil)
	f.agent(t, "flood_target", nil)
	f.agent(t, "spare_target", nil)
	letter := func(tok, to string) hubReply {
		return f.do(t, http.MethodPost, "/api/v1/tasks", tok, map[string]any{"to": to, "content": map[string]any{"title": "t", "body": "b"}})
	}
	for range 2 {
		hubExpect(t, letter(a.token, "flood_target"), http.StatusAccepted, "")
	}
	hubExpect(t, letter(c.token, "flood_target"), http.StatusAccepted, "")
	// The target has 3 waiting: another sender is refused too.
	r := letter(c.token, "flood_target")
	hubExpect(t, r, http.StatusTooManyRequests, "RATE_LIMITED")
	hubExpect(t, letter(a.token, "spare_target"), http.StatusAccepted, "")
	// The sender has 3 unfinished: refused whoever the target.
	hubExpect(t, letter(a.token, "spare_target"), http.StatusTooManyRequests, "RATE_LIMITED")
	var n int
	if err := f.db.QueryRow(context.Background(), `SELECT count(*) FROM kz_letters`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 4 {
		t.Fatalf("%d letters, want 4", n)
	}
	// A finished letter frees its place.
	var task string
	if err := f.db.QueryRow(context.Background(), `SELECT task_id FROM kz_letters ORDER BY id LIMIT 1`).Scan(&task); err != nil {
		t.Fatal(err)
	}
	f.ack(t, task)
	hubExpect(t, letter(a.token, "spare_target"), http.StatusAccepted, "")
}

// The audit cannot be emptied: UPDATE, DELETE and TRUNCATE are refused by
// PostgreSQL itself, TRUNCATE cascading from the letters too.
func TestHubAuditRefusesTruncate(t *testing.T) {
	f := newHub(t)
	ctx := context.Background()
	for _, q := range []string{`TRUNCATE kz_audit`, `TRUNCATE kz_letters CASCADE`, `TRUNCATE ledger`} {
		if _, err := f.db.Exec(ctx, q); err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s: %v", q, err)
		}
	}
}

func TestDeliverURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://box.example:7788":        "http://box.example:7788/kizuna/deliver",
		"http://box.example:7788/":       "http://box.example:7788/kizuna/deliver",
		"https://h.example/base/":        "https://h.example/base/kizuna/deliver",
		"https://h.example/hook?k=1":     "https://h.example/hook/kizuna/deliver?k=1",
		"https://h.example/hook?k=1#top": "https://h.example/hook/kizuna/deliver?k=1",
	} {
		if got := kizuna.DeliverURL(in); got != want {
			t.Errorf("DeliverURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// A card's name must be a non-empty string (null decoded as ""), and a
// PATCH cannot blank an agent's name.
func TestHubNamesAreText(t *testing.T) {
	f := newHub(t)
	f.agent(t, "named_agent", nil)
	for _, card := range []string{`{"name":null}`, `{"name":""}`, `{"name":7}`, `{}`} {
		r := f.do(t, http.MethodPatch, "/api/v1/agents/named_agent", hubAdmin, `{"agent_card":`+card+`}`)
		hubExpect(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		if got := hubFields(r); len(got) != 1 || got[0] != "agent_card.name" {
			t.Errorf("card %s: fields %v", card, got)
		}
	}
	r := f.do(t, http.MethodPatch, "/api/v1/agents/named_agent", hubAdmin, map[string]any{"name": "  "})
	hubExpect(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	if v := f.do(t, http.MethodGet, "/api/v1/agents/named_agent", hubAdmin, nil); v.str("name") != "Agent named_agent" {
		t.Errorf("name after refused PATCH: %s", v.raw)
	}
}
