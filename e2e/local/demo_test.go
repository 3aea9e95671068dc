package local

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// demoSandbox copies demo.sh and what it sources into a temporary tree
// whose deps.sh and cluster.sh only record that they ran (in the file
// calls), so that the demo can be run here without installing or starting
// anything (cluster.sh fails, so the demo stops there); it returns the
// tree and the calls file.
func demoSandbox(t *testing.T) (root, calls string) {
	t.Helper()
	root = t.TempDir()
	calls = filepath.Join(root, "calls")
	for _, f := range []string{"e2e/lib.sh", "e2e/versions.env", "e2e/local/demo.sh"} {
		b, err := os.ReadFile(filepath.Join("..", "..", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for stub, rc := range map[string]string{"deps.sh": "0", "cluster.sh": "1"} {
		// cluster.sh exits 1 after recording: the demo stops there.
		body := "#!/bin/sh\necho \"" + stub + " $*\" >>'" + calls + "'\nexit " + rc + "\n"
		if err := os.WriteFile(filepath.Join(root, "e2e", "local", stub), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root, calls
}

// TestDemoMode: make demo passes MODE to demo.sh, and
// demo.sh refuses a MODE it does not know, naming it, before it installs
// or starts anything; MODE=dra and the default go on to bring the node up.
func TestDemoMode(t *testing.T) {
	t.Run("make passes MODE", func(t *testing.T) {
		out, err := exec.Command("make", "-s", "-n", "-C", filepath.Join("..", ".."), "demo", "MODE=nosuchmode").CombinedOutput()
		if err != nil {
			t.Fatalf("make -n demo: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), `MODE="nosuchmode" e2e/local/demo.sh`) {
			t.Fatalf("make demo MODE=nosuchmode does not hand MODE to e2e/local/demo.sh:\n%s", out)
		}
	})
	for _, c := range []struct {
		mode    string
		refused bool
	}{
		{"nosuchmode", true},
		{"DRA", true},
		{"dra", false},
		{"device-plugin", false},
		{"", false},
	} {
		t.Run("MODE="+c.mode, func(t *testing.T) {
			root, calls := demoSandbox(t)
			cmd := exec.Command("bash", filepath.Join(root, "e2e", "local", "demo.sh"))
			cmd.Env = append(os.Environ(), "MODE="+c.mode, "E2E_WORK="+t.TempDir())
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("demo.sh succeeded with a cluster.sh that fails:\n%s", out)
			}
			ran, _ := os.ReadFile(calls)
			if !c.refused {
				if !strings.Contains(string(ran), "cluster.sh up") {
					t.Fatalf("MODE=%q: demo.sh did not bring the node up (ran %q):\n%s", c.mode, ran, out)
				}
				return
			}
			if len(ran) != 0 {
				t.Fatalf("MODE=%q: demo.sh ran %q before refusing:\n%s", c.mode, ran, out)
			}
			if want := "unknown MODE '" + c.mode + "'"; !strings.Contains(string(out), want) || !strings.Contains(string(out), "MODE=dra") {
				t.Fatalf("MODE=%q: the refusal does not name the value (%q) and the modes:\n%s", c.mode, want, out)
			}
		})
	}
}

// TestDemoFaultRecipe: the device-plugin demo deploys the plugin with
// the fault control on and ends with a one-line curl recipe that injects
// a fault through its socket.
func TestDemoFaultRecipe(t *testing.T) {
	b, err := os.ReadFile("demo.sh")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if !strings.Contains(s, "FAULT_CONTROL=true deploy/deploy.sh") {
		t.Error("demo.sh does not deploy the plugin with FAULT_CONTROL=true")
	}
	if !strings.Contains(s, "  curl --unix-socket /var/lib/cdi-device-plugin/cdi-device-plugin-faults.sock -X POST http://localhost/faults -d ") {
		t.Error("demo.sh prints no curl recipe of the plugin's fault control socket")
	}
}
