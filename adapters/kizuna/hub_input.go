package kizuna

import (
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// Path ids and query filters reach SQL text parameters, and PostgreSQL
// refuses NUL and invalid UTF-8 with an error, not a miss. They are
// checked here first, so odd bytes get a 404 or a 422, never a 500, and a
// long filter cannot make every row's comparison expensive.

// maxIDLen bounds an agent id in a path or filter; names are at most 32
// characters, so anything longer cannot exist.
const maxIDLen = 64

// maxQuery bounds the directory's free-text search.
const maxQuery = 200

// textOK reports whether s is valid UTF-8 of at most max bytes, free of
// NUL.
func textOK(s string, max int) bool {
	return len(s) <= max && utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// validTaskID reports whether s has the shape of the ids the hub mints
// (newTaskID); no other id can name a letter.
func validTaskID(s string) bool {
	if len(s) != 14 || !strings.HasPrefix(s, "T-") {
		return false
	}
	for _, c := range s[2:] {
		if !strings.ContainsRune(idAlphabet, c) {
			return false
		}
	}
	return true
}

// queryText reads filter name from the query string: at most max bytes of
// NUL-free UTF-8, else a 422 naming it.
func queryText(r *http.Request, name string, max int) (string, error) {
	s := r.URL.Query().Get(name)
	if !textOK(s, max) {
		return "", invalid(field{name, fmt.Sprintf("must be UTF-8 text of at most %d bytes without NUL", max)})
	}
	return s, nil
}
