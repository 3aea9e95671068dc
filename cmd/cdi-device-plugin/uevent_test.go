package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// fakeUevents stands in for the kernel's uevent socket (the openUevents
// seam): every resource that listens gets one end of a socket pair, and
// send writes a kernel-shaped datagram into the others, so the events go
// through the listener's parsing and subsystem filter as the kernel's do.
type fakeUevents struct {
	mu      sync.Mutex
	writers []*os.File
	opened  chan struct{}
}

func useFakeUevents(tb testing.TB) *fakeUevents {
	tb.Helper()
	f := &fakeUevents{opened: make(chan struct{}, 8)}
	saved := openUevents
	openUevents = f.open
	tb.Cleanup(func() {
		openUevents = saved
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, w := range f.writers {
			_ = w.Close()
		}
	})
	return f
}

func (f *fakeUevents) open() (io.ReadCloser, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.writers = append(f.writers, os.NewFile(uintptr(fds[1]), "uevents-w"))
	f.mu.Unlock()
	f.opened <- struct{}{}
	return os.NewFile(uintptr(fds[0]), "uevents-r"), nil
}

// send sends a uevent of the PCI function at devpath (below /sys).
func (f *fakeUevents) send(tb testing.TB, action, devpath string) {
	tb.Helper()
	msg := action + "@" + devpath + "\x00ACTION=" + action + "\x00DEVPATH=" + devpath + "\x00SUBSYSTEM=pci\x00"
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.writers {
		if _, err := w.WriteString(msg); err != nil {
			tb.Fatal(err)
		}
	}
}

// unboundGPU is a plugin run with one NVIDIA function found by a selector
// that names no driver, in a tree made here, its kernel events from
// fakeUevents.
type unboundGPU struct {
	r       *running
	ev      *fakeUevents
	d       dirs
	s       *sysTree
	fn      string // the function's directory
	driver  string // its driver link
	devpath string
}

func startGPU(tb testing.TB) *unboundGPU {
	tb.Helper()
	testutil.NeedMknod(tb)
	ev := useFakeUevents(tb)
	d := newDirs(tb)
	s := newSysTree(tb)
	fn := s.function("pci0000:00", "0000:01:00.0", "10de", "2330", "030200", "nvidia", 0)
	s.write(filepath.Join(s.proc, "driver", "nvidia", "gpus", "0000:01:00.0", "information"), "Model: \t H100\nDevice Minor: \t 0")
	testutil.Mknod(tb, filepath.Join(d.dev, "nvidia0"), 195, 0)
	// forgetAfter 1h: the source's one timer (the forget ticker, every
	// minute) cannot be what delivers a change in a test that ends sooner.
	cfg := writeConfig(tb, `
resources:
- name: example.com/gpu
  idPrefix: gpu
  pci: {vendor: "10de"}
  forgetAfter: 1h
`)
	r := startRun(tb, d, []string{"--config", cfg, "--sys-root", s.sys, "--proc-root", s.proc}, map[string]string{"NODE_NAME": "n1"})
	if _, err := r.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 1 }); err != nil {
		tb.Fatalf("one healthy GPU: %v\n%s", err, r.stderr.String())
	}
	select {
	case <-ev.opened:
	case <-time.After(5 * time.Second):
		tb.Fatal("the resource did not open its kernel events")
	}
	return &unboundGPU{r: r, ev: ev, d: d, s: s, fn: fn, driver: filepath.Join(fn, "driver"), devpath: "/devices/pci0000:00/0000:01:00.0"}
}

// unbind and bind change the function in the tree as the kernel does
// (its driver link; the NVIDIA driver's nodes stay, so no node changes).
func (g *unboundGPU) unbind(tb testing.TB) {
	tb.Helper()
	if err := os.Remove(g.driver); err != nil {
		tb.Fatal(err)
	}
}

func (g *unboundGPU) bind(tb testing.TB) {
	tb.Helper()
	if err := os.Symlink("../../../bus/pci/drivers/nvidia", g.driver); err != nil {
		tb.Fatal(err)
	}
}

// TestUeventToListAndWatch: a function unbound in a sysfs tree
// changes no node, so only its kernel event tells: injected through the
// uevent seam, it makes the kubelet stand-in's ListAndWatch stream report
// the device Unhealthy, and the bind event Healthy again. No timer
// delivers either: the directory watch sees no change (the nodes stay),
// and the source's only timer, the forget ticker, runs every minute with
// forgetAfter 1h, past the end of this test (checked at its end).
func TestUeventToListAndWatch(t *testing.T) {
	start := time.Now()
	g := startGPU(t)
	for _, c := range []struct {
		action string
		change func(testing.TB)
		health string
	}{
		{"unbind", g.unbind, pluginapi.Unhealthy},
		{"bind", g.bind, pluginapi.Healthy},
	} {
		c.change(t)
		g.ev.send(t, c.action, g.devpath)
		if _, err := g.r.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Health("gpu-n1-0") == c.health }); err != nil {
			t.Fatalf("%s event: %v, want gpu-n1-0 %s\n%s", c.action, err, c.health, g.r.stderr.String())
		}
	}
	if time.Since(start) >= time.Minute {
		t.Fatal("the test ran as long as the forget ticker's period: a timer may have delivered the change")
	}
}

// TestReboundToVFIO: the function rebound from nvidia to
// vfio-pci (its unbind and bind events) under a selector that names no
// driver is Unhealthy at once, and the spec keeps its NVIDIA node under
// its CDI name (no vfio node swapped in); bound back to nvidia: Healthy.
func TestReboundToVFIO(t *testing.T) {
	g := startGPU(t)
	testutil.Mknod(t, filepath.Join(g.d.dev, "vfio", "42"), 243, 0)
	testutil.Mknod(t, filepath.Join(g.d.dev, "vfio", "vfio"), 10, 196)
	if err := os.MkdirAll(filepath.Join(g.s.sys, "kernel", "iommu_groups", "42"), 0o755); err != nil {
		t.Fatal(err)
	}
	g.s.link(filepath.Join(g.fn, "iommu_group"), "../../../kernel/iommu_groups/42")
	// Rebound before the events, in one step (a new driver link renamed
	// over the old one), so that no rescan sees it unbound (missing) in
	// between: the nodes made above change the dev root, whose rescan
	// may come at any time; one that saw the function unbound made it
	// Unhealthy as missing, which the wait below took for the rebinding
	// (12 runs of 150 under load).
	next := t.TempDir()
	g.s.bind(next, "vfio-pci")
	if err := os.Rename(filepath.Join(next, "driver"), g.driver); err != nil {
		t.Fatal(err)
	}
	g.ev.send(t, "unbind", g.devpath)
	g.ev.send(t, "bind", g.devpath)
	if _, err := g.r.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Health("gpu-n1-0") == pluginapi.Unhealthy }); err != nil {
		t.Fatalf("rebound to vfio-pci: %v\n%s", err, g.r.stderr.String())
	}
	if !strings.Contains(g.r.stderr.String(), "cause=identity_changed") {
		t.Errorf("no identity_changed in the log:\n%s", g.r.stderr.String())
	}
	spec, err := os.ReadFile(filepath.Join(g.d.cdi, "k8s.example.com-gpu.json"))
	if err != nil || !strings.Contains(string(spec), `"path":"/dev/nvidia0"`) || strings.Contains(string(spec), "vfio") {
		t.Fatalf("the spec of the rebound function: %v\n%s", err, spec)
	}
	if err := os.Remove(g.driver); err != nil {
		t.Fatal(err)
	}
	g.bind(t)
	g.ev.send(t, "unbind", g.devpath)
	g.ev.send(t, "bind", g.devpath)
	if _, err := g.r.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Health("gpu-n1-0") == pluginapi.Healthy }); err != nil {
		t.Fatalf("bound back to nvidia: %v\n%s", err, g.r.stderr.String())
	}
}

// BenchmarkUeventToListAndWatch: from a kernel event (through the uevent
// seam) of a function unbound or bound again to the kubelet stand-in's
// ListAndWatch update that reports it: the source's rescan of the PCI
// bus, the spec write, the plugin's update and gRPC.
func BenchmarkUeventToListAndWatch(b *testing.B) {
	g := startGPU(b)
	bound := true
	for b.Loop() {
		b.StopTimer()
		action, health := "unbind", pluginapi.Unhealthy
		if bound {
			g.unbind(b)
		} else {
			g.bind(b)
			action, health = "bind", pluginapi.Healthy
		}
		bound = !bound
		b.StartTimer()
		g.ev.send(b, action, g.devpath)
		if _, err := g.r.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Health("gpu-n1-0") == health }); err != nil {
			b.Fatalf("%s event: %v", action, err)
		}
	}
}
