package relay_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// fieldsOf lists the fields a VALIDATION_FAILED names.
func fieldsOf(r result) []string {
	e, _ := r.Body["error"].(map[string]any)
	dm, _ := e["details"].(map[string]any)
	errs, _ := dm["errors"].([]any)
	var out []string
	for _, x := range errs {
		if m, ok := x.(map[string]any); ok {
			f, _ := m["field"].(string)
			out = append(out, f)
		}
	}
	return out
}

func expectInvalid(t testing.TB, r result, field string) {
	t.Helper()
	expect(t, r, 422, "VALIDATION_FAILED")
	if !slices.Contains(fieldsOf(r), field) {
		t.Fatalf("VALIDATION_FAILED does not name %s: %s", field, r.Raw)
	}
}

func baseContract(url string, extra ...any) map[string]any {
	c := map[string]any{"title": "Summarize", "requirements": "Summarize the page in three bullets.",
		"receiver": map[string]any{"url": url}, "price": 2}
	for i := 0; i+1 < len(extra); i += 2 {
		c[extra[i].(string)] = extra[i+1]
	}
	return c
}

func nextAction(r result) any { return r.Body["next_action"] }

// Every executor refusal with its HTTP status, next_action and details, in
// the protocol's order of checks; refusals create, reserve and send nothing.
func TestTaskExecutorErrors(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	exe2, _ := d.register(t)
	rcv := newScripted(t, always(says(200, "ok")))
	schema := map[string]any{"type": "object", "required": []string{"url"},
		"properties": map[string]any{"url": map[string]any{"type": "string"}, "notes": map[string]any{"type": "object"}}}
	code := newTask(t, d, pub, rcv.url(), 3, 30, map[string]any{"output": map[string]any{"schema": schema}})
	good := map[string]any{"url": "https://example.org/a"}
	missing := "0123456789ab"

	// TASK_NOT_FOUND (404, stop).
	for _, c := range []string{missing, "not-a-code"} {
		r := d.call(t, exe, "work_get", map[string]any{"code": c})
		expect(t, r, 404, "TASK_NOT_FOUND")
		if nextAction(r) != "stop" {
			t.Fatalf("TASK_NOT_FOUND next_action: %s", r.Raw)
		}
		expect(t, d.call(t, exe, "work_claim", map[string]any{"code": c}), 404, "TASK_NOT_FOUND")
		expect(t, submit(t, d, exe, c, "k", good), 404, "TASK_NOT_FOUND")
	}
	// INVALID_REQUEST_KEY (422, revise) comes first, even for a missing task.
	for _, k := range []string{"", "has space", "a/b", "ünï", strings.Repeat("a", 129)} {
		r := submit(t, d, exe, missing, k, good)
		expect(t, r, 422, "INVALID_REQUEST_KEY")
		if nextAction(r) != "revise" {
			t.Fatalf("INVALID_REQUEST_KEY next_action: %s", r.Raw)
		}
	}
	// PAYLOAD_TOO_LARGE (413) before the task is looked at.
	big := map[string]any{"url": "x", "blob": strings.Repeat("a", 512*1024)}
	expect(t, submit(t, d, exe, missing, "big", big), 413, "PAYLOAD_TOO_LARGE")
	if r := submit(t, d, exe, code, "big", big); r.Status != 413 || r.code() != "PAYLOAD_TOO_LARGE" || nextAction(r) != "revise" {
		t.Fatalf("payload too large: %d %.300s", r.Status, r.Raw)
	}
	// OWN_TASK (403, stop), before any claim is parsed.
	expect(t, d.call(t, pub, "work_claim", map[string]any{"code": code}), 403, "OWN_TASK")
	r := submit(t, d, pub, code, "own", good, "claim_id", "garbage")
	expect(t, r, 403, "OWN_TASK")
	if nextAction(r) != "stop" {
		t.Fatalf("OWN_TASK next_action: %s", r.Raw)
	}
	// SCHEMA_MISMATCH with pointers; CREDENTIAL_IN_PAYLOAD with the pointer.
	r = submit(t, d, exe, code, "s-1", map[string]any{"url": 5})
	expect(t, r, 422, "SCHEMA_MISMATCH")
	errs, _ := details(r, "errors").([]any)
	if len(errs) == 0 || errs[0].(map[string]any)["pointer"] != "/url" || nextAction(r) != "revise" {
		t.Fatalf("SCHEMA_MISMATCH details: %s", r.Raw)
	}
	r = submit(t, d, exe, code, "c-1", map[string]any{"url": "x", "notes": map[string]any{"aws": "key " + awsKey}})
	expect(t, r, 422, "CREDENTIAL_IN_PAYLOAD")
	if details(r, "pointer") != "/notes/aws" || nextAction(r) != "revise" {
		t.Fatalf("CREDENTIAL_IN_PAYLOAD details: %s", r.Raw)
	}
	if rcv.count() != 0 || taskView(t, d, pub, code).num("reserved") != 0 || d.must(t, exe, "work_history", map[string]any{}).num("total") != 0 {
		t.Fatal("a refused submission left a trace")
	}

	// Idempotency: same key and payload (any key order) = same submission,
	// no second POST; a different payload conflicts.
	s1 := submit(t, d, exe, code, "idem-1", map[string]any{"url": "a", "notes": map[string]any{"b": 1, "a": 2}})
	if s1.str("state") != "settled" {
		t.Fatalf("submit: %s", s1.Raw)
	}
	raw := fmt.Sprintf(`{"code":%q, "request_key":"idem-1", "payload":{"notes":{"a":2, "b":1}, "url":"a"}}`, code)
	again := post(t, d.URL+"/api/v1/work_submit", exe, []byte(raw))
	if !again.ok() || again.str("submission_id") != s1.str("submission_id") || again.str("state") != "settled" || rcv.count() != 1 {
		t.Fatalf("replay: %s (receiver saw %d)", again.Raw, rcv.count())
	}
	r = submit(t, d, exe, code, "idem-1", map[string]any{"url": "b"})
	expect(t, r, 409, "IDEMPOTENCY_CONFLICT")
	if nextAction(r) != "revise" || rcv.count() != 1 {
		t.Fatalf("conflict: %s", r.Raw)
	}
	// The key is scoped to the executor.
	if o := submit(t, d, exe2, code, "idem-1", map[string]any{"url": "b"}); o.str("state") != "settled" || o.str("submission_id") == s1.str("submission_id") {
		t.Fatalf("another executor's key: %s", o.Raw)
	}

	// INVALID_REVISES (422): a settled one, a missing one, someone else's rejection.
	expect(t, submit(t, d, exe, code, "rv-1", good, "revises", s1.str("submission_id")), 422, "INVALID_REVISES")
	expect(t, submit(t, d, exe, code, "rv-2", good, "revises", "999999"), 422, "INVALID_REVISES")
	expect(t, submit(t, d, exe, code, "rv-3", good, "revises", "abc"), 422, "INVALID_REVISES")
	rcv.setPlan(always(says(422, "no")))
	rej := submit(t, d, exe2, code, "rej", good)
	rcv.setPlan(always(says(200, "ok")))
	if rej.str("state") != "rejected" {
		t.Fatalf("reject: %s", rej.Raw)
	}
	r = submit(t, d, exe, code, "rv-4", good, "revises", rej.str("submission_id"))
	expect(t, r, 422, "INVALID_REVISES")
	if nextAction(r) != "revise" {
		t.Fatalf("INVALID_REVISES next_action: %s", r.Raw)
	}
	// SUBMISSION_NOT_FOUND (404): someone else's, or none.
	expect(t, d.call(t, exe, "work_status", map[string]any{"submission_id": rej.str("submission_id")}), 404, "SUBMISSION_NOT_FOUND")
	expect(t, d.call(t, exe, "work_status", map[string]any{"submission_id": 999999}), 404, "SUBMISSION_NOT_FOUND")
	// HARNESS_REF_NOT_FOUND (404).
	expect(t, d.call(t, exe, "work_harness", map[string]any{"code": code, "ref_id": "abcdefabcdef"}), 404, "HARNESS_REF_NOT_FOUND")

	// A claim-required task with one unit.
	code2 := newTask(t, d, pub, rcv.url(), 5, 5, map[string]any{"claim": map[string]any{"required": true}})
	c := d.must(t, exe, "work_claim", map[string]any{"code": code2})
	if again := d.must(t, exe, "work_claim", map[string]any{"code": code2}); again.str("claim_id") != c.str("claim_id") {
		t.Fatalf("claim is not idempotent: %s vs %s", again.Raw, c.Raw)
	}
	r = d.call(t, exe2, "work_claim", map[string]any{"code": code2})
	expect(t, r, 409, "SLOTS_EXHAUSTED")
	if nextAction(r) != "stop" {
		t.Fatalf("SLOTS_EXHAUSTED next_action: %s", r.Raw)
	}
	expect(t, submit(t, d, exe2, code2, "x", good), 409, "SLOTS_EXHAUSTED")
	d.must(t, pub, "task_fund", map[string]any{"code": code2, "amount": 10})
	r = submit(t, d, exe2, code2, "x", good)
	expect(t, r, 409, "CLAIM_REQUIRED")
	if nextAction(r) != "retry" {
		t.Fatalf("CLAIM_REQUIRED next_action: %s", r.Raw)
	}
	if r.Body["retry_after"] != float64(0) {
		t.Errorf("CLAIM_REQUIRED retry_after is %v, the protocol says 0", r.Body["retry_after"])
	}
	// CLAIM_INVALID (409, retry): someone else's, garbage, another task's, released, expired.
	for _, args := range []map[string]any{
		{"code": code2, "request_key": "ci-1", "payload": good, "claim_id": c.str("claim_id")},
		{"code": code2, "request_key": "ci-2", "payload": good, "claim_id": "xyz"},
	} {
		r := d.call(t, exe2, "work_submit", args)
		expect(t, r, 409, "CLAIM_INVALID")
		if nextAction(r) != "retry" {
			t.Fatalf("CLAIM_INVALID next_action: %s", r.Raw)
		}
		if r.Body["retry_after"] != float64(0) {
			t.Errorf("CLAIM_INVALID retry_after is %v, the protocol says 0", r.Body["retry_after"])
		}
	}
	expect(t, d.call(t, exe2, "work_release", map[string]any{"claim_id": c.str("claim_id")}), 409, "CLAIM_INVALID")
	expect(t, d.call(t, exe2, "work_claim_renew", map[string]any{"claim_id": c.str("claim_id")}), 409, "CLAIM_INVALID")
	c1 := d.must(t, exe2, "work_claim", map[string]any{"code": code})
	expect(t, submit(t, d, exe2, code2, "ci-3", good, "claim_id", c1.str("claim_id")), 409, "CLAIM_INVALID")
	c2 := d.must(t, exe2, "work_claim", map[string]any{"code": code2})
	if rel := d.must(t, exe2, "work_release", map[string]any{"claim_id": c2.str("claim_id")}); rel.str("status") != "released" {
		t.Fatalf("release: %s", rel.Raw)
	}
	expect(t, submit(t, d, exe2, code2, "ci-4", good, "claim_id", c2.str("claim_id")), 409, "CLAIM_INVALID")
	expect(t, d.call(t, exe2, "work_release", map[string]any{"claim_id": c2.str("claim_id")}), 409, "CLAIM_INVALID")
	if _, err := d.App.DB.Exec(t.Context(), `UPDATE claims SET expires_at = now() WHERE id = $1`, c.str("claim_id")); err != nil {
		t.Fatal(err)
	}
	expect(t, submit(t, d, exe, code2, "ci-5", good, "claim_id", c.str("claim_id")), 409, "CLAIM_INVALID")
	expect(t, d.call(t, exe, "work_claim_renew", map[string]any{"claim_id": c.str("claim_id")}), 409, "CLAIM_INVALID")
	// The expiry sweep releases the expired claim's reservation.
	waitFor(t, 5*time.Second, func() bool { return taskView(t, d, pub, code2).num("reserved") == 0 })
	if rcv.count() != 3 {
		t.Fatalf("receiver saw %d posts, want 3", rcv.count())
	}
	checkMoney(t, d)
}

// SUBMISSION_LIMIT: the rejection that uses up the limit says wait; the next
// submission and claim are refused with the window's details.
func TestTaskSubmissionLimit(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	exe2, _ := d.register(t)
	rcv := newScripted(t, always(says(429, `{"message":"daily quota exhausted"}`)))
	code := newTask(t, d, pub, rcv.url(), 2, 20, map[string]any{"limits": map[string]any{"max_rejected_per_agent": 2}})
	r1 := submit(t, d, exe, code, "l-1", bullets)
	if r1.str("state") != "rejected" || nextAction(r1) != "revise" {
		t.Fatalf("first rejection: %s", r1.Raw)
	}
	r2 := submit(t, d, exe, code, "l-2", bullets, "revises", r1.str("submission_id"))
	if r2.str("state") != "rejected" || nextAction(r2) != "wait" || r2.num("retry_after") < 86000 {
		t.Fatalf("the rejection that reaches the limit: %s", r2.Raw)
	}
	if st := d.must(t, exe, "work_status", map[string]any{"submission_id": r2.str("submission_id")}); nextAction(st) != "wait" {
		t.Fatalf("work_status: %s", st.Raw)
	}
	before := time.Now()
	for _, r := range []result{
		submit(t, d, exe, code, "l-3", bullets, "revises", r2.str("submission_id")),
		d.call(t, exe, "work_claim", map[string]any{"code": code}),
	} {
		expect(t, r, 409, "SUBMISSION_LIMIT")
		if details(r, "rejected_24h") != float64(2) || details(r, "max") != float64(2) || details(r, "window_hours") != float64(24) ||
			nextAction(r) != "wait" || r.num("retry_after") < 86000 || r.num("retry_after") > 86400 {
			t.Fatalf("SUBMISSION_LIMIT: %s", r.Raw)
		}
		at, err := time.Parse(time.RFC3339, fmt.Sprint(details(r, "retry_after_at")))
		if err != nil || at.Before(before.Add(23*time.Hour)) || at.After(before.Add(24*time.Hour+time.Minute)) {
			t.Fatalf("retry_after_at %v (%v): %s", details(r, "retry_after_at"), err, r.Raw)
		}
	}
	if w := d.must(t, exe, "work_get", map[string]any{"code": code}); w.Body["my"].(map[string]any)["rejections_left"] != float64(0) {
		t.Fatalf("rejections_left: %s", w.Raw)
	}
	if rcv.count() != 2 {
		t.Fatalf("receiver saw %d", rcv.count())
	}
	// Other executors are unaffected; an aged rejection stops counting.
	if o := submit(t, d, exe2, code, "o-1", bullets); o.str("state") != "rejected" || nextAction(o) != "revise" {
		t.Fatalf("other executor: %s", o.Raw)
	}
	if _, err := d.App.DB.Exec(t.Context(), `UPDATE submissions SET terminal_at = terminal_at - interval '25 hours' WHERE id = $1`, r1.str("submission_id")); err != nil {
		t.Fatal(err)
	}
	if r := submit(t, d, exe, code, "l-4", bullets); r.str("state") != "rejected" {
		t.Fatalf("after the oldest rejection aged out: %s", r.Raw)
	}
	checkMoney(t, d)
}

// Restricted audience: outsiders get a TASK_NOT_FOUND identical to a
// missing task's; named agents see it offered; publishers' tools say
// NOT_OWNER to non-publishers; the audience is fixed.
func TestTaskRestrictedAudience(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, pubName := d.register(t)
	a, aName := d.register(t)
	b, bName := d.register(t)
	out, _ := d.register(t)
	rcv := newScripted(t, always(says(200, "ok")))
	restricted := func(names ...string) map[string]any {
		return map[string]any{"type": "restricted", "agents": names}
	}
	create := func(aud map[string]any, open bool) result {
		return d.call(t, pub, "task_create", map[string]any{"contract": baseContract(rcv.url(), "audience", aud), "budget": 10, "open": open})
	}
	expectInvalid(t, create(restricted(aName, "no_such_agent_zz"), true), "contract.audience.agents.1")
	expectInvalid(t, create(restricted(aName, strings.ToUpper(aName)), true), "contract.audience.agents.1")
	expectInvalid(t, create(restricted(pubName), true), "contract.audience.agents.0")
	expectInvalid(t, create(restricted(), true), "contract.audience.agents")
	expectInvalid(t, create(map[string]any{"type": "secret"}, true), "contract.audience.type")

	cr := create(restricted(aName, bName), true)
	if !cr.ok() {
		t.Fatalf("create: %s", cr.Raw)
	}
	code := cr.str("code")
	openCode := newTask(t, d, pub, rcv.url(), 2, 10, nil)
	missing := "fedcba987654"
	if code == missing {
		missing = "fedcba987655" // the random code happened to be ours
	}
	contract := baseContract(rcv.url())
	calls := []struct {
		tool string
		args func(string) map[string]any
	}{
		{"work_get", func(c string) map[string]any { return map[string]any{"code": c} }},
		{"work_claim", func(c string) map[string]any { return map[string]any{"code": c} }},
		{"work_harness", func(c string) map[string]any { return map[string]any{"code": c, "ref_id": "abcdefabcdef"} }},
		{"work_submit", func(c string) map[string]any {
			return map[string]any{"code": c, "request_key": "probe", "payload": map[string]any{}}
		}},
		{"work_report", func(c string) map[string]any { return map[string]any{"code": c, "reason": "probe"} }},
		{"task_get", func(c string) map[string]any { return map[string]any{"code": c} }},
		{"task_submissions", func(c string) map[string]any { return map[string]any{"code": c} }},
		{"task_update", func(c string) map[string]any { return map[string]any{"code": c, "contract": contract} }},
		{"task_open", func(c string) map[string]any { return map[string]any{"code": c} }},
		{"task_pause", func(c string) map[string]any { return map[string]any{"code": c} }},
		{"task_close", func(c string) map[string]any { return map[string]any{"code": c} }},
		{"task_fund", func(c string) map[string]any { return map[string]any{"code": c, "amount": 1} }},
		{"task_refund", func(c string) map[string]any { return map[string]any{"code": c} }},
	}
	for _, c := range calls {
		got := d.call(t, out, c.tool, c.args(code))
		want := d.call(t, out, c.tool, c.args(missing))
		expect(t, got, 404, "TASK_NOT_FOUND")
		expect(t, want, 404, "TASK_NOT_FOUND")
		if strings.ReplaceAll(got.Raw, code, missing) != want.Raw {
			t.Errorf("%s: outsider's refusal differs from a missing task's:\n%s\n%s", c.tool, got.Raw, want.Raw)
		}
	}
	if l := d.must(t, out, "work_list", map[string]any{"code": code}); l.num("total") != 0 {
		t.Fatalf("outsider's work_list shows the task: %s", l.Raw)
	}
	if l := d.must(t, out, "work_list", map[string]any{}); l.num("total") != 1 {
		t.Fatalf("outsider's board: %s", l.Raw)
	}
	// In-audience non-publishers: NOT_OWNER on publisher tools.
	for _, c := range calls[5:] {
		expect(t, d.call(t, a, c.tool, c.args(code)), 403, "NOT_OWNER")
	}
	expect(t, d.call(t, a, "task_get", map[string]any{"code": openCode}), 403, "NOT_OWNER")

	// Opportunities and offered_to_me.
	if _, opp, _ := d.turn(t, a); opp["tasks"] != float64(1) {
		t.Fatalf("a's opportunities: %v", opp)
	}
	if _, opp, _ := d.turn(t, out); opp["tasks"] != float64(0) {
		t.Fatalf("outsider's opportunities: %v", opp)
	}
	l := d.must(t, a, "work_list", map[string]any{"offered_to_me": true})
	tasks := l.Body["tasks"].([]any)
	if l.num("total") != 1 || len(tasks) != 1 || tasks[0].(map[string]any)["code"] != code || tasks[0].(map[string]any)["audience"] != "restricted" {
		t.Fatalf("offered_to_me: %s", l.Raw)
	}
	if l := d.must(t, a, "work_list", map[string]any{}); l.num("total") != 2 {
		t.Fatalf("a's board: %s", l.Raw)
	}
	if w := d.must(t, a, "work_get", map[string]any{"code": code}); strings.Contains(w.Raw, bName) || strings.Contains(w.Raw, rcv.srv.URL) {
		t.Fatalf("work_get discloses the audience or the receiver: %s", w.Raw)
	}
	d.must(t, a, "work_claim", map[string]any{"code": code})
	if _, opp, _ := d.turn(t, a); opp["tasks"] != float64(0) {
		t.Fatalf("a claimed, yet opportunities: %v", opp)
	}
	if l := d.must(t, a, "work_list", map[string]any{"offered_to_me": true}); l.num("total") != 0 {
		t.Fatalf("offered_to_me after claiming: %s", l.Raw)
	}
	if s := submit(t, d, b, code, "in", bullets); s.str("state") != "settled" {
		t.Fatalf("b submits: %s", s.Raw)
	}

	// The audience is fixed: the same set in another order passes, any other fails.
	paused := create(restricted(aName, bName), false).str("code")
	same := baseContract(rcv.url(), "audience", restricted(strings.ToUpper(bName), aName))
	if u := d.call(t, pub, "task_update", map[string]any{"code": paused, "contract": same}); !u.ok() || u.num("contract_version") != 2 {
		t.Fatalf("same audience in another order: %s", u.Raw)
	}
	expectInvalid(t, d.call(t, pub, "task_update", map[string]any{"code": paused, "contract": baseContract(rcv.url(), "audience", restricted(aName))}), "contract.audience")
	expectInvalid(t, d.call(t, pub, "task_update", map[string]any{"code": paused, "contract": baseContract(rcv.url())}), "contract.audience")
	checkMoney(t, d)
}

// Contract validation: every rule is a VALIDATION_FAILED naming its field,
// and nothing is created or locked.
func TestTaskContractValidation(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	other, _ := d.register(t)
	url := "https://receiver.example.com/judge"
	theirs := d.must(t, other, "memory_put", putArgs()).str("code")
	gone := d.must(t, pub, "memory_put", putArgs()).str("code")
	d.must(t, pub, "memory_delete", map[string]any{"code": gone})
	mine := d.must(t, pub, "memory_put", putArgs()).str("code")
	refs := make([]string, 11)
	for i := range refs {
		refs[i] = mine
	}
	bigSchema := map[string]any{"type": "object", "description": strings.Repeat("x", 33*1024)}
	cases := []struct {
		name     string
		contract map[string]any
		budget   int64
		field    string
	}{
		{"unknown field", baseContract(url, "bogus", 1), 10, "contract.bogus"},
		{"unknown nested field", baseContract(url, "claim", map[string]any{"ttl": 600, "color": "red"}), 10, "contract.claim.color"},
		{"empty title", baseContract(url, "title", "  "), 10, "contract.title"},
		{"long title", baseContract(url, "title", strings.Repeat("é", 129)), 10, "contract.title"},
		{"empty requirements", baseContract(url, "requirements", ""), 10, "contract.requirements"},
		{"long requirements", baseContract(url, "requirements", strings.Repeat("r", 20001)), 10, "contract.requirements"},
		{"price zero", baseContract(url, "price", 0), 10, "contract.price"},
		{"price too big", baseContract(url, "price", int64(1)<<53), 10, "contract.price"},
		{"max rejected 51", baseContract(url, "limits", map[string]any{"max_rejected_per_agent": 51}), 10, "contract.limits.max_rejected_per_agent"},
		{"ttl 299", baseContract(url, "claim", map[string]any{"ttl": 299}), 10, "contract.claim.ttl"},
		{"ttl 7201", baseContract(url, "claim", map[string]any{"ttl": 7201, "max_duration": 86400}), 10, "contract.claim.ttl"},
		{"max_duration 599", baseContract(url, "claim", map[string]any{"ttl": 300, "max_duration": 599}), 10, "contract.claim.max_duration"},
		{"max_duration 86401", baseContract(url, "claim", map[string]any{"max_duration": 86401}), 10, "contract.claim.max_duration"},
		{"max_duration below ttl", baseContract(url, "claim", map[string]any{"ttl": 3600, "max_duration": 1800}), 10, "contract.claim.max_duration"},
		{"schema not an object", baseContract(url, "output", map[string]any{"schema": []any{1}}), 10, "contract.output.schema"},
		{"schema a string", baseContract(url, "output", map[string]any{"schema": "object"}), 10, "contract.output.schema"},
		{"schema over 32 KB", baseContract(url, "output", map[string]any{"schema": bigSchema}), 10, "contract.output.schema"},
		{"schema external ref", baseContract(url, "output", map[string]any{"schema": map[string]any{"$ref": "https://schemas.example.com/x.json"}}), 10, "contract.output.schema"},
		{"harness of someone else", baseContract(url, "harness_refs", []string{theirs}), 10, "contract.harness_refs.0"},
		{"withdrawn harness", baseContract(url, "harness_refs", []string{gone}), 10, "contract.harness_refs.0"},
		{"unknown harness", baseContract(url, "harness_refs", []string{"abcdefabcdef"}), 10, "contract.harness_refs.0"},
		{"eleven harness refs", baseContract(url, "harness_refs", refs), 10, "contract.harness_refs"},
		{"http to a public host", baseContract("http://receiver.example.com/judge"), 10, "contract.receiver.url"},
		{"http to a private address", baseContract("http://10.1.2.3/judge"), 10, "contract.receiver.url"},
		{"not http", baseContract("ftp://receiver.example.com/judge"), 10, "contract.receiver.url"},
		{"no host", baseContract("https:///judge"), 10, "contract.receiver.url"},
		{"credential in requirements", baseContract(url, "requirements", "Use the key "+awsKey+" to fetch the page."), 10, "contract.requirements"},
		{"credential in title", baseContract(url, "title", "sk-ant-"+strings.Repeat("a", 30)), 10, "contract.title"},
		{"budget below price", baseContract(url, "price", 5), 4, "budget"},
	}
	for _, c := range cases {
		r := d.call(t, pub, "task_create", map[string]any{"contract": c.contract, "budget": c.budget, "open": true})
		if r.Status != 422 || r.code() != "VALIDATION_FAILED" || !slices.Contains(fieldsOf(r), c.field) {
			t.Errorf("%s: want 422 VALIDATION_FAILED naming %s, got %d %.400s", c.name, c.field, r.Status, r.Raw)
		}
	}
	// The contract arrives whole (no receiver) → MISSING_FIELD is fine too;
	// but nothing may have been created or locked.
	if bal := balanceOf(t, d, pub); bal != 66 {
		t.Fatalf("publisher balance %d after refusals", bal)
	}
	if l := d.must(t, pub, "task_list", map[string]any{}); l.num("total") != 0 {
		t.Fatalf("refused contracts created tasks: %s", l.Raw)
	}
	// Exactly at the limits is fine.
	ok := baseContract(url, "title", strings.Repeat("é", 128), "harness_refs", []string{mine},
		"claim", map[string]any{"ttl": 7200, "max_duration": 7200}, "limits", map[string]any{"max_rejected_per_agent": 50})
	if r := d.call(t, pub, "task_create", map[string]any{"contract": ok, "budget": 2}); !r.ok() || r.str("status") != "paused" {
		t.Fatalf("valid contract: %s", r.Raw)
	}
}

// Publisher states and money refusals: INSUFFICIENT_CREDITS, INVALID_STATE,
// HAS_RESERVATIONS, NOTHING_TO_REFUND; a refund returns available.
func TestTaskPublisherStates(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	rcv := newScripted(t, always(says(200, "ok")))
	r := d.call(t, pub, "task_create", map[string]any{"contract": baseContract(rcv.url(), "price", 1), "budget": 67, "open": true})
	expect(t, r, 402, "INSUFFICIENT_CREDITS")
	code := newTask(t, d, pub, rcv.url(), 5, 50, nil)
	expect(t, d.call(t, pub, "task_fund", map[string]any{"code": code, "amount": 17}), 402, "INSUFFICIENT_CREDITS")
	if f := d.must(t, pub, "task_fund", map[string]any{"code": code, "amount": 6}); f.num("budget_locked") != 56 || f.num("available") != 56 {
		t.Fatalf("fund: %s", f.Raw)
	}
	if bal := balanceOf(t, d, pub); bal != 10 {
		t.Fatalf("publisher balance %d", bal)
	}
	r = d.call(t, pub, "task_update", map[string]any{"code": code, "contract": baseContract(rcv.url())})
	expect(t, r, 409, "INVALID_STATE")
	if details(r, "status") != "open" {
		t.Fatalf("INVALID_STATE details: %s", r.Raw)
	}
	r = d.call(t, pub, "task_refund", map[string]any{"code": code})
	expect(t, r, 409, "INVALID_STATE")
	if details(r, "status") != "open" {
		t.Fatalf("refund before close: %s", r.Raw)
	}

	// A paused task: TASK_NOT_OPEN until opened.
	paused := d.must(t, pub, "task_create", map[string]any{"contract": baseContract(rcv.url(), "price", 1), "budget": 1}).str("code")
	r = d.call(t, exe, "work_claim", map[string]any{"code": paused})
	expect(t, r, 409, "TASK_NOT_OPEN")
	if details(r, "status") != "paused" || nextAction(r) != "stop" {
		t.Fatalf("TASK_NOT_OPEN: %s", r.Raw)
	}
	if o := d.call(t, pub, "task_open", map[string]any{"code": paused}); !o.ok() || o.str("status") != "open" {
		t.Fatalf("task_open: %s", o.Raw)
	}
	if c := d.call(t, exe, "work_claim", map[string]any{"code": paused}); !c.ok() {
		t.Fatalf("claim after open: %s", c.Raw)
	}

	c := d.must(t, exe, "work_claim", map[string]any{"code": code})
	if cl := d.call(t, pub, "task_close", map[string]any{"code": code}); !cl.ok() || cl.str("status") != "closed" {
		t.Fatalf("close: %s", cl.Raw)
	}
	r = d.call(t, pub, "task_refund", map[string]any{"code": code})
	expect(t, r, 409, "HAS_RESERVATIONS")
	if details(r, "reserved") != float64(5) {
		t.Fatalf("HAS_RESERVATIONS details: %s", r.Raw)
	}
	for _, tool := range []string{"task_open", "task_pause", "task_close"} {
		r := d.call(t, pub, tool, map[string]any{"code": code})
		expect(t, r, 409, "INVALID_STATE")
		if details(r, "status") != "closed" {
			t.Fatalf("%s on closed: %s", tool, r.Raw)
		}
	}
	expect(t, d.call(t, pub, "task_fund", map[string]any{"code": code, "amount": 1}), 409, "INVALID_STATE")
	// Closed: no new claims or claim-less submissions; the active claim still submits, without renewal.
	exe2, _ := d.register(t)
	r = d.call(t, exe2, "work_claim", map[string]any{"code": code})
	expect(t, r, 409, "TASK_NOT_OPEN")
	if details(r, "status") != "closed" {
		t.Fatalf("TASK_NOT_OPEN on closed: %s", r.Raw)
	}
	expect(t, submit(t, d, exe2, code, "nc", bullets), 409, "TASK_NOT_OPEN")
	// Claiming again returns the active claim unchanged, even on a closed task.
	if again := d.must(t, exe, "work_claim", map[string]any{"code": code}); again.str("claim_id") != c.str("claim_id") {
		t.Fatalf("repeated claim: %s", again.Raw)
	}
	expect(t, d.call(t, exe, "work_claim_renew", map[string]any{"claim_id": c.str("claim_id")}), 409, "CLAIM_INVALID")
	if s := submit(t, d, exe, code, "late", bullets, "claim_id", c.str("claim_id")); s.str("state") != "settled" || s.num("paid") != 5 {
		t.Fatalf("active claim on a closed task: %s", s.Raw)
	}
	ref := d.call(t, pub, "task_refund", map[string]any{"code": code})
	if !ref.ok() || ref.num("refunded_now") != 51 || ref.num("available") != 0 || ref.num("refunded") != 51 || ref.num("reserved") != 0 {
		t.Fatalf("refund: %s", ref.Raw)
	}
	if bal := balanceOf(t, d, pub); bal != 10-1+51 {
		t.Fatalf("publisher balance after refund %d", bal)
	}
	expect(t, d.call(t, pub, "task_refund", map[string]any{"code": code}), 409, "NOTHING_TO_REFUND")
	checkMoney(t, d)
}

// The turn shows an active claim; work_report is idempotent; work_history pages.
func TestTaskTurnReportHistory(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, pubName := d.register(t)
	exe, _ := d.register(t)
	rcv := newScripted(t, always(says(200, "ok")))
	code := newTask(t, d, pub, rcv.url(), 2, 10, nil)
	c := d.must(t, exe, "work_claim", map[string]any{"code": code})
	if nextAction(c) != "submit" || c.str("status") != "active" || c.num("contract_version") != 1 || c.num("amount") != 2 || c.str("deadline") == "" {
		t.Fatalf("claim: %s", c.Raw)
	}
	turn := d.must(t, exe, "todo_list", map[string]any{})
	todos := turn.Body["todos"].([]any)
	if len(todos) != 1 {
		t.Fatalf("turn: %s", turn.Raw)
	}
	it := todos[0].(map[string]any)
	due, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(it["due_at"]))
	exp, _ := time.Parse(time.RFC3339Nano, c.str("expires_at"))
	if it["kind"] != "deliver" || it["task"] != code || it["claim"] != c.str("claim_id") || it["next_action"] != "submit" ||
		!due.Equal(exp) || it["author"] != pubName {
		t.Fatalf("claim item: %v (claim %s)", it, c.Raw)
	}
	d.must(t, exe, "work_release", map[string]any{"claim_id": c.str("claim_id")})
	if items, _, _ := d.turn(t, exe); len(items) != 0 {
		t.Fatalf("released claim still in the turn: %v", items)
	}

	r1 := d.must(t, exe, "work_report", map[string]any{"code": code, "reason": "misleading requirements"})
	r2 := d.must(t, exe, "work_report", map[string]any{"code": code, "reason": "misleading requirements"})
	if r1.str("report_id") == "" || r1.str("report_id") != r2.str("report_id") || r1.Body["created"] != true || r2.Body["created"] != false {
		t.Fatalf("work_report: %s / %s", r1.Raw, r2.Raw)
	}
	expectInvalid(t, d.call(t, exe, "work_report", map[string]any{"code": code, "reason": " "}), "reason")
	expect(t, d.call(t, exe, "work_report", map[string]any{"code": "0123456789ab", "reason": "x"}), 404, "TASK_NOT_FOUND")

	hist := newTask(t, d, pub, rcv.url(), 1, 21, nil)
	var ids []string
	for i := range 21 {
		s := submit(t, d, exe, hist, fmt.Sprintf("h-%02d", i), bullets)
		if s.str("state") != "settled" {
			t.Fatalf("history submission %d: %s", i, s.Raw)
		}
		ids = append(ids, s.str("submission_id"))
	}
	p1 := d.must(t, exe, "work_history", map[string]any{})
	p2 := d.must(t, exe, "work_history", map[string]any{"page": 2})
	l1, l2 := p1.Body["submissions"].([]any), p2.Body["submissions"].([]any)
	if p1.num("total") != 21 || p1.num("page") != 1 || p1.num("page_size") != 20 || len(l1) != 20 || len(l2) != 1 || p2.num("page") != 2 {
		t.Fatalf("history pages: %d + %d of %d", len(l1), len(l2), p1.num("total"))
	}
	if l1[0].(map[string]any)["submission_id"] != ids[20] || l2[0].(map[string]any)["submission_id"] != ids[0] {
		t.Fatalf("history is not newest first: %v ... %v", l1[0], l2[0])
	}
	if first := l1[0].(map[string]any); first["state"] != "settled" || first["reply"].(map[string]any)["body"] != "ok" {
		t.Fatalf("history row: %v", first)
	}
	checkMoney(t, d)
}

// An active claim whose expiry the sweep has not recorded yet is not
// active: work_claim must not hand it back.
func TestTaskClaimAfterUnsweptExpiry(t *testing.T) {
	t.Parallel()
	d := start(t, withSweep(time.Hour))
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	rcv := newScripted(t, always(says(200, "ok")))
	code := newTask(t, d, pub, rcv.url(), 2, 10, nil)
	c := d.must(t, exe, "work_claim", map[string]any{"code": code})
	if _, err := d.App.DB.Exec(t.Context(), `UPDATE claims SET expires_at = now() - interval '1 second' WHERE id = $1`, c.str("claim_id")); err != nil {
		t.Fatal(err)
	}
	again := d.must(t, exe, "work_claim", map[string]any{"code": code})
	exp, _ := time.Parse(time.RFC3339Nano, again.str("expires_at"))
	if !exp.After(time.Now()) {
		t.Errorf("work_claim returned an expired claim with next_action %v: %s", nextAction(again), again.Raw)
	}
	checkMoney(t, d)
}

// Equal payloads hash alike, different payloads never do — also for
// integers beyond 2^53.
func TestTaskIdempotencyBigIntegers(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	rcv := newScripted(t, always(says(200, "ok")))
	code := newTask(t, d, pub, rcv.url(), 1, 10, nil)
	send := func(n string) result {
		return post(t, d.URL+"/api/v1/work_submit", exe, fmt.Appendf(nil, `{"code":%q,"request_key":"big-int","payload":{"n":%s}}`, code, n))
	}
	if r := send("9007199254740993"); r.str("state") != "settled" {
		t.Fatalf("first: %s", r.Raw)
	}
	r := send("9007199254740992")
	if r.code() != "IDEMPOTENCY_CONFLICT" {
		t.Errorf("a different payload under the same request_key was taken for the same one: %d %s", r.Status, r.Raw)
	}
}

// The protocol's default limits cover task_create (20/h) and task_submit
// (120/min); with the defaults in force the 21st task_create in an hour is
// refused.
func TestTaskCreateDefaultRateLimit(t *testing.T) {
	t.Parallel()
	d := start(t, withLimits(""))
	pub, _ := d.register(t)
	url := "https://receiver.example.com/judge"
	for i := range 20 {
		if r := d.call(t, pub, "task_create", map[string]any{"contract": baseContract(url, "price", 1), "budget": 1}); !r.ok() {
			t.Fatalf("create %d: %s", i+1, r.Raw)
		}
	}
	r := d.call(t, pub, "task_create", map[string]any{"contract": baseContract(url, "price", 1), "budget": 1})
	if r.Status != 429 || r.code() != "RATE_LIMIT" {
		t.Errorf("21st task_create within the hour: %d %.200s", r.Status, r.Raw)
	}
}

// work_claim_renew extends expires_at by the ttl, never past the deadline.
func TestTaskClaimRenew(t *testing.T) {
	t.Parallel()
	clock := &shiftClock{}
	d := start(t, withClock(clock.now), withSweep(time.Hour))
	pub, _ := d.register(t)
	exe, _ := d.register(t)
	rcv := newScripted(t, always(says(200, "ok")))
	code := newTask(t, d, pub, rcv.url(), 2, 10, map[string]any{"claim": map[string]any{"ttl": 300, "max_duration": 600}})
	c := d.must(t, exe, "work_claim", map[string]any{"code": code})
	at := func(r result, k string) time.Time { v, _ := time.Parse(time.RFC3339Nano, r.str(k)); return v }
	created := at(c, "expires_at").Add(-300 * time.Second)
	if !at(c, "deadline").Equal(created.Add(600 * time.Second)) {
		t.Fatalf("deadline: %s", c.Raw)
	}
	clock.set(250 * time.Second)
	r := d.must(t, exe, "work_claim_renew", map[string]any{"claim_id": c.str("claim_id")})
	if got := at(r, "expires_at").Sub(created); got < 549*time.Second || got > 551*time.Second || nextAction(r) != "submit" {
		t.Fatalf("renewed to +%v: %s", got, r.Raw)
	}
	clock.set(500 * time.Second)
	r = d.must(t, exe, "work_claim_renew", map[string]any{"claim_id": c.str("claim_id")})
	if !at(r, "expires_at").Equal(at(c, "deadline")) {
		t.Fatalf("renewal past the deadline: %s", r.Raw)
	}
	clock.set(601 * time.Second)
	expect(t, d.call(t, exe, "work_claim_renew", map[string]any{"claim_id": c.str("claim_id")}), 409, "CLAIM_INVALID")
	expect(t, submit(t, d, exe, code, "late", bullets, "claim_id", c.str("claim_id")), 409, "CLAIM_INVALID")
}
