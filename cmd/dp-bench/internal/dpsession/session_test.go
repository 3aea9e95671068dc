package dpsession

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/target"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// bins are the plugins the tests run, built once per test binary.
var bins struct{ testplugin, ours string }

func TestMain(m *testing.M) {
	// The test binary is also dp-bench's helper (os.Executable).
	if spec, ok := os.LookupEnv(proc.HelperEnv); ok {
		os.Exit(proc.RunHelper(spec))
	}
	dir, err := os.MkdirTemp("", "dp-bench-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, err := exec.Command("go", "build", "-o", dir+"/", "../testplugin", "../../../cdi-device-plugin").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building the test plugins: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	bins.testplugin, bins.ours = filepath.Join(dir, "testplugin"), filepath.Join(dir, "cdi-device-plugin")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// testSettings keep a run short; the windows are generous for a loaded
// machine where they must pass and only as long as the faults need.
func testSettings() target.Settings {
	return target.Settings{Calls: 3, Prompt: time.Second, Register: 3 * time.Second, Restart: 2 * time.Second,
		Change: 2 * time.Second, Settle: 300 * time.Millisecond, Connect: time.Second, Term: 5 * time.Second}
}

func testPlugin(fault string) target.Target {
	return target.Target{
		Name:         "testplugin",
		Command:      []string{bins.testplugin, "-dir", "{{.SocketDir}}", "-cdi-dir", "{{.CDIDir}}", "-dev-dir", "{{.DevDir}}", "-count", "4", "-fault", fault, "-late", "1500ms"},
		DeviceFiles:  4,
		RemoveDevice: "{{.DevDir}}/dev-2",
		IDs:          4,
		Resource:     "example.com/tp",
	}
}

func ourPlugin() target.Target {
	return target.Target{
		Name: "cdi-device-plugin",
		Command: []string{bins.ours, "--device-plugin-dir", "{{.SocketDir}}", "--cdi-dir", "{{.CDIDir}}",
			"--dev-root", "{{.DevDir}}", "--state-dir", "{{.WorkDir}}/state", "--pod-resources-socket", "{{.PodResources}}", "--log-level", "warn"},
		Env:          []string{"NUMBER_DEVICES=8", "RESOURCE_NAME=example.com/bench", "DEVICE_ID_PREFIX=bench", "NODE_NAME=node-1"},
		RemoveDevice: "{{.DevDir}}/bench-3",
		IDs:          8,
		Resource:     "example.com/bench",
	}
}

// runAll runs the targets once each, concurrently (they mostly wait), and
// returns their results in order.
func runAll(t *testing.T, targets []target.Target) []*report.RunResult {
	t.Helper()
	res := make([]*report.RunResult, len(targets))
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i := range targets {
		wg.Go(func() { res[i], errs[i] = Run(context.Background(), targets[i], testSettings()) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", targets[i].Label(), err)
		}
	}
	return res
}

// TestChecksCatchFaults: each fault of the test plugin fails exactly the
// check that guards the rule it breaks, and the plugin without a fault
// passes every check.
func TestChecksCatchFaults(t *testing.T) {
	testutil.NeedMknod(t)
	cases := []struct {
		fault string
		fails []string
	}{
		{"", nil},
		{"register-before-serve", []string{"serves-before-register"}},
		{"bad-version", []string{"register-version"}},
		{"bad-resource", []string{"register-resource"}},
		{"options-mismatch", []string{"register-options"}},
		{"late-list", []string{"listandwatch-initial"}},
		{"partial-allocate", []string{"allocate"}},
		{"accept-unknown", []string{"allocate-unknown"}},
		{"bad-cdi", []string{"cdi-resolve"}},
		{"preferred-drop-must", []string{"preferred-allocation"}},
		{"preferred-size", []string{"preferred-allocation"}},
		{"preferred-unavailable", []string{"preferred-allocation"}},
		{"prestart-fail", []string{"prestart"}},
		{"no-change", []string{"listandwatch-change"}},
		{"no-reregister", []string{"kubelet-restart"}},
		{"double-register", []string{"kubelet-restart"}},
		{"keep-socket", []string{"sigterm-socket"}},
	}
	var targets []target.Target
	for _, c := range cases {
		targets = append(targets, testPlugin(c.fault))
	}
	results := runAll(t, targets)
	for i, c := range cases {
		name := c.fault
		if name == "" {
			name = "no-fault"
		}
		t.Run(name, func(t *testing.T) {
			r := results[i]
			if got := r.Failed(); !slices.Equal(got, c.fails) {
				t.Errorf("failed checks %v, want %v", got, c.fails)
			}
			if c.fault == "" {
				assertAllPass(t, r)
			}
			if t.Failed() {
				t.Logf("checks: %+v\nerror: %s\nplugin log:\n%s", r.Checks, r.Err, r.Log)
			}
		})
	}
}

func assertAllPass(t *testing.T, r *report.RunResult) {
	t.Helper()
	for _, c := range report.PluginChecks {
		got, ok := r.Checks[c.ID]
		if !ok && c.ID == "uevent-change" {
			continue // only for targets that configure it (make bench's PCI target)
		}
		if got.Status != report.Pass {
			t.Errorf("%s: %s %s", c.ID, got.Status, got.Detail)
		}
	}
	if r.Err != "" {
		t.Errorf("run stopped early: %s", r.Err)
	}
}

// TestOurPluginPassesAll: the plugin of this repository passes every
// check, and the run measured what it should.
func TestOurPluginPassesAll(t *testing.T) {
	testutil.NeedMknod(t)
	r := runAll(t, []target.Target{ourPlugin()})[0]
	assertAllPass(t, r)
	for _, m := range []string{"start-registered", "start-listed", "ids", "rss", "allocate", "preferred", "prestart", "restart-registered", "removed-update"} {
		if _, ok := r.Metrics[m]; !ok {
			t.Errorf("metric %s not measured", m)
		}
	}
	if r.Metrics["ids"].Value != 8 {
		t.Errorf("ids %v", r.Metrics["ids"].Value)
	}
	if t.Failed() {
		t.Logf("plugin log:\n%s", r.Log)
	}
}

// TestPrivateMounts: a plugin that insists on fixed directories gets the
// run's fresh ones bound there, in its own mount namespace only.
func TestPrivateMounts(t *testing.T) {
	testutil.NeedMknod(t)
	base := t.TempDir()
	tg := testPlugin("")
	tg.SocketDir = filepath.Join(base, "not", "there", "device-plugins")
	tg.CDIDir = filepath.Join(base, "cdi")
	if err := os.Mkdir(tg.CDIDir, 0o755); err != nil {
		t.Fatal(err)
	}
	r := runAll(t, []target.Target{tg})[0]
	assertAllPass(t, r)
	if _, err := os.Stat(filepath.Join(base, "not")); !os.IsNotExist(err) {
		t.Errorf("the bind target was created on the host: %v", err)
	}
	if entries, _ := os.ReadDir(tg.CDIDir); len(entries) != 0 {
		t.Errorf("the plugin wrote into the host's %s: %v", tg.CDIDir, entries)
	}
}
