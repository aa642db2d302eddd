package schema

import (
	"strings"
	"testing"

	"github.com/dojo-relay/dojo/kungfu"
)

func TestCompileRefusesExternalRefs(t *testing.T) {
	for _, ref := range []string{"file:///etc/passwd", "https://example.org/s.json", "other.json"} {
		_, err := Compile([]byte(`{"$ref":"` + ref + `"}`))
		if err == nil || err.Error() != "external $ref is not allowed; inline every definition" {
			t.Errorf("$ref %s: %v", ref, err)
		}
	}
	for _, bad := range []string{`[1]`, `{"type":`, `"x"`} {
		if _, err := Compile([]byte(bad)); err == nil {
			t.Errorf("Compile(%s) accepted", bad)
		}
	}
	if _, err := Compile([]byte(`{"$defs":{"n":{"type":"integer"}},"properties":{"a":{"$ref":"#/$defs/n"}}}`)); err != nil {
		t.Fatalf("local $ref refused: %v", err)
	}
}

func TestMismatch(t *testing.T) {
	sch, err := Compile([]byte(`{"type":"object","properties":{"a/b":{"type":"integer"},"c":{"type":"string"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	e := kungfu.AsError(sch.Check(map[string]any{"a/b": "x", "c": 1.0}, "bad payload"))
	if e == nil || e.Code != kungfu.CodeSchemaMismatch || e.Message != "bad payload" {
		t.Fatalf("Mismatch: %v", e)
	}
	problems := e.Details.(map[string]any)["errors"].([]Problem)
	var ptrs []string
	for _, p := range problems {
		ptrs = append(ptrs, p.Pointer)
	}
	if got := strings.Join(ptrs, " "); !strings.Contains(got, "/a~1b") || !strings.Contains(got, "/c") {
		t.Fatalf("pointers %q", got)
	}
}

// TestCompileErrorsSpeakOfTheDocument: compile errors used to quote the
// library's internals (Dojo's base URL, metaschema URLs) and called an
// unknown $schema an external $ref.
func TestCompileErrorsSpeakOfTheDocument(t *testing.T) {
	for _, c := range []struct{ schema, want string }{
		{`{"type":"foo"}`, "not a valid JSON Schema: /type: "},
		{`{"properties":{"a":{"minLength":-1}}}`, "/properties/a/minLength: "},
		{`{"$dynamicRef":"#nope"}`, "anchor the schema does not define: #nope"},
		{`{"$ref":"#/$defs/missing"}`, "points at nothing in the schema: #/$defs/missing"},
		{`{"$schema":"https://example.com/my-dialect"}`, "$schema names a dialect Dojo does not know"},
		{`{"$ref":"https://example.com/other.json"}`, "external $ref is not allowed"},
	} {
		_, err := Compile([]byte(c.schema))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "dojo.invalid") ||
			strings.Contains(err.Error(), "json-schema.org/draft/2020-12/meta") {
			t.Errorf("%s: %v, want %q", c.schema, err, c.want)
		}
	}
}
