package userjson

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/dojo-relay/dojo/kungfu"
)

// Bounds of one document. Depth counts nested objects and arrays. Number
// literals are bounded because schema checks parse them exactly: a single
// 1e999999 costs such a parse a sixth of a second, a 500 000-digit literal
// most of a second.
const (
	MaxDepth    = 64
	MaxNumber   = 100 // bytes of one number literal
	MaxExponent = 400 // magnitude of a literal's written exponent
)

// Error says why a document was refused and where.
type Error struct {
	// Path names the offending value the way field errors do
	// ("payload.items.0"); "" is the document itself.
	Path    string
	Message string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Message
	}
	return e.Path + ": " + e.Message
}

// Check reads doc strictly and returns an *Error for the first thing it
// refuses: anything that is not one JSON value (RFC 8259), raw bytes that
// are not UTF-8, an escaped lone UTF-16 surrogate, \u0000 in any string or
// key (PostgreSQL cannot store it), an object naming the same key twice
// (after unescaping: readers disagree on which one wins), nesting deeper
// than MaxDepth, and number literals beyond MaxNumber or MaxExponent.
func Check(doc []byte) error {
	s := scanner{doc: doc}
	return s.run()
}

// Validate is Check as the protocol's refusal: VALIDATION_FAILED naming
// field followed by the path inside the document. field "" names the
// document's own members.
func Validate(field string, doc []byte) error {
	err := Check(doc)
	if err == nil {
		return nil
	}
	e := err.(*Error)
	at := e.Path
	if field != "" {
		at = strings.TrimSuffix(field+"."+e.Path, ".")
	}
	return kungfu.Invalid(kungfu.FieldError{Field: at, Message: e.Message})
}

// Step is one level of a path inside a document: an object member's Key,
// or an array element's Index (Index is -1 for object members).
type Step struct {
	Key   string
	Index int
}

// RewriteNumbers checks doc like Check and calls f with the path and
// literal of every number in it; a non-nil result replaces that literal.
// Everything else keeps its bytes. Without replacements doc is returned
// as is.
func RewriteNumbers(doc []byte, f func(path []Step, lit []byte) []byte) ([]byte, error) {
	s := scanner{doc: doc, number: f}
	if err := s.run(); err != nil {
		return nil, err
	}
	if len(s.edits) == 0 {
		return doc, nil
	}
	out := make([]byte, 0, len(doc))
	at := 0
	for _, e := range s.edits {
		out = append(out, doc[at:e.start]...)
		out = append(out, e.with...)
		at = e.end
	}
	return append(out, doc[at:]...), nil
}

// Integer returns the plain decimal form of a number literal whose value
// is whole ("1.0", "1e2", "-0.0" give "1", "100", "0"). ok is false for a
// fraction, for anything that is not a number literal, and for values of
// more than a thousand digits.
func Integer(lit []byte) (string, bool) {
	i, neg := 0, false
	if i < len(lit) && lit[i] == '-' {
		neg, i = true, i+1
	}
	start := i
	for i < len(lit) && isDigit(lit[i]) {
		i++
	}
	whole := string(lit[start:i])
	if whole == "" || (len(whole) > 1 && whole[0] == '0') {
		return "", false
	}
	frac := ""
	if i < len(lit) && lit[i] == '.' {
		i++
		start = i
		for i < len(lit) && isDigit(lit[i]) {
			i++
		}
		if frac = string(lit[start:i]); frac == "" {
			return "", false
		}
	}
	exp := 0
	if i < len(lit) && (lit[i] == 'e' || lit[i] == 'E') {
		i++
		sign := 1
		if i < len(lit) && (lit[i] == '+' || lit[i] == '-') {
			if lit[i] == '-' {
				sign = -1
			}
			i++
		}
		start = i
		for i < len(lit) && isDigit(lit[i]) {
			if exp < 1e6 {
				exp = exp*10 + int(lit[i]-'0')
			}
			i++
		}
		if i == start {
			return "", false
		}
		exp *= sign
	}
	if i != len(lit) {
		return "", false
	}
	// The value is 0.digits × 10^point.
	digits := whole + frac
	point := len(whole) + exp
	for len(digits) > 0 && digits[0] == '0' {
		digits, point = digits[1:], point-1
	}
	digits = strings.TrimRight(digits, "0")
	switch {
	case digits == "":
		return "0", true
	case point < len(digits), point > 1000:
		return "", false
	}
	digits += strings.Repeat("0", point-len(digits))
	if neg {
		digits = "-" + digits
	}
	return digits, true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

type edit struct {
	start, end int
	with       []byte
}

// scanner is one recursive-descent pass. It allocates the keys it has to
// compare and one key set per depth, reused by every object at that depth.
type scanner struct {
	doc    []byte
	i      int
	path   []Step
	seen   []*keySet
	number func(path []Step, lit []byte) []byte
	edits  []edit
}

func (s *scanner) run() error {
	s.space()
	if err := s.value(0); err != nil {
		return err
	}
	s.space()
	if s.i < len(s.doc) {
		return s.syntax("more data after the value")
	}
	return nil
}

func (s *scanner) value(depth int) error {
	if s.i >= len(s.doc) {
		return s.syntax("unexpected end")
	}
	switch c := s.doc[s.i]; {
	case c == '{':
		return s.object(depth + 1)
	case c == '[':
		return s.array(depth + 1)
	case c == '"':
		_, err := s.str(false)
		return err
	case c == '-' || isDigit(c):
		return s.num()
	case c == 't':
		return s.word("true")
	case c == 'f':
		return s.word("false")
	case c == 'n':
		return s.word("null")
	}
	return s.unexpected()
}

func (s *scanner) object(depth int) error {
	if depth > MaxDepth {
		return s.fail(fmt.Sprintf("nested deeper than %d levels", MaxDepth))
	}
	s.i++
	for len(s.seen) < depth {
		s.seen = append(s.seen, &keySet{})
	}
	keys := s.seen[depth-1]
	keys.reset()
	s.space()
	if s.at('}') {
		s.i++
		return nil
	}
	for {
		if !s.at('"') {
			return s.syntax("expected a quoted key")
		}
		key, err := s.str(true)
		if err != nil {
			return err
		}
		if !keys.add(key) {
			return s.fail(fmt.Sprintf("duplicate key %q", key))
		}
		s.space()
		if !s.at(':') {
			return s.syntax("expected ':' after a key")
		}
		s.i++
		s.space()
		s.path = append(s.path, Step{Key: key, Index: -1})
		if err := s.value(depth); err != nil {
			return err
		}
		s.path = s.path[:len(s.path)-1]
		s.space()
		switch {
		case s.at(','):
			s.i++
			s.space()
		case s.at('}'):
			s.i++
			return nil
		default:
			return s.syntax("expected ',' or '}'")
		}
	}
}

func (s *scanner) array(depth int) error {
	if depth > MaxDepth {
		return s.fail(fmt.Sprintf("nested deeper than %d levels", MaxDepth))
	}
	s.i++
	s.space()
	if s.at(']') {
		s.i++
		return nil
	}
	for n := 0; ; n++ {
		s.path = append(s.path, Step{Index: n})
		if err := s.value(depth); err != nil {
			return err
		}
		s.path = s.path[:len(s.path)-1]
		s.space()
		switch {
		case s.at(','):
			s.i++
			s.space()
		case s.at(']'):
			s.i++
			return nil
		default:
			return s.syntax("expected ',' or ']'")
		}
	}
}

// str reads one string; for a key it returns the unescaped text.
func (s *scanner) str(key bool) (string, error) {
	s.i++
	var buf []byte
	mark := s.i
	for s.i < len(s.doc) {
		c := s.doc[s.i]
		switch {
		case c == '"':
			var text string
			if key {
				text = string(append(buf, s.doc[mark:s.i]...))
			}
			s.i++
			return text, nil
		case c == '\\':
			if key {
				buf = append(buf, s.doc[mark:s.i]...)
			}
			r, err := s.escape(key)
			if err != nil {
				return "", err
			}
			if key {
				buf = utf8.AppendRune(buf, r)
			}
			mark = s.i
		case c < 0x20:
			return "", s.syntax("a raw control character in a string")
		case c < utf8.RuneSelf:
			s.i++
		default:
			r, n := utf8.DecodeRune(s.doc[s.i:])
			if r == utf8.RuneError && n == 1 {
				return "", s.fail(inKey(key, "not valid UTF-8"))
			}
			s.i += n
		}
	}
	return "", s.syntax("unterminated string")
}

// escape reads one backslash escape and returns the character it stands for.
func (s *scanner) escape(key bool) (rune, error) {
	if s.i+1 >= len(s.doc) {
		return 0, s.syntax("unterminated string")
	}
	c := s.doc[s.i+1]
	s.i += 2
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
	default:
		return 0, s.syntax(fmt.Sprintf("invalid escape \\%s", printable(c)))
	}
	r, ok := hex4(s.doc, s.i)
	if !ok {
		return 0, s.syntax("invalid \\u escape")
	}
	s.i += 4
	switch {
	case r == 0:
		return 0, s.fail(inKey(key, `must not contain NUL (\u0000) characters`))
	case r >= 0xDC00 && r <= 0xDFFF:
		return 0, s.fail(inKey(key, fmt.Sprintf(`holds a lone UTF-16 surrogate \u%04x`, r)))
	case r >= 0xD800 && r <= 0xDBFF:
		if s.i+6 <= len(s.doc) && s.doc[s.i] == '\\' && s.doc[s.i+1] == 'u' {
			if lo, ok := hex4(s.doc, s.i+2); ok && lo >= 0xDC00 && lo <= 0xDFFF {
				s.i += 6
				return utf16.DecodeRune(r, lo), nil
			}
		}
		return 0, s.fail(inKey(key, fmt.Sprintf(`holds a lone UTF-16 surrogate \u%04x`, r)))
	}
	return r, nil
}

func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

func (s *scanner) num() error {
	start := s.i
	if s.doc[s.i] == '-' {
		s.i++
	}
	switch {
	case s.at('0'):
		s.i++
	case s.i < len(s.doc) && isDigit(s.doc[s.i]):
		s.digits()
	default:
		return s.syntax("a number needs digits")
	}
	if s.at('.') {
		s.i++
		if s.digits() == 0 {
			return s.syntax("a number needs digits after '.'")
		}
	}
	exp := 0
	if s.at('e') || s.at('E') {
		s.i++
		if s.at('+') || s.at('-') {
			s.i++
		}
		from := s.i
		if s.digits() == 0 {
			return s.syntax("a number needs digits in its exponent")
		}
		for _, c := range s.doc[from:s.i] {
			if exp = exp*10 + int(c-'0'); exp > MaxExponent {
				break
			}
		}
	}
	if s.i-start > MaxNumber {
		return s.fail(fmt.Sprintf("a number literal longer than %d characters", MaxNumber))
	}
	if exp > MaxExponent {
		return s.fail(fmt.Sprintf("a number with an exponent beyond %d", MaxExponent))
	}
	if s.number != nil {
		if with := s.number(s.path, s.doc[start:s.i]); with != nil {
			s.edits = append(s.edits, edit{start, s.i, with})
		}
	}
	return nil
}

func (s *scanner) digits() int {
	from := s.i
	for s.i < len(s.doc) && isDigit(s.doc[s.i]) {
		s.i++
	}
	return s.i - from
}

func (s *scanner) word(w string) error {
	if len(s.doc)-s.i < len(w) || string(s.doc[s.i:s.i+len(w)]) != w {
		return s.unexpected()
	}
	s.i += len(w)
	return nil
}

func (s *scanner) space() {
	for s.i < len(s.doc) {
		switch s.doc[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) at(c byte) bool { return s.i < len(s.doc) && s.doc[s.i] == c }

func (s *scanner) unexpected() error {
	if s.i >= len(s.doc) {
		return s.syntax("unexpected end")
	}
	return s.syntax("unexpected " + printable(s.doc[s.i]))
}

func (s *scanner) syntax(msg string) error { return s.fail("not valid JSON: " + msg) }

func (s *scanner) fail(msg string) error {
	var b strings.Builder
	for i, st := range s.path {
		if i > 0 {
			b.WriteByte('.')
		}
		if st.Index >= 0 {
			b.WriteString(strconv.Itoa(st.Index))
		} else {
			b.WriteString(st.Key)
		}
	}
	return &Error{Path: b.String(), Message: msg}
}

func printable(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return strconv.QuoteRune(rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

func inKey(key bool, msg string) string {
	if key {
		return "key " + msg
	}
	return msg
}

// keySet holds the keys of the object being read at one depth: a short
// list while the object is small, a map once it is not.
type keySet struct {
	list []string
	set  map[string]struct{}
}

func (k *keySet) reset() {
	k.list = k.list[:0]
	clear(k.set)
}

func (k *keySet) add(key string) bool {
	if k.set != nil {
		if _, dup := k.set[key]; dup {
			return false
		}
		k.set[key] = struct{}{}
		return true
	}
	for _, have := range k.list {
		if have == key {
			return false
		}
	}
	if len(k.list) < 16 {
		k.list = append(k.list, key)
		return true
	}
	k.set = make(map[string]struct{}, 64)
	for _, have := range k.list {
		k.set[have] = struct{}{}
	}
	k.set[key] = struct{}{}
	return true
}
