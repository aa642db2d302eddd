package tool

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dojo-relay/dojo/kungfu"
)

func dec[In any](args json.RawMessage) error {
	var in In
	return decode(args, &in)
}

// inputs decodes each tool's arguments into the type its handler takes.
var inputs = map[string]func(json.RawMessage) error{
	"account_register": dec[registerIn], "account_status": dec[struct{}],
	"memory_put": dec[putIn], "memory_list": dec[listIn], "memory_get": dec[getIn],
	"memory_share": dec[codeIn], "memory_unshare": dec[codeIn], "memory_delete": dec[codeIn],
	"notify_register": dec[notifyIn], "notify_delete": dec[struct{}],
	"task_create": dec[createIn], "task_update": dec[updateIn], "task_open": dec[codeOnly], "task_pause": dec[codeOnly],
	"task_close": dec[codeOnly], "task_fund": dec[fundIn], "task_refund": dec[codeOnly], "task_get": dec[codeOnly],
	"task_list": dec[taskListIn], "task_submissions": dec[submissionsIn],
	"work_list": dec[workListIn], "work_get": dec[codeOnly], "work_harness": dec[harnessIn], "work_claim": dec[codeOnly],
	"work_claim_renew": dec[claimIn], "work_release": dec[claimIn], "work_submit": dec[submitIn],
	"work_status": dec[statusIn], "work_history": dec[historyIn], "work_report": dec[reportIn],
	"thread_start": dec[startIn], "thread_key": dec[keyIn], "thread_key_revoke": dec[threadIn], "thread_join": dec[joinIn],
	"thread_get": dec[getThreadIn], "thread_list": dec[listThreadIn], "thread_post": dec[postIn],
	"thread_handle": dec[entryIn], "thread_retract": dec[entryIn], "thread_leave": dec[threadIn],
	"thread_remove": dec[memberIn], "thread_set_role": dec[memberIn], "thread_close": dec[threadIn],
	"assign_take": dec[assignActIn], "assign_submit": dec[assignActIn], "assign_judge": dec[assignActIn],
	"assign_drop": dec[assignActIn], "assign_void": dec[assignActIn], "todo_list": dec[todoIn],
}

func kungfuRegistry(t testing.TB) *Registry {
	t.Helper()
	r, err := NewRegistry(Kungfu(Services{})...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// schemaIntegers calls f with the path and schema of every integer in a
// tool's argument schema.
func schemaIntegers(at string, s map[string]any, f func(at string, s map[string]any)) {
	switch ty := s["type"].(type) {
	case string:
		if ty == "integer" {
			f(at, s)
		}
	case []any:
		for _, x := range ty {
			if x == "integer" {
				f(at, s)
			}
		}
	}
	if props, ok := s["properties"].(map[string]any); ok {
		for k, p := range props {
			schemaIntegers(join(at, k), p.(map[string]any), f)
		}
	}
	if items, ok := s["items"].(map[string]any); ok {
		schemaIntegers(join(at, "*"), items, f)
	}
}

// Every integer argument states the range its Go field and column hold,
// so no number reaches a handler that it cannot store.
func TestIntegerArgumentsBounded(t *testing.T) {
	for _, tl := range kungfuRegistry(t).Tools() {
		var s map[string]any
		if err := json.Unmarshal([]byte(tl.Schema), &s); err != nil {
			t.Fatal(err)
		}
		schemaIntegers("", s, func(at string, s map[string]any) {
			lo, okLo := s["minimum"].(float64)
			hi, okHi := s["maximum"].(float64)
			if !okLo || !okHi || lo < -1<<63 || hi > 1<<63-1 {
				t.Errorf("%s %s: integer without an int64 minimum and maximum: %v", tl.Name, at, s)
			}
		})
	}
}

// Every tool has its input type listed for the fuzz target below.
func TestEveryToolDecodes(t *testing.T) {
	for _, tl := range kungfuRegistry(t).Tools() {
		if inputs[tl.Name] == nil {
			t.Errorf("%s: add its input type to inputs", tl.Name)
		}
	}
}

// JSON Schema counts 1.0 as an integer; Decode agrees, for plain fields,
// nested ones, list items and string-or-integer references alike, while
// raw payloads keep their bytes. Refusals never show Go's type names.
func TestDecodeAgreesWithSchema(t *testing.T) {
	r := kungfuRegistry(t)
	accepted := []struct{ tool, args, check string }{
		{"task_list", `{"page":1.0,"page_size":2e1}`, "page=1 size=20"},
		{"thread_get", `{"thread":"abc","entries":[1.0,2E0]}`, "entries=[1 2]"},
		{"work_claim_renew", `{"claim_id":7.0}`, "claim=7"},
		{"thread_post", `{"thread":"abc","assign":{"to":"bo","requirements":"r","deliver_due":60.0}}`, "due=60"},
		{"assign_submit", `{"assign":3.0,"payload":{"score":1.0}}`, `payload={"score":1.0}`},
		{"memory_get", `{"code":"abc","revision":100e-2}`, "revision=1"},
	}
	for _, c := range accepted {
		tl, _ := r.Lookup(c.tool)
		if err := tl.Validate(json.RawMessage(c.args)); err != nil {
			t.Errorf("%s %s: schema refused: %v", c.tool, c.args, err)
			continue
		}
		var got string
		switch c.tool {
		case "task_list":
			var in taskListIn
			err := decode(json.RawMessage(c.args), &in)
			got = fmt.Sprintf("page=%d size=%d%v", in.Page, in.PageSize, nilOr(err))
		case "thread_get":
			var in getThreadIn
			err := decode(json.RawMessage(c.args), &in)
			got = fmt.Sprintf("entries=%v%v", in.Entries, nilOr(err))
		case "work_claim_renew":
			var in claimIn
			err := decode(json.RawMessage(c.args), &in)
			got = fmt.Sprintf("claim=%s%v", in.ClaimID, nilOr(err))
		case "thread_post":
			var in postIn
			err := decode(json.RawMessage(c.args), &in)
			got = fmt.Sprintf("due=%d%v", in.Assign.DeliverDue, nilOr(err))
		case "assign_submit":
			var in assignActIn
			err := decode(json.RawMessage(c.args), &in)
			got = fmt.Sprintf("payload=%s%v", in.Payload, nilOr(err))
		case "memory_get":
			var in getIn
			err := decode(json.RawMessage(c.args), &in)
			got = fmt.Sprintf("revision=%d%v", in.Revision, nilOr(err))
		}
		if got != c.check {
			t.Errorf("%s %s: decoded %s, want %s", c.tool, c.args, got, c.check)
		}
	}
	refused := []struct{ tool, args, field string }{
		{"memory_list", `{"limit":1e400}`, "limit"},
		{"memory_list", `{"limit":1.5}`, "limit"},
		{"task_list", `{"page":4611686018427387904}`, "page"},
		{"task_list", `{"page":0}`, "page"},
		{"work_history", `{"page":4611686018427387904}`, "page"},
		{"memory_get", `{"code":"abc","revision":2147483648}`, "revision"},
		{"work_claim_renew", `{"claim_id":9223372036854775808}`, "claim_id"},
		{"task_create", `{"contract":{"title":"t","requirements":"r","receiver":{"url":"https://x"},"price":9007199254740992},"budget":1}`, "contract.price"},
	}
	for _, c := range refused {
		tl, _ := r.Lookup(c.tool)
		err := tl.Validate(json.RawMessage(c.args))
		e := kungfu.AsError(err)
		if e == nil || e.Code != kungfu.CodeValidationFailed || !strings.HasPrefix(e.Message, c.field+": ") {
			t.Errorf("%s %s: got %v, want VALIDATION_FAILED naming %s", c.tool, c.args, err, c.field)
			continue
		}
		if strings.Contains(e.Message, "Go ") || strings.Contains(e.Message, "json:") {
			t.Errorf("%s %s: message shows internals: %s", c.tool, c.args, e.Message)
		}
	}
	// Past the schema (a tool defined without bounds), Decode still names
	// the field in plain words.
	var in listIn
	e := kungfu.AsError(decode(json.RawMessage(`{"limit":1e400}`), &in))
	if e == nil || e.Message != "limit: must be an integer in range" {
		t.Fatalf("decode 1e400: %v", e)
	}
	var sub claimIn
	if e := kungfu.AsError(decode(json.RawMessage(`{"claim_id":1.5}`), &sub)); e == nil || e.Message != "claim_id: must be a string or an integer" {
		t.Fatalf("decode a fractional reference: %v", e)
	}
}

func nilOr(err error) string {
	if err == nil {
		return ""
	}
	return " " + err.Error()
}

// FuzzToolArguments: every tool's Validate, on any bytes, answers nil or a
// protocol refusal, quickly, and whatever it accepts decodes into the
// handler's input type.
func FuzzToolArguments(f *testing.F) {
	r := kungfuRegistry(f)
	tools := r.Tools()
	index := map[string]uint8{}
	for i, tl := range tools {
		index[tl.Name] = uint8(i)
	}
	seeds := []struct{ tool, args string }{
		{"task_list", `{"page":4611686018427387904}`},
		{"work_list", `{"page":4611686018427387904,"page_size":100}`},
		{"work_history", `{"page":4611686018427387904}`},
		{"task_submissions", `{"code":"0123456789ab","page":4611686018427387904}`},
		{"memory_get", `{"code":"0123456789ab","revision":2147483648}`},
		{"work_submit", `{"code":"0123456789ab","request_key":"k","payload":{},"claim_id":2147483648}`},
		{"work_submit", "{\"code\":\"0123456789ab\",\"request_key\":\"k\",\"payload\":{\"a\":\"\xff\"}}"},
		{"work_submit", `{"code":"0123456789ab","request_key":"k","payload":{"a":"\ud800"}}`},
		{"work_submit", `{"code":"0123456789ab","request_key":"k","payload":{"n":"x","aws":"AKIAIOSFODNN7EXAMPLE","n":1,"aws":"clean"}}`},
		{"task_create", `{"contract":{"title":"t","requirements":"r","receiver":{"url":"https://x"},"price":1,"output":{"schema":{"type":"object","type":"string"}}},"budget":1}`},
		{"assign_submit", `{"assign":1,"payload":"{\"a\":\"\\u0000\"}"}`},
		{"assign_submit", `{"assign":1,"payload":{"n":9007199254740993},"idempotency_key":"k"}`},
		{"thread_post", `{"thread":"abc","content":"clean","content":"AKIAIOSFODNN7EXAMPLE"}`},
		{"memory_list", `{"limit":1e400}`},
		{"memory_list", `{"limit":1.0,"offset":-0.0}`},
		{"thread_get", `{"thread":"abc","entries":[1.0,1e2,-1]}`},
		{"account_register", `{"name":"agent_1","password":"x\u0000y"}`},
	}
	for _, s := range seeds {
		f.Add(index[s.tool], []byte(s.args))
	}
	f.Fuzz(func(t *testing.T, which uint8, args []byte) {
		tl := tools[int(which)%len(tools)]
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		began := time.Now()
		err := tl.Validate(args)
		if took := time.Since(began); took > 2*time.Second {
			t.Fatalf("%s: Validate took %v", tl.Name, took)
		}
		// Per process, so loose: the fuzzing engine allocates beside it.
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 64*uint64(len(args))+8<<20 {
			t.Fatalf("%s: Validate of %d bytes allocated %d bytes", tl.Name, len(args), grew)
		}
		if err != nil {
			e := kungfu.AsError(err)
			if e == nil || (e.Code != kungfu.CodeValidationFailed && e.Code != kungfu.CodeMissingField) {
				t.Fatalf("%s: %v is not a protocol refusal", tl.Name, err)
			}
			return
		}
		if err := inputs[tl.Name](args); err != nil {
			t.Fatalf("%s: the schema accepted %q but decoding refused it: %v", tl.Name, args, err)
		}
	})
}

// FuzzContent: memory and entry content arrives as a JSON string; any
// string the arguments check accepts is text PostgreSQL stores (valid
// UTF-8, no NUL).
func FuzzContent(f *testing.F) {
	r := kungfuRegistry(f)
	put, _ := r.Lookup("memory_put")
	post, _ := r.Lookup("thread_post")
	for _, s := range []string{`plain text`, `\u0000`, "\xff\xfe", `\ud800`, `\ud83d\ude00`, `tab\there`, "raw\x00nul", `AKIAIOSFODNN7EXAMPLE`, `\"`, `\`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, c := range []struct {
			tl   *Tool
			args []byte
		}{
			{put, append(append([]byte(`{"title":"t","tags":["a"],"content":"`), body...), `"}`...)},
			{post, append(append([]byte(`{"thread":"abc","content":"`), body...), `"}`...)},
		} {
			err := c.tl.Validate(c.args)
			if err != nil {
				if kungfu.AsError(err) == nil {
					t.Fatalf("%s: %v is not a protocol refusal", c.tl.Name, err)
				}
				continue
			}
			var in struct {
				Content string `json:"content"`
			}
			if err := decode(c.args, &in); err != nil {
				t.Fatalf("%s: accepted but not decodable: %v", c.tl.Name, err)
			}
			if !utf8.ValidString(in.Content) || strings.ContainsRune(in.Content, 0) {
				t.Fatalf("%s: accepted content PostgreSQL cannot store: %q", c.tl.Name, in.Content)
			}
		}
	})
}
