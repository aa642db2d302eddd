package tool

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dojo-relay/dojo/kungfu"
)

func testTool(t *testing.T) *Tool {
	t.Helper()
	tl := &Tool{Name: "t", Schema: `{"type":"object","properties":{"a":{"type":"string"},"n":{"type":"integer"},
		"o":{"type":"object","properties":{"x":{"type":"string"}},"additionalProperties":false}},"required":["a"],"additionalProperties":false}`,
		Handler: Decode(func(_ context.Context, _ kungfu.Caller, in struct{ A string }) (any, error) { return in, nil })}
	if _, err := NewRegistry(tl); err != nil {
		t.Fatal(err)
	}
	return tl
}

func TestValidate(t *testing.T) {
	tl := testTool(t)
	cases := []struct {
		args, code, field string
	}{
		{`{"a":"x"}`, "", ""},
		{`{"a":"x","n":3}`, "", ""},
		{`{}`, "MISSING_FIELD", ""},
		{``, "MISSING_FIELD", ""},
		{`{"a":"x","bogus":1}`, "VALIDATION_FAILED", "bogus"},
		{`{"a":"x","o":{"y":1}}`, "VALIDATION_FAILED", "o.y"},
		{`{"a":1}`, "VALIDATION_FAILED", "a"},
		{`{"a":"x","n":1.5}`, "VALIDATION_FAILED", "n"},
		{`[1]`, "VALIDATION_FAILED", ""},
		{`{"a":`, "VALIDATION_FAILED", ""},
		{`{"bogus":1}`, "VALIDATION_FAILED", "bogus"},
	}
	for _, c := range cases {
		err := tl.Validate(json.RawMessage(c.args))
		e := kungfu.AsError(err)
		switch {
		case c.code == "" && err != nil:
			t.Errorf("%s: unexpected %v", c.args, err)
		case c.code != "" && (e == nil || e.Code != c.code):
			t.Errorf("%s: got %v, want %s", c.args, err, c.code)
		case c.field != "":
			b, _ := json.Marshal(e.Details)
			if !strings.Contains(string(b), `"field":"`+c.field+`"`) {
				t.Errorf("%s: details %s do not name %s", c.args, b, c.field)
			}
		}
	}
}

func TestNewRegistryRejectsMistakes(t *testing.T) {
	a := &Tool{Name: "a", Schema: `{"type":"object"}`}
	if _, err := NewRegistry(a, &Tool{Name: "a", Schema: `{"type":"object"}`}); err == nil {
		t.Error("duplicate name accepted")
	}
	if _, err := NewRegistry(&Tool{Name: "b", Schema: `{"type":"object","properties":{"x":{"type":"strin"}}}`}); err == nil {
		t.Error("invalid schema accepted")
	}
	if _, err := NewRegistry(&Tool{Name: "c", Schema: `{not json`}); err == nil {
		t.Error("malformed schema accepted")
	}
	// A prefetched read is sent before the caller and its rate limit are
	// known: a tool that writes must never do that.
	writes := &Tool{Name: "d", Schema: `{"type":"object"}`, Prefetch: func(*pgx.Batch, kungfu.Gate, json.RawMessage) Handler { return nil }}
	if _, err := NewRegistry(writes); err == nil {
		t.Error("a prefetch on a tool that writes was accepted")
	}
}

func TestKungfuToolsAreWellFormed(t *testing.T) {
	r, err := NewRegistry(Kungfu(Services{})...)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range r.Tools() {
		var s map[string]any
		if err := json.Unmarshal([]byte(tl.Schema), &s); err != nil || s["type"] != "object" || s["additionalProperties"] != false {
			t.Errorf("%s: schema must be an object refusing unknown arguments", tl.Name)
		}
		if tl.Description == "" || tl.Group == "" || tl.Handler == nil {
			t.Errorf("%s: incomplete definition", tl.Name)
		}
	}
	if md := Markdown(r); !strings.Contains(md, "### `account_register`") || !strings.Contains(md, "public (no key)") {
		t.Error("markdown incomplete")
	}
}
