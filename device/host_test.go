package device

import (
	"context"
	"errors"
	"fmt"
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

// TestKernelEventRescans: a function unbound from its driver
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

// TestForgetVanished: a device gone for ForgetAfter that no
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

// TestMatchesNothingSaidOnce: a selector that matches nothing
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

// TestUnhealthyAtStartSaid: devices that are unhealthy from the start are
// said in one line with their cause (their later changes are logged as
// transitions).
func TestUnhealthyAtStartSaid(t *testing.T) {
	log, hook := test.NewNullLogger()
	fd := &fakeDiscovery{}
	fd.set(gpu("0000:01:00.0", 0, 0), gpu("0000:02:00.0", 1, 0))
	src, err := NewSource(Options{DevRoot: t.TempDir(), IDPrefix: "gpu", Discover: fd.discover, DiscoverKind: "pci", Log: logrus.NewEntry(log)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Prepare(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range hook.AllEntries() {
		if e.Message == "devices unhealthy at start" {
			lines = append(lines, fmt.Sprint(e.Data["unhealthy"], " ", e.Data["first"]))
		}
	}
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "2 gpu-0 (missing") {
		t.Fatalf("said %q, want one line naming both missing nodes", lines)
	}
}

// vfio is gpu's function rebound to vfio-pci: its node the IOMMU group's.
func vfio(f Found, group string) Found {
	f.Node = Node{HostPath: "vfio/" + group, Type: Char, Major: 511, Minor: 0}
	f.Identity.PCIDriver, f.Identity.IOMMUGroup = "vfio-pci", group
	return f
}

// TestIdentityChanged: a known device found again under its
// key with another identity (a function rebound from nvidia to vfio-pci
// by a selector that names no driver; another vendor or device ID; a USB
// device of another product or serial on the same port) is Unhealthy
// (identity_changed) and keeps the nodes it had, also across a restart
// (the registry records the identity); it is Healthy again when the
// identity is back. A registry of an earlier version, with no identity,
// takes the first one found.
func TestIdentityChanged(t *testing.T) {
	fn := useFakeNodes(t)
	root, state := t.TempDir(), t.TempDir()
	fn.make(t, filepath.Join(root, "nvidia0"), 195, 0)
	fn.make(t, filepath.Join(root, "vfio", "42"), 511, 0)
	fd := &fakeDiscovery{}
	nv := gpu("0000:01:00.0", 0, 0)
	fd.set(nv)
	opts := Options{DevRoot: root, IDPrefix: "gpu", Discover: fd.discover, DiscoverKind: "pci", Registry: filepath.Join(state, "registry.json")}
	src, err := NewSource(opts)
	if err != nil {
		t.Fatal(err)
	}
	if snap, err := src.Prepare(); err != nil || snap.Healthy() != 1 {
		t.Fatalf("prepare: %v %+v", err, snap)
	}
	changed := func(src *Source, what string, wants ...string) {
		t.Helper()
		d := src.Snapshot().Devices
		if len(d) != 1 || d[0].Healthy || d[0].Problem.Cause != CauseIdentityChanged {
			t.Fatalf("%s: %+v, want one device Unhealthy for %s", what, d, CauseIdentityChanged)
		}
		if d[0].HostPath != filepath.Join(root, "nvidia0") || d[0].Name != "gpu-0" || d[0].Identity.PCIDriver != "nvidia" {
			t.Fatalf("%s: the device's nodes or identity were swapped: %+v", what, d[0])
		}
		for _, w := range wants {
			if !strings.Contains(d[0].Problem.Message, w) {
				t.Errorf("%s: problem %q does not say %q", what, d[0].Problem, w)
			}
		}
	}
	fd.set(vfio(nv, "42"))
	src.Refresh()
	changed(src, "rebound to vfio-pci", "driver", "nvidia", "vfio-pci")

	// A restart while it is rebound: still the old device, Unhealthy.
	src2, err := NewSource(opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src2.Prepare(); err != nil {
		t.Fatal(err)
	}
	changed(src2, "rebound, after a restart", "driver")

	// Another device ID on the same address.
	other := nv
	other.Identity.PCIDevice = "2335"
	fd.set(other)
	src2.Refresh()
	changed(src2, "another device ID", "device", "2330", "2335")

	// Back with the same identity: Healthy, the same device.
	fd.set(nv)
	src2.Refresh()
	if d := src2.Snapshot().Devices; len(d) != 1 || !d[0].Healthy || d[0].Name != "gpu-0" {
		t.Fatalf("identity back: %+v", d)
	}

	// A registry of an earlier version has no identity: the first found is
	// taken, and a later change is one.
	reg := `{"version": 1, "devices": [{"path": "pci/0000:01:00.0", "id": "gpu-0", "index": 0, "type": "c", "major": 195, "minor": 0, "node": "nvidia0"}]}`
	if err := os.WriteFile(opts.Registry, []byte(reg), 0o600); err != nil {
		t.Fatal(err)
	}
	fd.set(vfio(nv, "42"))
	src3, err := NewSource(opts)
	if err != nil {
		t.Fatal(err)
	}
	if snap, err := src3.Prepare(); err != nil || snap.Healthy() != 1 || snap.Devices[0].Identity.PCIDriver != "vfio-pci" {
		t.Fatalf("an old registry takes what is found first: %v %+v", err, snap)
	}
	fd.set(nv)
	src3.Refresh()
	if d := src3.Snapshot().Devices; len(d) != 1 || d[0].Problem.Cause != CauseIdentityChanged || d[0].HostPath != filepath.Join(root, "vfio", "42") {
		t.Fatalf("rebound after an old registry's identity was taken: %+v", d)
	}
}

// TestUSBIdentityChanged: a USB device without serial is keyed by its
// port; another product on that port is not the device the port had.
func TestUSBIdentityChanged(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	fn.make(t, filepath.Join(root, "ttyUSB0"), 188, 0)
	usb := func(product string) Found {
		return Found{Key: "port:1-2", Node: Node{HostPath: "ttyUSB0", Type: Char, Major: 188, Minor: 0}, NUMANode: NoNUMA,
			Identity: Identity{USBBus: 1, USBDevice: 4, USBVendor: "0403", USBProduct: product}}
	}
	fd := &fakeDiscovery{}
	fd.set(usb("6001"))
	src, err := NewSource(Options{DevRoot: root, IDPrefix: "ser", Discover: fd.discover, DiscoverKind: "usb"})
	if err != nil {
		t.Fatal(err)
	}
	if snap, err := src.Prepare(); err != nil || snap.Healthy() != 1 {
		t.Fatalf("prepare: %v %+v", err, snap)
	}
	fd.set(usb("6015"))
	src.Refresh()
	if d := src.Snapshot().Devices; len(d) != 1 || d[0].Problem.Cause != CauseIdentityChanged || d[0].Identity.USBProduct != "6001" ||
		!strings.Contains(d[0].Problem.Message, "6015") {
		t.Fatalf("another product on the port: %+v", d)
	}
	// Plugged in again (another device number): the same device, Healthy.
	back := usb("6001")
	back.Identity.USBDevice = 5
	fd.set(back)
	src.Refresh()
	if d := src.Snapshot().Devices; len(d) != 1 || !d[0].Healthy || d[0].Identity.USBDevice != 5 {
		t.Fatalf("back: %+v", d)
	}
}

// TestRebindOnPurpose: the way out for an operator who rebinds
// a function on purpose: after forgetAfter, a rebound device that no
// container holds is forgotten, and found again as a new device (the next
// index) with its new nodes.
func TestRebindOnPurpose(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	fn.make(t, filepath.Join(root, "nvidia0"), 195, 0)
	fn.make(t, filepath.Join(root, "vfio", "42"), 511, 0)
	fd := &fakeDiscovery{}
	nv := gpu("0000:01:00.0", 0, 0)
	fd.set(nv)
	src, err := NewSource(Options{DevRoot: root, IDPrefix: "gpu", Discover: fd.discover, DiscoverKind: "pci",
		ForgetAfter: 30 * time.Millisecond, Holders: func(context.Context) ([]string, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Prepare(); err != nil {
		t.Fatal(err)
	}
	out := runSource(t, src)
	fd.set(vfio(nv, "42"))
	src.Refresh()
	waitSnap(t, src, out, 2*time.Second, "forgotten, found again as a new device", func(s *Snapshot) bool {
		return len(s.Devices) == 1 && s.Devices[0].Name == "gpu-1" && s.Devices[0].Healthy && s.Devices[0].HostPath == filepath.Join(root, "vfio", "42")
	})
}

// TestVFIOContainerNode: a function bound to vfio-pci has the
// shared /dev/vfio/vfio among its own nodes (the discovery gives it): once
// in the device even when sharedNodes names it too, and a device without
// it is Unhealthy (missing), as for any of its nodes.
func TestVFIOContainerNode(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	fn.make(t, filepath.Join(root, "vfio", "42"), 511, 0)
	fn.make(t, filepath.Join(root, "vfio", "vfio"), 10, 196)
	fd := &fakeDiscovery{}
	f := vfio(gpu("0000:3b:00.2", 0, 0), "42")
	f.Extra = []Node{{HostPath: "vfio/vfio", Type: Char}}
	fd.set(f)
	src, err := NewSource(Options{DevRoot: root, IDPrefix: "vf", Discover: fd.discover, DiscoverKind: "pci", SharedNodes: []string{"vfio/vfio"}})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := src.Prepare()
	if err != nil || snap.Healthy() != 1 {
		t.Fatalf("prepare: %v %+v", err, snap)
	}
	var paths []string
	for _, n := range snap.Devices[0].AllNodes() {
		paths = append(paths, n.ContainerPath)
	}
	if want := []string{"/dev/vfio/42", "/dev/vfio/vfio"}; strings.Join(paths, " ") != strings.Join(want, " ") {
		t.Fatalf("nodes %q, want %q (vfio/vfio once)", paths, want)
	}
	if n := snap.Devices[0].Extra; len(n) != 1 || n[0].Major != 10 || n[0].Minor != 196 {
		t.Fatalf("vfio/vfio's numbers are read from the node: %+v", n)
	}
	if err := os.Remove(filepath.Join(root, "vfio", "vfio")); err != nil {
		t.Fatal(err)
	}
	if d := src.Refresh().Devices[0]; d.Healthy || d.Problem.Cause != CauseMissing || !strings.Contains(d.Problem.Message, "vfio/vfio") {
		t.Fatalf("without /dev/vfio/vfio: %+v %s", d, d.Problem)
	}
}
