package signing

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// The kd-mcp-v1 scheme signs the tool arguments as PostgreSQL prints them
// back from jsonb, so a client can check its bytes against any PostgreSQL.
// The printer below reproduces jsonb::text from the raw request bytes: a
// float64 or a Go map would lose "2.50" and the order of duplicate keys.

// maxDepth bounds recursion; PostgreSQL only stops at its stack limit.
const maxDepth = 64

// PostgreSQL's numeric limits, as numeric_in enforces them.
const (
	// maxExponent: numeric_in refuses an exponent of INT_MAX/2 or more in
	// either direction, even on a zero mantissa.
	maxExponent = 1<<30 - 1
	// maxScale: digits after the decimal point (NUMERIC_DSCALE_MAX).
	maxScale = 0x3FFF
	// maxWeight: the power of ten of the leading nonzero digit; the weight
	// in base-10000 digits is an int16.
	maxWeight = 4*(1<<15) - 1
)

// maxGrowth bounds the output. Outside numbers the printed text is at most
// 1.5 times the input, but one eight-byte literal such as 1e131071 prints
// 131 072 digits; PostgreSQL accepts that, and we accept it too, but not
// enough of them to turn a small request into gigabytes.
const maxGrowth = 1 << 20

// Canonical prints raw JSON the way PostgreSQL prints jsonb (jsonb::text).
// It refuses what PostgreSQL refuses (invalid JSON or UTF-8, \u0000, an
// unpaired surrogate, a number outside numeric's range) and, to bound its
// work, nesting deeper than 64 levels and output longer than twice the
// input plus 1 MiB.
func Canonical(raw []byte) ([]byte, error) {
	p := &canon{in: raw, limit: 2*len(raw) + maxGrowth}
	out := make([]byte, 0, len(raw)+len(raw)/4+8)
	p.space()
	out, err := p.value(out, 0)
	if err != nil {
		return nil, err
	}
	p.space()
	if p.pos < len(p.in) {
		return nil, p.errorf("unexpected %s after the value", p.what())
	}
	return out, nil
}

type canon struct {
	in      []byte
	pos     int
	limit   int    // longest output allowed
	scratch []byte // reused by every object to reorder its members
}

func (p *canon) errorf(format string, args ...any) error {
	return fmt.Errorf("signing: canonical arguments: at offset %d: %s", p.pos, fmt.Sprintf(format, args...))
}

// what names the byte at pos for an error message.
func (p *canon) what() string {
	if p.pos >= len(p.in) {
		return "end of input"
	}
	c := p.in[p.pos]
	if c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("%q", rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

// space skips JSON's four whitespace bytes, the same set PostgreSQL skips.
func (p *canon) space() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *canon) value(out []byte, depth int) ([]byte, error) {
	if p.pos >= len(p.in) {
		return nil, p.errorf("unexpected end of input, want a value")
	}
	switch c := p.in[p.pos]; {
	case c == '{':
		return p.object(out, depth+1)
	case c == '[':
		return p.array(out, depth+1)
	case c == '"':
		s, err := p.str(nil)
		if err != nil {
			return nil, err
		}
		return p.grow(quote(out, s))
	case c == '-' || c >= '0' && c <= '9':
		return p.number(out)
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if bytes.HasPrefix(p.in[p.pos:], []byte(lit)) {
				p.pos += len(lit)
				return append(out, lit...), nil
			}
		}
		return nil, p.errorf("unexpected %s, want a value", p.what())
	}
}

func (p *canon) grow(out []byte) ([]byte, error) {
	if len(out) > p.limit {
		return nil, p.errorf("canonical text longer than %d bytes", p.limit)
	}
	return out, nil
}

func (p *canon) array(out []byte, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, p.errorf("nested deeper than %d levels", maxDepth)
	}
	p.pos++ // [
	out = append(out, '[')
	p.space()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		return append(out, ']'), nil
	}
	for first := true; ; first = false {
		if !first {
			out = append(out, ", "...)
		}
		var err error
		p.space()
		if out, err = p.value(out, depth); err != nil {
			return nil, err
		}
		p.space()
		if p.pos >= len(p.in) {
			return nil, p.errorf("unexpected end of input in an array")
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return p.grow(append(out, ']'))
		default:
			return nil, p.errorf("unexpected %s in an array, want ',' or ']'", p.what())
		}
	}
}

type member struct {
	key        []byte // decoded UTF-8
	start, end int    // the printed value, within the object's scratch text
}

// object prints the members' values one after another as they come, then
// writes them out again in jsonb's key order: length first, then bytewise,
// keeping only the last of equal keys.
func (p *canon) object(out []byte, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, p.errorf("nested deeper than %d levels", maxDepth)
	}
	p.pos++ // {
	p.space()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		return append(out, "{}"...), nil
	}
	base := len(out)
	var members []member
	for {
		p.space()
		if p.pos >= len(p.in) || p.in[p.pos] != '"' {
			return nil, p.errorf("unexpected %s in an object, want a key", p.what())
		}
		key, err := p.str(nil)
		if err != nil {
			return nil, err
		}
		p.space()
		if p.pos >= len(p.in) || p.in[p.pos] != ':' {
			return nil, p.errorf("unexpected %s after a key, want ':'", p.what())
		}
		p.pos++
		p.space()
		start := len(out)
		if out, err = p.value(out, depth); err != nil {
			return nil, err
		}
		members = append(members, member{key: key, start: start - base, end: len(out) - base})
		p.space()
		if p.pos >= len(p.in) {
			return nil, p.errorf("unexpected end of input in an object")
		}
		if p.in[p.pos] == ',' {
			p.pos++
			continue
		}
		if p.in[p.pos] == '}' {
			p.pos++
			break
		}
		return nil, p.errorf("unexpected %s in an object, want ',' or '}'", p.what())
	}
	// The stable sort keeps equal keys in input order, so the last of a run
	// is the one that wins.
	sort.SliceStable(members, func(i, j int) bool {
		a, b := members[i].key, members[j].key
		if len(a) != len(b) {
			return len(a) < len(b)
		}
		return bytes.Compare(a, b) < 0
	})
	p.scratch = append(p.scratch[:0], out[base:]...)
	values := p.scratch
	out = append(out[:base], '{')
	first := true
	for i, m := range members {
		if i+1 < len(members) && bytes.Equal(m.key, members[i+1].key) {
			continue
		}
		if !first {
			out = append(out, ", "...)
		}
		first = false
		out = quote(out, m.key)
		out = append(out, ": "...)
		out = append(out, values[m.start:m.end]...)
	}
	return p.grow(append(out, '}'))
}

// str decodes the string at pos onto dst, refusing what PostgreSQL's JSON
// lexer refuses: raw control characters, unknown escapes, \u0000 (text
// cannot hold it), unpaired surrogates and invalid UTF-8.
func (p *canon) str(dst []byte) ([]byte, error) {
	p.pos++ // opening quote
	for {
		if p.pos >= len(p.in) {
			return nil, p.errorf("unterminated string")
		}
		c := p.in[p.pos]
		switch {
		case c == '"':
			p.pos++
			return dst, nil
		case c == '\\':
			var err error
			if dst, err = p.escape(dst); err != nil {
				return nil, err
			}
		case c < 0x20:
			return nil, p.errorf("control character 0x%02x in a string must be escaped", c)
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			p.pos++
		default:
			r, n := utf8.DecodeRune(p.in[p.pos:])
			if r == utf8.RuneError && n <= 1 {
				return nil, p.errorf("invalid UTF-8 in a string")
			}
			dst = append(dst, p.in[p.pos:p.pos+n]...)
			p.pos += n
		}
	}
}

func (p *canon) escape(dst []byte) ([]byte, error) {
	if p.pos+1 >= len(p.in) {
		p.pos++
		return nil, p.errorf("unterminated string")
	}
	p.pos++ // backslash
	c := p.in[p.pos]
	p.pos++
	switch c {
	case '"', '\\', '/':
		return append(dst, c), nil
	case 'b':
		return append(dst, '\b'), nil
	case 'f':
		return append(dst, '\f'), nil
	case 'n':
		return append(dst, '\n'), nil
	case 'r':
		return append(dst, '\r'), nil
	case 't':
		return append(dst, '\t'), nil
	case 'u':
	default:
		p.pos--
		return nil, p.errorf("invalid escape \\%s in a string", p.what())
	}
	r, err := p.hex4()
	if err != nil {
		return nil, err
	}
	switch {
	case r == 0:
		return nil, p.errorf("\\u0000 is not allowed in a string")
	case r >= 0xDC00 && r <= 0xDFFF:
		return nil, p.errorf("unpaired low surrogate \\u%04x", r)
	case r >= 0xD800 && r <= 0xDBFF:
		if p.pos+1 >= len(p.in) || p.in[p.pos] != '\\' || p.in[p.pos+1] != 'u' {
			return nil, p.errorf("unpaired high surrogate \\u%04x", r)
		}
		p.pos += 2
		lo, err := p.hex4()
		if err != nil {
			return nil, err
		}
		if lo < 0xDC00 || lo > 0xDFFF {
			return nil, p.errorf("high surrogate \\u%04x not followed by a low surrogate", r)
		}
		r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
	}
	return utf8.AppendRune(dst, r), nil
}

func (p *canon) hex4() (rune, error) {
	if p.pos+4 > len(p.in) {
		return 0, p.errorf("incomplete \\u escape")
	}
	var r rune
	for _, c := range p.in[p.pos : p.pos+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, p.errorf("invalid \\u escape")
		}
	}
	p.pos += 4
	return r, nil
}

// quote appends s as PostgreSQL's escape_json writes it: only the quote,
// the backslash and control characters are escaped, in lowercase hex;
// everything else, U+2028 and DEL included, is written raw.
func quote(dst, s []byte) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	for _, c := range s {
		switch c {
		case '"':
			dst = append(dst, '\\', '"')
		case '\\':
			dst = append(dst, '\\', '\\')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			if c < 0x20 {
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			} else {
				dst = append(dst, c)
			}
		}
	}
	return append(dst, '"')
}

// number prints a JSON number literal the way numeric_out prints what
// numeric_in made of it: plain decimal notation, never an exponent, with
// exactly as many fraction digits as the literal implies (its fraction
// digits minus its exponent, at least zero), and no sign on zero. The
// printing is exact: that scale always keeps every significant digit.
func (p *canon) number(out []byte) ([]byte, error) {
	start := p.pos
	neg := false
	if p.in[p.pos] == '-' {
		neg = true
		p.pos++
	}
	digits := func() []byte {
		s := p.pos
		for p.pos < len(p.in) && p.in[p.pos] >= '0' && p.in[p.pos] <= '9' {
			p.pos++
		}
		return p.in[s:p.pos]
	}
	intPart := digits()
	if len(intPart) == 0 {
		return nil, p.errorf("invalid number, want a digit")
	}
	if len(intPart) > 1 && intPart[0] == '0' {
		p.pos = start
		return nil, p.errorf("invalid number: leading zero")
	}
	var frac []byte
	if p.pos < len(p.in) && p.in[p.pos] == '.' {
		p.pos++
		if frac = digits(); len(frac) == 0 {
			return nil, p.errorf("invalid number, want a digit after '.'")
		}
	}
	exp := int64(0)
	if p.pos < len(p.in) && (p.in[p.pos] == 'e' || p.in[p.pos] == 'E') {
		p.pos++
		expNeg := false
		if p.pos < len(p.in) && (p.in[p.pos] == '+' || p.in[p.pos] == '-') {
			expNeg = p.in[p.pos] == '-'
			p.pos++
		}
		e := digits()
		if len(e) == 0 {
			return nil, p.errorf("invalid number, want a digit in the exponent")
		}
		e = bytes.TrimLeft(e, "0")
		if len(e) > 10 {
			return nil, p.outOfRange(start)
		}
		for _, c := range e {
			exp = exp*10 + int64(c-'0')
		}
		if exp >= maxExponent {
			return nil, p.outOfRange(start)
		}
		if expNeg {
			exp = -exp
		}
	}
	// The literal is 0.D × 10^point, D being all its digits.
	d := make([]byte, 0, len(intPart)+len(frac))
	d = append(append(d, intPart...), frac...)
	point := int64(len(intPart)) + exp
	scale := max(int64(len(frac))-exp, 0)
	if scale > maxScale {
		return nil, p.outOfRange(start)
	}
	lead := int64(bytes.IndexFunc(d, func(r rune) bool { return r != '0' }))
	if lead < 0 { // zero
		n := int64(1)
		if scale > 0 {
			n += 1 + scale
		}
		if int64(len(out))+n > int64(p.limit) {
			return nil, p.errorf("canonical text longer than %d bytes", p.limit)
		}
		out = append(out, '0')
		if scale > 0 {
			out = append(out, '.')
			out = appendDigits(out, d, point, point+scale)
		}
		return out, nil
	}
	if point-lead-1 > maxWeight {
		return nil, p.outOfRange(start)
	}
	// Digit positions lead..point-1 are the integer part (or "0").
	n := max(point-lead, 1) + scale + 2
	if int64(len(out))+n > int64(p.limit) {
		return nil, p.errorf("canonical text longer than %d bytes", p.limit)
	}
	if neg {
		out = append(out, '-')
	}
	if lead < point {
		out = appendDigits(out, d, lead, point)
	} else {
		out = append(out, '0')
	}
	if scale > 0 {
		out = append(out, '.')
		out = appendDigits(out, d, point, point+scale)
	}
	return out, nil
}

func (p *canon) outOfRange(start int) error {
	lit := p.in[start:p.pos]
	if len(lit) > 40 {
		lit = append(bytes.Clone(lit[:37]), "..."...)
	}
	p.pos = start
	return p.errorf("number %s is outside PostgreSQL's numeric range", lit)
}

// appendDigits appends the digits at positions from..to-1 of d, positions
// outside d being zeros.
func appendDigits(out, d []byte, from, to int64) []byte {
	for i := from; i < to; i++ {
		if i >= 0 && i < int64(len(d)) {
			out = append(out, d[i])
			continue
		}
		// Runs of zeros can be long (1e131071): fill them in bulk.
		j := to
		if i < 0 {
			j = min(to, 0)
		}
		for ; i < j; i++ {
			out = append(out, '0')
		}
		i--
	}
	return out
}

// KDText is the six-line kd-mcp-v1 text to sign (LF-joined, no trailing LF);
// argsHash is ArgsHash(canonical).
func KDText(tool, agentID, timestamp, nonce, argsHash string) string {
	return strings.Join([]string{"kd-mcp-v1", tool, agentID, timestamp, nonce, argsHash}, "\n")
}

// ArgsHash is the lowercase hex SHA-256 of a canonical text.
func ArgsHash(canonical []byte) string {
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:])
}

var errKDSignature = errors.New("signing: kd signature: want 64 bytes in base64url or base64")

// DecodeKDSignature accepts base64url or standard base64, padding optional,
// and exactly 64 decoded bytes.
func DecodeKDSignature(s string) ([]byte, error) {
	// 64 bytes are 86 characters, and "==" when padded. Go's decoders skip
	// CR and LF, and the unpadded forms accept any length: check the shape
	// first so that only the two exact spellings pass.
	switch {
	case len(s) == 88 && strings.HasSuffix(s, "=="):
		s = s[:86]
	case len(s) != 86:
		return nil, errKDSignature
	}
	if strings.ContainsAny(s, "\r\n") {
		return nil, errKDSignature
	}
	for _, enc := range []*base64.Encoding{base64.RawURLEncoding, base64.RawStdEncoding} {
		// Strict refuses nonzero trailing bits, so each signature has one
		// spelling per alphabet.
		b, err := enc.Strict().DecodeString(s)
		if err == nil && len(b) == ed25519.SignatureSize {
			return b, nil
		}
	}
	return nil, errKDSignature
}
