package userjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzStrict: Check never panics, accepts only what encoding/json accepts
// (and refuses all it refuses), lets no NUL, invalid UTF-8 or repeated key
// through, and allocates at most a fixed multiple of the input.
func FuzzStrict(f *testing.F) {
	for _, s := range []string{
		`{"n":"x","aws":"AKIAIOSFODNN7EXAMPLE","n":1,"aws":"clean"}`,
		`{"payload":{"a":"\ud800"}}`,
		"{\"payload\":{\"a\":\"\xff\xfe\"}}",
		`{"payload":"{\"a\":\"\\u0000\"}"}`,
		`{"page":4611686018427387904}`,
		`{"revision":2147483648,"claim_id":2147483648}`,
		`{"limit":1e400}`,
		`{"n":9007199254740993}`,
		`{"n":1.0,"m":-0.0e-0}`,
		`{"a":"\ud83d\ude00","\u0061":1}`,
		`{"a":1,"\u0061":2}`,
		`[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]`,
		strings.Repeat("[", 100),
		`{"$defs":{"n":{"properties":{"x":{"oneOf":[{"$ref":"#/$defs/n"},{"$ref":"#/$defs/n"}]}}}},"$ref":"#/$defs/n"}`,
		`1e999999`,
		``,
		`"\u12`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := Check(doc)
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > uint64(32*len(doc)+1<<20) {
			// TotalAlloc is per process and the fuzzing engine allocates beside
			// Check, so the bound is loose; a runaway parse needs far more.
			t.Fatalf("Check of %d bytes allocated %d bytes", len(doc), grew)
		}
		valid := json.Valid(doc)
		if err == nil {
			if !valid {
				t.Fatalf("accepted what encoding/json refuses: %q", doc)
			}
			if !utf8.Valid(doc) {
				t.Fatalf("accepted invalid UTF-8: %q", doc)
			}
			if problem := reference(doc); problem != "" {
				t.Fatalf("accepted a document with %s: %q", problem, doc)
			}
			if out, rerr := RewriteNumbers(doc, func([]Step, []byte) []byte { return nil }); rerr != nil || !bytes.Equal(out, doc) {
				t.Fatalf("RewriteNumbers disagrees with Check: %v", rerr)
			}
			return
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("not an *Error: %v", err)
		}
		if !valid {
			return
		}
		if strings.HasPrefix(e.Message, "not valid JSON") {
			t.Fatalf("called valid JSON invalid (%v): %q", err, doc)
		}
	})
}

// reference finds, with encoding/json's own tokenizer, a repeated key or a
// NUL that Check should have refused.
func reference(doc []byte) string {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	type frame struct {
		object bool
		keys   map[string]bool
		key    bool // the next string token is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return ""
		}
		if err != nil {
			return "" // Check agreed it is JSON; tokenizer limits are not ours
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				if top != nil && top.object {
					top.key = true
				}
				stack = append(stack, &frame{object: v == '{', keys: map[string]bool{}, key: v == '{'})
			default:
				stack = stack[:len(stack)-1]
			}
			continue
		case string:
			if strings.ContainsRune(v, 0) {
				return "a NUL"
			}
			if top != nil && top.object && top.key {
				if top.keys[v] {
					return "a repeated key"
				}
				top.keys[v] = true
				top.key = false
				continue
			}
		}
		if top != nil && top.object {
			top.key = true
		}
	}
}
