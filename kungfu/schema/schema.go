package schema

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/dojo-relay/dojo/kungfu"
)

// Printer renders validation messages in English.
var Printer = message.NewPrinter(language.English)

// Limits of what a check against a user schema reports.
const (
	// MaxProblems is how many failures SCHEMA_MISMATCH lists; the rest are
	// counted in details.omitted. A payload that fails everywhere would
	// otherwise echo itself many times over.
	MaxProblems = 32
	// MaxMessage is the longest message of one failure, in runes: some
	// messages quote the value or the whole enum.
	MaxMessage = 200
)

// base is the schema's own URL: hierarchical so relative refs resolve, and
// fail like any other external ref; .invalid never resolves, and there is
// no loader anyway.
const base = "https://dojo.invalid/user-schema.json"

// Schema is a compiled user schema with the bound on the work of checking
// one value against it, level by level of nesting.
type Schema struct {
	sch    *jsonschema.Schema
	bound  []work // bound[d]: one value d levels deep, at most
	keys   bool   // propertyNames is used: member names are checked as values
	uneval bool   // unevaluated* is used: evaluations copy member sets
}

// Compile compiles a schema a user gives now (task_create, task_update,
// an assignment): the document must fit the limits in limit.go, and the
// work of checking a value nested MaxDepth levels deep must fit a
// quarter of the budget, so a schema whose work multiplies with nesting
// is refused here with a reason rather than at every submission.
//
// No loader is installed: every external $ref fails with one fixed
// message, so no file or URL is ever read and nothing about the server
// leaks through the error.
func Compile(raw []byte) (*Schema, error) {
	s, err := Load(raw)
	if err != nil {
		return nil, err
	}
	if err := s.thin(); err != nil {
		return nil, err
	}
	return s, nil
}

// Load compiles a schema stored earlier, without the nesting test of
// Compile: a schema accepted before that test existed still checks every
// payload that fits the budget, and refuses the others quickly.
func Load(raw []byte) (*Schema, error) {
	if len(raw) > MaxBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxBytes)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, errors.New("not JSON")
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, errors.New("must be a JSON Schema object")
	}
	if err := scan(doc); err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(jsonschema.SchemeURLLoader{})
	re := &engine{seen: map[string]*pattern{}}
	c.UseRegexpEngine(re.compile)
	if err := c.AddResource(base, doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile(base)
	var g *schemaGraph
	if err == nil {
		// Still compiling: graph may compile $dynamicAnchor targets.
		g, err = graph(c, sch, doc)
	}
	re.done()
	if re.err != nil {
		return nil, re.err
	}
	if err != nil {
		return nil, explain(err, doc)
	}
	return &Schema{sch: sch, bound: g.bounds(MaxDepth), keys: g.keys, uneval: g.uneval}, nil
}

// Check validates a decoded payload (numbers as json.Number, as
// jsonschema.UnmarshalJSON gives them) and returns nil or
// SCHEMA_MISMATCH with message. Before running the validator it measures
// the payload and refuses, as a mismatch at the root, one whose bound
// exceeds Budget: the submitter can send a smaller or flatter payload,
// and nothing else can make the check affordable.
func (s *Schema) Check(inst any, message string) error {
	shape, err := measure(inst, s.keys)
	if err != nil {
		return mismatch(message, []Problem{*err}, 0)
	}
	if cost := s.cost(shape); cost > Budget {
		return mismatch(message, []Problem{{Message: "checking this payload against the schema would take too long; send a smaller or less nested payload"}}, 0)
	}
	if err := s.sch.Validate(inst); err != nil {
		return Mismatch(err, message)
	}
	return nil
}

// CheckStored checks a payload against a stored schema (see Load). A
// schema stored before today's limits that no longer compiles refuses
// every payload with the reason: only its author can replace it.
func CheckStored(raw []byte, inst any, message string) error {
	s, err := Load(raw)
	if err != nil {
		return mismatch(message, []Problem{{Message: clip("the schema cannot be checked any more (" + err.Error() + "); its author must replace it")}}, 0)
	}
	return s.Check(inst, message)
}

// Problem is one failed check, located by JSON Pointer.
type Problem struct {
	Pointer string `json:"pointer"`
	Message string `json:"message"`
}

// Mismatch turns a validation error into SCHEMA_MISMATCH with
// details.errors listing at most MaxProblems leaf failures, the first in
// instance order, and details.omitted counting the others. Only the kept
// failures are rendered: a message may quote the whole value.
func Mismatch(err error, message string) error {
	var verr *jsonschema.ValidationError
	if !errors.As(err, &verr) {
		return mismatch(message, []Problem{{Message: clip(err.Error())}}, 0)
	}
	// Kept sorted while walking, so the same payload reports the same
	// failures (the validator visits members in map order) without
	// sorting them all.
	var kept []*jsonschema.ValidationError
	leaves := 0
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		for _, c := range e.Causes {
			walk(c)
		}
		if len(e.Causes) > 0 {
			return
		}
		leaves++
		if len(kept) == MaxProblems && !before(e.InstanceLocation, kept[MaxProblems-1].InstanceLocation) {
			return
		}
		i := sort.Search(len(kept), func(i int) bool { return before(e.InstanceLocation, kept[i].InstanceLocation) })
		if len(kept) < MaxProblems {
			kept = append(kept, nil)
		}
		copy(kept[i+1:], kept[i:])
		kept[i] = e
	}
	walk(verr)
	out := make([]Problem, len(kept))
	for i, e := range kept {
		out[i] = Problem{Pointer: Pointer(e.InstanceLocation), Message: clip(e.ErrorKind.LocalizedString(Printer))}
	}
	return mismatch(message, out, leaves-len(kept))
}

// before orders instance locations token by token, parents first.
func before(a, b []string) bool {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

func mismatch(message string, problems []Problem, omitted int) error {
	details := map[string]any{"errors": problems}
	if omitted > 0 {
		details["truncated"] = true
		details["omitted"] = omitted
	}
	return kungfu.Errorf(kungfu.CodeSchemaMismatch, "%s", message).WithDetails(details)
}

func clip(s string) string {
	if utf8.RuneCountInString(s) <= MaxMessage {
		return s
	}
	r := []rune(s)
	return string(r[:MaxMessage]) + "…"
}

// Pointer renders an instance location as an RFC 6901 JSON Pointer.
func Pointer(loc []string) string {
	var b strings.Builder
	for _, p := range loc {
		b.WriteString("/" + strings.ReplaceAll(strings.ReplaceAll(p, "~", "~0"), "/", "~1"))
	}
	return b.String()
}

// explain turns the library's compile errors into a sentence about the
// user's own document: JSON Pointers into it rather than Dojo's internal
// base URL, and no quoting of the library's metaschema URLs.
func explain(err error, doc any) error {
	var (
		load    *jsonschema.LoadURLError
		meta    *jsonschema.SchemaValidationError
		anchor  *jsonschema.AnchorNotFoundError
		pointer *jsonschema.JSONPointerNotFoundError
		draft   *jsonschema.UnsupportedDraftError
		vocab   *jsonschema.UnsupportedVocabularyError
	)
	switch {
	case errors.As(err, &load):
		if m, _ := doc.(map[string]any); m != nil && m["$schema"] == load.URL {
			return errors.New("$schema names a dialect Dojo does not know; use https://json-schema.org/draft/2020-12/schema or leave it out")
		}
		return errors.New("external $ref is not allowed; inline every definition")
	case errors.As(err, &draft), errors.As(err, &vocab):
		return errors.New("$schema names a dialect Dojo does not know; use https://json-schema.org/draft/2020-12/schema or leave it out")
	case errors.As(err, &meta):
		var verr *jsonschema.ValidationError
		if errors.As(meta.Err, &verr) {
			var out []string
			var walk func(e *jsonschema.ValidationError)
			walk = func(e *jsonschema.ValidationError) {
				if len(e.Causes) == 0 && len(out) < 3 {
					at := Pointer(e.InstanceLocation)
					if at == "" {
						at = "/"
					}
					out = append(out, at+": "+clip(e.ErrorKind.LocalizedString(Printer)))
				}
				for _, c := range e.Causes {
					walk(c)
				}
			}
			walk(verr)
			if len(out) > 0 {
				return errors.New("not a valid JSON Schema: " + strings.Join(out, "; "))
			}
		}
		return errors.New("not a valid JSON Schema")
	case errors.As(err, &anchor):
		return fmt.Errorf("a reference names an anchor the schema does not define: %s", local(anchor.Reference))
	case errors.As(err, &pointer):
		return fmt.Errorf("a $ref points at nothing in the schema: %s", local(pointer.URL))
	}
	return errors.New(local(err.Error()))
}

// local strips the schema's internal base URL from a reference.
func local(s string) string { return strings.ReplaceAll(s, base, "") }
