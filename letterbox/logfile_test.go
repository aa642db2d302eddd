package letterbox

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLogFileRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "logs", "dojo-box.log")
	l, err := OpenLogFile(path, 100, 3)
	if err != nil {
		t.Fatal(err)
	}
	line := func(c byte) []byte { return append(bytes.Repeat([]byte{c}, 39), '\n') } // 40 bytes
	for _, c := range "abcdefghij" {
		if n, err := l.Write(line(byte(c))); err != nil || n != 40 {
			t.Fatalf("write %c: %d %v", c, n, err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// Two lines fit in 100 bytes: ab cd ef gh ij, so the current file has
	// i and j, .1 g and h, .2 e and f, .3 c and d; a and b are gone.
	want := map[string]string{"": "ij", ".1": "gh", ".2": "ef", ".3": "cd"}
	for suffix, letters := range want {
		b, err := os.ReadFile(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != string(line(letters[0]))+string(line(letters[1])) {
			t.Errorf("%s holds %q, want lines of %s", filepath.Base(path+suffix), b, letters)
		}
		if info, _ := os.Stat(path + suffix); info.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v", suffix, info.Mode())
		}
	}
	if _, err := os.Stat(path + ".4"); !os.IsNotExist(err) {
		t.Errorf("a fourth old file was kept: %v", err)
	}

	// Reopening appends and counts what is there.
	l, err = OpenLogFile(path, 100, 3)
	if err != nil {
		t.Fatal(err)
	}
	l.Write(line('k'))
	l.Close()
	b, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(b), string(line('k'))) {
		t.Errorf("after reopening a full file, the new line should start a fresh file: %q", b)
	}
}
