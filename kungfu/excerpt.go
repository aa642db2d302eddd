package kungfu

import (
	"strings"
	"unicode/utf8"
)

// MaxExcerpt is how much of a stranger's reply (a task receiver's, a
// letterbox's) Dojo keeps with each attempt.
const MaxExcerpt = 4000

// Excerpt keeps the first MaxExcerpt bytes of a reply as text PostgreSQL
// accepts, cut on a rune boundary: a receiver is a stranger too, and
// invalid UTF-8 or a NUL would make recording its answer fail.
func Excerpt(b []byte) string {
	s := strings.ReplaceAll(strings.ToValidUTF8(string(b), "\uFFFD"), "\x00", "\uFFFD")
	if len(s) <= MaxExcerpt {
		return s
	}
	cut := MaxExcerpt
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
