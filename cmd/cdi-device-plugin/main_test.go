package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
)

type dirs struct{ plugins, cdi, dev, state string }

func newDirs(t testing.TB) dirs {
	t.Helper()
	short, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(short) })
	base := t.TempDir()
	d := dirs{plugins: short, cdi: filepath.Join(base, "cdi"), dev: filepath.Join(base, "dev"), state: filepath.Join(base, "state")}
	if err := os.Mkdir(d.dev, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d dirs) args(extra ...string) []string {
	return append([]string{"--device-plugin-dir", d.plugins, "--cdi-dir", d.cdi, "--dev-root", d.dev, "--state-dir", d.state}, extra...)
}

// podResources is the socket of a PodResources stand-in that lists no
// pods, served for the whole test binary: the kubelet of a node, DRA
// driver or not. The claim guard fails closed until PodResources answers
// (no device is advertised healthy), so a plugin run here asks it, not
// the PodResources of a kubelet that runs on the machine.
var podResources string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "dp-pr")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer func() { _ = os.RemoveAll(dir) }()
		podResources = filepath.Join(dir, "pod-resources.sock")
		pr, err := kubeletsim.ServePodResources(podResources)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer pr.Stop()
		return m.Run()
	}())
}

// envOf is an environment of m alone, but for POD_RESOURCES_SOCKET:
// podResources (listing no pods) unless m sets it.
func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		if !ok && k == "POD_RESOURCES_SOCKET" {
			return podResources, true
		}
		return v, ok
	}
}

// syncBuffer is a goroutine-safe log sink (testutil.SyncBuffer).
type syncBuffer = testutil.SyncBuffer

// running is the plugin run in-process against the kubelet stand-in,
// registered, with a ListAndWatch stream open.
type running struct {
	kubelet *kubeletsim.Kubelet
	reg     kubeletsim.Registration
	c       *kubeletsim.Client
	updates <-chan kubeletsim.Update
	last    *kubeletsim.Update // the last update read by wait
	stderr  *syncBuffer
	stop    func() int // cancels the run, returns its exit status
}

func startRun(t testing.TB, d dirs, args []string, env map[string]string) *running {
	t.Helper()
	k, err := kubeletsim.Start(d.plugins)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{kubelet: k, stderr: &syncBuffer{}}
	done := make(chan int, 1)
	go func() { done <- run(ctx, d.args(args...), envOf(env), r.stderr) }()
	var once sync.Once
	code := 0
	r.stop = func() int {
		once.Do(func() { cancel(); code = <-done })
		return code
	}
	t.Cleanup(func() { r.stop() })
	if r.reg, err = k.WaitRegistration(5 * time.Second); err != nil {
		t.Fatalf("%v; log:\n%s", err, r.stderr.String())
	}
	r.c, r.updates = testutil.Watch(ctx, t, d.plugins, r.reg.Request.Endpoint)
	return r
}

func TestBadConfigExits2AndWritesNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"bad count", map[string]string{"NUMBER_DEVICES": "-1"}, nil, `NUMBER_DEVICES="-1"`},
		{"bad env prefix", map[string]string{"ENV_PREFIX": "A-B"}, nil, `ENV_PREFIX="A-B"`},
		{"escaping file prefix", map[string]string{"DEVICE_FILE_PREFIX": "../x"}, nil, `DEVICE_FILE_PREFIX="../x"`},
		{"unknown flag", nil, []string{"--frobnicate"}, "frobnicate"},
		// Checked by the constructors, still before anything is written.
		{"long socket dir", nil, []string{"--device-plugin-dir", "/" + strings.Repeat("d", 100)}, `device-plugin-dir="/ddd`},
		// Said at every log level, not only those that show errors.
		{"long socket dir, log level panic", map[string]string{"LOG_LEVEL": "panic"}, []string{"--device-plugin-dir", "/" + strings.Repeat("d", 100)}, `device-plugin-dir="/ddd`},
		{"bad exec template", map[string]string{"CONFIG_FILE": "EXEC_TEMPLATE"}, nil, `resources[0].prestart.steps[0].command="/bin/echo {{.Serial}}"`},
		// 262,144 IDs, a list the kubelet cannot read.
		{"list too large", map[string]string{"CONFIG_FILE": "BIG_LIST"}, nil, `example.com/big can list 262144 device IDs`},
		{"no CDI annotation key", map[string]string{"DEVICE_LIST_STRATEGY": "cdi-annotations", "PLUGIN_NAME": strings.Repeat("p", 24), "RESOURCE_NAME": "example.com/" + strings.Repeat("r", 30)},
			[]string{"--device-plugin-dir", "/t"}, `RESOURCE_NAME="example.com/rrrr`},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newDirs(t)
			if c.env["CONFIG_FILE"] == "BIG_LIST" {
				c.env["CONFIG_FILE"] = writeConfig(t, "resources:\n- name: example.com/big\n  count: 4096\n  replicas: 64\n")
			}
			if c.env["CONFIG_FILE"] == "EXEC_TEMPLATE" {
				c.env["CONFIG_FILE"] = writeConfig(t, "resources:\n- name: example.com/a\n  prestart:\n    steps: [{type: exec, command: [/bin/echo, \"{{.Serial}}\"]}]\n")
			}
			var stderr syncBuffer
			code := run(context.Background(), d.args(c.args...), envOf(c.env), &stderr)
			if code != 2 {
				t.Fatalf("exit %d, want 2; stderr: %s", code, stderr.String())
			}
			if !strings.Contains(strings.ReplaceAll(stderr.String(), `\"`, `"`), c.want) {
				t.Fatalf("stderr %q does not name %q", stderr.String(), c.want)
			}
			for _, dir := range []string{d.cdi, d.dev, d.plugins, d.state} {
				if entries, _ := os.ReadDir(dir); len(entries) != 0 {
					t.Fatalf("%s written: %v", dir, entries)
				}
			}
		})
	}
	// A dev root that does not exist is a configuration error too.
	d := newDirs(t)
	var stderr syncBuffer
	if code := run(context.Background(), append(d.args(), "--dev-root", "/nonexistent-dev-root"), envOf(nil), &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "dev-root") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}

// TestPluginEndToEnd runs the whole plugin in-process against the kubelet
// stand-in: registration, 8 healthy devices, an Allocate whose CDI names
// resolve with a fresh cache into the host nodes, health on node removal,
// and cleanup on shutdown. Stale specs of this plugin go at start.
func TestPluginEndToEnd(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	// A stale spec of ours (resource no longer configured) and a foreign one.
	if err := os.MkdirAll(d.cdi, 0o755); err != nil {
		t.Fatal(err)
	}
	stale := `{"cdiVersion":"0.6.0","kind":"k8s.example.com/old","annotations":{"cdi-device-plugin/owner":"simple-device-plugin"},"devices":[{"name":"x","containerEdits":{"env":["A=1"]}}]}`
	foreign := `{"cdiVersion":"0.6.0","kind":"vendor.com/gpu","devices":[{"name":"x","containerEdits":{"env":["A=1"]}}]}`
	_ = os.WriteFile(filepath.Join(d.cdi, "k8s.example.com-old.json"), []byte(stale), 0o644)
	_ = os.WriteFile(filepath.Join(d.cdi, "vendor.com-gpu.json"), []byte(foreign), 0o644)

	env := map[string]string{"NUMBER_DEVICES": "8", "RESOURCE_NAME": "example.com/sim", "DEVICE_ID_PREFIX": "sim",
		"ENV_PREFIX": "SIM", "NODE_NAME": "node-a", "DEVICE_LIST_STRATEGY": "cdi-cri,cdi-annotations"}
	r := startRun(t, d, nil, env)
	reg, c, updates, ctx := r.reg, r.c, r.updates, context.Background()
	if reg.Request.ResourceName != "example.com/sim" || !strings.HasPrefix(reg.Request.Endpoint, "simple-device-plugin-example_com_sim-") {
		t.Fatalf("registration %+v", reg.Request)
	}
	first, err := kubeletsim.WaitFor(updates, 5*time.Second, func(kubeletsim.Update) bool { return true })
	if err != nil || len(first.Devices) != 8 || first.Healthy() != 8 {
		t.Fatalf("first list %+v %v", first, err)
	}

	specPath := filepath.Join(d.cdi, "k8s.example.com-sim.json")
	if _, err := os.Stat(filepath.Join(d.cdi, "k8s.example.com-old.json")); !os.IsNotExist(err) {
		t.Errorf("stale spec of ours not removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.cdi, "vendor.com-gpu.json")); err != nil {
		t.Errorf("foreign spec removed: %v", err)
	}

	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"sim-node-a-2", "sim-node-a-5"}}}})
	if err != nil {
		t.Fatal(err)
	}
	cr := resp.ContainerResponses[0]
	var names []string
	for _, n := range cr.CdiDevices {
		names = append(names, n.Name)
	}
	_, annotated, err := cdiapi.ParseAnnotations(cr.Annotations)
	if err != nil || strings.Join(annotated, ",") != strings.Join(names, ",") {
		t.Fatalf("CDI annotations %v vs %v: %v", annotated, names, err)
	}
	// Resolve as containerd does: a fresh cache over the spec dir.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(d.cdi), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, names...); err != nil {
		t.Fatal(err)
	}
	if len(spec.Linux.Devices) != 2 {
		t.Fatalf("injected %+v", spec.Linux.Devices)
	}
	for _, dev := range spec.Linux.Devices {
		host := filepath.Join(d.dev, filepath.Base(dev.Path))
		var st unix.Stat_t
		if err := unix.Stat(host, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR ||
			int64(unix.Major(uint64(st.Rdev))) != dev.Major || int64(unix.Minor(uint64(st.Rdev))) != dev.Minor || dev.Major != 1 || dev.Minor != 3 {
			t.Fatalf("host node for %+v: %v", dev, err)
		}
	}
	if strings.Join(spec.Process.Env, " ") != "SIM_2=/dev/sim-2 SIM_5=/dev/sim-5" {
		t.Fatalf("env %v", spec.Process.Env)
	}

	// Health: removing a node reports it, restoring it too; the spec is
	// not rewritten for a health change.
	before, _ := os.Stat(specPath)
	if err := os.Remove(filepath.Join(d.dev, "sim-4")); err != nil {
		t.Fatal(err)
	}
	if _, err := kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool {
		return u.Health("sim-node-a-4") == pluginapi.Unhealthy && u.Healthy() == 7
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"sim-node-a-4"}}}}); err == nil {
		t.Fatal("allocated an unhealthy device")
	}
	if err := unix.Mknod(filepath.Join(d.dev, "sim-4"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if _, err := kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 8 }); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(specPath)
	if !os.SameFile(before, after) {
		t.Error("spec rewritten on a health change")
	}

	if code := r.stop(); code != 0 {
		t.Fatalf("exit %d; log:\n%s", code, r.stderr.String())
	}
	if _, err := os.Stat(filepath.Join(d.plugins, reg.Request.Endpoint)); !os.IsNotExist(err) {
		t.Errorf("socket left after shutdown: %v", err)
	}
	// Specs and nodes stay: containers restarting during an upgrade need them.
	if _, err := os.Stat(specPath); err != nil {
		t.Errorf("spec removed on shutdown: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.dev, "sim-0")); err != nil {
		t.Errorf("node removed on shutdown: %v", err)
	}
}

// TestSIGTERM builds the binary and checks a signal shuts it down cleanly.
func TestSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	d := newDirs(t)
	testutil.NeedMknod(t)
	bin := filepath.Join(t.TempDir(), "cdi-device-plugin")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	k, err := kubeletsim.Start(d.plugins)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	cmd := exec.Command(bin, d.args("--pod-resources-socket", podResources)...)
	cmd.Env = []string{"NUMBER_DEVICES=2"}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reg, err := k.WaitRegistration(10 * time.Second)
	if err != nil {
		_ = cmd.Process.Kill()
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(d.plugins, reg.Request.Endpoint)); !os.IsNotExist(err) {
		t.Fatalf("socket left: %v", err)
	}
	if !strings.Contains(stderr.String(), "shut down cleanly") {
		t.Fatalf("log: %s", stderr.String())
	}
}

// TestPreStartEndToEnd: a config-file resource with reset and a 1 MiB
// reprogram; PreStartContainer through gRPC updates the state that the CDI
// spec mounts into the container; a corrupt image fails the call and makes
// the device Unhealthy on ListAndWatch; a fixed image and a reset heal it.
func TestPreStartEndToEnd(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	img := filepath.Join(t.TempDir(), "bitstream.bin")
	good := bytes.Repeat([]byte{0xa5}, 1<<20)
	if err := os.WriteFile(img, good, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(good)
	cfgFile := filepath.Join(t.TempDir(), "config.yaml")
	cfg := fmt.Sprintf(`
resources:
- name: example.com/fpga
  count: 2
  idPrefix: fpga
  prestart:
    steps:
    - type: reset
    - type: reprogram
      image: %s
      sha256: %s
`, img, hex.EncodeToString(sum[:]))
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	r := startRun(t, d, []string{"--config", cfgFile}, nil)
	reg, c, updates, ctx, stderr := r.reg, r.c, r.updates, context.Background(), r.stderr
	if !reg.Request.Options.PreStartRequired {
		t.Fatal("PreStartRequired not set for a resource with steps")
	}
	ids := []string{"fpga-0", "fpga-1"}
	stateOf := func(id string) prestart.State {
		t.Helper()
		s, err := prestart.LoadState(filepath.Join(d.state, "devices", id))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for gen := int64(1); gen <= 2; gen++ {
		if _, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids}); err != nil {
			t.Fatalf("%v\n%s", err, stderr.String())
		}
		for _, id := range ids {
			if s := stateOf(id); s.Generation != gen || s.Status != prestart.StatusReady || s.Firmware == nil || s.Firmware.SHA256 != hex.EncodeToString(sum[:]) {
				t.Fatalf("%s after call %d: %+v", id, gen, s)
			}
		}
	}

	// The state directory reaches the container read-only through CDI.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(d.cdi), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, "k8s.example.com/fpga=fpga-1"); err != nil {
		t.Fatal(err)
	}
	if len(spec.Mounts) != 1 || spec.Mounts[0].Source != filepath.Join(d.state, "devices", "fpga-1") ||
		spec.Mounts[0].Destination != "/run/cdi-device-plugin/fpga-1" || !slices.Contains(spec.Mounts[0].Options, "ro") {
		t.Fatalf("mounts %+v", spec.Mounts)
	}

	// Corrupt image: the call fails naming device, step and cause, and the
	// devices go Unhealthy.
	if err := os.WriteFile(img, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids[:1]})
	if err == nil || !strings.Contains(err.Error(), "device fpga-0: step reprogram:") || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("corrupt image: %v", err)
	}
	if _, err := kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool {
		return u.Health("fpga-0") == pluginapi.Unhealthy && u.Health("fpga-1") == pluginapi.Healthy
	}); err != nil {
		t.Fatal(err)
	}
	if s := stateOf("fpga-0"); s.Status != prestart.StatusFailed || s.Generation != 2 {
		t.Fatalf("%+v", s)
	}
	// Fixed: the next start (a container restart) resets and heals it.
	if err := os.WriteFile(img, good, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids[:1]}); err != nil {
		t.Fatal(err)
	}
	if _, err := kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 2 }); err != nil {
		t.Fatal(err)
	}
	if s := stateOf("fpga-0"); s.Status != prestart.StatusReady || s.Generation != 3 {
		t.Fatalf("%+v", s)
	}
}
