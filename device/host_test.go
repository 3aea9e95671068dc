package device

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

// fakeDiscovery is a discovery whose devices the test sets.
type fakeDiscovery struct {
	mu    sync.Mutex
	found []Found
}

func (f *fakeDiscovery) set(found ...Found) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.found = found
}

func (f *fakeDiscovery) discover() ([]Found, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Found(nil), f.found...), nil
}

func gpu(addr string, minor uint32, numa int) Found {
	return Found{
		Key:      addr,
		Node:     Node{HostPath: "nvidia" + itoa(minor), Type: Char, Major: 195, Minor: minor},
		NUMANode: numa,
		Identity: Identity{PCIAddress: addr, PCIVendor: "10de", PCIDevice: "2330", PCIClass: "030200", PCIDriver: "nvidia"},
	}
}

func itoa(u uint32) string { return string(rune('0' + u)) }

// TestDiscoveredDevices: devices a discovery finds get stable IDs and
// indexes (kept in the registry across restarts), their nodes and the
// shared ones (absent ones skipped), their NUMA node and identity; a
// device whose node is missing or wrong, or that the discovery no longer
// finds, is Unhealthy with that cause, and Healthy again when it is back.
func TestDiscoveredDevices(t *testing.T) {
	fn := useFakeNodes(t)
	root, state := t.TempDir(), t.TempDir()
	mk := func(rel string, major, minor uint32) {
		t.Helper()
		fn.make(t, filepath.Join(root, rel), major, minor)
	}
	mk("nvidia0", 195, 0)
	mk("nvidia1", 195, 1)
	mk("nvidiactl", 195, 255)
	mk("nvidia-uvm", 238, 0)
	fd := &fakeDiscovery{}
	fd.set(gpu("0000:41:00.0", 1, 1), gpu("0000:01:00.0", 0, 0))
	opts := Options{
		DevRoot: root, IDPrefix: "gpu", NodeName: "n1", Discover: fd.discover, DiscoverKind: "pci",
		SharedNodes: []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}, Registry: filepath.Join(state, "registry.json"),
	}
	src, err := NewSource(opts)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := src.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Devices) != 2 || snap.Healthy() != 2 {
		t.Fatalf("devices %+v", snap.Devices)
	}
	d0, d1 := snap.Devices[0], snap.Devices[1]
	if d0.Name != "gpu-n1-0" || d0.Identity.PCIAddress != "0000:41:00.0" || d0.HostPath != filepath.Join(root, "nvidia1") ||
		d0.ContainerPath != "/dev/nvidia1" || d0.NUMANode != 1 || d0.Minor != 1 {
		t.Errorf("first found is device 0: %+v", d0)
	}
	if d1.Name != "gpu-n1-1" || d1.Identity.PCIAddress != "0000:01:00.0" || d1.NUMANode != 0 {
		t.Errorf("second found is device 1: %+v", d1)
	}
	if len(d0.Shared) != 2 || d0.Shared[0].ContainerPath != "/dev/nvidiactl" || d0.Shared[0].Minor != 255 || d0.Shared[1].Major != 238 {
		t.Errorf("shared nodes (nvidia-uvm-tools absent, skipped): %+v", d0.Shared)
	}
	if n := d0.AllNodes(); len(n) != 3 || n[0].HostPath != d0.HostPath {
		t.Errorf("all nodes %+v", n)
	}

	out := make(chan *Snapshot, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, out) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	defer stop()
	wait := func(what string, cond func(*Snapshot) bool) {
		t.Helper()
		waitSnap(t, src, out, 2*time.Second, what, cond)
	}
	// The node of device 1 removed: Unhealthy, missing (seen by inotify).
	_ = os.Remove(filepath.Join(root, "nvidia0"))
	wait("node removed", func(s *Snapshot) bool { return s.Devices[1].Problem.Cause == CauseMissing && s.Devices[0].Healthy })
	// Back with other numbers: a wrong node.
	mk("nvidia0", 195, 7)
	wait("wrong node", func(s *Snapshot) bool { return s.Devices[1].Problem.Cause == CauseWrongNode })
	mk("nvidia0", 195, 0)
	wait("node right", func(s *Snapshot) bool { return s.Healthy() == 2 })
	// The function vanishes (unbound): Unhealthy, kept under its ID.
	fd.set(gpu("0000:01:00.0", 0, 0))
	src.Refresh()
	if s := src.Snapshot(); len(s.Devices) != 2 || s.Devices[0].Healthy || s.Devices[0].Problem.Cause != CauseMissing {
		t.Fatalf("vanished function: %+v", s.Devices)
	}
	stop()

	// A restart finds it again under the same ID and index, and a new
	// function gets the next index.
	fd.set(gpu("0000:c1:00.0", 0, 1), gpu("0000:41:00.0", 1, 1), gpu("0000:01:00.0", 0, 0))
	src2, err := NewSource(opts)
	if err != nil {
		t.Fatal(err)
	}
	snap, err = src2.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, d := range snap.Devices {
		got[d.Identity.PCIAddress] = d.Name
	}
	want := map[string]string{"0000:41:00.0": "gpu-n1-0", "0000:01:00.0": "gpu-n1-1", "0000:c1:00.0": "gpu-n1-2"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("after restart %s is %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}

// TestKernelEventRescans (issue 20): a function unbound from its driver
// changes no node, so only its kernel event tells; the source rescans on
// it and publishes the device Unhealthy, then Healthy when it is bound
// again. The latency from the event to the snapshot is logged (dp-bench
// measures it; a unit test does not time).
func TestKernelEventRescans(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	fn.make(t, filepath.Join(root, "nvidia0"), 195, 0)
	fd := &fakeDiscovery{}
	fd.set(gpu("0000:01:00.0", 0, 0))
	changed := make(chan func(), 1)
	stopped := make(chan struct{})
	src, err := NewSource(Options{DevRoot: root, IDPrefix: "gpu", Discover: fd.discover, DiscoverKind: "pci",
		KernelEvents: func(_ context.Context, f func()) (func(), error) {
			changed <- f
			return func() { close(stopped) }, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Prepare(); err != nil {
		t.Fatal(err)
	}
	// Runs after runSource's cleanup has joined Run.
	t.Cleanup(func() {
		select {
		case <-stopped:
		default:
			t.Error("Run returned without stopping the kernel events")
		}
	})
	out := runSource(t, src)
	event := <-changed
	if h := src.Snapshot().Healthy(); h != 1 {
		t.Fatalf("healthy %d at start", h)
	}
	for _, c := range []struct {
		name    string
		found   []Found
		healthy int
	}{
		{"unbound", nil, 0},
		{"bound again", []Found{gpu("0000:01:00.0", 0, 0)}, 1},
	} {
		fd.set(c.found...)
		at := time.Now()
		event()
		waitSnap(t, src, out, 2*time.Second, c.name, func(s *Snapshot) bool { return s.Healthy() == c.healthy && len(s.Devices) == 1 })
		t.Logf("%s: published %v after the event", c.name, time.Since(at))
	}
}

// TestForgetVanished (issue 20): a device gone for ForgetAfter that no
// container holds is forgotten (snapshot and registry); one a container
// holds stays, Unhealthy; while the holders cannot be told, nothing goes.
// Forgotten indexes are not given again.
func TestForgetVanished(t *testing.T) {
	fn := useFakeNodes(t)
	root, state := t.TempDir(), t.TempDir()
	for i := range uint32(3) {
		fn.make(t, filepath.Join(root, "nvidia"+itoa(i)), 195, i)
	}
	fd := &fakeDiscovery{}
	fd.set(gpu("0000:01:00.0", 0, 0), gpu("0000:02:00.0", 1, 0), gpu("0000:03:00.0", 2, 0))
	var mu sync.Mutex
	held, holdersErr := []string{"gpu-1::0"}, error(nil)
	opts := Options{DevRoot: root, IDPrefix: "gpu", Discover: fd.discover, DiscoverKind: "pci", Replicas: 2,
		Registry: filepath.Join(state, "registry.json"), ForgetAfter: 30 * time.Millisecond,
		Holders: func(context.Context) ([]string, error) {
			mu.Lock()
			defer mu.Unlock()
			return held, holdersErr
		}}
	src, err := NewSource(opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Prepare(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	holdersErr = errors.New("no PodResources socket")
	mu.Unlock()
	out := runSource(t, src)
	// 02 (held through a replica) and 03 vanish; 03 is held by nobody.
	fd.set(gpu("0000:01:00.0", 0, 0))
	src.Refresh()
	time.Sleep(100 * time.Millisecond) // well past ForgetAfter
	if n := len(src.Snapshot().Devices); n != 3 {
		t.Fatalf("%d devices while the holders cannot be told, want all 3 kept", n)
	}
	mu.Lock()
	holdersErr = nil
	mu.Unlock()
	waitSnap(t, src, out, 2*time.Second, "forgotten", func(s *Snapshot) bool { return len(s.Devices) == 2 })
	names := []string{src.Snapshot().Devices[0].Name, src.Snapshot().Devices[1].Name}
	if names[0] != "gpu-0" || names[1] != "gpu-1" || src.Snapshot().Devices[1].Healthy {
		t.Fatalf("kept %v (gpu-1 held, Unhealthy), want gpu-0 and gpu-1: %+v", names, src.Snapshot().Devices)
	}
	data, err := os.ReadFile(opts.Registry)
	if err != nil || strings.Contains(string(data), "0000:03:00.0") {
		t.Fatalf("registry still knows the forgotten device: %v\n%s", err, data)
	}
	// It comes back: a new device, with the next index.
	fd.set(gpu("0000:01:00.0", 0, 0), gpu("0000:03:00.0", 2, 0))
	src.Refresh()
	if d := src.Snapshot().Devices; len(d) != 3 || d[2].Name != "gpu-3" || d[2].Identity.PCIAddress != "0000:03:00.0" {
		t.Fatalf("back after being forgotten: %+v", d)
	}
}

// TestMatchesNothingSaidOnce (issue 20): a selector that matches nothing
// is no error; the resource advertises none and says so once, until a
// device matches again.
func TestMatchesNothingSaidOnce(t *testing.T) {
	log, hook := test.NewNullLogger()
	fd := &fakeDiscovery{}
	src, err := NewSource(Options{DevRoot: t.TempDir(), IDPrefix: "gpu", Discover: fd.discover, DiscoverKind: "pci", Log: logrus.NewEntry(log)})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := src.Prepare()
	if err != nil || len(snap.Devices) != 0 {
		t.Fatalf("prepare: %v %+v", err, snap)
	}
	said := func() int {
		n := 0
		for _, e := range hook.AllEntries() {
			if strings.Contains(e.Message, "no device matches") {
				n++
			}
		}
		return n
	}
	src.Refresh()
	src.Refresh()
	if n := said(); n != 1 {
		t.Fatalf("said %d times over three scans, want once", n)
	}
	fd.set(gpu("0000:01:00.0", 0, 0))
	src.Refresh()
	fd.set()
	src.Refresh()
	if n := said(); n != 2 {
		t.Fatalf("said %d times, want again after a device matched and went", n)
	}
}
