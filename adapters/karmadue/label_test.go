package karmadue

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dojo-relay/dojo/kungfu"
)

// distance is the plain Levenshtein distance over runes, the definition
// the index keys must agree with.
func distance(a, b string) int {
	x, y := []rune(a), []rune(b)
	prev := make([]int, len(y)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(x); i++ {
		cur := make([]int, len(y)+1)
		cur[0] = i
		for j := 1; j <= len(y); j++ {
			sub := prev[j-1]
			if x[i-1] != y[j-1] {
				sub++
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, sub)
		}
		prev = cur
	}
	return prev[len(y)]
}

// lookalike is what the database answers: a probe of one label meets the
// reservation of the other.
func lookalike(a, b string) bool {
	res := reservation(fold(a))
	for _, p := range probes(fold(b)) {
		if slices.Contains(res, p) {
			return true
		}
	}
	return false
}

func TestLookalikes(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"Alice", "alice", true},
		{"Alice", "Alise", true},
		{"Alice", "Alic", true},
		{"Alice", "Aliice", true},
		{"Alice", "A1ice", true},
		{"Alice", "AL1CE", true},
		{"Alice", "Аlice", true},  // Cyrillic А
		{"modern", "modem", true}, // rn reads as m
		{"my bot", "my_bot", true},
		// Invisible or combining characters no longer split a lookalike
		// from its original (review of issue 8); printable refuses most of
		// them outright, fold drops the marks it lets through.
		{"Alice", "A\uFE0Fl\uFE0Fice", true},
		{"Alice", "Alice\u3164\u3164", true},
		{"Alice", "A\u034Fl\u034Fice", true},
		{"Alice", "Ali\u0301\u0302\u0303ce", true},
		{"Alice", "Alicé", true},
		{"Alice", "Ali\u20DDce", true}, // enclosing mark
		{"Alice", "Alicia", false},
		{"abc", "bca", false}, // share a deletion, two edits apart
		{"Alice", "Bob", false},
		{"ab", "ba", false},
	} {
		if got := lookalike(c.a, c.b); got != c.want {
			t.Errorf("lookalike(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

// TestLabelRefusals covers checkLabel alone, including what reaches it
// from suggest.
func TestLabelRefusals(t *testing.T) {
	for _, label := range []string{
		"A\uFE0Fl\uFE0Fice", "Alice\U000E01EF", "A\u034Fl\u034Fice", "Alice\u3164\u3164", "\u115FAlice",
		"Al\u1160ice", "Alice\uFFA0", "Alice\u2800", "Al\u00ADice", "Alice\u2028", "Alice\U000F0000",
		strings.Repeat("\uFDFA", 40), strings.Repeat("\uFDFA", 4),
	} {
		err := checkLabel("name", label)
		if e := kungfu.AsError(err); e == nil || e.Code != kungfu.CodeValidationFailed || fieldOf(err) != "name" {
			t.Errorf("checkLabel(%+q) = %v", label, err)
		}
	}
	// The folded form may reach the bound, not pass it: U+FDFA folds to 18
	// characters, three of them and ten letters are 64.
	for _, label := range []string{strings.Repeat("\uFDFA", 3) + "abcdefghij", "Alicé", "김철수", "Bot ❤"} {
		if err := checkLabel("name", label); err != nil {
			t.Errorf("checkLabel(%+q) = %v", label, err)
		}
	}
	if n := utf8.RuneCountInString(fold(strings.Repeat("\uFDFA", 3) + "abcdefghij")); n != maxFold {
		t.Errorf("fold is %d characters, want %d", n, maxFold)
	}
	// Hangul is compared by syllable, not by jamo.
	if n := utf8.RuneCountInString(fold("김철수")); n != 3 {
		t.Errorf("fold(김철수) is %d characters", n)
	}
}

// FuzzLookalike checks the index keys against the definition: two labels
// collide exactly when their folds are at most one edit apart, either way
// round.
func FuzzLookalike(f *testing.F) {
	for _, s := range [][2]string{{"Alice", "alice"}, {"abc", "bca"}, {"ab", "ba"}, {"Scout", "Sc0ut"}, {"rnodern", "modem"}, {"日本語", "日本"}, {"a", ""}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if !utf8.ValidString(a) || !utf8.ValidString(b) || len(a) > 64 || len(b) > 64 {
			return
		}
		want := distance(fold(a), fold(b)) <= 1
		if got := lookalike(a, b); got != want {
			t.Fatalf("lookalike(%q, %q) = %v; folds %q %q", a, b, got, fold(a), fold(b))
		}
		if lookalike(b, a) != want {
			t.Fatalf("lookalike is not symmetric for %q, %q", a, b)
		}
	})
}
