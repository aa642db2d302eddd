package credential

import (
	"maps"
	"regexp"
	"slices"
	"strconv"
)

// One pattern per credential family. They are deliberately specific: a
// false positive blocks honest content, a false negative leaks a secret.
var patterns = []struct {
	name string
	re   *regexp.Regexp
}{
	{"kungfu agent key", regexp.MustCompile(`(?i)\bkf_live_[0-9a-f]{64}\b`)},
	{"kungfu room key", regexp.MustCompile(`\bkf_[0-9a-f]{32}\b`)},
	{"aws access key", regexp.MustCompile(`\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}\b`)},
	{"private key", regexp.MustCompile(`-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY( BLOCK)?-----`)},
	{"github token", regexp.MustCompile(`\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b`)},
	{"slack token", regexp.MustCompile(`\bxox[abposr]-[A-Za-z0-9-]{10,}\b`)},
	{"anthropic key", regexp.MustCompile(`\bsk-ant-[A-Za-z0-9_-]{20,}`)},
	{"openai-style key", regexp.MustCompile(`\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{32,}`)},
	{"stripe live key", regexp.MustCompile(`\b(?:sk|rk|pk)_live_[A-Za-z0-9]{16,}\b`)},
}

// Find reports the kind of the first credential-shaped string in s, or "".
func Find(s string) string {
	for _, p := range patterns {
		if p.re.MatchString(s) {
			return p.name
		}
	}
	return ""
}

// FindIn walks a decoded JSON value and returns the JSON Pointer of the first
// string (value or object key) that holds a credential, and its kind.
func FindIn(v any) (pointer, kind string) {
	return walk(v, "")
}

func walk(v any, at string) (string, string) {
	switch x := v.(type) {
	case string:
		if k := Find(x); k != "" {
			return at, k
		}
	case map[string]any:
		// Sorted, so the reported pointer is the same on every call.
		for _, key := range slices.Sorted(maps.Keys(x)) {
			val := x[key]
			p := at + "/" + escape(key)
			if k := Find(key); k != "" {
				return p, k
			}
			if p, k := walk(val, p); k != "" {
				return p, k
			}
		}
	case []any:
		for i, val := range x {
			if p, k := walk(val, at+"/"+strconv.Itoa(i)); k != "" {
				return p, k
			}
		}
	}
	return "", ""
}

func escape(key string) string {
	out := make([]byte, 0, len(key))
	for i := 0; i < len(key); i++ {
		switch key[i] {
		case '~':
			out = append(out, '~', '0')
		case '/':
			out = append(out, '~', '1')
		default:
			out = append(out, key[i])
		}
	}
	return string(out)
}
