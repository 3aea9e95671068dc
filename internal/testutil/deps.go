package testutil

import (
	"os/exec"
	"strings"
	"testing"
)

// Deps are the packages pkg links (go list -deps), for the tests that keep
// a binary's dependencies out; the test is skipped where go cannot tell
// (no go in PATH, no module).
func Deps(t testing.TB, pkg string) []string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go in PATH: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", pkg).CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v: %s", err, out)
	}
	return strings.Fields(string(out))
}
