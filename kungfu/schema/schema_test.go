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
