package schema

import (
	"bytes"
	"errors"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/dojo-relay/dojo/kungfu"
)

// Printer renders validation messages in English.
var Printer = message.NewPrinter(language.English)

// Compile compiles a user's JSON Schema (draft 2020-12 unless it says
// otherwise) with no loader at all: every external $ref fails with one
// fixed message, so no file or URL is ever read and nothing about the
// server leaks through the error.
func Compile(raw []byte) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, errors.New("not JSON")
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, errors.New("must be a JSON Schema object")
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(jsonschema.SchemeURLLoader{})
	// A hierarchical base so relative refs resolve, and fail like any other
	// external ref; .invalid never resolves, and there is no loader anyway.
	const url = "https://dojo.invalid/user-schema.json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile(url)
	var load *jsonschema.LoadURLError
	if errors.As(err, &load) {
		return nil, errors.New("external $ref is not allowed; inline every definition")
	}
	return sch, err
}

// Problem is one failed check, located by JSON Pointer.
type Problem struct {
	Pointer string `json:"pointer"`
	Message string `json:"message"`
}

// Mismatch turns a validation error into SCHEMA_MISMATCH with
// details.errors listing every leaf failure.
func Mismatch(err error, message string) error {
	var out []Problem
	var verr *jsonschema.ValidationError
	if errors.As(err, &verr) {
		var walk func(e *jsonschema.ValidationError)
		walk = func(e *jsonschema.ValidationError) {
			if len(e.Causes) == 0 {
				out = append(out, Problem{Pointer: Pointer(e.InstanceLocation), Message: e.ErrorKind.LocalizedString(Printer)})
			}
			for _, c := range e.Causes {
				walk(c)
			}
		}
		walk(verr)
	}
	if len(out) == 0 {
		out = append(out, Problem{Message: err.Error()})
	}
	return kungfu.Errorf(kungfu.CodeSchemaMismatch, "%s", message).WithDetails(map[string]any{"errors": out})
}

// Pointer renders an instance location as an RFC 6901 JSON Pointer.
func Pointer(loc []string) string {
	var b strings.Builder
	for _, p := range loc {
		b.WriteString("/" + strings.ReplaceAll(strings.ReplaceAll(p, "~", "~0"), "/", "~1"))
	}
	return b.String()
}
