package relay_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// getRaw fetches a public path with no token, from the client address ip
// (the test servers trust loopback as a proxy).
func getRaw(t *testing.T, url, ip string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ip != "" {
		req.Header.Set("X-Forwarded-For", ip)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// The hub's own card is public, a valid A2A Agent Card under both the
// v0.3 and v1.0 shapes, and names the hub's paths from the public URL.
func TestKizunaHubCard(t *testing.T) {
	t.Parallel()
	d := start(t, withAdmin)
	r := hub(t, http.MethodGet, d.URL+"/.well-known/agent-card.json", "", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("hub card: %d %s", r.Status, r.Raw)
	}
	for _, k := range []string{"name", "description", "url", "version", "protocolVersion",
		"capabilities", "defaultInputModes", "defaultOutputModes", "skills", "supportedInterfaces"} {
		if _, ok := r.Body[k]; !ok {
			t.Errorf("hub card lacks %s: %s", k, r.Raw)
		}
	}
	skills, _ := r.Body["skills"].([]any)
	if len(skills) == 0 {
		t.Fatalf("no skills: %s", r.Raw)
	}
	for _, s := range skills {
		m, _ := s.(map[string]any)
		for _, k := range []string{"id", "name", "description", "tags"} {
			if _, ok := m[k]; !ok {
				t.Errorf("skill lacks %s: %v", k, m)
			}
		}
	}
	kz, _ := r.Body["kizuna"].(map[string]any)
	want := map[string]string{
		"enqueue":   d.URL + "/api/v1/tasks",
		"directory": d.URL + "/api/v1/agents",
		"result":    d.URL + "/api/v1/tasks/{task_id}/result",
	}
	for k, v := range want {
		if kz[k] != v {
			t.Errorf("kizuna.%s = %v, want %s", k, kz[k], v)
		}
	}
	if doc, _ := r.Body["documentationUrl"].(string); !strings.HasPrefix(doc, d.URL) {
		t.Errorf("documentationUrl %q", doc)
	} else if resp, _ := getRaw(t, doc, ""); resp.StatusCode != http.StatusOK {
		t.Errorf("documentationUrl %s: %d", doc, resp.StatusCode)
	}
	if r := hub(t, http.MethodPost, d.URL+"/.well-known/agent-card.json", "", nil); r.Status != http.StatusMethodNotAllowed {
		t.Errorf("POST on the card: %d %s", r.Status, r.Raw)
	}
}

// An agent's card is published by PATCH, served as published on both
// paths, refused when nameless or over 64 KB (the stored card is kept),
// withdrawn by null, and gone with the agent.
func TestKizunaAgentCard(t *testing.T) {
	t.Parallel()
	d := start(t, withAdmin)
	a := enroll(t, d, "Carded")
	well := d.URL + "/.well-known/agent-card.json?agent=" + a.ID
	alias := d.URL + "/api/v1/agents/" + a.ID + "/agent-card.json"
	for _, u := range []string{well, alias, d.URL + "/.well-known/agent-card.json?agent=nobody-here",
		d.URL + "/api/v1/agents/nobody-here/agent-card.json", d.URL + "/.well-known/agent-card.json?agent="} {
		hubWant(t, hub(t, http.MethodGet, u, "", nil), http.StatusNotFound, "AGENT_CARD_NOT_FOUND")
	}

	card := `{"name":"Carded","zeta":1,"alpha":{"b":[1,2],"a":"x"}}`
	patch := d.URL + "/api/v1/agents/" + a.ID
	if r := hub(t, http.MethodPatch, patch, kzAdmin, []byte(`{"agent_card":`+card+`}`)); r.Status != http.StatusOK {
		t.Fatalf("publish: %d %s", r.Status, r.Raw)
	}
	for _, u := range []string{well, alias} {
		resp, body := getRaw(t, u, "")
		if resp.StatusCode != http.StatusOK || body != card || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("GET %s: %d %q", u, resp.StatusCode, body)
		}
	}

	big := `{"name":"Big","pad":"` + strings.Repeat("x", 64*1024) + `"}`
	for body, name := range map[string]string{
		`{"agent_card":` + big + `}`:               "agent_card",
		`{"agent_card":{"description":"no name"}}`: "agent_card.name",
		`{"agent_card":{"name":7}}`:                "agent_card.name",
		`{"agent_card":"a string"}`:                "agent_card",
	} {
		r := hub(t, http.MethodPatch, patch, kzAdmin, []byte(body))
		hubWant(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		if !strings.Contains(r.Raw, `"field":"`+name+`"`) {
			t.Errorf("refusal does not name %s: %s", name, r.Raw)
		}
	}
	if _, body := getRaw(t, alias, ""); body != card {
		t.Errorf("a refused PATCH changed the card: %s", body)
	}
	// The cap holds at registration too.
	r := hub(t, http.MethodPost, d.URL+"/api/v1/agents", kzAdmin, map[string]any{
		"name": "Big", "capabilities": "x", "webhook_url": "http://127.0.0.1:9/", "agent_card": map[string]any{"name": "Big", "pad": strings.Repeat("x", 64*1024)}})
	hubWant(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")

	if r := hub(t, http.MethodPatch, patch, kzAdmin, []byte(`{"agent_card":null}`)); r.Status != http.StatusOK {
		t.Fatalf("withdraw: %d %s", r.Status, r.Raw)
	}
	hubWant(t, hub(t, http.MethodGet, well, "", nil), http.StatusNotFound, "AGENT_CARD_NOT_FOUND")

	// Published at registration, then the agent is deleted.
	r = hub(t, http.MethodPost, d.URL+"/api/v1/agents", kzAdmin, map[string]any{
		"agent_id": "card-at-birth", "name": "Born", "capabilities": "x", "webhook_url": "http://127.0.0.1:9/",
		"agent_card": map[string]any{"name": "Born"}})
	if r.Status != http.StatusCreated {
		t.Fatalf("register with card: %d %s", r.Status, r.Raw)
	}
	born := d.URL + "/api/v1/agents/card-at-birth/agent-card.json"
	if r := hub(t, http.MethodGet, born, "", nil); r.Status != http.StatusOK || r.str("name") != "Born" {
		t.Fatalf("card at birth: %d %s", r.Status, r.Raw)
	}
	if r := hub(t, http.MethodDelete, d.URL+"/api/v1/agents/card-at-birth", kzAdmin, nil); r.Status >= 300 {
		t.Fatalf("delete: %d %s", r.Status, r.Raw)
	}
	hubWant(t, hub(t, http.MethodGet, born, "", nil), http.StatusNotFound, "AGENT_CARD_NOT_FOUND")
}

// The hub's paths share the Redis limiter and refuse in the hub's own
// shape with Retry-After; before this, hub paths had no limit at all.
func TestKizunaRateLimited(t *testing.T) {
	t.Parallel()
	d := start(t, withAdmin, withLimits("kz_send=2/1m,kz_card=2/1m,kz_register=1/1h"))
	// The admin token is not counted against kz_register.
	a, b := enroll(t, d, "Limited"), enroll(t, d, "Target")

	send := func() hubReply {
		return hub(t, http.MethodPost, d.URL+"/api/v1/tasks", a.Token,
			map[string]any{"to": b.ID, "content": map[string]any{"title": "t", "body": "b"}})
	}
	for i := 0; i < 2; i++ {
		if r := send(); r.Status != http.StatusAccepted {
			t.Fatalf("send %d: %d %s", i, r.Status, r.Raw)
		}
	}
	r := send()
	hubWant(t, r, http.StatusTooManyRequests, "RATE_LIMITED")
	if e, _ := r.Body["error"].(map[string]any); e["message"] == "" || e["details"] == nil {
		t.Errorf("429 shape: %s", r.Raw)
	}
	if n := letterCount(t, d); n != 2 {
		t.Errorf("a refused send stored a letter: %d letters", n)
	}
	// Another agent has its own window.
	if r := hub(t, http.MethodPost, d.URL+"/api/v1/tasks", b.Token,
		map[string]any{"to": a.ID, "content": map[string]any{"title": "t", "body": "b"}}); r.Status != http.StatusAccepted {
		t.Errorf("other agent's send: %d %s", r.Status, r.Raw)
	}

	card := d.URL + "/.well-known/agent-card.json"
	for i := 0; i < 2; i++ {
		if resp, body := getRaw(t, card, "203.0.113.7"); resp.StatusCode != http.StatusOK {
			t.Fatalf("card %d: %d %s", i, resp.StatusCode, body)
		}
	}
	resp, body := getRaw(t, card, "203.0.113.7")
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || err != nil || secs < 1 || secs > 60 ||
		!strings.Contains(body, `"code":"RATE_LIMITED"`) {
		t.Errorf("third card read: %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if resp, _ := getRaw(t, card, "203.0.113.8"); resp.StatusCode != http.StatusOK {
		t.Errorf("another address was limited: %d", resp.StatusCode)
	}
	// HEAD does a GET's work and pays a GET's limit.
	head := func() int {
		req, _ := http.NewRequest(http.MethodHead, card, nil)
		req.Header.Set("X-Forwarded-For", "203.0.113.9")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if a, b, c := head(), head(), head(); a != http.StatusOK || b != http.StatusOK || c != http.StatusTooManyRequests {
		t.Errorf("HEAD statuses %d %d %d, want 200 200 429", a, b, c)
	}
}
