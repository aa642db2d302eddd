package signing_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dojo-relay/dojo/signing"
)

// FuzzCanonical: Canonical never panics; what it prints is JSON, prints as
// itself again, has its keys in jsonb order and once each, and means what
// the input meant to encoding/json (numbers compared as decimal values);
// the output stays within its bound; and plain JSON that cannot reach a
// PostgreSQL limit is never refused. PostgreSQL itself is the judge in
// TestCanonicalPostgres; this target needs no database.
func FuzzCanonical(f *testing.F) {
	for _, c := range canonCases {
		if len(c.in) < 1000 {
			f.Add([]byte(c.in))
		}
	}
	for _, s := range []string{
		`{"agent_id": "00000000-0000-4000-8000-000000000001", "finding_id": "11111111-2222-4333-8444-555555555555", "reason": "test, café"}`,
		`{"b":{"d":[1,{"f":2.50,"e":-0}],"c":"\u2028"},"a":[{},[],"",0.0e-0]}`,
		`[1e131071,-1e-16383,0e1073741822]`,
		`{"\u00e9":1,"é":2,"e\u0301":3,"\ud83d\ude00":[4]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := signing.Canonical(in)
		if err != nil {
			if out != nil {
				t.Fatalf("output %.200q beside error %v", out, err)
			}
			// Nothing PostgreSQL would accept is refused unless a number
			// has an exponent, a string has an escape, or the nesting may
			// pass 64 levels: none of which fits this shape.
			if len(in) < 128 && utf8.Valid(in) && json.Valid(in) && !bytes.ContainsAny(in, `\eE`) {
				t.Fatalf("%.200q refused: %v", in, err)
			}
			return
		}
		if limit := 2*len(in) + 1<<20; len(out) > limit {
			t.Fatalf("%d bytes out of %d in", len(out), len(in))
		}
		if !utf8.Valid(out) || !json.Valid(out) {
			t.Fatalf("%.200q printed invalid JSON %.200q", in, out)
		}
		if !json.Valid(in) {
			t.Fatalf("encoding/json refuses %.200q, which printed as %.200q", in, out)
		}
		again, err := signing.Canonical(out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: %.200q printed %.200q, then %.200q (%v)", in, out, again, err)
		}
		if err := keysInOrder(out); err != nil {
			t.Fatalf("%.200q printed %.200q: %v", in, out, err)
		}
		a, b := decode(t, in), decode(t, out)
		if !sameValue(a, b) {
			t.Fatalf("%.200q printed %.200q, which means something else", in, out)
		}
	})
}

func decode(t *testing.T, raw []byte) any {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("decode %.200q: %v", raw, err)
	}
	return v
}

// sameValue compares decoded JSON, numbers by their decimal value.
func sameValue(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			if w, ok := b[k]; !ok || !sameValue(v, w) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !sameValue(a[i], b[i]) {
				return false
			}
		}
		return true
	case json.Number:
		b, ok := b.(json.Number)
		return ok && decimal(string(a)) == decimal(string(b))
	default:
		return a == b
	}
}

// decimal writes a number literal as sign, significant digits and the
// power of ten of the first of them, so that equal values compare equal:
// "2.50", "25e-1" and "0.25e1" all become "+25e0".
func decimal(lit string) string {
	neg := strings.HasPrefix(lit, "-")
	lit = strings.TrimPrefix(lit, "-")
	mant, exp := lit, int64(0)
	if i := strings.IndexAny(lit, "eE"); i >= 0 {
		mant = lit[:i]
		e, err := strconv.ParseInt(strings.TrimPrefix(lit[i+1:], "+"), 10, 64)
		if err != nil {
			return "bad exponent " + lit
		}
		exp = e
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := intPart + frac
	lead := strings.IndexFunc(digits, func(r rune) bool { return r != '0' })
	if lead < 0 {
		return "0"
	}
	sig := strings.TrimRight(digits[lead:], "0")
	sign := "+"
	if neg {
		sign = "-"
	}
	return sign + sig + "e" + strconv.FormatInt(int64(len(intPart))+exp-int64(lead)-1, 10)
}

// keysInOrder checks that every object of a printed text has its keys
// ordered by byte length, then bytewise, each key once.
func keysInOrder(out []byte) error {
	d := json.NewDecoder(bytes.NewReader(out))
	d.UseNumber() // 1e131071 prints 131 072 digits, too many for a float64
	type frame struct {
		object bool
		last   *string // the previous key of this object
		atKey  bool    // the next string token is a key
	}
	var stack []*frame
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.atKey {
			if _, isDelim := tok.(json.Delim); !isDelim {
				k := tok.(string)
				if top.last != nil && !(len(*top.last) < len(k) || len(*top.last) == len(k) && *top.last < k) {
					return errors.New("key " + strconv.Quote(k) + " after " + strconv.Quote(*top.last))
				}
				top.last, top.atKey = &k, false
				continue
			}
		}
		if top != nil && top.object {
			top.atKey = true // a value token (or the end) comes next, then a key
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, atKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
	}
}
