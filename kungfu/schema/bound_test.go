package schema

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/dojo-relay/dojo/kungfu"
)

// attackSchema is issue 7's schema: a $defs node whose property is a
// oneOf of two $refs to itself. Each level of nesting doubles the
// validator's work: 142 bytes nested 20 deep took 7 s and 1.7 GB, and 16
// deep answered with 32 768 errors in 3.2 MB.
const attackSchema = `{"$defs":{"n":{"type":"object","properties":{"a":{"oneOf":[{"$ref":"#/$defs/n"},{"$ref":"#/$defs/n"}]}}}},"$ref":"#/$defs/n"}`

func nested(depth int) string {
	return strings.Repeat(`{"a":`, depth) + "{}" + strings.Repeat("}", depth)
}

func decode(t testing.TB, s string) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(s))
	if err != nil {
		t.Fatalf("decode %.80s: %v", s, err)
	}
	return v
}

func list(n int, f func(i int) string) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = f(i)
	}
	return strings.Join(parts, ",")
}

func members(n int, value string) string {
	return "{" + list(n, func(i int) string { return fmt.Sprintf(`"p%d":%s`, i, value) }) + "}"
}

func array(n int, item string) string {
	return "[" + list(n, func(int) string { return item }) + "]"
}

func problems(t testing.TB, err error) (*kungfu.Error, []Problem) {
	t.Helper()
	e := kungfu.AsError(err)
	if e == nil || e.Code != kungfu.CodeSchemaMismatch {
		t.Fatalf("want SCHEMA_MISMATCH, got %v", err)
	}
	return e, e.Details.(map[string]any)["errors"].([]Problem)
}

// Reproduces issue 7 item 1: the attack schema is refused where it is
// given, with a reason.
func TestCompileRefusesIssueAttack(t *testing.T) {
	_, err := Compile([]byte(attackSchema))
	if err == nil || !strings.Contains(err.Error(), "grows too fast with nesting") {
		t.Fatalf("Compile(attack) = %v", err)
	}
}

// Reproduces issue 7 item 1 for a schema stored before the bound existed:
// the payloads of the issue are refused at once instead of running for
// seconds, and shallow ones still reach the validator.
func TestCheckRefusesIssueAttackQuickly(t *testing.T) {
	s, err := Load([]byte(attackSchema))
	if err != nil {
		t.Fatal(err)
	}
	for _, depth := range []int{16, 20, 22} {
		inst := decode(t, nested(depth))
		start := time.Now()
		err := s.Check(inst, "bad payload")
		if took := time.Since(start); took > raceFactor*50*time.Millisecond {
			t.Errorf("depth %d: Check took %v", depth, took)
		}
		_, ps := problems(t, err)
		if len(ps) != 1 || ps[0].Pointer != "" || !strings.Contains(ps[0].Message, "would take too long") {
			t.Errorf("depth %d: %+v", depth, ps)
		}
	}
	_, ps := problems(t, s.Check(decode(t, nested(2)), "bad payload"))
	if strings.Contains(ps[0].Message, "too long") {
		t.Fatalf("a shallow payload was refused by the budget: %+v", ps)
	}
}

// Reproduces issue 7 item 1's 32 768-error answer: at most MaxProblems
// failures are listed, sorted, and the rest counted.
func TestMismatchCapped(t *testing.T) {
	s, err := Compile([]byte(`{"items":{"type":"string"}}`))
	if err != nil {
		t.Fatal(err)
	}
	e, ps := problems(t, s.Check(decode(t, array(5000, "1")), "bad"))
	d := e.Details.(map[string]any)
	if len(ps) != MaxProblems || d["truncated"] != true || d["omitted"] != 5000-MaxProblems {
		t.Fatalf("details: %d problems, %v", len(ps), d)
	}
	if ps[0].Pointer != "/0" || ps[1].Pointer != "/1" || ps[2].Pointer != "/10" {
		t.Fatalf("not in pointer order: %+v", ps[:3])
	}
	// A message quoting a long value is clipped.
	s, err = Compile([]byte(`{"pattern":"^a+$"}`))
	if err != nil {
		t.Fatal(err)
	}
	_, ps = problems(t, s.Check(strings.Repeat("b", 10000), "bad"))
	if n := len([]rune(ps[0].Message)); n > MaxMessage+1 {
		t.Fatalf("message of %d runes", n)
	}
	// Few failures: listed whole, nothing said about truncation.
	e, ps = problems(t, s.Check("b", "bad"))
	if len(ps) != 1 || e.Details.(map[string]any)["truncated"] != nil {
		t.Fatalf("details: %v", e.Details)
	}
}

func TestCompileLimits(t *testing.T) {
	patterns := func(n int, f func(i int) string) string {
		return `{"properties":{` + list(n, func(i int) string { return fmt.Sprintf(`"p%d":{"pattern":%q}`, i, f(i)) }) + `}}`
	}
	for _, c := range []struct{ name, schema, want string }{
		{"size", `{"enum":` + array(9000, `"abc"`) + `}`, "larger than 32768 bytes"},
		{"nesting", strings.Repeat(`{"not":`, 40) + "{}" + strings.Repeat("}", 40), "nested deeper than 32 levels"},
		{"objects", `{"allOf":[` + list(600, func(int) string { return "{}" }) + `]}`, "more than 500 objects"},
		{"long number", `{"const":1` + strings.Repeat("0", 600) + `}`, "more than 512 digits"},
		{"huge exponent", `{"minimum":1e600}`, "more than 512 digits"},
		{"tiny multipleOf", `{"multipleOf":1e-999999}`, "more than 512 digits"},
		{"pattern bytes", patterns(30, func(i int) string { return fmt.Sprintf("^%d[a-z]{1,3}", i) + strings.Repeat("x", 80) }), "more than 2048 bytes"},
		{"unicode classes", patterns(70, func(i int) string { return fmt.Sprintf(`\pL%d`, i) }), "Unicode classes"},
		{"case folding", `{"pattern":"(?i)[\\x{41}-\\x{1E921}]"}`, "inline flags"},
		{"program size", patterns(12, func(i int) string { return fmt.Sprintf(".{1000}%d", i) }), "too large"},
		{"recursiveRef", `{"$schema":"https://json-schema.org/draft/2019-09/schema","$recursiveAnchor":true,"items":{"$recursiveRef":"#"}}`, "$recursiveRef"},
		{"self ref", `{"$ref":"#"}`, "endless loop"},
		{"ref loop", `{"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/b"}]},"b":{"allOf":[{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"}`, "endless loop"},
		{"fan-out", `{"$defs":{` + list(30, func(i int) string {
			return fmt.Sprintf(`"d%d":{"allOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%d"}]}`, i, i+1, i+1)
		}) + `,"d30":{}},"$ref":"#/$defs/d0"}`, "checking one value would evaluate"},
		{"discriminated recursion", `{"$defs":{"n":{"oneOf":[{"properties":{"k":{"const":"a"},"c":{"$ref":"#/$defs/n"}}},{"properties":{"k":{"const":"b"},"c":{"$ref":"#/$defs/n"}}}]}},"$ref":"#/$defs/n"}`, "grows too fast"},
		// The dearest $dynamicAnchor counts even when nothing refers to it:
		// the tree's $dynamicRef resolves to the root's "node", which doubles.
		{"dynamic anchor", `{"$defs":{"node":{"$dynamicAnchor":"node","properties":{"a":{"oneOf":[{"$dynamicRef":"#node"},{"$dynamicRef":"#node"}]}}},
			"tree":{"$id":"https://dojo.invalid/tree","$dynamicAnchor":"node","properties":{"a":{"$dynamicRef":"#node"}}}},
			"$ref":"https://dojo.invalid/tree"}`, "grows too fast"},
	} {
		_, err := Compile([]byte(c.schema))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Compile = %v, want %q", c.name, err, c.want)
		}
	}
}

func TestCompileAccepts(t *testing.T) {
	for name, s := range map[string]string{
		"task output": `{"type":"object","required":["url"],"properties":{"url":{"type":"string","format":"uri","pattern":"^https://"},
			"tags":{"type":"array","items":{"enum":["a","b","c"]},"uniqueItems":true,"maxItems":10},
			"score":{"type":"number","minimum":0,"maximum":1,"multipleOf":0.01}},"additionalProperties":false}`,
		"tree": `{"$defs":{"n":{"type":"object","properties":{"name":{"type":"string"},"kids":{"type":"array","items":{"$ref":"#/$defs/n"}}},
			"required":["name"]}},"$ref":"#/$defs/n"}`,
		"dynamic tree": `{"$id":"https://dojo.invalid/t","$dynamicAnchor":"node","type":"object",
			"properties":{"kids":{"type":"array","items":{"$dynamicRef":"#node"}}}}`,
		"draft-07": `{"$schema":"http://json-schema.org/draft-07/schema#","definitions":{"s":{"type":"string","format":"email"}},
			"items":[{"$ref":"#/definitions/s"}],"additionalItems":false,"dependencies":{"a":["b"]}}`,
		"unevaluated": `{"allOf":[{"properties":{"a":{}}}],"unevaluatedProperties":false,"propertyNames":{"pattern":"^[a-z]+$"}}`,
	} {
		if _, err := Compile([]byte(s)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A schema stored before today's limits is not a 500 at submission.
func TestCheckStoredUnloadable(t *testing.T) {
	old := strings.Repeat(`{"not":`, 40) + "{}" + strings.Repeat("}", 40)
	_, ps := problems(t, CheckStored([]byte(old), decode(t, `{}`), "bad"))
	if !strings.Contains(ps[0].Message, "cannot be checked any more") {
		t.Fatalf("%+v", ps)
	}
}

// Every check either fits the budget and runs, or is refused before it
// starts; none takes long either way. Each case was slow before the
// bound (the comment gives the time measured unbounded).
func TestCheckBudget(t *testing.T) {
	deepTree := strings.Repeat(`{"name":"x","kids":[`, 30) + `{"name":"y"}` + strings.Repeat("]}", 30)
	for _, c := range []struct {
		name, schema, payload string
		refused               bool
	}{
		{"pattern on 200 KB (10 s)", `{"properties":{"s":{"pattern":"[\\pL\\pN]{1000}x"}}}`, `{"s":"` + strings.Repeat("a", 200000) + `"}`, true},
		{"numeric enum (2.8 s)", `{"additionalProperties":{"enum":[` + list(3000, func(i int) string { return fmt.Sprint(i) }) + `]}}`, members(30000, "1"), true},
		{"100 000 exact parses (0.3 s)", `{"items":{"minimum":5}}`, array(100000, "1"), true},
		{"pairwise uniqueItems", `{"items":{"uniqueItems":true}}`, array(10000, `[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]`), true},
		{"patternProperties", `{"patternProperties":{"(.*){100}x":{}}}`, members(20000, "1"), true},
		{"unevaluated sets (0.1 s)", `{"allOf":[{},{},{},{},{},{},{},{},{},{}],"unevaluatedProperties":false}`, members(40000, "1"), true},
		{"regex format", `{"$schema":"http://json-schema.org/draft-07/schema#","format":"regex"}`, `"` + strings.Repeat(`[\\pL-\\pN]`, 2000) + `"`, true},
		{"30 000 strings", `{"additionalProperties":{"type":"string"}}`, members(30000, `"x"`), false},
		{"150 KB string, simple pattern", `{"properties":{"s":{"pattern":"^[A-Za-z0-9+/]*$"}}}`, `{"s":"` + strings.Repeat("a", 150000) + `"}`, false},
		{"deep tree", `{"$defs":{"n":{"type":"object","properties":{"name":{"type":"string"},"kids":{"type":"array","items":{"$ref":"#/$defs/n"}}},"required":["name"]}},"$ref":"#/$defs/n"}`, deepTree, false},
	} {
		s, err := Load([]byte(c.schema))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		inst := decode(t, c.payload)
		start := time.Now()
		err = s.Check(inst, "bad")
		took := time.Since(start)
		refused := err != nil && strings.Contains(fmt.Sprint(kungfu.AsError(err).Details), "would take too long")
		if refused != c.refused {
			t.Errorf("%s: refused=%v: %v", c.name, refused, err)
		}
		if took > raceFactor*100*time.Millisecond {
			t.Errorf("%s: Check took %v", c.name, took)
		}
	}
}

// The payload's own bounds: nesting and number literals.
func TestCheckPayloadBounds(t *testing.T) {
	s, err := Compile([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	_, ps := problems(t, s.Check(decode(t, `{"a":`+strings.Repeat("[", MaxDepth)+strings.Repeat("]", MaxDepth)+`}`), "bad"))
	if ps[0].Pointer != "/a"+strings.Repeat("/0", MaxDepth-1) || !strings.Contains(ps[0].Message, "nested deeper") {
		t.Fatalf("%+v", ps)
	}
	if err := s.Check(decode(t, strings.Repeat("[", MaxDepth)+strings.Repeat("]", MaxDepth)), "bad"); err != nil {
		t.Fatalf("nesting of exactly MaxDepth: %v", err)
	}
	_, ps = problems(t, s.Check(decode(t, `{"n":[1,1e999999]}`), "bad"))
	if ps[0].Pointer != "/n/1" || !strings.Contains(ps[0].Message, "digits") {
		t.Fatalf("%+v", ps)
	}
}

// PostgreSQL stores a schema's numbers written out in full: what Compile
// accepted must still load after the round trip.
func TestLoadNumbersWrittenOut(t *testing.T) {
	given := `{"maximum":1e400,"multipleOf":1e-400,"enum":[1.5e-10,` + strings.Repeat("9", 100) + `e400]}`
	stored := `{"maximum":1` + strings.Repeat("0", 400) + `,"multipleOf":0.` + strings.Repeat("0", 399) + `1,` +
		`"enum":[0.00000000015,` + strings.Repeat("9", 100) + strings.Repeat("0", 400) + `]}`
	if _, err := Compile([]byte(given)); err != nil {
		t.Fatal(err)
	}
	s, err := Load([]byte(stored))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(decode(t, `1.5e-10`), "bad"); err != nil {
		t.Fatal(err)
	}
}

// The model must not undercount: a check it lets through runs within
// twice its modelled time.
func TestCheckModelHolds(t *testing.T) {
	for name, c := range map[string][2]string{
		"strings":       {`{"additionalProperties":{"type":"string"}}`, members(20000, "1")},
		"integers":      {`{"items":{"type":"integer","minimum":0}}`, array(8000, "12345")},
		"unevaluated":   {`{"allOf":[{},{}],"unevaluatedProperties":{"type":"number"}}`, members(10000, `"x"`)},
		"enum":          {`{"items":{"enum":[` + list(300, func(i int) string { return fmt.Sprintf(`"v%d"`, i) }) + `]}}`, array(3000, `"zz"`)},
		"pattern":       {`{"items":{"pattern":"(a|b)*c"}}`, array(20, `"`+strings.Repeat("ab", 2000)+`"`)},
		"uniqueItems":   {`{"uniqueItems":true}`, array(5000, `{"a":[1,2]}`)},
		"propertyNames": {`{"propertyNames":{"maxLength":3,"pattern":"^p"}}`, members(10000, "1")},
	} {
		s, err := Load([]byte(c[0]))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		inst := decode(t, c[1])
		shape, p := measure(inst, s.keys)
		if p != nil {
			t.Fatalf("%s: %+v", name, p)
		}
		model := time.Duration(s.cost(shape))
		if model > Budget {
			t.Fatalf("%s: modelled %v, over the budget", name, model)
		}
		start := time.Now()
		_ = s.sch.Validate(inst)
		if took := time.Since(start); took > raceFactor*2*model {
			t.Errorf("%s: took %v, modelled %v", name, took, model)
		}
	}
}

func BenchmarkCheck(b *testing.B) {
	s, err := Compile([]byte(`{"type":"object","required":["url","title"],"additionalProperties":false,"properties":{
		"url":{"type":"string","format":"uri","pattern":"^https://"},"title":{"type":"string","minLength":1,"maxLength":200},
		"tags":{"type":"array","items":{"type":"string","enum":["bug","feature","docs"]},"uniqueItems":true},
		"score":{"type":"number","minimum":0,"maximum":1},"notes":{"type":"object","additionalProperties":{"type":"string"}}}}`))
	if err != nil {
		b.Fatal(err)
	}
	raw := []byte(`{"url":"https://example.org/x","title":"A title","tags":["bug","docs"],"score":0.5,
		"notes":{"a":"` + strings.Repeat("n", 500) + `","b":"c"}}`)
	b.ReportAllocs()
	for b.Loop() {
		inst, _ := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err := s.Check(inst, "bad"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCompile(b *testing.B) {
	raw := []byte(`{"$defs":{"n":{"type":"object","properties":{"name":{"type":"string"},"kids":{"type":"array","items":{"$ref":"#/$defs/n"}}},
		"required":["name"]}},"$ref":"#/$defs/n"}`)
	for b.Loop() {
		if _, err := Compile(raw); err != nil {
			b.Fatal(err)
		}
	}
}
