// Package local holds the scripts that run a local node for the e2e suite;
// this test checks their guards.
package local

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestClusterScriptGuards: cluster.sh never stops or removes what "up" did
// not make: "down" refuses without up's marker, and "up" refuses a kubelet
// root it did not make ("check" runs up's checks alone, so a broken guard
// cannot start a node here), and says what to do next. Both refusals
// happen before anything is touched, so the test is safe on a machine
// where a real cluster (or another test's) runs.
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
// without FEATURE_GATES in the environment, lib.sh takes the line of
// K8S_VERSION's minor (FEATURE_GATES_1_36, FEATURE_GATES_1_37) from
// e2e/versions.env: the pinned gates turn on what the DRA scenarios need
// and do not set the gates 1.37 made GA. A minor without a line and a
// malformed value stop the scripts.
func TestFeatureGatesYAML(t *testing.T) {
	for _, c := range []struct {
		name    string
		version string // K8S_VERSION; "": the pinned one
		gates   string // FEATURE_GATES; "": the line of the version's minor
		want    map[string]bool
		wantErr string
	}{
		{"pinned", "", "", map[string]bool{"DRAExtendedResource": true, "DRADeviceTaints": true, "ResourceHealthStatus": true, "DRAConsumableCapacity": true,
			"DRADeviceBindingConditions": true, "DRAResourceClaimDeviceStatus": true}, ""},
		{"1.36", "v1.36.3", "", map[string]bool{"DRAExtendedResource": true, "DRADeviceTaints": true, "ResourceHealthStatus": true, "DRAConsumableCapacity": true,
			"DRADeviceBindingConditions": true, "DRAResourceClaimDeviceStatus": true}, ""},
		// DRAExtendedResource and DRAResourceClaimDeviceStatus are GA and
		// locked in 1.37, DRADeviceTaints GA: setting one only earns a
		// warning; the beta gates stay pinned.
		{"1.37", "v1.37.2", "", map[string]bool{"ResourceHealthStatus": true, "DRAConsumableCapacity": true, "DRADeviceBindingConditions": true}, ""},
		{"no line for the minor", "v1.99.0", "", nil, "e2e/versions.env has no FEATURE_GATES_1_99 for K8S_VERSION=v1.99.0"},
		{"not a version", "latest", "", nil, "K8S_VERSION=latest is not vMAJOR.MINOR.PATCH"},
		{"given", "", "A=true,B=false", map[string]bool{"A": true, "B": false}, ""},
		{"given wins over the version's line", "v1.37.2", "A=true", map[string]bool{"A": true}, ""},
		{"not a boolean", "", "A=true,B=yes", nil, "'B=yes' is not Name=true or Name=false"},
		{"no value", "", "A", nil, "'A' is not Name=true or Name=false"},
		{"empty entry", "", "A=true,,B=true", nil, "'' is not Name=true or Name=false"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := envWithout("FEATURE_GATES", "K8S_VERSION")
			if c.gates != "" {
				env = append(env, "FEATURE_GATES="+c.gates)
			}
			if c.version != "" {
				env = append(env, "K8S_VERSION="+c.version)
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
			if len(got) != len(c.want) {
				t.Errorf("gates %v, want %v", got, c.want)
			}
		})
	}
}

// envWithout is the test's environment without the variables named.
func envWithout(names ...string) []string {
	var env []string
	for _, e := range os.Environ() {
		name, _, _ := strings.Cut(e, "=")
		if !slices.Contains(names, name) {
			env = append(env, e)
		}
	}
	return env
}

// TestRunSuiteSubset: run_suite hands E2E_RUN to go test -run (make e2e
// E2E_RUN=... runs a subset of the suite on the local node; CI's stage on
// the next Kubernetes version does), and no -run without it. A fake go on
// PATH prints the arguments it was given, one a line.
func TestRunSuiteSubset(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte("#!/bin/sh\nprintf 'arg %s\\n' \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	const pattern = `^TestDRA$|^TestE2E$/^(1-daemonset-capacity|2-pod-sees-its-devices)$`
	for _, c := range []struct {
		name, run string
		want      []string // the arguments after ./e2e/
	}{
		{"all", "", []string{"-x"}},
		{"subset", pattern, []string{"-run", pattern, "-x"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := append(envWithout("E2E_RUN", "PATH"), "PATH="+bin+":"+os.Getenv("PATH"))
			if c.run != "" {
				env = append(env, "E2E_RUN="+c.run)
			}
			cmd := exec.Command("bash", "-c", `source ../lib.sh && run_suite "" -x`)
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			var args []string
			for _, l := range strings.Split(string(out), "\n") {
				if a, ok := strings.CutPrefix(l, "arg "); ok {
					args = append(args, a)
				}
			}
			i := slices.Index(args, "./e2e/")
			if i < 0 || args[0] != "test" {
				t.Fatalf("go %q, want go test ... ./e2e/ ...:\n%s", args, out)
			}
			if got := args[i+1:]; !slices.Equal(got, c.want) {
				t.Errorf("go test arguments after ./e2e/: %q, want %q", got, c.want)
			}
		})
	}
}

// TestMakeVersions: a version given on make's command line reaches the
// scripts (e2e/lib.sh, where the environment wins over e2e/versions.env),
// with the feature gates of its minor: make e2e K8S_VERSION=v1.37.2 builds
// and runs that version. make e2e-versions prints what make e2e would use.
func TestMakeVersions(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"pinned", nil, []string{"K8S_VERSION=v1.36.3", "FEATURE_GATES=DRAExtendedResource=true,DRADeviceTaints=true,ResourceHealthStatus=true,DRAConsumableCapacity=true," +
			"DRADeviceBindingConditions=true,DRAResourceClaimDeviceStatus=true"}},
		{"command line", []string{"K8S_VERSION=v1.37.2"}, []string{"K8S_VERSION=v1.37.2", "FEATURE_GATES=ResourceHealthStatus=true,DRAConsumableCapacity=true,DRADeviceBindingConditions=true"}},
		{"gates on the command line", []string{"K8S_VERSION=v1.37.2", "FEATURE_GATES=A=true"}, []string{"K8S_VERSION=v1.37.2", "FEATURE_GATES=A=true"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command("make", append([]string{"-s", "--no-print-directory", "-C", "../..", "e2e-versions"}, c.args...)...)
			cmd.Env = envWithout("FEATURE_GATES", "K8S_VERSION", "MAKEFLAGS", "MFLAGS")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			for _, w := range c.want {
				if !slices.Contains(lines, w) {
					t.Errorf("make e2e-versions %s: no line %q:\n%s", strings.Join(c.args, " "), w, out)
				}
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

// TestKCMControllers: the local node's kube-controller-manager runs every
// default controller but those a cloud or node IPAM needs, named only when
// the binary knows them: 1.37 dropped cloud-node-lifecycle, node-route and
// service-lb, and refuses to start when told to disable an unknown one
// ('"cloud-node-lifecycle" is not in the list of known controllers'). Fake
// binaries print the two help texts; the cached real ones, when built, too.
func TestKCMControllers(t *testing.T) {
	const help = `      --controllers strings     A list of controllers to enable. '*' enables all on-by-default controllers.
                                All controllers: bootstrap-signer-controller, %s, daemonset-controller, node-ipam-controller, node-lifecycle-controller, %s
                                Disabled-by-default controllers: bootstrap-signer-controller (default [*])
`
	v136 := "*,-node-ipam-controller,-cloud-node-lifecycle-controller,-node-route-controller,-service-lb-controller"
	v137 := "*,-node-ipam-controller"
	dir := t.TempDir()
	fake := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\ncat >&2 <<'EOF'\n"+text+"EOF\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct{ name, bin, want string }{
		{"1.36", fake("kcm-1.36", fmt.Sprintf(help, "cloud-node-lifecycle-controller", "node-route-controller, service-lb-controller, ttl-controller")), v136},
		{"1.37", fake("kcm-1.37", fmt.Sprintf(help, "clusterrole-aggregation-controller", "ttl-controller")), v137},
		{"no list", fake("kcm-none", "usage\n"), ""},
	}
	cache := filepath.Join(os.Getenv("HOME"), ".cache", "cdi-device-plugin-e2e", "bin")
	for _, c := range []struct{ version, want string }{{"v1.36.3", v136}, {"v1.37.2", v137}} {
		if p := filepath.Join(cache, "kube-controller-manager-"+c.version); fileExists(p) {
			cases = append(cases, struct{ name, bin, want string }{"built " + c.version, p, c.want})
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := exec.Command("bash", "-c", `source ../lib.sh && kcm_controllers "$1"`, "bash", c.bin).CombinedOutput()
			if c.want == "" {
				if err == nil || !strings.Contains(string(out), "lists no controllers") {
					t.Fatalf("err %v, output %q; want a failure saying it lists no controllers", err, out)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if string(out) != c.want {
				t.Errorf("controllers %q, want %q", out, c.want)
			}
		})
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// TestRemoveMetadataSpecs: "down" removes the CDI specs the DRA kubelet
// plugin helper writes for a claim's device metadata
// (<driver>_metadata_<claim UID>_<request>.json in the CDI dir) when they
// were written since "up" and mount files below the kubelet's plugins
// directory, which down removes: they would name files that are gone. An
// older one, a vendor's spec of the same name pattern that mounts
// something else, and the driver's other specs stay.
func TestRemoveMetadataSpecs(t *testing.T) {
	cdiDir, plugins := t.TempDir(), filepath.Join(t.TempDir(), "plugins")
	marker := filepath.Join(t.TempDir(), "made-by-cluster-sh")
	spec := func(name, hostPath string, age time.Duration) string {
		p := filepath.Join(cdiDir, name)
		body := fmt.Sprintf(`{
  "cdiVersion": "0.5.0",
  "kind": "sim.example.com/metadata",
  "devices": [
    {
      "name": "u1_dev",
      "containerEdits": {
        "mounts": [
          {
            "hostPath": %q,
            "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/dev/sim.example.com-metadata.json",
            "options": ["ro", "bind"]
          }
        ]
      }
    }
  ]
}
`, hostPath)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(-age)
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-time.Hour)
	if err := os.Chtimes(marker, at, at); err != nil {
		t.Fatal(err)
	}
	ours := filepath.Join(plugins, "sim.example.com", "dra-device-metadata", "default_c", "dev", "metadata.json")
	gone := spec("sim.example.com_metadata_u1_dev.json", ours, 0)
	kept := []string{
		spec("sim.example.com_metadata_u0_dev.json", ours, 2*time.Hour), // before up
		spec("gpu.vendor.com_metadata_u2_dev.json", "/opt/vendor/metadata.json", 0),
		spec("k8s.sim.example.com-claim_u1.json", ours, 0), // not a metadata spec
	}
	out, err := exec.Command("bash", "-c", `source ../lib.sh && remove_metadata_specs "$@"`, "bash", cdiDir, plugins, marker).CombinedOutput()
	if err != nil {
		t.Fatalf("remove_metadata_specs: %v\n%s", err, out)
	}
	if fileExists(gone) {
		t.Errorf("%s, written since up and naming %s, is still there", gone, ours)
	}
	for _, p := range kept {
		if !fileExists(p) {
			t.Errorf("%s was removed", p)
		}
	}
}
