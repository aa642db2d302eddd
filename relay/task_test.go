package relay_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/dojo-relay/dojo/kungfu/task"
)

// judge is a loopback receiver that answers with a fixed status and body
// and remembers every request.
type judge struct {
	srv    *httptest.Server
	mu     sync.Mutex
	seen   []*http.Request
	bodies [][]byte
	status int
	reply  string
}

func newJudge(t testing.TB, status int, reply string) *judge {
	j := &judge{status: status, reply: reply}
	j.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		j.mu.Lock()
		j.seen, j.bodies = append(j.seen, r), append(j.bodies, b)
		status, reply := j.status, j.reply
		j.mu.Unlock()
		w.WriteHeader(status)
		_, _ = io.WriteString(w, reply)
	}))
	t.Cleanup(j.srv.Close)
	return j
}

func (j *judge) count() int { j.mu.Lock(); defer j.mu.Unlock(); return len(j.seen) }

// checkMoney runs the task invariants (dojo check) on d's database.
func checkMoney(t testing.TB, d *dojo) {
	t.Helper()
	problems, err := task.Check(context.Background(), d.App.DB)
	if err != nil || len(problems) > 0 {
		t.Fatalf("task.Check: %v %v", problems, err)
	}
}

func newTask(t testing.TB, d *dojo, key, url string, price, budget int64, extra map[string]any) string {
	t.Helper()
	contract := map[string]any{"title": "Summarize", "requirements": "Summarize the page in three bullets.",
		"receiver": map[string]any{"url": url}, "price": price}
	for k, v := range extra {
		contract[k] = v
	}
	r := d.must(t, key, "task_create", map[string]any{"contract": contract, "budget": budget, "open": true})
	return r.str("code")
}

func TestTaskSmoke(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	j := newJudge(t, 200, `{"accepted":true}`)
	code := newTask(t, d, pub, j.srv.URL+"/judge", 5, 20, nil)
	if st := d.must(t, pub, "account_status", map[string]any{}); st.num("balance") != 46 {
		t.Fatalf("publisher balance %s", st.Raw)
	}
	l := d.must(t, exe, "work_list", map[string]any{})
	if l.num("total") != 1 {
		t.Fatalf("work_list: %s", l.Raw)
	}
	c := d.must(t, exe, "work_claim", map[string]any{"code": code})
	if c.Body["next_action"] != "submit" || c.str("claim_id") == "" {
		t.Fatalf("claim: %s", c.Raw)
	}
	items, _, _ := d.turn(t, exe)
	if len(items) != 1 {
		t.Fatalf("claim not in the turn: %v", items)
	}
	sub := d.must(t, exe, "work_submit", map[string]any{"code": code, "request_key": "k1", "payload": map[string]any{"bullets": []string{"a"}}, "claim_id": c.str("claim_id")})
	if sub.str("state") != "settled" || sub.num("paid") != 5 || sub.Body["next_action"] != "done" {
		t.Fatalf("submit: %s", sub.Raw)
	}
	var body map[string]any
	_ = json.Unmarshal(j.bodies[0], &body)
	if len(body) != 4 || body["submission_id"] != sub.str("submission_id") || body["task_code"] != code || len(body["agent_ref"].(string)) != 16 {
		t.Fatalf("receiver body %s", j.bodies[0])
	}
	h := j.seen[0].Header
	if h.Get("Idempotency-Key") != sub.str("submission_id") || h.Get("Kungfu-Task") != code || h.Get("webhook-signature") == "" {
		t.Fatalf("receiver headers %v", h)
	}
	if st := d.must(t, exe, "account_status", map[string]any{}); st.num("balance") != 71 {
		t.Fatalf("executor balance %s", st.Raw)
	}
	g := d.must(t, pub, "task_get", map[string]any{"code": code})
	if g.num("settled") != 5 || g.num("reserved") != 0 || g.num("available") != 15 {
		t.Fatalf("task_get: %s", g.Raw)
	}
	checkMoney(t, d)
}
