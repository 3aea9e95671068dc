package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

// TestLinkedPackages: the plugin, built as make builds it, links none of
// the packages that weigh on every node for nothing. text/template and
// html/template look methods up by name (reflect's MethodByName), and a
// binary that can do that keeps every exported method of every type it
// links: 2.2 MB of a 14.3 MB plugin, read into memory with the rest.
// golang.org/x/net/trace (gRPC's, left out by the grpcnotrace tag) brings
// html/template.
func TestLinkedPackages(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^GO_TAGS\s*:?=\s*(.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("no GO_TAGS in the Makefile")
	}
	tags := strings.TrimSpace(string(m[1]))
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go in PATH: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", "-tags", tags, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		deps[p] = true
	}
	if !deps["google.golang.org/grpc"] {
		t.Fatalf("go list -deps -tags %s lists no gRPC: %s", tags, out)
	}
	for _, p := range []string{"text/template", "html/template", "golang.org/x/net/trace"} {
		if deps[p] {
			t.Errorf("the plugin (tags %q) links %s", tags, p)
		}
	}
}

// TestDefaultGC: without GOGC in the environment the GC target is
// gcPercent; GOGC, when set (off included), is left to the runtime.
func TestDefaultGC(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	for _, c := range []struct {
		name string
		env  map[string]string
		want int
	}{
		{"unset", nil, gcPercent},
		{"set", map[string]string{"GOGC": "200"}, 100},
		{"off", map[string]string{"GOGC": "off"}, 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			debug.SetGCPercent(100)
			defaultGC(envOf(c.env))
			if got := debug.SetGCPercent(100); got != c.want {
				t.Fatalf("GC target %d, want %d", got, c.want)
			}
		})
	}
}
