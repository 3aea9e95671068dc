package main

// Tests of the invariant the plugin lives by: every device advertised on
// ListAndWatch as Healthy is described by the spec on disk, and every path
// that spec names exists, for the device's whole life (hot plug, failed
// writes, specs removed by others, restarts). They run the plugin
// in-process against the kubelet stand-in, with real files and sockets.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// mknod makes a char device node below the dev root (parents included).
func mknod(t *testing.T, d dirs, rel string, major, minor uint32) {
	t.Helper()
	testutil.Mknod(t, filepath.Join(d.dev, rel), major, minor)
}

func writeConfig(t testing.TB, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// serialConfig is a hostDevices resource without prestart steps: the
// default for config-file resources.
const serialConfig = `
resources:
- name: example.com/serial
  idPrefix: ser
  envPrefix: SER
  hostDevices: ["ttyR*"]
`

// resolve does what the kubelet and containerd do with ids: Allocate, then
// resolve the CDI names it returns through a fresh cache over the spec dir
// and inject them. Every path the injected edits name on the host must
// exist (runc refuses a missing mount source). It returns the OCI spec.
func resolve(ctx context.Context, d dirs, c *kubeletsim.Client, ids ...string) (*oci.Spec, error) {
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return nil, fmt.Errorf("allocate %v: %w", ids, err)
	}
	var names []string
	for _, n := range resp.ContainerResponses[0].CdiDevices {
		names = append(names, n.Name)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(d.cdi), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, err
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, names...); err != nil {
		return nil, fmt.Errorf("inject %v: %w", names, err)
	}
	for _, m := range spec.Mounts {
		if _, err := os.Stat(m.Source); err != nil {
			return nil, fmt.Errorf("mount source of %s: %w", m.Destination, err)
		}
	}
	for _, n := range names {
		for _, dn := range cache.GetDevice(n).ContainerEdits.DeviceNodes {
			if _, err := os.Stat(dn.HostPath); err != nil {
				return nil, fmt.Errorf("node of %s: %w", n, err)
			}
		}
	}
	return spec, nil
}

// wait returns the first ListAndWatch update, the last one seen included,
// for which cond holds.
func (r *running) wait(timeout time.Duration, cond func(kubeletsim.Update) bool) (kubeletsim.Update, error) {
	if r.last != nil && cond(*r.last) {
		return *r.last, nil
	}
	u, err := kubeletsim.WaitFor(r.updates, timeout, func(u kubeletsim.Update) bool {
		r.last = &u
		return cond(u)
	})
	return u, err
}

// waitResolves waits until ids are listed Healthy and resolve.
func waitResolves(t *testing.T, r *running, d dirs, timeout time.Duration, ids ...string) *oci.Spec {
	t.Helper()
	if _, err := r.wait(timeout, func(u kubeletsim.Update) bool {
		return !slices.ContainsFunc(ids, func(id string) bool { return u.Health(id) != pluginapi.Healthy })
	}); err != nil {
		t.Fatalf("%v healthy: %v; log:\n%s", ids, err, r.stderr.String())
	}
	spec, err := resolve(context.Background(), d, r.c, ids...)
	if err != nil {
		t.Fatalf("%v; log:\n%s", err, r.stderr.String())
	}
	return spec
}

// TestHotPluggedHostDeviceResolves: a host device that
// appears after start gets a spec entry whose state-dir mount source
// exists, so a container given it can start.
func TestHotPluggedHostDeviceResolves(t *testing.T) {
	for _, c := range []struct{ name, cfg string }{
		{"without steps", serialConfig},
		// With steps, the spec mounts each device's state directory.
		{"with an exec step", serialConfig + "  prestart:\n    steps: [{type: exec, command: [/bin/true]}]\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newDirs(t)
			testutil.NeedMknod(t)
			mknod(t, d, "ttyR0", 4, 64)
			r := startRun(t, d, []string{"--config", writeConfig(t, c.cfg)}, nil)
			spec := waitResolves(t, r, d, 5*time.Second, "ser-ttyR0")
			if mounted := len(spec.Mounts) == 1; mounted != strings.Contains(c.cfg, "exec") {
				t.Fatalf("state mounts %+v", spec.Mounts)
			}

			mknod(t, d, "ttyR1", 4, 65)
			waitResolves(t, r, d, 5*time.Second, "ser-ttyR1")
		})
	}
}

// TestNoHostDeviceAtStart: a host resource that matches nothing at start
// registers with no device and no spec (the CDI library refuses an empty
// one); the first device that appears gets a spec and resolves.
func TestNoHostDeviceAtStart(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	r := startRun(t, d, []string{"--config", writeConfig(t, serialConfig)}, nil)
	if u, err := r.wait(5*time.Second, func(kubeletsim.Update) bool { return true }); err != nil || len(u.Devices) != 0 {
		t.Fatalf("first list %+v %v", u.Devices, err)
	}
	if _, err := os.Stat(filepath.Join(d.cdi, "k8s.example.com-serial.json")); !os.IsNotExist(err) {
		t.Fatalf("a spec without devices: %v", err)
	}
	mknod(t, d, "ttyR0", 4, 64)
	waitResolves(t, r, d, 5*time.Second, "ser-ttyR0")
	if strings.Contains(r.stderr.String(), "level=error") {
		t.Fatalf("errors logged:\n%s", r.stderr.String())
	}
}

// TestSpecWriteFailureHoldsDevicesBack: while the spec cannot be
// written, a new device is not advertised Healthy (its CDI name would not
// resolve) and cannot be allocated; the write is retried, and once it
// succeeds the device is Healthy and resolves. Devices the spec on disk
// describes stay Healthy throughout.
func TestSpecWriteFailureHoldsDevicesBack(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	mknod(t, d, "ttyR0", 4, 64)
	r := startRun(t, d, []string{"--config", writeConfig(t, serialConfig)}, nil)
	waitResolves(t, r, d, 5*time.Second, "ser-ttyR0")

	// An immutable directory refuses new files, even to root.
	if out, err := exec.Command("chattr", "+i", d.cdi).CombinedOutput(); err != nil {
		t.Skipf("chattr +i: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("chattr", "-i", d.cdi).Run() })
	mknod(t, d, "ttyR1", 4, 65)
	u, err := r.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Health("ser-ttyR1") != "" })
	if err != nil {
		t.Fatal(err)
	}
	if u.Health("ser-ttyR1") != pluginapi.Unhealthy || u.Health("ser-ttyR0") != pluginapi.Healthy {
		t.Fatalf("with the spec unwritable: %+v", u.Devices)
	}
	if _, err := r.c.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"ser-ttyR1"}}}}); err == nil {
		t.Fatal("allocated a device the spec does not describe")
	}
	time.Sleep(300 * time.Millisecond) // a few failed retries
	if err := exec.Command("chattr", "-i", d.cdi).Run(); err != nil {
		t.Fatal(err)
	}
	waitResolves(t, r, d, 10*time.Second, "ser-ttyR0", "ser-ttyR1")
	if !strings.Contains(r.stderr.String(), "CDI spec") {
		t.Errorf("the failed write is not logged:\n%s", r.stderr.String())
	}
}

// TestSpecRestored: our spec removed, emptied or replaced by
// someone else is written back at once.
func TestSpecRestored(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	r := startRun(t, d, nil, map[string]string{"NUMBER_DEVICES": "2", "RESOURCE_NAME": "example.com/sim", "DEVICE_ID_PREFIX": "sim", "PRESTART_STEPS": "none"})
	waitResolves(t, r, d, 5*time.Second, "sim-0", "sim-1")
	spec := filepath.Join(d.cdi, "k8s.example.com-sim.json")
	want, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	other := strings.Replace(string(want), `"sim-1"`, `"sim-9"`, 1)
	for _, c := range []struct {
		name   string
		damage func() error
	}{
		{"removed", func() error { return os.Remove(spec) }},
		{"emptied", func() error { return os.WriteFile(spec, nil, 0o644) }},
		{"replaced", func() error { return os.WriteFile(spec+".new", []byte(other), 0o644) }},
		{"renamed away", func() error { return os.Rename(spec, spec+".bak") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.damage(); err != nil {
				t.Fatal(err)
			}
			if c.name == "replaced" {
				if err := os.Rename(spec+".new", spec); err != nil {
					t.Fatal(err)
				}
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				got, _ := os.ReadFile(spec)
				if bytes.Equal(got, want) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("spec not restored:\n%s\nlog:\n%s", got, r.stderr.String())
				}
				time.Sleep(5 * time.Millisecond)
			}
			if _, err := resolve(context.Background(), d, r.c, "sim-0", "sim-1"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestOwnerIsPerDeployment: two deployments with the same plugin
// name in different namespaces do not remove each other's specs at start.
func TestOwnerIsPerDeployment(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	a := startRun(t, d, nil, map[string]string{"POD_NAMESPACE": "team-a", "RESOURCE_NAME": "example.com/a", "DEVICE_ID_PREFIX": "a", "PRESTART_STEPS": "none"})
	waitResolves(t, a, d, 5*time.Second, "a-0")
	if code := a.stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}
	b := startRun(t, d, nil, map[string]string{"POD_NAMESPACE": "team-b", "RESOURCE_NAME": "example.com/b", "DEVICE_ID_PREFIX": "b", "PRESTART_STEPS": "none"})
	waitResolves(t, b, d, 5*time.Second, "b-0")
	if _, err := os.Stat(filepath.Join(d.cdi, "k8s.example.com-a.json")); err != nil {
		t.Fatalf("the other deployment's spec is gone: %v\n%s", err, b.stderr.String())
	}
}

// TestHostIDsInjectiveAndIndexesStable: net/tun and net_tun get
// different IDs; a device keeps its index (and so its <ENV_PREFIX>_<i>)
// when another one that sorts earlier appears, and across a restart in
// which a device vanished.
func TestHostIDsInjectiveAndIndexesStable(t *testing.T) {
	t.Run("injective", func(t *testing.T) {
		d := newDirs(t)
		testutil.NeedMknod(t)
		mknod(t, d, "net/tun", 10, 200)
		mknod(t, d, "net_tun", 10, 201)
		cfg := writeConfig(t, "resources:\n- name: example.com/tun\n  idPrefix: tun\n  hostDevices: [\"net/tun\", \"net_tun\"]\n")
		r := startRun(t, d, []string{"--config", cfg}, nil)
		u, err := r.wait(5*time.Second, func(kubeletsim.Update) bool { return true })
		if err != nil || len(u.Devices) != 2 || u.Devices[0].ID == u.Devices[1].ID {
			t.Fatalf("%+v %v", u.Devices, err)
		}
		for _, dev := range u.Devices {
			spec := waitResolves(t, r, d, 5*time.Second, dev.ID)
			if len(spec.Linux.Devices) != 1 {
				t.Fatalf("%s: %+v", dev.ID, spec.Linux.Devices)
			}
		}
		a, _ := resolve(context.Background(), d, r.c, u.Devices[0].ID)
		b, _ := resolve(context.Background(), d, r.c, u.Devices[1].ID)
		if a.Linux.Devices[0].Path == b.Linux.Devices[0].Path {
			t.Fatalf("both IDs give %s", a.Linux.Devices[0].Path)
		}
	})
	t.Run("stable indexes", func(t *testing.T) {
		d := newDirs(t)
		testutil.NeedMknod(t)
		mknod(t, d, "ttyR2", 4, 66)
		mknod(t, d, "ttyR5", 4, 69)
		cfg := writeConfig(t, serialConfig)
		envOf := func(r *running, id string) string {
			t.Helper()
			spec := waitResolves(t, r, d, 5*time.Second, id)
			return strings.Join(spec.Process.Env, " ")
		}
		r := startRun(t, d, []string{"--config", cfg}, nil)
		if e2, e5 := envOf(r, "ser-ttyR2"), envOf(r, "ser-ttyR5"); e2 != "SER_0=/dev/ttyR2" || e5 != "SER_1=/dev/ttyR5" {
			t.Fatalf("first indexes: %q %q", e2, e5)
		}
		mknod(t, d, "ttyR0", 4, 64) // sorts before both
		if e0, e2, e5 := envOf(r, "ser-ttyR0"), envOf(r, "ser-ttyR2"), envOf(r, "ser-ttyR5"); e0 != "SER_2=/dev/ttyR0" || e2 != "SER_0=/dev/ttyR2" || e5 != "SER_1=/dev/ttyR5" {
			t.Fatalf("after hot plug: %q %q %q", e0, e2, e5)
		}
		if code := r.stop(); code != 0 {
			t.Fatalf("exit %d", code)
		}
		// ttyR2 vanishes while the plugin is down: it stays known (the
		// kubelet may hold it), unhealthy, and nobody takes its index.
		if err := os.Remove(filepath.Join(d.dev, "ttyR2")); err != nil {
			t.Fatal(err)
		}
		r = startRun(t, d, []string{"--config", cfg}, nil)
		if e0, e5 := envOf(r, "ser-ttyR0"), envOf(r, "ser-ttyR5"); e0 != "SER_2=/dev/ttyR0" || e5 != "SER_1=/dev/ttyR5" {
			t.Fatalf("after restart: %q %q", e0, e5)
		}
		u, err := r.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Health("ser-ttyR2") != "" })
		if err != nil || u.Health("ser-ttyR2") != pluginapi.Unhealthy {
			t.Fatalf("vanished device: %+v %v", u.Devices, err)
		}
	})
}

// TestCorruptStateAtStart: an unreadable state.json does not stop
// the plugin; it is set aside, logged, and the device starts afresh.
func TestCorruptStateAtStart(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	dir := filepath.Join(d.state, "devices", "sim-0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "state.json"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := startRun(t, d, nil, map[string]string{"NUMBER_DEVICES": "1", "RESOURCE_NAME": "example.com/sim", "DEVICE_ID_PREFIX": "sim"})
	waitResolves(t, r, d, 5*time.Second, "sim-0")
	if _, err := r.c.PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: []string{"sim-0"}}); err != nil {
		t.Fatal(err)
	}
	if kept, err := os.ReadFile(filepath.Join(dir, "state.json.corrupt")); err != nil || string(kept) != "{not json" {
		t.Fatalf("corrupt state not kept aside: %q %v", kept, err)
	}
	if !strings.Contains(r.stderr.String(), "unreadable device state") {
		t.Fatalf("not logged:\n%s", r.stderr.String())
	}
}

// TestRecoveryWithoutTheFailedPod: a host device whose exec step
// failed becomes Healthy again once the cause is gone, without the kubelet
// ever retrying that container (the pod may be gone). The kubelet's
// PodResources API says no container holds it.
func TestRecoveryWithoutTheFailedPod(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	sock := filepath.Join(d.plugins, "pod-resources.sock")
	testutil.ServePodResources(t, sock)
	mknod(t, d, "ttyR0", 4, 64)
	ok := filepath.Join(t.TempDir(), "ok")
	cfg := writeConfig(t, fmt.Sprintf(`
resources:
- name: example.com/serial
  idPrefix: ser
  hostDevices: ["ttyR*"]
  prestart:
    recoveryInterval: 100ms
    steps:
    - type: exec
      command: ["/bin/sh", "-c", "test -e %s"]
`, ok))
	r := startRun(t, d, []string{"--config", cfg, "--pod-resources-socket", sock}, nil)
	waitResolves(t, r, d, 5*time.Second, "ser-ttyR0")
	if _, err := r.c.PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: []string{"ser-ttyR0"}}); err == nil {
		t.Fatal("exec step did not fail")
	}
	if _, err := r.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Health("ser-ttyR0") == pluginapi.Unhealthy }); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ok, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitResolves(t, r, d, 10*time.Second, "ser-ttyR0")
}

// TestSpecAppearsWithFinalMode: the spec is never visible with
// another mode than 0644: no chmod after it is in place (an IN_ATTRIB
// event on its name would show one).
func TestSpecAppearsWithFinalMode(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	if err := os.MkdirAll(d.cdi, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, d.cdi, unix.IN_ATTRIB|unix.IN_MOVED_TO|unix.IN_CREATE); err != nil {
		t.Fatal(err)
	}
	r := startRun(t, d, nil, map[string]string{"NUMBER_DEVICES": "1", "RESOURCE_NAME": "example.com/sim", "DEVICE_ID_PREFIX": "sim", "PRESTART_STEPS": "none"})
	waitResolves(t, r, d, 5*time.Second, "sim-0")
	name := "k8s.example.com-sim.json"
	fi, err := os.Stat(filepath.Join(d.cdi, name))
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("spec mode %v %v", fi, err)
	}
	buf := make([]byte, 64*1024)
	n, err := unix.Read(fd, buf)
	if err != nil && !errors.Is(err, unix.EAGAIN) {
		t.Fatal(err)
	}
	appeared := false
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
		off += unix.SizeofInotifyEvent + int(ev.Len)
		if strings.TrimRight(string(nameBytes), "\x00") != name {
			continue
		}
		if ev.Mask&(unix.IN_MOVED_TO|unix.IN_CREATE) != 0 {
			appeared = true
		}
		if ev.Mask&unix.IN_ATTRIB != 0 && appeared {
			t.Fatal("the spec's attributes changed after it appeared: it was visible with another mode")
		}
	}
	if !appeared {
		t.Fatal("no event for the spec")
	}
}

// TestNewerProcessOwnsTheSpec: two processes serving the same resource
// (a rolling update with surge, or two deployments) do not rewrite each
// other's spec forever: the one started last owns it, the other reports
// its devices unhealthy.
func TestNewerProcessOwnsTheSpec(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	env := map[string]string{"NUMBER_DEVICES": "1", "RESOURCE_NAME": "example.com/sim", "DEVICE_ID_PREFIX": "sim", "PRESTART_STEPS": "none"}
	old := startRun(t, d, nil, env)
	waitResolves(t, old, d, 5*time.Second, "sim-0")
	d2 := d
	d2.plugins = newDirs(t).plugins
	env["NUMBER_DEVICES"] = "2" // the new version adds a device
	cur := startRun(t, d2, nil, env)
	waitResolves(t, cur, d2, 5*time.Second, "sim-0", "sim-1")
	if _, err := old.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 0 }); err != nil {
		t.Fatalf("the older process still advertises devices: %v\n%s", err, old.stderr.String())
	}
	spec := filepath.Join(d.cdi, "k8s.example.com-sim.json")
	a, _ := os.Stat(spec)
	time.Sleep(500 * time.Millisecond)
	b, _ := os.Stat(spec)
	if !os.SameFile(a, b) {
		t.Fatal("the spec is still being rewritten")
	}
	waitResolves(t, cur, d2, time.Second, "sim-0", "sim-1")
}
