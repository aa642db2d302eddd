package tool

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/schema"
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
	// Limit names the rate-limit action charged per call ("" = none).
	Limit string
	// LimitByIP charges the client address instead of the account.
	LimitByIP bool
	Handler   Handler

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
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return kungfu.Invalid(kungfu.FieldError{Field: "", Message: "arguments must be a JSON object"})
	}
	if _, ok := inst.(map[string]any); !ok {
		return kungfu.Invalid(kungfu.FieldError{Field: "", Message: "arguments must be a JSON object"})
	}
	// PostgreSQL text cannot hold NUL; refuse it here rather than fail later.
	if at, found := findNUL(inst, ""); found {
		return kungfu.Invalid(kungfu.FieldError{Field: at, Message: "must not contain NUL (\\u0000) characters"})
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
		if len(bytes.TrimSpace(args)) > 0 {
			if err := json.Unmarshal(args, &in); err != nil {
				return nil, kungfu.Invalid(kungfu.FieldError{Message: err.Error()})
			}
		}
		return fn(ctx, who, in)
	}
}

func findNUL(v any, at string) (string, bool) {
	switch x := v.(type) {
	case string:
		return at, strings.ContainsRune(x, 0)
	case map[string]any:
		for k, val := range x {
			if strings.ContainsRune(k, 0) {
				return join(at, k), true
			}
			if p, ok := findNUL(val, join(at, k)); ok {
				return p, true
			}
		}
	case []any:
		for i, val := range x {
			if p, ok := findNUL(val, join(at, fmt.Sprint(i))); ok {
				return p, true
			}
		}
	}
	return "", false
}
