// Command fuzz runs every Go fuzz target of the module for a short time,
// one after another: `go test -fuzz` takes one target per run. It is part
// of README's test command, so every user-JSON entry point is fuzzed on
// each CI run and not only replayed from its seed corpus.
//
// Each target runs for a number of executions, not for a duration: Go 1.26's
// fuzz coordinator can report a spurious "context deadline exceeded" when a
// -fuzztime duration ends while a worker is busy (go.dev/issue/75804), and a
// count never meets that deadline. -timeout still bounds a run that hangs.
//
// Usage: go run ./cmd/fuzz [-execs N] [-run REGEXP]
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

var fuzzFunc = regexp.MustCompile(`^func (Fuzz\w+)\(\w+ \*testing\.F\)`)

func main() {
	execs := flag.Int("execs", 30000, "how many inputs to try per target")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up on a target after this long")
	run := flag.String("run", "", "only targets whose name matches this regexp")
	flag.Parse()
	var only *regexp.Regexp
	if *run != "" {
		only = regexp.MustCompile(*run)
	}
	targets, err := find(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fuzz:", err)
		os.Exit(1)
	}
	failed := 0
	ran := 0
	for _, t := range targets {
		if only != nil && !only.MatchString(t.name) {
			continue
		}
		ran++
		fmt.Printf("fuzz: %s in ./%s, %d inputs\n", t.name, t.dir, *execs)
		// A target in a module of its own (third_party/go-sdk) is run from
		// that module's root: the main module does not contain it.
		mod, pkg := module(t.dir)
		cmd := exec.Command("go", "test", "-run", "^$", "-fuzz", "^"+t.name+"$",
			"-fuzztime", fmt.Sprintf("%dx", *execs), "-timeout", timeout.String(), "./"+pkg)
		cmd.Dir = mod
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			failed++
			fmt.Printf("fuzz: %s FAILED: %v\n", t.name, err)
		}
	}
	fmt.Printf("fuzz: %d passed, %d failed\n", ran-failed, failed)
	if failed > 0 || ran == 0 {
		os.Exit(1)
	}
}

type target struct{ dir, name string }

// module returns the root of the module holding dir (the nearest parent
// with a go.mod, "." at the latest) and dir relative to it.
func module(dir string) (root, rel string) {
	for d := dir; d != "." && d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			r, _ := filepath.Rel(d, dir)
			return d, filepath.ToSlash(r)
		}
	}
	return ".", dir
}

// find lists the fuzz targets below root by reading the test files.
func find(root string) ([]target, error) {
	var out []target
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && path != root && (strings.HasPrefix(e.Name(), ".") || e.Name() == "testdata") {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if m := fuzzFunc.FindStringSubmatch(sc.Text()); m != nil {
				out = append(out, target{dir: filepath.ToSlash(filepath.Dir(path)), name: m[1]})
			}
		}
		return sc.Err()
	})
	sort.Slice(out, func(i, j int) bool { return out[i].dir+out[i].name < out[j].dir+out[j].name })
	return out, err
}
