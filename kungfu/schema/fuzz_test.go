package schema

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/dojo-relay/dojo/kungfu"
)

// FuzzSchemaValidate: any schema and any payload are compiled and checked
// quickly, without panic, within a fixed allocation, and a mismatch lists
// at most MaxProblems short failures. A schema Compile refuses is tried
// with Load, as one stored before the bound existed.
func FuzzSchemaValidate(f *testing.F) {
	for _, s := range [][2]string{
		{attackSchema, nested(20)},
		{attackSchema, nested(16)},
		{attackSchema, nested(2)},
		{`{"items":{"type":"string"}}`, array(2000, "1")},
		{`{"properties":{"s":{"pattern":"[\\pL\\pN]{1000}x"}}}`, `{"s":"` + strings.Repeat("a", 20000) + `"}`},
		{`{"additionalProperties":{"enum":[1,2,3,1e400,{"a":[1.5]}]}}`, `{"a":1e-400,"b":2,"c":{"a":[1.50]}}`},
		{`{"uniqueItems":true,"items":{"$ref":"#"}}`, `[[],[[]],[[],[[]]]]`},
		{`{"$id":"https://dojo.invalid/t","$dynamicAnchor":"node","properties":{"kids":{"items":{"$dynamicRef":"#node"}}}}`, `{"kids":[{"kids":[]}]}`},
		{`{"$schema":"http://json-schema.org/draft-07/schema#","items":[{"format":"regex"},{"format":"email"}],"additionalItems":{"format":"uri"}}`, `["(?i)a","a@b","http://x"]`},
		{`{"multipleOf":1e-300,"maximum":1e300}`, `1e300`},
		{`{"$ref":"#"}`, `1`},
		{`{"propertyNames":{"pattern":"^a"},"patternProperties":{"b+":{"minLength":2}},"unevaluatedProperties":false}`, `{"ab":1,"bb":"x"}`},
		{`{"minLength":1000000,"maxLength":1}`, `"` + strings.Repeat("é", 100) + `"`},
		{`{"if":{"required":["a"]},"then":{"dependentSchemas":{"a":{"not":{"const":[1,{"b":null}]}}}},"else":false}`, `{"a":[1,{"b":null}]}`},
		{`{"contains":{"type":"integer"},"minContains":2,"prefixItems":[true,false],"unevaluatedItems":{"type":"string"}}`, `[1,1.0,"x",2e0]`},
	} {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	// Check's own budget (the modelled cost) is what bounds the work; this
	// wall-clock backstop is wide, because a fuzzing worker shares two
	// cores with another and a timing "crash" would be kept in testdata.
	limit := raceFactor * 2 * time.Second
	f.Fuzz(func(t *testing.T, raw, payload []byte) {
		if len(payload) > 512<<10 {
			return // above every payload limit
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		start := time.Now()
		s, err := Compile(raw)
		if err != nil {
			s, err = Load(raw)
		}
		if took := time.Since(start); took > limit {
			t.Fatalf("compiling %d bytes took %v", len(raw), took)
		}
		if err != nil {
			return
		}
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
		if err != nil {
			return
		}
		start = time.Now()
		err = s.Check(inst, "bad payload")
		if took := time.Since(start); took > limit {
			t.Fatalf("checking %d bytes took %v", len(payload), took)
		}
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 128<<20+16*uint64(len(payload)) {
			t.Fatalf("allocated %d MB", grew>>20)
		}
		if err == nil {
			return
		}
		e := kungfu.AsError(err)
		if e == nil || e.Code != kungfu.CodeSchemaMismatch {
			t.Fatalf("Check: %v", err)
		}
		ps := e.Details.(map[string]any)["errors"].([]Problem)
		if len(ps) == 0 || len(ps) > MaxProblems {
			t.Fatalf("%d problems", len(ps))
		}
		for _, p := range ps {
			if utf8.RuneCountInString(p.Message) > MaxMessage+1 {
				t.Fatalf("message of %d runes", utf8.RuneCountInString(p.Message))
			}
		}
	})
}
