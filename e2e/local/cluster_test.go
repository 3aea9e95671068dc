// Package local holds the scripts that run a local node for the e2e suite;
// this test checks their guards.
package local

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestClusterScriptGuards (issue 8 item 12): cluster.sh never stops or
// removes what "up" did not make: "down" refuses without up's marker, and
// "up" refuses a kubelet root it did not make ("check" runs up's checks
// alone, so a broken guard cannot start a node here). Both refusals happen
// before anything is touched, so the test is safe on a machine where a
// real cluster (or another test's) runs.
func TestClusterScriptGuards(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("cluster.sh needs root")
	}
	for _, cmd := range []string{"down", "check"} {
		t.Run(cmd, func(t *testing.T) {
			work, root := t.TempDir(), t.TempDir()
			keep := filepath.Join(root, "pods", "kept")
			if err := os.MkdirAll(filepath.Dir(keep), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(keep, []byte("a real node's kubelet state"), 0o644); err != nil {
				t.Fatal(err)
			}
			c := exec.Command("bash", "cluster.sh", cmd)
			c.Env = append(os.Environ(), "E2E_WORK="+work, "E2E_KUBELET_ROOT="+root)
			out, err := c.CombinedOutput()
			if err == nil {
				t.Fatalf("%s succeeded:\n%s", cmd, out)
			}
			if !strings.Contains(string(out), "refusing") {
				t.Fatalf("%s failed without saying it refuses:\n%s", cmd, out)
			}
			if _, err := os.Stat(keep); err != nil {
				t.Fatalf("%s removed the kubelet root: %v\n%s", cmd, err, out)
			}
			if entries, _ := os.ReadDir(work); len(entries) != 0 {
				t.Fatalf("%s wrote into E2E_WORK: %v", cmd, entries)
			}
		})
	}
}
