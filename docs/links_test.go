package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLinksStayInside: README and docs ship in a clone and in the binary,
// so every relative link must name a file inside the repository. The README
// once pointed at a design page outside the repository, which a clone lacks.
func TestLinksStayInside(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	pages, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	pages = append(pages, filepath.Join(root, "README.md"))
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			abs := filepath.Clean(filepath.Join(filepath.Dir(page), target))
			if rel, err := filepath.Rel(root, abs); err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s links outside the repository: %s", filepath.Base(page), m[1])
				continue
			}
			if _, err := os.Stat(abs); err != nil {
				t.Errorf("%s links to a missing file: %s", filepath.Base(page), m[1])
			}
			checked++
		}
		if strings.Contains(string(b), "../shared") {
			t.Errorf("%s mentions ../shared, which is not part of the product", filepath.Base(page))
		}
	}
	if checked == 0 {
		t.Fatal("no links found: the pattern is broken")
	}
}
