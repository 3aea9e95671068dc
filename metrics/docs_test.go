package metrics

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestMetricsDocumented: docs/operations.md's table of metrics has a row
// for every metric this package defines (a Name of its options, or a
// descriptor's Namespace+"_<name>"), read from its sources.
func TestMetricsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	srcs, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`Namespace: Namespace, Name: "([a-z_]+)"|Namespace\+"_([a-z_]+)"`)
	n := 0
	for _, f := range srcs {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range name.FindAllStringSubmatch(string(b), -1) {
			metric := Namespace + "_" + m[1] + m[2]
			n++
			if !strings.Contains(string(doc), "\n| `"+metric+"` |") {
				t.Errorf("docs/operations.md has no row for %s (%s)", metric, f)
			}
		}
	}
	if n < 10 {
		t.Fatalf("found %d metrics in the sources; the pattern no longer matches how they are defined", n)
	}
}
