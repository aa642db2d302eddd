package relay_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Issue 7, items 2-4: no user input becomes a 500, every user JSON document
// is read strictly (one document, one meaning), and idempotent writes hash
// exact numbers. Each case runs through both doors, the HTTP JSON twin and
// MCP tools/call, with the arguments sent as raw bytes.

type door struct {
	name string
	send func(t *testing.T, d *dojo, key, tool string, args string) result
}

var doors = []door{
	{"http", func(t *testing.T, d *dojo, key, tool, args string) result {
		return post(t, d.URL+"/api/v1/"+tool, key, []byte(args))
	}},
	{"mcp", func(t *testing.T, d *dojo, key, tool, args string) result {
		t.Helper()
		body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `}}`
		r := post(t, d.URL+"/mcp", key, []byte(body), "Accept", "application/json, text/event-stream", "Mcp-Protocol-Version", "2025-11-25")
		var rpc struct {
			Result struct {
				IsError           bool           `json:"isError"`
				StructuredContent map[string]any `json:"structuredContent"`
			} `json:"result"`
		}
		if r.Status != 200 || json.Unmarshal([]byte(r.Raw), &rpc) != nil || rpc.Result.StructuredContent == nil {
			t.Fatalf("mcp %s: not a tool result: %d %.300s", tool, r.Status, r.Raw)
		}
		out := result{Status: r.Status, Header: r.Header, Body: rpc.Result.StructuredContent, Raw: r.Raw}
		if rpc.Result.IsError == out.ok() {
			t.Fatalf("mcp %s: isError %v with ok %v", tool, rpc.Result.IsError, out.ok())
		}
		return out
	}},
}

// refused asserts a refusal: the HTTP status (MCP answers 200 with
// isError), the code, and that details name field, or for a message-only
// code that the message mentions it. Nothing may show Go internals.
func refused(t *testing.T, dr door, r result, status int, code, field string) {
	t.Helper()
	want := status
	if dr.name == "mcp" {
		want = 200
	}
	if r.Status != want || r.code() != code || r.ok() {
		t.Fatalf("%s: want %d %s, got %d %.400s", dr.name, status, code, r.Status, r.Raw)
	}
	e, _ := r.Body["error"].(map[string]any)
	msg, _ := e["message"].(string)
	if code == "VALIDATION_FAILED" && !slices.Contains(fieldsOf(r), field) || code != "VALIDATION_FAILED" && !strings.Contains(msg, field) {
		t.Fatalf("%s: %s does not name %q: %.400s", dr.name, code, field, r.Raw)
	}
	shown, _ := json.Marshal(e)
	for _, internal := range []string{"Go ", "json:", "unmarshal", "struct", "SQLSTATE", "int4"} {
		if strings.Contains(string(shown), internal) {
			t.Fatalf("%s: the refusal shows internals (%q): %.400s", dr.name, internal, r.Raw)
		}
	}
}

// bareRoom starts a room of boss and worker and returns its code.
func bareRoom(t *testing.T, d *dojo) (room, boss, worker, workerName string) {
	t.Helper()
	boss, _ = d.register(t)
	worker, workerName = d.register(t)
	st := d.must(t, boss, "thread_start", map[string]any{"subject": "input", "key": true})
	room = st.Body["thread"].(map[string]any)["code"].(string)
	d.must(t, worker, "thread_join", map[string]any{"key": st.str("key")})
	return
}

func timelineLen(t *testing.T, d *dojo, key, room string) int {
	t.Helper()
	return len(d.must(t, key, "thread_get", map[string]any{"thread": room}).Body["timeline"].([]any))
}

// assignRow reads one assignment, expanded, as raw JSON with its numbers
// exactly as stored.
func assignRow(t *testing.T, d *dojo, key, room string, id int64) (state, raw string) {
	t.Helper()
	r := d.must(t, key, "thread_get", map[string]any{"thread": room, "assignments": []int64{id}})
	var view struct {
		Assignments []json.RawMessage `json:"assignments"`
	}
	if err := json.Unmarshal([]byte(r.Raw), &view); err != nil {
		t.Fatal(err)
	}
	for _, a := range view.Assignments {
		var row struct {
			ID    int64  `json:"id"`
			State string `json:"state"`
		}
		if json.Unmarshal(a, &row) == nil && row.ID == id {
			return row.State, string(a)
		}
	}
	t.Fatalf("assignment %d missing: %s", id, r.Raw)
	return "", ""
}

func postAssign(t *testing.T, d *dojo, boss, room, to string) int64 {
	t.Helper()
	r := d.must(t, boss, "thread_post", map[string]any{"thread": room, "content": "do it", "ask": []string{},
		"assign": map[string]any{"to": to, "requirements": "do it"}})
	return int64(r.Body["assign"].(map[string]any)["id"].(float64))
}

// Reproduces: page 4611686018427387904 made (page-1)*page_size overflow
// into a negative OFFSET, a 500 on all four paged tools.
func TestInputHugePage(t *testing.T) {
	t.Parallel()
	d := start(t)
	pub, _ := d.register(t)
	code := newTask(t, d, pub, newJudge(t, 200, "ok").srv.URL+"/judge", 1, 1, nil)
	for _, dr := range doors {
		for _, c := range []struct{ tool, args string }{
			{"task_list", `{"page":4611686018427387904}`},
			{"work_list", `{"page":4611686018427387904,"page_size":100}`},
			{"work_history", `{"page":4611686018427387904}`},
			{"task_submissions", `{"code":"` + code + `","page":4611686018427387904}`},
		} {
			refused(t, dr, dr.send(t, d, pub, c.tool, c.args), 422, "VALIDATION_FAILED", "page")
		}
	}
	// The largest page allowed is simply empty.
	if r := d.must(t, pub, "task_list", map[string]any{"page": 2147483647, "page_size": 100}); r.num("total") != 1 || len(r.Body["tasks"].([]any)) != 0 {
		t.Fatalf("last page: %s", r.Raw)
	}
}

// Reproduces: revision 2147483648 and claim_id 2147483648 reached int4
// query parameters (PostgreSQL refused them: 500), as did room cursors.
func TestInputInt4Parameters(t *testing.T) {
	t.Parallel()
	d, pub, exe, j, code := inputFixture(t)
	mem := d.must(t, pub, "memory_put", map[string]any{"title": "note", "tags": []string{"a"}, "content": content(60)}).str("code")
	room, boss, _, _ := bareRoom(t, d)
	for _, dr := range doors {
		refused(t, dr, dr.send(t, d, pub, "memory_get", `{"code":"`+mem+`","revision":2147483648}`), 422, "VALIDATION_FAILED", "revision")
		for i, claim := range []string{`2147483648`, `"2147483648"`, `9223372036854775807`} {
			args := fmt.Sprintf(`{"code":%q,"request_key":"k%d","payload":{"a":1},"claim_id":%s}`, code, i, claim)
			refused(t, dr, dr.send(t, d, exe, "work_submit", args), 409, "CLAIM_INVALID", "claim")
		}
		refused(t, dr, dr.send(t, d, exe, "work_submit", fmt.Sprintf(`{"code":%q,"request_key":"k","payload":{},"claim_id":9223372036854775808}`, code)),
			422, "VALIDATION_FAILED", "claim_id")
		for _, args := range []string{`{"thread":"` + room + `","cursor":"2147483648"}`, `{"thread":"` + room + `","assignments_cursor":"9223372036854775807"}`} {
			if r := dr.send(t, d, boss, "thread_get", args); !r.ok() {
				t.Fatalf("%s thread_get %s: %s", dr.name, args, r.Raw)
			}
		}
		if r := dr.send(t, d, boss, "thread_list", `{"cursor":"2147483648"}`); !r.ok() || len(r.Body["threads"].([]any)) != 1 {
			t.Fatalf("%s thread_list: %s", dr.name, r.Raw)
		}
	}
	if h := d.must(t, exe, "work_history", map[string]any{}); h.num("total") != 0 || j.count() != 0 || balanceOf(t, d, exe) != 66 {
		t.Fatalf("a refused submission left traces: %s, %d deliveries", h.Raw, j.count())
	}
}

// Reproduces: raw invalid UTF-8 and an escaped lone surrogate were stored
// raw into json columns (PostgreSQL refused them: 500); "\u0000" inside a
// payload given as a JSON string slipped past the NUL check the same way.
func TestInputUnstorableText(t *testing.T) {
	t.Parallel()
	d, pub, exe, j, code := inputFixture(t)
	room, boss, worker, workerName := bareRoom(t, d)
	open := postAssign(t, d, boss, room, workerName)
	taken := postAssign(t, d, boss, room, workerName)
	d.must(t, worker, "assign_take", map[string]any{"assign": taken})
	contract := func(schema string) string {
		return `{"contract":{"title":"t","requirements":"r","receiver":{"url":"` + j.srv.URL + `/judge"},"price":1,"output":{"schema":` + schema + `}},"budget":1}`
	}
	for _, bad := range []struct{ text, why string }{{"\"caf\xe9\"", "UTF-8"}, {`"\ud800"`, "surrogate"}, {"\"\xed\xa0\x80\"", "UTF-8"}} {
		for _, dr := range doors {
			r := dr.send(t, d, exe, "work_submit", `{"code":"`+code+`","request_key":"k","payload":{"note":`+bad.text+`}}`)
			refused(t, dr, r, 422, "VALIDATION_FAILED", "payload.note")
			r = dr.send(t, d, pub, "task_create", contract(`{"type":"object","description":`+bad.text+`}`))
			refused(t, dr, r, 422, "VALIDATION_FAILED", "contract.output.schema.description")
			r = dr.send(t, d, worker, "assign_take", fmt.Sprintf(`{"assign":%d,"payload":{"note":%s}}`, open, bad.text))
			refused(t, dr, r, 422, "VALIDATION_FAILED", "payload.note")
			r = dr.send(t, d, worker, "assign_submit", fmt.Sprintf(`{"assign":%d,"payload":[%s]}`, taken, bad.text))
			refused(t, dr, r, 422, "VALIDATION_FAILED", "payload.0")
			if !strings.Contains(r.Raw, bad.why) {
				t.Fatalf("%s: the reason is not given: %s", dr.name, r.Raw)
			}
		}
	}
	for _, dr := range doors {
		// The payload as a JSON string holding JSON, as the protocol sends it.
		r := dr.send(t, d, worker, "assign_submit", fmt.Sprintf(`{"assign":%d,"payload":"{\"note\":\"\\u0000\"}"}`, taken))
		refused(t, dr, r, 422, "VALIDATION_FAILED", "payload.note")
		r = dr.send(t, d, worker, "assign_take", fmt.Sprintf(`{"assign":%d,"payload":"[\"\\ud800\"]"}`, open))
		refused(t, dr, r, 422, "VALIDATION_FAILED", "payload.0")
	}
	if s, _ := assignRow(t, d, boss, room, open); s != "open" {
		t.Fatalf("refused take changed the assignment: %s", s)
	}
	if s, raw := assignRow(t, d, boss, room, taken); s != "taken" || strings.Contains(raw, `"payload"`) {
		t.Fatalf("refused delivery was stored: %s", raw)
	}
	if h := d.must(t, exe, "work_history", map[string]any{}); h.num("total") != 0 || j.count() != 0 {
		t.Fatalf("refused submissions were stored or sent: %s", h.Raw)
	}
	if l := d.must(t, pub, "task_list", map[string]any{}); l.num("total") != 1 || balanceOf(t, d, pub) != 61 {
		t.Fatalf("refused task_create created or locked: %s", l.Raw)
	}
}

// Reproduces: with a key given twice the schema and the credential filter
// read the last value while the first travelled on in the stored bytes.
func TestInputDuplicateKeys(t *testing.T) {
	t.Parallel()
	d, pub, exe, j, code := inputFixture(t)
	room, boss, worker, workerName := bareRoom(t, d)
	open := postAssign(t, d, boss, room, workerName)
	entries := timelineLen(t, d, boss, room)
	const aws = "AKIAIOSFODNN7EXAMPLE"
	smuggle := `{"n":"x","aws":"` + aws + `","n":1,"aws":"clean"}`
	for _, dr := range doors {
		// The arguments themselves, and a content given twice.
		r := dr.send(t, d, pub, "memory_put", `{"title":"a","tags":["x"],"content":"`+content(60)+`","title":"b"}`)
		refused(t, dr, r, 422, "VALIDATION_FAILED", "")
		if !strings.Contains(r.Raw, `duplicate key \"title\"`) {
			t.Fatalf("%s: the key is not named: %s", dr.name, r.Raw)
		}
		r = dr.send(t, d, boss, "thread_post", `{"thread":"`+room+`","content":"`+aws+` is the key","summary":"s","content":"harmless"}`)
		refused(t, dr, r, 422, "VALIDATION_FAILED", "")
		// A work payload, a task output schema, an assignment schema and payloads.
		refused(t, dr, dr.send(t, d, exe, "work_submit", `{"code":"`+code+`","request_key":"k","payload":`+smuggle+`}`), 422, "VALIDATION_FAILED", "payload")
		r = dr.send(t, d, pub, "task_create", `{"contract":{"title":"t","requirements":"r","receiver":{"url":"`+j.srv.URL+`/judge"},"price":1,
			"output":{"schema":{"type":"object","properties":{"a":{"type":"string","type":"integer"}}}}},"budget":1}`)
		refused(t, dr, r, 422, "VALIDATION_FAILED", "contract.output.schema.properties.a")
		r = dr.send(t, d, boss, "thread_post", `{"thread":"`+room+`","content":"c","assign":{"to":"`+workerName+`","requirements":"r",
			"output_schema":{"type":"object","required":["a"],"required":[]}}}`)
		refused(t, dr, r, 422, "VALIDATION_FAILED", "assign.output_schema")
		refused(t, dr, dr.send(t, d, worker, "assign_take", fmt.Sprintf(`{"assign":%d,"payload":%s}`, open, smuggle)), 422, "VALIDATION_FAILED", "payload")
		wrapped, _ := json.Marshal(smuggle)
		refused(t, dr, dr.send(t, d, worker, "assign_take", fmt.Sprintf(`{"assign":%d,"payload":%s}`, open, wrapped)), 422, "VALIDATION_FAILED", "payload")
		// Keys equal after unescaping are the same key.
		refused(t, dr, dr.send(t, d, worker, "assign_take", fmt.Sprintf(`{"assign":%d,"payload":{"aws":1,"\u0061ws":2}}`, open)), 422, "VALIDATION_FAILED", "payload")
	}
	if m := d.must(t, pub, "memory_list", map[string]any{}); m.num("total") != 0 {
		t.Fatalf("refused memory_put stored: %s", m.Raw)
	}
	if n := timelineLen(t, d, boss, room); n != entries {
		t.Fatalf("refused posts added entries: %d, want %d", n, entries)
	}
	if s, _ := assignRow(t, d, boss, room, open); s != "open" {
		t.Fatalf("refused take changed the assignment: %s", s)
	}
	if h := d.must(t, exe, "work_history", map[string]any{}); h.num("total") != 0 || j.count() != 0 {
		t.Fatalf("refused submission was stored or sent: %s", h.Raw)
	}
	if l := d.must(t, pub, "task_list", map[string]any{}); l.num("total") != 1 {
		t.Fatalf("refused task_create created a task: %s", l.Raw)
	}
}

// Reproduces: 1e400 in an integer field answered with Go's decoder message
// ("json: cannot unmarshal number 1e400 into Go struct field listIn.limit"),
// and 1.0, an integer to the schema, was refused the same way by decoding.
func TestInputIntegerForms(t *testing.T) {
	t.Parallel()
	d := start(t)
	key, _ := d.register(t)
	mem := d.must(t, key, "memory_put", map[string]any{"title": "note", "tags": []string{"a"}, "content": content(60)}).str("code")
	for _, dr := range doors {
		refused(t, dr, dr.send(t, d, key, "memory_list", `{"limit":1e400}`), 422, "VALIDATION_FAILED", "limit")
		refused(t, dr, dr.send(t, d, key, "memory_list", `{"limit":1.5}`), 422, "VALIDATION_FAILED", "limit")
		refused(t, dr, dr.send(t, d, key, "memory_list", `{"offset":1e999999}`), 422, "VALIDATION_FAILED", "offset")
		if r := dr.send(t, d, key, "memory_list", `{"limit":1.0,"offset":0.0}`); !r.ok() || r.num("returned") != 1 {
			t.Fatalf("%s: limit 1.0: %s", dr.name, r.Raw)
		}
		if r := dr.send(t, d, key, "task_list", `{"page":1.0,"page_size":5e0}`); !r.ok() || r.num("page") != 1 || r.num("page_size") != 5 {
			t.Fatalf("%s: page 1.0: %s", dr.name, r.Raw)
		}
		if r := dr.send(t, d, key, "memory_get", `{"code":"`+mem+`","revision":100e-2}`); !r.ok() || r.num("revision") != 1 {
			t.Fatalf("%s: revision 100e-2: %s", dr.name, r.Raw)
		}
	}
}

// Reproduces: room and assignment writes hashed their arguments through
// float64, so 9007199254740992 replayed the result of 9007199254740993.
func TestInputIdempotencyExactNumbers(t *testing.T) {
	t.Parallel()
	d := start(t)
	room, boss, worker, workerName := bareRoom(t, d)
	for _, dr := range doors {
		postArgs := func(n string) string {
			return `{"thread":"` + room + `","content":"typed","ask":[],"idempotency_key":"room-` + dr.name + `",
				"assign":{"to":"` + workerName + `","requirements":"r","output_schema":{"type":"object","properties":{"n":{"maximum":` + n + `}}}}}`
		}
		first := dr.send(t, d, boss, "thread_post", postArgs("9007199254740993"))
		if !first.ok() {
			t.Fatalf("%s: first post: %s", dr.name, first.Raw)
		}
		entries := timelineLen(t, d, boss, room)
		if again := dr.send(t, d, boss, "thread_post", postArgs("9007199254740993")); !again.ok() || again.num("entry") != first.num("entry") {
			t.Fatalf("%s: the same request did not replay: %s", dr.name, again.Raw)
		}
		refused(t, dr, dr.send(t, d, boss, "thread_post", postArgs("9007199254740992")), 409, "IDEMPOTENCY_CONFLICT", "idempotency_key")
		if n := timelineLen(t, d, boss, room); n != entries {
			t.Fatalf("%s: conflict added entries", dr.name)
		}

		id := int64(first.Body["assign"].(map[string]any)["id"].(float64))
		take := func(n string) string {
			return fmt.Sprintf(`{"assign":%d,"payload":{"n":%s},"idempotency_key":"take-%s"}`, id, n, dr.name)
		}
		if r := dr.send(t, d, worker, "assign_take", take("9007199254740993")); !r.ok() {
			t.Fatalf("%s: take: %s", dr.name, r.Raw)
		}
		refused(t, dr, dr.send(t, d, worker, "assign_take", take("9007199254740992")), 409, "IDEMPOTENCY_CONFLICT", "idempotency_key")
		if _, raw := assignRow(t, d, boss, room, id); !strings.Contains(raw, `"n":9007199254740993`) {
			t.Fatalf("%s: stored delivery changed: %s", dr.name, raw)
		}
	}
}

// Reproduces: the owner sign-in read its JSON body leniently, so a name
// given twice was resolved by whichever reader looked.
func TestInputOwnerKeyDuplicateName(t *testing.T) {
	t.Parallel()
	d := start(t)
	key, name := d.register(t)
	r := post(t, d.URL+"/owner/key", "", []byte(`{"name":"`+name+`","password":"correct horse","name":"someone_else"}`))
	refused(t, doors[0], r, 422, "VALIDATION_FAILED", "")
	if !strings.Contains(r.Raw, `duplicate key \"name\"`) {
		t.Fatalf("owner sign-in with a repeated name: %s", r.Raw)
	}
	// Nothing was reset: the Agent key still works.
	d.must(t, key, "account_status", map[string]any{})
}

// inputFixture is a server with a publisher, an executor and one open task
// judged by a loopback receiver that accepts everything.
func inputFixture(t *testing.T) (d *dojo, pub, exe string, j *judge, code string) {
	t.Helper()
	d = start(t)
	pub, _ = d.register(t)
	exe, _ = d.register(t)
	j = newJudge(t, 200, "ok")
	code = newTask(t, d, pub, j.srv.URL+"/judge", 1, 5, nil)
	return d, pub, exe, j, code
}
