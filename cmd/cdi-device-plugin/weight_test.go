package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
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

// gogc is the GC target now, read without changing it.
func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestGCTarget: without GOGC in the environment the GC target becomes
// gcPercent at the first registration, not before; GOGC, when set (off
// included), is left to the runtime.
func TestGCTarget(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	for _, c := range []struct {
		name string
		env  map[string]string
		want uint64
	}{
		{"unset", nil, gcPercent},
		{"set", map[string]string{"GOGC": "200"}, 100},
		{"off", map[string]string{"GOGC": "off"}, 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			debug.SetGCPercent(100)
			g := newGCTarget(envOf(c.env))
			if got := gogc(); got != 100 {
				t.Fatalf("GC target %d before the first registration, want 100", got)
			}
			g.inService()
			g.inService()
			if got := gogc(); got != c.want {
				t.Fatalf("GC target %d, want %d", got, c.want)
			}
		})
	}
	t.Run("the plugin's first registration", func(t *testing.T) {
		testutil.NeedMknod(t)
		debug.SetGCPercent(100)
		d := newDirs(t)
		// Built, served and its spec written, the plugin has not
		// registered (no kubelet): the target is Go's.
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		go func() { done <- run(ctx, d.args(), envOf(map[string]string{"NUMBER_DEVICES": "2"}), io.Discard) }()
		deadline := time.Now().Add(5 * time.Second)
		for {
			if m, _ := filepath.Glob(filepath.Join(d.plugins, "*.sock")); len(m) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no socket served within 5s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if got := gogc(); got != 100 {
			t.Fatalf("GC target %d before the first registration, want 100", got)
		}
		cancel()
		<-done
		startRun(t, newDirs(t), nil, map[string]string{"NUMBER_DEVICES": "2"})
		deadline = time.Now().Add(5 * time.Second)
		for gogc() != gcPercent {
			if time.Now().After(deadline) {
				t.Fatalf("GC target %d after the registration, want %d", gogc(), gcPercent)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}
