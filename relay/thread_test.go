package relay_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// must calls a tool and fails the test unless it was accepted.
func (d *dojo) must(t testing.TB, key, tool string, args map[string]any) result {
	t.Helper()
	r := d.call(t, key, tool, args)
	if !r.ok() {
		t.Fatalf("%s %v: %s", tool, args, r.Raw)
	}
	return r
}

// turn returns the caller's todo items as "kind:thread-or-assign" strings.
func (d *dojo) turn(t testing.TB, key string) (items []string, opportunities map[string]any, raw result) {
	t.Helper()
	r := d.must(t, key, "todo_list", map[string]any{})
	for _, it := range r.Body["todos"].([]any) {
		m := it.(map[string]any)
		id := m["entry"]
		if m["assign"] != nil {
			id = m["assign"]
		}
		items = append(items, fmt.Sprintf("%s:%v", m["kind"], id))
	}
	return items, r.Body["opportunities"].(map[string]any), r
}

func expectTurn(t testing.TB, d *dojo, who, key string, want ...string) {
	t.Helper()
	got, _, raw := d.turn(t, key)
	if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
		t.Fatalf("%s's turn = %v, want %v\n%s", who, got, want, raw.Raw)
	}
	if len(want) == 0 && (raw.Body["next_action"] != "wait" || raw.num("retry_after") != 60) {
		t.Fatalf("%s's empty turn must say wait: %s", who, raw.Raw)
	}
}

func id(r result, k string) string { return fmt.Sprint(int64(r.Body[k].(float64))) }

func TestTeamScenario(t *testing.T) {
	t.Parallel()
	d := start(t)
	gov, _ := d.register(t)
	a, aName := d.register(t)
	b, bName := d.register(t)
	c, cName := d.register(t)

	st := d.must(t, gov, "thread_start", map[string]any{"subject": "Launch week", "key": true})
	room := st.Body["thread"].(map[string]any)["code"].(string)
	key := st.str("key")
	if !strings.HasPrefix(key, "kf_") || len(key) != 35 || st.str("role") != "governor" {
		t.Fatalf("thread_start: %s", st.Raw)
	}
	expectTurn(t, d, "governor", gov)
	for _, k := range []string{a, b, c} {
		j := d.must(t, k, "thread_join", map[string]any{"key": key})
		if j.str("role") != "speaker" || j.Body["already_member"] != false {
			t.Fatalf("join: %s", j.Raw)
		}
	}
	// A second join with the same key is the existing membership.
	if j := d.must(t, a, "thread_join", map[string]any{"key": key}); j.Body["already_member"] != true {
		t.Fatalf("second join: %s", j.Raw)
	}

	// Discussion: the governor asks all three.
	kick := d.must(t, gov, "thread_post", map[string]any{"thread": room, "content": "Kickoff: read the brief and say hello.", "ask": []string{aName, bName, cName}})
	kickID := id(kick, "entry")
	if asked := kick.Body["asked"].([]any); len(asked) != 3 || kick.num("seq") != 1 {
		t.Fatalf("kickoff: %s", kick.Raw)
	}
	expectTurn(t, d, "a", a, "reply:"+kickID)
	expectTurn(t, d, "b", b, "reply:"+kickID)
	expectTurn(t, d, "c", c, "reply:"+kickID)
	expectTurn(t, d, "governor", gov)

	// A replies (which asks the governor back), B handles with a note, C stays silent.
	rep := d.must(t, a, "thread_post", map[string]any{"thread": room, "content": "Hello, on it.", "reply_to": kick.num("entry")})
	if rep.Body["fulfilled"] != true || rep.Body["asked"].([]any)[0] != d.nameOf(t, gov) {
		t.Fatalf("reply: %s", rep.Raw)
	}
	d.must(t, b, "thread_handle", map[string]any{"thread": room, "entry": kick.num("entry"), "note": "read, no questions"})
	expectTurn(t, d, "a", a)
	expectTurn(t, d, "b", b)
	expectTurn(t, d, "c", c, "reply:"+kickID)
	expectTurn(t, d, "governor", gov, "reply:"+id(rep, "entry"))

	// The handle note is visible to the entry's author and to B only.
	noteSeen := func(key string) bool {
		v := d.must(t, key, "thread_get", map[string]any{"thread": room})
		return strings.Contains(v.Raw, "read, no questions")
	}
	if !noteSeen(gov) || !noteSeen(b) || noteSeen(a) || noteSeen(c) {
		t.Fatal("handle note visibility is wrong")
	}

	// Three assignments.
	schema := map[string]any{"type": "object", "required": []string{"url"}, "properties": map[string]any{"url": map[string]any{"type": "string"}}}
	assign := func(to, req string) string {
		r := d.must(t, gov, "thread_post", map[string]any{"thread": room, "summary": req, "content": req,
			"assign": map[string]any{"to": to, "requirements": req, "output_schema": schema}})
		return fmt.Sprint(int64(r.Body["assign"].(map[string]any)["id"].(float64)))
	}
	asA, asB, asC := assign(aName, "Write the landing page"), assign(bName, "Record the demo"), assign(cName, "Draft the announcement")
	for _, k := range []string{a, b, c} {
		if _, opp, _ := d.turn(t, k); opp["assignments"] != float64(1) || opp["tasks"] != float64(0) {
			t.Fatalf("opportunities: %v", opp)
		}
	}
	expectTurn(t, d, "a", a)

	num := func(s string) int64 { var n int64; fmt.Sscan(s, &n); return n }
	tk := d.must(t, a, "assign_take", map[string]any{"assign": num(asA)})
	if tk.str("state") != "taken" || tk.str("deliver_due_at") == "" {
		t.Fatalf("take: %s", tk.Raw)
	}
	d.must(t, b, "assign_take", map[string]any{"assign": num(asB)})
	// C takes and delivers in one call, with the payload as a JSON string.
	tc := d.must(t, c, "assign_take", map[string]any{"assign": num(asC), "payload": `{"url":"https://example.org/draft"}`})
	if tc.str("state") != "delivered" {
		t.Fatalf("take+submit: %s", tc.Raw)
	}
	expectTurn(t, d, "a", a, "deliver:"+asA)
	expectTurn(t, d, "b", b, "deliver:"+asB)
	expectTurn(t, d, "c", c, "reply:"+kickID)
	expectTurn(t, d, "governor", gov, "reply:"+id(rep, "entry"), "judge:"+asC)

	bad := d.call(t, a, "assign_submit", map[string]any{"assign": num(asA), "payload": map[string]any{"link": 1}})
	expect(t, bad, 422, "SCHEMA_MISMATCH")
	d.must(t, a, "assign_submit", map[string]any{"assign": num(asA), "payload": map[string]any{"url": "https://example.org/landing"}})
	d.must(t, b, "assign_submit", map[string]any{"assign": num(asB), "payload": map[string]any{"url": "https://example.org/demo"}})
	expectTurn(t, d, "a", a)
	expectTurn(t, d, "governor", gov, "reply:"+id(rep, "entry"), "judge:"+asC, "judge:"+asA, "judge:"+asB)

	d.must(t, gov, "assign_judge", map[string]any{"assign": num(asA), "verdict": "adopt"})
	d.must(t, gov, "assign_judge", map[string]any{"assign": num(asB), "verdict": "adopt"})
	expect(t, d.call(t, gov, "assign_judge", map[string]any{"assign": num(asC), "verdict": "reject"}), 422, "VALIDATION_FAILED")
	rj := d.must(t, gov, "assign_judge", map[string]any{"assign": num(asC), "verdict": "reject", "reason": "Missing the pricing section."})
	if rj.str("state") != "rejected" {
		t.Fatalf("reject: %s", rj.Raw)
	}
	expectTurn(t, d, "governor", gov, "reply:"+id(rep, "entry"))
	d.must(t, gov, "thread_handle", map[string]any{"thread": room, "entry": rep.num("entry")})
	expectTurn(t, d, "governor", gov)

	// C reads the reason; redo is a new assignment referencing the old one.
	v := d.must(t, c, "thread_get", map[string]any{"thread": room, "assignments": []any{num(asC)}})
	if !strings.Contains(v.Raw, "Missing the pricing section.") {
		t.Fatalf("reason not readable: %s", v.Raw)
	}
	redo := assign(cName, "Redo of assignment "+asC+": add the pricing section")
	d.must(t, c, "assign_take", map[string]any{"assign": num(redo)})
	d.must(t, c, "thread_post", map[string]any{"thread": room, "content": "Sorry, late hello.", "reply_to": kick.num("entry")})
	d.must(t, c, "assign_submit", map[string]any{"assign": num(redo), "payload": map[string]any{"url": "https://example.org/draft2"}})
	// An assignment taken but not delivered when the room closes.
	late := assign(aName, "Translate the page")
	d.must(t, a, "assign_take", map[string]any{"assign": num(late)})
	expectTurn(t, d, "a", a, "deliver:"+late)
	expectTurn(t, d, "c", c)

	cl := d.must(t, gov, "thread_close", map[string]any{"thread": room})
	if cl.Body["thread"].(map[string]any)["status"] != "closed" || cl.num("voided") != 1 {
		t.Fatalf("close: %s", cl.Raw)
	}
	expectTurn(t, d, "a", a)
	expectTurn(t, d, "governor", gov, "judge:"+redo)
	// Delivered work is still judged after close.
	d.must(t, gov, "assign_judge", map[string]any{"assign": num(redo), "verdict": "adopt"})
	for name, k := range map[string]string{"governor": gov, "a": a, "b": b, "c": c} {
		expectTurn(t, d, name, k)
	}
	// The closed room is terminal but readable; its key no longer admits anyone.
	v = d.must(t, c, "thread_get", map[string]any{"thread": room})
	if v.Body["thread"].(map[string]any)["status"] != "closed" || v.Body["key"].(map[string]any)["active"] != false || len(v.Body["timeline"].([]any)) != 8 {
		t.Fatalf("closed room view: %s", v.Raw)
	}
	stranger, _ := d.register(t)
	expect(t, d.call(t, stranger, "thread_join", map[string]any{"key": key}), 401, "KEY_INVALID")
	expect(t, d.call(t, gov, "thread_post", map[string]any{"thread": room, "content": "anyone?"}), 409, "THREAD_CLOSED")
	states := map[string]string{}
	v = d.must(t, gov, "thread_get", map[string]any{"thread": room})
	for _, x := range v.Body["assignments"].([]any) {
		m := x.(map[string]any)
		states[fmt.Sprint(int64(m["id"].(float64)))] = m["state"].(string)
	}
	want := map[string]string{asA: "adopted", asB: "adopted", asC: "rejected", redo: "adopted", late: "voided"}
	for k, s := range want {
		if states[k] != s {
			t.Fatalf("assignment states %v, want %v", states, want)
		}
	}
}

// nameOf returns the account name behind a key.
func (d *dojo) nameOf(t testing.TB, key string) string {
	return d.must(t, key, "account_status", map[string]any{}).str("bot_name")
}
