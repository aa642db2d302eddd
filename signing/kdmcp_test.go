package signing_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/dojo-relay/dojo/signing"
)

// TestKDWorkedExample reproduces the worked example of the kd-mcp-v1
// contract byte for byte, with its published example key (seed 00..1f).
func TestKDWorkedExample(t *testing.T) {
	const (
		args      = `{"agent_id": "00000000-0000-4000-8000-000000000001", "finding_id": "11111111-2222-4333-8444-555555555555", "reason": "test, café"}`
		canonical = `{"reason": "test, café", "agent_id": "00000000-0000-4000-8000-000000000001", "finding_id": "11111111-2222-4333-8444-555555555555"}`
		hash      = "d4c5d794a6ebcfd92cbc37b0ac8119475e5ab7ed85bbe522d9aebf730eb96498"
		text      = "kd-mcp-v1\nwithdraw_finding\n00000000-0000-4000-8000-000000000001\n1791700000\nn-3f9a1c2e7b5d4f60\n" + hash
		publicKey = "A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg"
		signature = "tfqegxIsYOO_QAOBGLjyFrP3IrWX-PHqWUEaDXjDRvi76ikl7lwt7eCRMfEa10vwYdLaeO8QaYck1X4YFOpuBA"
	)
	got, err := signing.Canonical([]byte(args))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != canonical {
		t.Fatalf("canonical:\n got %s\nwant %s", got, canonical)
	}
	if h := signing.ArgsHash(got); h != hash {
		t.Fatalf("hash %s, want %s", h, hash)
	}
	msg := signing.KDText("withdraw_finding", "00000000-0000-4000-8000-000000000001", "1791700000", "n-3f9a1c2e7b5d4f60", hash)
	if msg != text {
		t.Fatalf("text to sign:\n got %q\nwant %q", msg, text)
	}

	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = byte(i)
	}
	key := ed25519.NewKeyFromSeed(seed)
	pub := key.Public().(ed25519.PublicKey)
	if s := base64.RawURLEncoding.EncodeToString(pub); s != publicKey {
		t.Fatalf("public key %s, want %s", s, publicKey)
	}
	if s := base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, []byte(msg))); s != signature {
		t.Fatalf("signature %s, want %s", s, signature)
	}
	sig, err := signing.DecodeKDSignature(signature)
	if err != nil {
		t.Fatal(err)
	}
	if !ed25519.Verify(pub, []byte(msg), sig) {
		t.Fatal("the seed's signature does not verify")
	}
}

// canonCase is one input with PostgreSQL's jsonb::text of it, or refused
// when PostgreSQL refuses it. TestCanonicalCases checks Canonical against
// the table and TestCanonicalPostgres checks the table against PostgreSQL,
// so every entry is PostgreSQL's own answer. Each kind of generated case on
// which the printer and PostgreSQL once disagreed stays here by name.
type canonCase struct {
	name, in, want string
	refused        bool
}

var canonCases = []canonCase{
	{name: "worked example order", in: `{"agent_id":1,"finding_id":2,"reason":3}`, want: `{"reason": 3, "agent_id": 1, "finding_id": 2}`},
	{name: "keys by length then bytes", in: `{"bb":1,"a":2,"ab":3,"B":4,"":5}`, want: `{"": 5, "B": 4, "a": 2, "ab": 3, "bb": 1}`},
	{name: "key length in bytes not runes", in: `{"é":1,"ab":2,"z":3}`, want: `{"z": 3, "ab": 2, "é": 1}`},
	{name: "keys bytewise above ascii", in: `{"é":1,"ä":2,"zz":3}`, want: `{"zz": 3, "ä": 2, "é": 1}`},
	{name: "last duplicate wins", in: `{"a":1,"b":2,"a":3}`, want: `{"a": 3, "b": 2}`},
	{name: "duplicate by escape", in: `{"a":1,"\u0061":2}`, want: `{"a": 2}`},
	{name: "duplicate by escape first", in: `{"\u0061":1,"a":2,"b":{"\/":1,"/":[]}}`, want: `{"a": 2, "b": {"/": []}}`},
	{name: "nested duplicates", in: `{"x":{"k":1,"k":{"k":2,"k":3}}}`, want: `{"x": {"k": {"k": 3}}}`},
	{name: "empty containers", in: ` { "a" : [ ] , "b" : { } } `, want: `{"a": [], "b": {}}`},
	{name: "arrays", in: "[1,\t[2 ,3],\r\n[]]", want: `[1, [2, 3], []]`},
	{name: "top-level string", in: `"x"`, want: `"x"`},
	{name: "top-level literals", in: `[true,false,null]`, want: `[true, false, null]`},
	{name: "escapes kept", in: `"\"\\\b\f\n\r\t"`, want: `"\"\\\b\f\n\r\t"`},
	{name: "solidus unescaped", in: `"\/</"`, want: `"/</"`},
	{name: "control chars lowercase hex", in: `"\u0001\u001F\u000b\u001a"`, want: `"\u0001\u001f\u000b\u001a"`},
	{name: "short escapes for control chars", in: `"\u0008\u000C\u000a\u000D\u0009"`, want: `"\b\f\n\r\t"`},
	{name: "del raw", in: `"\u007f"`, want: "\"\x7f\""},
	{name: "html chars raw", in: `"<&>'\u003c\u0026\u0027"`, want: `"<&>'<&'"`},
	{name: "line separators raw", in: `"\u2028\u2029"`, want: "\"\u2028\u2029\""},
	{name: "unicode escapes decoded", in: `"caf\u00e9 \u4E2D"`, want: `"café 中"`},
	{name: "surrogate pair", in: `"\ud83d\ude00\uD834\uDD1E"`, want: `"😀𝄞"`},
	{name: "raw astral and combining", in: `"e` + "\u0301" + `😀"`, want: `"e` + "\u0301" + `😀"`},
	{name: "bom and nonchar", in: `"\ufeff\uffff"`, want: "\"\ufeff\uffff\""},
	{name: "number trailing zeros kept", in: `2.50`, want: `2.50`},
	{name: "exponent expanded", in: `1e2`, want: `100`},
	{name: "upper exponent with plus", in: `1E+2`, want: `100`},
	{name: "negative zero", in: `-0`, want: `0`},
	{name: "negative zero fraction", in: `-0.0`, want: `0.0`},
	{name: "negative zero exponent", in: `-0e-3`, want: `0.000`},
	{name: "small exponent", in: `1.5e-3`, want: `0.0015`},
	{name: "scale from fraction minus exponent", in: `2.50e1`, want: `25.0`},
	{name: "scale clamped at zero", in: `0.00001e5`, want: `1`},
	{name: "fraction leading zeros", in: `100e-2`, want: `1.00`},
	{name: "exponent leading zeros", in: `1e00000000000000000000000002`, want: `100`},
	{name: "exponent minus zero", in: `-1.0e-0`, want: `-1.0`},
	{name: "long mantissa", in: `-123456789012345678901234567890.123456789e-5`, want: `-1234567890123456789012345.67890123456789`},
	{name: "zero with scale", in: `0.0e-5`, want: `0.000000`},
	{name: "huge zero exponent", in: `0e1073741822`, want: `0`},
	{name: "largest weight", in: `9.9e131071`, want: "99" + strings.Repeat("0", 131070)},
	{name: "largest weight via fraction", in: `0.1e131072`, want: "1" + strings.Repeat("0", 131071)},
	{name: "largest scale", in: `-1e-16383`, want: "-0." + strings.Repeat("0", 16382) + "1"},
	{name: "largest scale of zero", in: `0e-16383`, want: "0." + strings.Repeat("0", 16383)},
	{name: "largest scale with digits", in: `1.000e-16380`, want: "0." + strings.Repeat("0", 16379) + "1000"},
	{name: "nested 64", in: strings.Repeat("[", 64) + strings.Repeat("]", 64), want: strings.Repeat("[", 64) + strings.Repeat("]", 64)},

	{name: "weight overflow", in: `1e131072`, refused: true},
	{name: "weight overflow via digits", in: `10e131071`, refused: true},
	{name: "scale overflow", in: `1e-16384`, refused: true},
	{name: "scale overflow of zero", in: `0e-16384`, refused: true},
	{name: "scale overflow by digits", in: `1.0000e-16380`, refused: true},
	{name: "exponent overflow on zero", in: `0e1073741823`, refused: true},
	{name: "exponent overflow negative", in: `0e-1073741823`, refused: true},
	{name: "exponent beyond long", in: `[1e99999999999999999999999]`, refused: true},
	{name: "nul escape", in: `{"a":"\u0000"}`, refused: true},
	{name: "nul escape in key", in: `{"\u0000":1}`, refused: true},
	{name: "lone high surrogate", in: `"\ud83d"`, refused: true},
	{name: "lone low surrogate", in: `"\ude00"`, refused: true},
	{name: "high then high", in: `"\ud83d\ud83d"`, refused: true},
	{name: "high then text", in: `"\ud83dx"`, refused: true},
	{name: "high then escape", in: `"\ud83d\n"`, refused: true},
	{name: "raw control char", in: "\"\x01\"", refused: true},
	{name: "raw tab in string", in: "\"\t\"", refused: true},
	{name: "bad escape", in: `"\x41"`, refused: true},
	{name: "short unicode escape", in: `"\u12"`, refused: true},
	{name: "leading zero", in: `01`, refused: true},
	{name: "negative leading zero", in: `-01`, refused: true},
	{name: "bare fraction", in: `.5`, refused: true},
	{name: "empty fraction", in: `1.`, refused: true},
	{name: "empty exponent", in: `1e`, refused: true},
	{name: "plus sign", in: `+1`, refused: true},
	{name: "lone minus", in: `-`, refused: true},
	{name: "nan", in: `NaN`, refused: true},
	{name: "infinity", in: `-Infinity`, refused: true},
	{name: "trailing comma", in: `[1,]`, refused: true},
	{name: "trailing garbage", in: `{} x`, refused: true},
	{name: "two values", in: `1 2`, refused: true},
	{name: "literal prefix", in: `truex`, refused: true},
	{name: "single quotes", in: `{'a':1}`, refused: true},
	{name: "empty", in: ``, refused: true},
	{name: "blank", in: " \n", refused: true},
	{name: "form feed is not whitespace", in: "\f1", refused: true},
}

func TestCanonicalCases(t *testing.T) {
	for _, c := range canonCases {
		got, err := signing.Canonical([]byte(c.in))
		switch {
		case c.refused && err == nil:
			t.Errorf("%s: %q printed %q, want an error", c.name, c.in, got)
		case !c.refused && err != nil:
			t.Errorf("%s: %q: %v", c.name, c.in, err)
		case !c.refused && string(got) != c.want:
			t.Errorf("%s: %q:\n got %q\nwant %q", c.name, c.in, got, c.want)
		}
	}
}

// TestCanonicalLimits covers what Canonical refuses on its own, beyond
// PostgreSQL: nesting past 64 levels, invalid UTF-8 (PostgreSQL refuses it
// before jsonb sees it), and output far larger than the input.
func TestCanonicalLimits(t *testing.T) {
	for _, in := range []string{
		strings.Repeat("[", 65) + strings.Repeat("]", 65),
		strings.Repeat(`{"a":`, 65) + "1" + strings.Repeat("}", 65),
		strings.Repeat("[", 100000),
		"\"\xff\"",
		"\"\xc3\"",
		"\"\xed\xa0\x80\"", // a surrogate in UTF-8
		"\"\xc0\xaf\"",     // overlong
		"{\"\xe9\":1}",
		"[" + strings.Repeat("1e131071,", 20) + "0]",
	} {
		if out, err := signing.Canonical([]byte(in)); err == nil {
			t.Errorf("%.40q: printed %d bytes, want an error", in, len(out))
		}
	}
	// One extreme number is fine; the bound is on the whole output.
	if out, err := signing.Canonical([]byte(`[1e131071,-1e-16383]`)); err != nil || len(out) != 131072+2+16386+2 {
		t.Errorf("two extreme numbers: %d bytes, %v", len(out), err)
	}
}

// TestDecodeKDSignature: both alphabets, padded or not, exactly 64 bytes.
func TestDecodeKDSignature(t *testing.T) {
	sig := make([]byte, 64)
	for i := range sig {
		sig[i] = byte(0xfb - i) // bytes that need '-' '_' or '+' '/'
	}
	url, std := base64.URLEncoding.EncodeToString(sig), base64.StdEncoding.EncodeToString(sig)
	if !strings.ContainsAny(url, "-_") || !strings.ContainsAny(std, "+/") {
		t.Fatalf("test signature does not exercise both alphabets: %s %s", url, std)
	}
	for _, s := range []string{url, strings.TrimRight(url, "="), std, strings.TrimRight(std, "=")} {
		got, err := signing.DecodeKDSignature(s)
		if err != nil || !bytes.Equal(got, sig) {
			t.Errorf("%s: %x, %v", s, got, err)
		}
	}
	short, long := base64.RawURLEncoding.EncodeToString(sig[:63]), base64.RawURLEncoding.EncodeToString(append(sig, 1))
	lastBits := []byte(strings.TrimRight(url, "="))
	lastBits[85] = 'B' // nonzero bits past the 512th
	for _, s := range []string{
		"",
		short, base64.URLEncoding.EncodeToString(sig[:63]),
		long, base64.StdEncoding.EncodeToString(append(sig, 1)),
		strings.TrimRight(url, "=") + "=",       // half the padding
		strings.TrimRight(url, "=") + "===",     // too much padding
		"=" + strings.TrimRight(url, "=") + "=", // padding in front
		strings.TrimRight(url, "=")[:85] + "+",  // mixed alphabets
		strings.Replace(std, "+", "-", 1),       // mixed alphabets
		strings.TrimRight(url, "=")[:40] + "\n" + strings.TrimRight(url, "=")[40:85],
		strings.TrimRight(url, "=")[:85] + " ",
		string(lastBits),
		strings.Repeat("!", 86),
		strings.Repeat("A", 88),
		hex.EncodeToString(sig),
	} {
		if got, err := signing.DecodeKDSignature(s); err == nil {
			t.Errorf("%q: decoded %x, want an error", s, got)
		}
	}
}
