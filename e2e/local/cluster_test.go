// Package local holds the scripts that run a local node for the e2e suite;
// this test checks their guards.
package local

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestClusterScriptGuards (issue 8 item 12): cluster.sh never stops or
// removes what "up" did not make: "down" refuses without up's marker, and
// "up" refuses a kubelet root it did not make ("check" runs up's checks
// alone, so a broken guard cannot start a node here), and says what to do
// next (issue 28, item 10). Both refusals happen
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
			// up's refusal says what to do next (make demo shows it).
			if cmd == "check" {
				for _, next := range []string{"clean machine or VM", "E2E_WORK=<that dir> make demo-down"} {
					if !strings.Contains(string(out), next) {
						t.Errorf("%s refuses without saying what to do (%q):\n%s", cmd, next, out)
					}
				}
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

// TestPluginHostFollowsTheUnit: the host plugin of e2e scenario 10 runs as
// systemd would run deploy/systemd/cdi-device-plugin.service: a clean
// environment with the unit's Environment= first and its env file after
// (EnvironmentFile format: comments, quotes; a later line wins), the
// unit's capability bounding set and NoNewPrivileges, its ExecStart.
func TestPluginHostFollowsTheUnit(t *testing.T) {
	work := t.TempDir()
	envFile := filepath.Join(t.TempDir(), "env")
	if err := os.WriteFile(envFile, []byte(`# a comment
  ; another
RESOURCE_NAME=example.com/a
NUMBER_DEVICES = "4"
ENV_PREFIX='SIM'

RESOURCE_NAME=example.com/b
NODE_NAME=node-x
`), 0o644); err != nil {
		t.Fatal(err)
	}
	c := exec.Command("bash", "cluster.sh", "unit-command", envFile)
	c.Env = append(os.Environ(), "E2E_WORK="+work)
	out, err := c.Output()
	if err != nil {
		t.Fatalf("unit-command: %v", err)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")

	unit, err := os.ReadFile("../../deploy/systemd/cdi-device-plugin.service")
	if err != nil {
		t.Fatal(err)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	bounding := "-all"
	var noNewPrivs bool
	for _, l := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(l, "CapabilityBoundingSet="); ok {
			for _, c := range strings.Fields(v) {
				bounding += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
			}
		}
		noNewPrivs = noNewPrivs || l == "NoNewPrivileges=yes"
	}
	if !strings.Contains(bounding, "+mknod") || !noNewPrivs {
		t.Fatalf("the unit changed: bounding set %q, NoNewPrivileges=yes %v", bounding, noNewPrivs)
	}
	want := []string{"env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"NODE_NAME=" + host, // the unit's Environment=NODE_NAME=%H
		"RESOURCE_NAME=example.com/a", "NUMBER_DEVICES=4", "ENV_PREFIX=SIM", "RESOURCE_NAME=example.com/b", "NODE_NAME=node-x",
		"setpriv", "--bounding-set", bounding, "--inh-caps", "-all", "--no-new-privs",
		filepath.Join(work, "images", "cdi-device-plugin")}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("command\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// env applies its assignments in order, as systemd does: the later wins.
	envOut, err := exec.Command("env", "-i", "A=1", "A=2", "env").Output()
	if err != nil || strings.TrimSpace(string(envOut)) != "A=2" {
		t.Fatalf("env with A twice: %q %v", envOut, err)
	}
}

// TestFeatureGatesYAML: FEATURE_GATES, as cluster.sh passes it to the
// control plane, becomes the featureGates map of the kubelet's
// configuration (cluster.sh) and of kind's cluster config (kind/run.sh);
// the pinned value turns on the gates the DRA scenarios need, and a
// malformed value stops the scripts.
func TestFeatureGatesYAML(t *testing.T) {
	for _, c := range []struct {
		name, gates string // gates "": the pinned value of e2e/versions.env
		want        map[string]bool
		wantErr     string
	}{
		{"pinned", "", map[string]bool{"DRAExtendedResource": true, "DRADeviceTaints": true, "ResourceHealthStatus": true}, ""},
		{"given", "A=true,B=false", map[string]bool{"A": true, "B": false}, ""},
		{"not a boolean", "A=true,B=yes", nil, "'B=yes' is not Name=true or Name=false"},
		{"no value", "A", nil, "'A' is not Name=true or Name=false"},
		{"empty entry", "A=true,,B=true", nil, "'' is not Name=true or Name=false"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var env []string
			for _, e := range os.Environ() {
				if !strings.HasPrefix(e, "FEATURE_GATES=") {
					env = append(env, e)
				}
			}
			if c.gates != "" {
				env = append(env, "FEATURE_GATES="+c.gates)
			}
			cmd := exec.Command("bash", "-c", `source ../lib.sh && feature_gates_yaml "  "`)
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			if c.wantErr != "" {
				if err == nil || !strings.Contains(string(out), c.wantErr) {
					t.Fatalf("err %v, output %q; want a failure saying %q", err, out, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			var got map[string]bool
			if err := yaml.UnmarshalStrict(append([]byte("featureGates:\n"), out...), &struct {
				FeatureGates *map[string]bool `json:"featureGates"`
			}{&got}); err != nil {
				t.Fatalf("not a YAML map: %v\n%s", err, out)
			}
			for k, v := range c.want {
				if g, ok := got[k]; !ok || g != v {
					t.Errorf("%s: %v (set: %v), want %v; all: %v", k, g, ok, v, got)
				}
			}
			if c.gates != "" && len(got) != len(c.want) {
				t.Errorf("gates %v, want %v", got, c.want)
			}
		})
	}
}

// TestOtherKubelet: "up" refuses to start beside a kubelet it did not
// start that shares this machine's mounts (its /var/lib/kubelet is ours),
// and ignores one in another mount namespace (a kind node's, inside its
// container), so that make e2e and make e2e-kind can run side by side.
func TestOtherKubelet(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("cluster.sh needs root")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare")
	}
	if out, _ := exec.Command("pgrep", "-x", "kubelet").Output(); len(out) > 0 {
		t.Skip("a kubelet runs on this machine already")
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(t.TempDir(), "kubelet") // pgrep -x kubelet finds it
	if err := os.WriteFile(fake, data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		argv    []string
		refused bool
	}{
		{"same mount namespace", []string{fake, "60"}, true},
		{"another mount namespace", []string{"unshare", "--mount", fake, "60"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := exec.Command(c.argv[0], c.argv[1:]...)
			if err := k.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = k.Process.Kill(); _ = k.Wait() }()
			// The fake is found once it runs under its own name.
			for i := 0; i < 100; i++ {
				if out, _ := exec.Command("pgrep", "-x", "kubelet").Output(); len(out) > 0 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			sh := exec.Command("bash", "cluster.sh", "check")
			sh.Env = append(os.Environ(), "E2E_WORK="+t.TempDir(), "E2E_KUBELET_ROOT="+filepath.Join(t.TempDir(), "absent"))
			out, _ := sh.CombinedOutput()
			if got := strings.Contains(string(out), "another kubelet is running"); got != c.refused {
				t.Fatalf("refused beside the kubelet: %v, want %v:\n%s", got, c.refused, out)
			}
			if c.refused && !strings.Contains(string(out), "clean machine or VM") {
				t.Errorf("refused beside the kubelet without saying what to do:\n%s", out)
			}
		})
	}
}
