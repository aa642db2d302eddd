package tool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/schema"
	"github.com/dojo-relay/dojo/kungfu/userjson"
)

// Integer ranges of argument schemas. Every integer argument states one,
// so a number its Go field or column cannot hold is VALIDATION_FAILED
// naming the field before anything decodes it. Counts, seconds and pages
// are int32 (INT columns; the services clamp or refuse within that range),
// row ids int64, credits 1 to 2^53-1 as the protocol bounds money.
const (
	int32Range = `"minimum":-2147483648,"maximum":2147483647`
	idRange    = `"minimum":1,"maximum":9223372036854775807`
	moneyRange = `"minimum":1,"maximum":9007199254740991`
	// page is 1-based; its bound keeps (page-1)*page_size far from overflow.
	pageProp     = `{"type":"integer","minimum":1,"maximum":2147483647,"description":"1-based, default 1"}`
	pageSizeProp = `{"type":"integer",` + int32Range + `,"description":"default 20, max 100 (larger reads as 100)"}`
)

// Handler runs one tool for the caller with arguments that already passed
// the tool's schema. It returns the tool's own result fields (a struct or
// map that marshals to a JSON object) or an error.
type Handler func(ctx context.Context, who kungfu.Caller, args json.RawMessage) (any, error)

// Tool is one protocol tool.
type Tool struct {
	Name        string
	Group       string
	Description string
	// Schema is the JSON Schema (draft 2020-12) of the arguments object.
	Schema string
	// Public tools accept anonymous callers.
	Public bool
	// Signed tools act on the signing key itself (rotation, revocation):
	// only a call that carries a kd-mcp-v1 signature may run them.
	Signed bool
	// Limit names the rate-limit action charged per call ("" = none).
	Limit string
	// LimitByIP charges the client address instead of the account.
	LimitByIP bool
	// ReadOnly tools only read: one may run while its rate-limit verdict
	// is still out, since a refused call's result is dropped and nothing
	// of it stays. A tool that writes must never set it, or its write could
	// commit before a refusal (TestReadOnlyTools runs each on a read-only
	// database).
	ReadOnly bool
	Handler  Handler
	// Prefetch, when set, queues the tool's first read on b for args that
	// passed the schema, so that read travels in the PostgreSQL round trip
	// that authenticates the caller, and returns the handler that finishes
	// the call from it once b is sent and closed. The read must find
	// nothing unless gate holds (the caller's credential is good). It
	// returns nil when these args need another read first; Handler runs
	// then. Only a ReadOnly tool may have one: the read is sent before the
	// caller and its rate limit are known.
	Prefetch func(b *pgx.Batch, gate kungfu.Gate, args json.RawMessage) Handler

	compiled *jsonschema.Schema
}

// Advisor is implemented by results that set next_action or retry_after.
type Advisor interface {
	Advice() (nextAction string, retryAfter *int)
}

// Registry is the ordered set of tools.
type Registry struct {
	tools  []*Tool
	byName map[string]*Tool
}

// NewRegistry compiles every tool's schema; a bad schema is a programming
// error reported at startup, not at the first call.
func NewRegistry(tools ...*Tool) (*Registry, error) {
	r := &Registry{byName: map[string]*Tool{}}
	for _, t := range tools {
		if _, dup := r.byName[t.Name]; dup {
			return nil, fmt.Errorf("tool %s defined twice", t.Name)
		}
		if t.Prefetch != nil && !t.ReadOnly {
			return nil, fmt.Errorf("tool %s: only a read-only tool may prefetch", t.Name)
		}
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(t.Schema))
		if err != nil {
			return nil, fmt.Errorf("tool %s: schema: %w", t.Name, err)
		}
		c := jsonschema.NewCompiler()
		c.DefaultDraft(jsonschema.Draft2020)
		url := "dojo:tool/" + t.Name
		if err := c.AddResource(url, doc); err != nil {
			return nil, fmt.Errorf("tool %s: schema: %w", t.Name, err)
		}
		if t.compiled, err = c.Compile(url); err != nil {
			return nil, fmt.Errorf("tool %s: schema: %w", t.Name, err)
		}
		r.tools = append(r.tools, t)
		r.byName[t.Name] = t
	}
	return r, nil
}

// Lookup finds a tool by name.
func (r *Registry) Lookup(name string) (*Tool, bool) {
	t, ok := r.byName[name]
	return t, ok
}

// Tools returns the tools in definition order.
func (r *Registry) Tools() []*Tool { return slices.Clone(r.tools) }

// Validate checks raw arguments against the tool's schema. Absent arguments
// are an empty object. A missing required argument is MISSING_FIELD; any
// other mismatch, an unknown argument included, is VALIDATION_FAILED naming
// each field.
func (t *Tool) Validate(args json.RawMessage) error {
	if len(bytes.TrimSpace(args)) == 0 || string(bytes.TrimSpace(args)) == "null" {
		args = json.RawMessage(`{}`)
	}
	// The strict read comes first: the schema, the credential filter and
	// the stores must all see the one document the caller sent.
	if err := userjson.Validate("", args); err != nil {
		return err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return kungfu.Invalid(kungfu.FieldError{Field: "", Message: "arguments must be a JSON object"})
	}
	if _, ok := inst.(map[string]any); !ok {
		return kungfu.Invalid(kungfu.FieldError{Field: "", Message: "arguments must be a JSON object"})
	}
	err = t.compiled.Validate(inst)
	if err == nil {
		return nil
	}
	verr, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return fmt.Errorf("validate %s: %w", t.Name, err)
	}
	var (
		fields  []kungfu.FieldError
		missing []string
	)
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		at := strings.Join(e.InstanceLocation, ".")
		switch k := e.ErrorKind.(type) {
		case *kind.AdditionalProperties:
			for _, p := range k.Properties {
				fields = append(fields, kungfu.FieldError{Field: join(at, p), Message: "unknown argument"})
			}
		case *kind.Required:
			for _, p := range k.Missing {
				missing = append(missing, join(at, p))
			}
		// Bounds are printed exactly: the library's float rendering makes
		// 2147483648 and 2^63 unreadable, and a huge value is not echoed.
		case *kind.Minimum:
			fields = append(fields, kungfu.FieldError{Field: at, Message: "must be at least " + k.Want.RatString()})
		case *kind.Maximum:
			fields = append(fields, kungfu.FieldError{Field: at, Message: "must be at most " + k.Want.RatString()})
		default:
			fields = append(fields, kungfu.FieldError{Field: at, Message: e.ErrorKind.LocalizedString(schema.Printer)})
		}
	}
	walk(verr)
	if len(fields) == 0 && len(missing) > 0 {
		return kungfu.Errorf(kungfu.CodeMissingField, "%s is required", strings.Join(missing, ", ")).
			WithDetails(map[string]any{"missing": missing})
	}
	for _, m := range missing {
		fields = append(fields, kungfu.FieldError{Field: m, Message: "required"})
	}
	return kungfu.Invalid(fields...)
}

func join(at, p string) string {
	if at == "" {
		return p
	}
	return at + "." + p
}

// Decode is the usual handler shape: arguments decoded into In.
func Decode[In any](fn func(ctx context.Context, who kungfu.Caller, in In) (any, error)) Handler {
	return func(ctx context.Context, who kungfu.Caller, args json.RawMessage) (any, error) {
		var in In
		if err := decode(args, &in); err != nil {
			return nil, err
		}
		return fn(ctx, who, in)
	}
}

// Prefetch is Decode for Tool.Prefetch: queue decodes the arguments and
// queues the read on b, returning the handler that finishes from it, or
// nil to leave the call to the tool's Handler. Arguments that do not decode
// prefetch nothing; Handler refuses them as it always does.
func Prefetch[In any](queue func(b *pgx.Batch, gate kungfu.Gate, in In) Handler) func(b *pgx.Batch, gate kungfu.Gate, args json.RawMessage) Handler {
	return func(b *pgx.Batch, gate kungfu.Gate, args json.RawMessage) Handler {
		var in In
		if err := decode(args, &in); err != nil {
			return nil
		}
		return queue(b, gate, in)
	}
}

// decode unmarshals arguments that passed the schema into in. JSON Schema
// counts 1.0 and 1e2 as integers, so integer fields take them too: such
// literals are rewritten to plain digits where in holds an integer (never
// inside raw payloads) and decoded again. Whatever still fails is named by
// field in plain words, without Go's type names.
func decode(args json.RawMessage, in any) error {
	if len(bytes.TrimSpace(args)) == 0 {
		return nil
	}
	err := json.Unmarshal(args, in)
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && strings.HasPrefix(te.Value, "number ") {
		v := reflect.ValueOf(in).Elem()
		fixed, ferr := userjson.RewriteNumbers(args, func(path []userjson.Step, lit []byte) []byte {
			if !integerAt(v.Type(), path) {
				return nil
			}
			if n, ok := userjson.Integer(lit); ok && n != string(lit) {
				return []byte(n)
			}
			return nil
		})
		if ferr == nil && !bytes.Equal(fixed, args) {
			v.SetZero()
			err = json.Unmarshal(fixed, in)
		}
	}
	if err == nil {
		return nil
	}
	if errors.As(err, &te) {
		return kungfu.Invalid(kungfu.FieldError{Field: te.Field, Message: "must be " + kindOf(te.Type)})
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return kungfu.Invalid(kungfu.FieldError{Message: "arguments are not valid JSON"})
	}
	return fmt.Errorf("decode arguments: %w", err)
}

var (
	rawType         = reflect.TypeFor[json.RawMessage]()
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
)

// integerAt reports whether the value at path decodes into a Go integer
// (not into raw JSON nor through a type's own UnmarshalJSON).
func integerAt(t reflect.Type, path []userjson.Step) bool {
	for _, st := range path {
		t = indirect(t)
		if t == rawType || reflect.PointerTo(t).Implements(unmarshalerType) {
			return false
		}
		switch t.Kind() {
		case reflect.Struct:
			f, ok := fieldNamed(t, st.Key)
			if !ok {
				return false
			}
			t = f
		case reflect.Slice, reflect.Array, reflect.Map:
			t = t.Elem()
		default:
			return false
		}
	}
	t = indirect(t)
	if t == rawType || reflect.PointerTo(t).Implements(unmarshalerType) {
		return false
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

func indirect(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// fieldNamed finds the field that decodes the JSON key name; arguments
// are matched exactly, as the schemas list them.
func fieldNamed(t reflect.Type, name string) (reflect.Type, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case tag == "-":
		case tag == "" && f.Anonymous:
			if ft, ok := fieldNamed(indirect(f.Type), name); ok {
				return ft, true
			}
		case tag == name, tag == "" && f.Name == name:
			return f.Type, true
		}
	}
	return nil, false
}

// kindOf names what a Go type takes, in the protocol's words.
func kindOf(t reflect.Type) string {
	t = indirect(t)
	switch {
	case t == reflect.TypeFor[ref]():
		return "a string or an integer"
	case t == rawType:
		return "JSON"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer in range"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}
