package userjson

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/dojo-relay/dojo/kungfu"
)

func TestCheck(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	cases := []struct {
		doc, path, msg string // msg "" = accepted
	}{
		{`{"a":1,"b":[true,false,null],"c":{"d":"é\u00e9\ud83d\ude00"}}`, "", ""},
		{` 1 `, "", ""},
		{`-0.5e+10`, "", ""},
		{`"\/\b\f\n\r\t\\\""`, "", ""},
		{`{"a":{},"b":{"a":1},"c":[{"a":1},{"a":2}]}`, "", ""},
		{deep(MaxDepth), "", ""},
		{`1e400`, "", ""},
		{strings.Repeat("9", MaxNumber), "", ""},

		{``, "", "not valid JSON"},
		{`{"a":1,}`, "", "not valid JSON"},
		{`{"a":01}`, "", "not valid JSON"},
		{`[1,2`, "", "not valid JSON"},
		{`{"a":"x"} {}`, "", "not valid JSON"},
		{`{'a':1}`, "", "not valid JSON"},
		{`{"a":"\x"}`, "a", "not valid JSON"},
		{`{"a":"\u12"}`, "a", "not valid JSON"},
		{"{\"a\":\"\t\"}", "a", "not valid JSON"},
		{`{"a":tru}`, "a", "not valid JSON"},
		{`{"a":-}`, "a", "not valid JSON"},
		{`{"a":1.}`, "a", "not valid JSON"},
		{`{"a":1e}`, "a", "not valid JSON"},
		{`NaN`, "", "not valid JSON"},

		{"{\"note\":\"\xff\"}", "note", "not valid UTF-8"},
		{"{\"a\":[\"ok\",\"\xed\xa0\x80\"]}", "a.1", "not valid UTF-8"}, // UTF-8 encoded surrogate
		{"{\"\xc3\":1}", "", "key not valid UTF-8"},
		{`{"a":"\ud800"}`, "a", `holds a lone UTF-16 surrogate \ud800`},
		{`{"a":"\udc00x"}`, "a", `holds a lone UTF-16 surrogate \udc00`},
		{`{"a":"\ud800\u0041"}`, "a", `holds a lone UTF-16 surrogate \ud800`},
		{`{"a":{"b":"x\u0000"}}`, "a.b", `must not contain NUL (\u0000) characters`},
		{`{"a\u0000":1}`, "", `key must not contain NUL (\u0000) characters`},
		{`{"n":"x","aws":"AKIA","n":1,"aws":"clean"}`, "", `duplicate key "n"`},
		{`{"p":{"aws":1,"\u0061ws":2}}`, "p", `duplicate key "aws"`},
		{`{"p":[{"a":1},{"b":1,"b":2}]}`, "p.1", `duplicate key "b"`},
		{deep(MaxDepth + 1), strings.TrimSuffix(strings.Repeat("0.", MaxDepth), "."), "nested deeper than 64 levels"},
		{`{"a":1e401}`, "a", "a number with an exponent beyond 400"},
		{`{"a":1e99999999999999999999}`, "a", "a number with an exponent beyond 400"},
		{`[` + strings.Repeat("9", MaxNumber+1) + `]`, "0", "a number literal longer than 100 characters"},
	}
	for _, c := range cases {
		err := Check([]byte(c.doc))
		if c.msg == "" {
			if err != nil {
				t.Errorf("%.60q: refused: %v", c.doc, err)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%.60q: got %v, want %q at %q", c.doc, err, c.msg, c.path)
			continue
		}
		if e.Path != c.path || !strings.HasPrefix(e.Message, c.msg) {
			t.Errorf("%.60q: got %q at %q, want %q at %q", c.doc, e.Message, e.Path, c.msg, c.path)
		}
	}
}

// Many keys switch the duplicate check from a list to a map; both find a
// repeat, and objects at the same depth do not share keys.
func TestCheckManyKeys(t *testing.T) {
	var b strings.Builder
	b.WriteString(`[{`)
	for i := range 40 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"k` + strings.Repeat("x", i) + `":1`)
	}
	b.WriteString(`},{"k":2,"kx":3}]`)
	if err := Check([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
	dup := strings.Replace(b.String(), `},{"k":2`, `,"k":9},{"k":2`, 1)
	if err := Check([]byte(dup)); err == nil || err.(*Error).Path != "0" {
		t.Fatalf("duplicate among 41 keys: %v", err)
	}
}

func TestValidate(t *testing.T) {
	if err := Validate("payload", []byte(`{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	err := Validate("payload", []byte(`{"n":"x","aws":"AKIA","n":1}`))
	e := kungfu.AsError(err)
	if e == nil || e.Code != kungfu.CodeValidationFailed || e.Message != `payload: duplicate key "n"` {
		t.Fatalf("got %v", err)
	}
	err = Validate("payload", []byte(`{"a":{"b":"\u0000"}}`))
	if e := kungfu.AsError(err); e == nil || !strings.HasPrefix(e.Message, "payload.a.b: ") {
		t.Fatalf("got %v", err)
	}
	if e := kungfu.AsError(Validate("", []byte(`{"a":"\ud800"}`))); e == nil || !strings.HasPrefix(e.Message, "a: ") {
		t.Fatalf("got %v", e)
	}
}

func TestInteger(t *testing.T) {
	cases := []struct {
		lit, want string
		ok        bool
	}{
		{"1", "1", true}, {"1.0", "1", true}, {"-0.0", "0", true}, {"0", "0", true}, {"-12", "-12", true},
		{"1e2", "100", true}, {"1E+2", "100", true}, {"1200e-2", "12", true}, {"0.5e1", "5", true},
		{"9007199254740993.000", "9007199254740993", true}, {"0e999", "0", true},
		{"1.5", "", false}, {"1e-1", "", false}, {"0.1", "", false}, {"1e2000", "", false},
		{"", "", false}, {"-", "", false}, {"01", "", false}, {"1.", "", false}, {"1e", "", false}, {"x", "", false},
	}
	for _, c := range cases {
		got, ok := Integer([]byte(c.lit))
		if got != c.want || ok != c.ok {
			t.Errorf("Integer(%q) = %q, %v; want %q, %v", c.lit, got, ok, c.want, c.ok)
		}
	}
}

func TestRewriteNumbers(t *testing.T) {
	doc := []byte(`{"n":1.0,"raw":{"n":1.0},"list":[2e0, 3]}`)
	out, err := RewriteNumbers(doc, func(path []Step, lit []byte) []byte {
		if path[0].Key == "raw" {
			return nil
		}
		if n, ok := Integer(lit); ok && n != string(lit) {
			return []byte(n)
		}
		return nil
	})
	if err != nil || string(out) != `{"n":1,"raw":{"n":1.0},"list":[2, 3]}` {
		t.Fatalf("got %s, %v", out, err)
	}
	same, _ := RewriteNumbers(doc, func([]Step, []byte) []byte { return nil })
	if &same[0] != &doc[0] {
		t.Fatal("no replacement copied the document")
	}
	if _, err := RewriteNumbers([]byte(`{"a":1,"a":2}`), nil); err == nil {
		t.Fatal("RewriteNumbers accepted a duplicate key")
	}
}

// oldRoomHash is how room and assignment writes hashed before Hash: through
// float64.
func oldRoomHash(args []byte) []byte {
	var all map[string]json.RawMessage
	_ = json.Unmarshal(args, &all)
	delete(all, "idempotency_key")
	b, _ := json.Marshal(all)
	var generic any
	_ = json.Unmarshal(b, &generic)
	c, _ := json.Marshal(generic)
	sum := sha256.Sum256(c)
	return sum[:]
}

// oldSubmissionHash is how task submissions hashed before Hash.
func oldSubmissionHash(raw []byte) []byte {
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	c := raw
	if dec.Decode(&v) == nil {
		c, _ = json.Marshal(v)
	}
	sum := sha256.Sum256(c)
	return sum[:]
}

func TestHash(t *testing.T) {
	// Exact numbers: the float64 route made these one request.
	a := Hash([]byte(`{"n":9007199254740993,"idempotency_key":"k"}`), "idempotency_key")
	b := Hash([]byte(`{"n":9007199254740992,"idempotency_key":"k"}`), "idempotency_key")
	if bytes.Equal(a, b) {
		t.Fatal("9007199254740993 and 9007199254740992 hash alike")
	}
	if !bytes.Equal(oldRoomHash([]byte(`{"n":9007199254740993}`)), oldRoomHash([]byte(`{"n":9007199254740992}`))) {
		t.Fatal("the old room hash was expected to merge them (this test documents the bug)")
	}
	// Order, space and the omitted key do not matter; values do.
	same := []string{`{"b":[1,{"y":"<&>","x":2}],"a":"é","idempotency_key":"k1"}`,
		` { "a" : "\u00e9", "b" : [ 1 , { "x" : 2 , "y" : "\u003c&>" } ] , "idempotency_key" : "k2" } `}
	if !bytes.Equal(Hash([]byte(same[0]), "idempotency_key"), Hash([]byte(same[1]), "idempotency_key")) {
		t.Fatal("equal documents hash differently")
	}
	if bytes.Equal(Hash([]byte(`{"a":1}`)), Hash([]byte(`{"a":"1"}`))) || bytes.Equal(Hash([]byte(`{}`)), Hash([]byte(`{"a":null}`))) {
		t.Fatal("different documents hash alike")
	}
	// Hashes stored before Hash existed still match: every task submission,
	// and room writes whose numbers are written in shortest form.
	for _, doc := range []string{`{"b":[1,2.5,-3e-7,{"z":true}],"a":"x<y"}`, `{"n":1.0,"big":9007199254740993,"s":"\u2028"}`, `not json`} {
		if !bytes.Equal(Hash([]byte(doc)), oldSubmissionHash([]byte(doc))) {
			t.Errorf("submission hash of %s changed", doc)
		}
	}
	for _, doc := range []string{`{"thread":"abc","content":"hi <b>","ask":[1,22],"assign":{"to":"bo","deliver_due":60},"idempotency_key":"k"}`,
		`{"assign":7,"payload":{"score":0.25,"n":-12},"idempotency_key":"k"}`} {
		if !bytes.Equal(Hash([]byte(doc), "idempotency_key"), oldRoomHash([]byte(doc))) {
			t.Errorf("room hash of %s changed", doc)
		}
	}
}
