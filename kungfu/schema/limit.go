package schema

import (
	"encoding/json"
	"fmt"
	"regexp"
	"regexp/syntax"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/dojo-relay/dojo/kungfu/userjson"
)

// Limits of a schema document. The validator library compiles in time
// that grows with the number of subschemas times their nesting (it checks
// the document against its metaschema, whose $dynamicRef resolution walks
// the whole scope chain), and a few hundred bytes of regular expression
// can take a second to compile; measured on one core, a 32 KB schema of
// 4 000 nested "not" took 90 s and 1 000 patterns of [\pL\pN]{1000} took
// 0.6 s. Within these limits the worst compile stays near 20 ms.
const (
	// MaxBytes is the size of a schema document, the protocol's limit for
	// output.schema, applied to assignment output schemas too.
	MaxBytes = 32 << 10
	// MaxNesting is how deeply objects and arrays nest in a schema
	// document; real schemas rarely pass ten.
	MaxNesting = 32
	// MaxObjects counts objects anywhere in a schema document, enum and
	// const values included: any of them can be compiled through a $ref.
	MaxObjects = 500
	// MaxPatternBytes is the total source of the schema's distinct
	// regular expressions (pattern, patternProperties), and
	// MaxUnicodeClasses the \p and \P classes among them: parsing costs
	// up to 13 µs a byte where such classes are merged ([\pL-\pN]).
	MaxPatternBytes   = 2048
	MaxUnicodeClasses = 64
	// MaxPatternInsts is the total size of their compiled programs:
	// compiling costs up to 250 ns an instruction, and matching up to
	// 60 ns an instruction per input byte, which the budget charges to
	// every string checked.
	MaxPatternInsts = 10000
)

// Limits of a payload checked against a schema, and of every number
// literal in a schema or such a payload.
const (
	// MaxDepth is how deeply objects and arrays nest in a payload checked
	// against a schema: the bound Dojo's JSON reader enforces on every
	// document, so it only refuses here for callers that skipped it.
	MaxDepth = userjson.MaxDepth
	// MaxDigits bounds a number literal written out in full (1e400 and
	// 0.5e-3 count 401 and 5 digits): the validator compares numbers
	// exactly (math/big), and 1e999999 alone costs such a parse 35 ms, a
	// 100 000-digit literal 40 ms. Counted written out because PostgreSQL
	// stores a schema's 1e400 as 401 digits, which must still load.
	MaxDigits = 512
)

// scan checks a decoded schema document against the limits above before
// the library sees it.
func scan(doc any) error {
	objects := 0
	var walk func(v any, depth int) error
	walk = func(v any, depth int) error {
		switch v := v.(type) {
		case map[string]any:
			if objects++; objects > MaxObjects {
				return fmt.Errorf("more than %d objects; simplify the schema", MaxObjects)
			}
			if depth > MaxNesting {
				return fmt.Errorf("nested deeper than %d levels", MaxNesting)
			}
			for _, x := range v {
				if err := walk(x, depth+1); err != nil {
					return err
				}
			}
		case []any:
			if depth > MaxNesting {
				return fmt.Errorf("nested deeper than %d levels", MaxNesting)
			}
			for _, x := range v {
				if err := walk(x, depth+1); err != nil {
					return err
				}
			}
		case json.Number:
			if err := checkNumber(string(v)); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(doc, 1)
}

// checkNumber refuses a literal too long or too large to compare exactly
// at a bounded cost.
func checkNumber(lit string) error {
	exp, _ := exponent(lit)
	digits := 0
	for i := 0; i < len(lit) && lit[i] != 'e' && lit[i] != 'E'; i++ {
		if lit[i] >= '0' && lit[i] <= '9' {
			digits++
		}
	}
	if digits+exp > MaxDigits {
		if len(lit) > 24 {
			lit = lit[:24] + "…"
		}
		return fmt.Errorf("number %s has more than %d digits written out", lit, MaxDigits)
	}
	return nil
}

// exponent returns the magnitude of a literal's written exponent and the
// number of its fraction digits (both scale the denominator or numerator
// math/big builds).
func exponent(lit string) (exp, frac int) {
	if i := strings.IndexAny(lit, "eE"); i >= 0 {
		e := strings.TrimLeft(lit[i+1:], "+-")
		if len(e) > 9 {
			exp = 1 << 30
		} else {
			exp, _ = strconv.Atoi(e)
		}
		lit = lit[:i]
	}
	if i := strings.IndexByte(lit, '.'); i >= 0 {
		frac = len(lit) - i - 1
	}
	return exp, frac
}

// engine compiles the schema's regular expressions with Go's regexp, as
// the library does by default, within MaxPatternBytes and
// MaxPatternInsts, and remembers each program's size for the budget.
// After compiling it only serves "format": "regex" (asserted by drafts
// before 2019-09), where a payload string is parsed, never compiled.
type engine struct {
	checking             atomic.Bool
	bytes, size, classes int
	seen                 map[string]*pattern
	err                  error // the first limit passed, reported as is
}

// pattern is a compiled regular expression and what matching costs per
// input byte, in nanoseconds: Go's matcher may step every instruction at
// every byte, measured at up to 30 ns an instruction and 60 where a
// character class has many ranges ([\pL\pN]{1000}x on 200 KB: 10 s).
type pattern struct {
	*regexp.Regexp
	perByte uint64
}

func (e *engine) done() { e.checking.Store(true) }

func (e *engine) compile(s string) (jsonschema.Regexp, error) {
	classes, fold := scanPattern(s)
	if fold {
		// Case folding a wide range costs the parser milliseconds
		// ((?i)[\x{41}-\x{1E921}] takes 3 ms), and JSON Schema patterns
		// are ECMA-262, which has no inline flags at all.
		return nil, e.fail(fmt.Errorf("pattern %q: inline flags like (?i) are not supported", clip(s)))
	}
	if e.checking.Load() {
		// Validity is all "format": "regex" asks; parsing answers it.
		_, err := syntax.Parse(s, syntax.Perl)
		return nil, err
	}
	if p := e.seen[s]; p != nil {
		return p, nil
	}
	if e.bytes += len(s); e.bytes > MaxPatternBytes {
		return nil, e.fail(fmt.Errorf("regular expressions total more than %d bytes", MaxPatternBytes))
	}
	if e.classes += classes; e.classes > MaxUnicodeClasses {
		return nil, e.fail(fmt.Errorf("regular expressions use more than %d Unicode classes (\\p, \\P)", MaxUnicodeClasses))
	}
	re, err := syntax.Parse(s, syntax.Perl)
	if err != nil {
		return nil, err
	}
	// Estimated before compiling: compiling is what costs.
	if e.size += estimate(re); e.size > MaxPatternInsts {
		return nil, e.fail(fmt.Errorf("regular expressions are too large (over %d program steps in total); simplify counted repetitions like {1000}", MaxPatternInsts))
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return nil, err
	}
	rx, err := regexp.Compile(s)
	if err != nil {
		return nil, err
	}
	p := &pattern{Regexp: rx}
	for _, in := range prog.Inst {
		if in.Op == syntax.InstRune && len(in.Rune) > 8 {
			p.perByte += 60
		} else {
			p.perByte += 30
		}
	}
	e.seen[s] = p
	return p, nil
}

func (e *engine) fail(err error) error {
	if e.err == nil && !e.checking.Load() {
		e.err = err
	}
	return err
}

// scanPattern counts the Unicode class escapes of a regular expression
// source and reports an inline flag group that turns case folding on.
// Escapes are skipped, so \(?i is a literal; inside a bracket (?i is
// also taken as flags, a harmless false alarm.
func scanPattern(s string) (classes int, fold bool) {
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s):
			if s[i+1] == 'p' || s[i+1] == 'P' {
				classes++
			}
			i++
		case s[i] == '(' && i+1 < len(s) && s[i+1] == '?':
			for j := i + 2; j < len(s) && (s[j] == '-' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z'); j++ {
				if s[j] == 'i' {
					fold = true
				}
			}
		}
	}
	return classes, fold
}

// estimate bounds the program size of a parsed expression from above,
// counted repetitions expanded as Simplify expands them.
func estimate(re *syntax.Regexp) int {
	const cap = 1 << 24
	n := 0
	switch re.Op {
	case syntax.OpLiteral:
		n = len(re.Rune)
	case syntax.OpCapture:
		n = 2 + estimate(re.Sub[0])
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest:
		n = 2 + estimate(re.Sub[0])
	case syntax.OpRepeat:
		copies := max(re.Min, re.Max) + 1
		n = copies * (2 + estimate(re.Sub[0]))
	case syntax.OpConcat, syntax.OpAlternate:
		for _, sub := range re.Sub {
			n += 1 + estimate(sub)
		}
	default:
		n = 1
	}
	return min(n+2, cap)
}
