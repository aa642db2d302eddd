package relay_test

import (
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/dojo-relay/dojo/kungfu/tool"
)

// hostile are argument values a stranger may send in place of any field:
// each has broken a server somewhere (overflow, int4 columns, float
// parsing, text PostgreSQL refuses, type confusion, nesting).
var hostile = []string{
	`4611686018427387904`, `-9223372036854775809`, `2147483648`, `1e400`, `-0.0`, `1.5`,
	`"\u0000"`, `"\ud800"`, `"` + strings.Repeat("x", 70000) + `"`, `""`,
	`{"a":{"a":{"a":{"a":{"a":{"a":[[[[[[]]]]]]}}}}}}`, `[1,"a",null,{}]`, `null`, `true`,
}

// TestNoInternalErrorFromArguments sends every hostile value in place of
// every argument of every tool, over both doors, with a live account:
// whatever Dojo thinks of it, the answer is a refusal of the input, never
// a 500 (INTERNAL_ERROR over MCP).
func TestNoInternalErrorFromArguments(t *testing.T) {
	t.Parallel()
	d := start(t)
	key, _ := d.register(t)
	reg, err := tool.NewRegistry(tool.Kungfu(tool.Services{})...)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	for _, tl := range reg.Tools() {
		var sch struct {
			Properties map[string]json.RawMessage `json:"properties"`
		}
		if err := json.Unmarshal([]byte(tl.Schema), &sch); err != nil {
			t.Fatalf("%s schema: %v", tl.Name, err)
		}
		props := make([]string, 0, len(sch.Properties))
		for p := range sch.Properties {
			props = append(props, p)
		}
		sort.Strings(props)
		for _, p := range props {
			for _, v := range hostile {
				args := `{"` + p + `":` + v + `}`
				if r := post(t, d.URL+"/api/v1/"+tl.Name, key, []byte(args)); r.Status >= 500 || r.code() == "INTERNAL_ERROR" {
					t.Errorf("api %s %.80s: %d %.300s", tl.Name, args, r.Status, r.Raw)
				}
				r := post(t, d.URL+"/mcp", key, mcpCall(tl.Name, args), mcpAccept...)
				if r.Status != http.StatusOK || strings.Contains(r.Raw, `"INTERNAL_ERROR"`) {
					t.Errorf("mcp %s %.80s: %d %.300s", tl.Name, args, r.Status, r.Raw)
				}
				calls += 2
			}
		}
	}
	if calls < 1000 {
		t.Fatalf("only %d calls: the tool list is not being walked", calls)
	}
}
