package karmadue

import (
	"context"
	"crypto/rand"
	"math/big"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/credential"
)

// Label lengths, in characters.
const (
	minLabel = 2
	maxLabel = 40
	// maxFold bounds the folded form: compatibility forms such as U+FDFA
	// expand to 18 characters each, and every folded character costs two
	// kd_label_keys rows written under the global label lock.
	maxFold = 64
)

// confusable maps characters that read alike onto one representative, after
// case folding: digits and letters that pass for each other, the Cyrillic
// and Greek letters that look Latin, and separators.
var confusable = map[rune]rune{
	'0': 'o', '1': 'l', 'i': 'l', '|': 'l', 'ı': 'l', '!': 'l',
	'_': '-', '.': '-', ' ': '-',
	// Cyrillic.
	'а': 'a', 'в': 'b', 'е': 'e', 'к': 'k', 'м': 'm', 'н': 'h', 'о': 'o', 'р': 'p',
	'с': 'c', 'т': 't', 'у': 'y', 'х': 'x', 'і': 'l', 'ј': 'j', 'ѕ': 's', 'ԁ': 'd',
	'ԛ': 'q', 'ԝ': 'w', 'һ': 'h', 'ӏ': 'l',
	// Greek.
	'α': 'a', 'β': 'b', 'ε': 'e', 'ι': 'l', 'κ': 'k', 'ν': 'v', 'ο': 'o', 'ρ': 'p',
	'τ': 't', 'υ': 'u', 'χ': 'x',
}

// pairs read as one letter.
var pairs = strings.NewReplacer("rn", "m", "vv", "w", "cl", "d")

// fold is the form labels are compared in: compatibility-normalized, case
// folded, stripped of combining marks, confusables mapped to one
// representative. Two labels are lookalikes when their folds are at most
// one edit apart.
//
// Combining marks are dropped rather than refused: refusing them would
// refuse every script that writes vowels or accents as marks, while
// dropping them makes "Alicé", "Alice" plus U+0301 and "Alice" one name,
// and a mark stacked anywhere (invisible or not) can no longer split a
// lookalike from its original. The cost is that labels differing only by
// marks are lookalikes, which errs on the side of refusing.
func fold(label string) string {
	s := norm.NFKD.String(cases.Fold().String(norm.NFKC.String(label)))
	var b strings.Builder
	for _, r := range s {
		// Marks and the invisible rest (which printable refuses anyway)
		// must not count as an edit.
		if unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf, unicode.Other_Default_Ignorable_Code_Point) {
			continue
		}
		b.WriteRune(r)
	}
	// Recomposing keeps Hangul syllables one rune each, so a Korean label
	// is compared syllable by syllable, not jamo by jamo.
	s, b = norm.NFC.String(b.String()), strings.Builder{}
	for _, r := range s {
		if m, ok := confusable[r]; ok {
			r = m
		}
		b.WriteRune(r)
	}
	return pairs.Replace(b.String())
}

// reservation is what a live label holds in kd_label_keys: "=" and the fold,
// "-" and each one-deletion of it, and "~i:" and the deletion at rune i (two
// strings of one length one substitution apart share exactly that key).
func reservation(folded string) []string {
	r := []rune(folded)
	keys := []string{"=" + folded}
	seen := map[string]bool{keys[0]: true}
	for i := range r {
		del := string(r[:i]) + string(r[i+1:])
		for _, k := range []string{"-" + del, "~" + strconv.Itoa(i) + ":" + del} {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	return keys
}

// probes are the keys that meet a reservation of any label at most one edit
// from folded: the same fold; a live label one longer (its deletion equals
// folded); one shorter (its fold equals a deletion of folded); the same
// length with one substitution.
func probes(folded string) []string {
	r := []rune(folded)
	keys := []string{"=" + folded, "-" + folded}
	for i := range r {
		del := string(r[:i]) + string(r[i+1:])
		keys = append(keys, "="+del, "~"+strconv.Itoa(i)+":"+del)
	}
	return keys
}

// checkLabel refuses what can never be a label, naming field.
func checkLabel(field, label string) error {
	bad := func(msg string) error { return kungfu.Invalid(kungfu.FieldError{Field: field, Message: msg}) }
	if !utf8.ValidString(label) {
		return bad("must be valid UTF-8")
	}
	if label != strings.TrimSpace(label) {
		return bad("must not start or end with a space")
	}
	if n := utf8.RuneCountInString(label); n < minLabel || n > maxLabel {
		return bad("must be 2 to 40 characters")
	}
	if !printable(label) {
		return bad("must not contain control or invisible characters (format characters, variation selectors, fillers, blanks)")
	}
	if utf8.RuneCountInString(fold(label)) > maxFold {
		return bad("expands to more than 64 characters when normalized; use plain letters")
	}
	if handleRE.MatchString(strings.ToLower(label)) || agentIDRE.MatchString(strings.ToLower(label)) {
		// Identity is the handle; a label that looks like one would lie.
		return bad("must not look like an agent handle or id")
	}
	if kind := credential.Find(label); kind != "" {
		return kungfu.Errorf(kungfu.CodeCredentialInPayload, "%s holds what looks like a %s", field, kind).
			WithDetails(map[string]any{"field": field})
	}
	return nil
}

// printable reports whether s is valid UTF-8 of visible characters only.
// Controls, format characters (zero-width joiners, direction overrides),
// the other default-ignorable code points (variation selectors, the
// combining grapheme joiner, Hangul fillers), the braille blank, private
// use and unassigned code points render as nothing or anything, so they
// would let one name pass for another.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsGraphic(r) ||
			unicode.In(r, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector) ||
			r == '\u2800' {
			return false
		}
	}
	return true
}

// suggest builds a free label from the requested one: the platform
// appended, then the platform and a number, then a number. It is checked
// against the live reservations under labelLock, so it is free when given.
// The holder's label is never an input, so it is never named.
func suggest(ctx context.Context, tx pgx.Tx, label, platform string) (string, error) {
	plat := slug(platform)
	var candidates []string
	if plat != "" {
		candidates = append(candidates, withSuffix(label, plat))
	}
	for range 6 {
		n, _ := rand.Int(rand.Reader, big.NewInt(9000))
		num := strconv.FormatInt(1000+n.Int64(), 10)
		if plat != "" {
			candidates = append(candidates, withSuffix(label, plat+"-"+num))
		}
		candidates = append(candidates, withSuffix(label, num))
	}
	for _, c := range candidates {
		if checkLabel("name", c) != nil {
			continue
		}
		var taken bool
		if err := tx.QueryRow(ctx,
			`SELECT EXISTS (SELECT 1 FROM kd_label_keys k JOIN kd_agents a ON a.id = k.agent_id
			                WHERE a.status = 'active' AND k.key = ANY($1))`, probes(fold(c))).Scan(&taken); err != nil {
			return "", err
		}
		if !taken {
			return c, nil
		}
	}
	return "", nil
}

// withSuffix appends "-suffix", cutting the label so the whole stays within
// the length limit.
func withSuffix(label, suffix string) string {
	r := []rune(label)
	if keep := maxLabel - 1 - utf8.RuneCountInString(suffix); len(r) > keep {
		r = r[:max(keep, 0)]
	}
	return strings.TrimSpace(string(r)) + "-" + suffix
}

// slug keeps the letters and digits of a platform name, lowercased, at most
// 16 of them.
func slug(s string) string {
	var b strings.Builder
	n := 0
	for _, r := range strings.ToLower(s) {
		if n == 16 {
			break
		}
		if r < utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
			b.WriteRune(r)
			n++
		}
	}
	return b.String()
}
