// Command fuzz runs every Go fuzz target of the module for a short time,
// one after another: `go test -fuzz` takes one target per run. It is part
// of README's test command, so every user-JSON entry point is fuzzed on
// each CI run and not only replayed from its seed corpus.
//
// Usage: go run ./cmd/fuzz [-time 5s] [-run REGEXP]
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
	d := flag.Duration("time", 5*time.Second, "how long to fuzz each target")
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
		fmt.Printf("fuzz: %s in ./%s for %s\n", t.name, t.dir, *d)
		cmd := exec.Command("go", "test", "-run", "^$", "-fuzz", "^"+t.name+"$", "-fuzztime", d.String(), "./"+t.dir)
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
