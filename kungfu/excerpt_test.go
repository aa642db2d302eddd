package kungfu

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestExcerpt(t *testing.T) {
	if got := Excerpt([]byte("short")); got != "short" {
		t.Fatal(got)
	}
	long := strings.Repeat("é", 3000) // 6000 bytes, 2 bytes a rune
	got := Excerpt([]byte(long))
	if len(got) != 4000 || !utf8.ValidString(got) {
		t.Fatalf("len %d valid %v", len(got), utf8.ValidString(got))
	}
	odd := "x" + strings.Repeat("€", 2000) // 3-byte runes: the cut must step back
	got = Excerpt([]byte(odd))
	if len(got) > 4000 || !utf8.ValidString(got) || len(got) < 3997 {
		t.Fatalf("len %d valid %v", len(got), utf8.ValidString(got))
	}
	if got := Excerpt([]byte{'a', 0xff, 'b'}); got != "a\uFFFDb" {
		t.Fatalf("invalid UTF-8 not replaced: %q", got)
	}
	// A receiver's NUL would make PostgreSQL refuse the whole verdict.
	if got := Excerpt([]byte("a\x00b")); got != "a\uFFFDb" {
		t.Fatalf("NUL not replaced: %q", got)
	}
	if Excerpt(nil) != "" {
		t.Fatal("empty body")
	}
}
