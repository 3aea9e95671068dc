package device

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

// pciFound is a PCI function found with nodes (own first), relative to the
// dev root.
func pciFound(addr string, nodes ...Node) Found {
	return Found{Key: addr, Node: nodes[0], Extra: nodes[1:], NUMANode: NoNUMA,
		Identity: Identity{PCIAddress: addr, PCIVendor: "8086", PCIDevice: "56a0", PCIClass: "030000", PCIDriver: "i915"}}
}

// byName is the snapshot's devices by name.
func byName(s *Snapshot) map[string]Device {
	out := map[string]Device{}
	for _, d := range s.Devices {
		out[d.Name] = d
	}
	return out
}

// logged reports whether an entry of hook says all of words.
func logged(hook *test.Hook, words ...string) bool {
	for _, e := range hook.AllEntries() {
		line, _ := e.String()
		ok := true
		for _, w := range words {
			ok = ok && strings.Contains(line, w)
		}
		if ok {
			return true
		}
	}
	return false
}

// TestSharedNodeOneResource: two devices of one
// resource that both list a host node (a root port given its GPU's nodes
// by a discovery that walked too far) are both Unhealthy (shared_node),
// and the log names both devices and the node; a device of its own stays
// Healthy, and a node named in sharedNodes (and the VFIO container) is
// never a conflict. When the overlap goes away, the device left is
// Healthy again.
func TestSharedNodeOneResource(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	for i, rel := range []string{"dri/card1", "dri/renderD128", "dri/card2", "ctl", "vfio/vfio"} {
		fn.make(t, filepath.Join(root, rel), 226, uint32(i))
	}
	card1 := Node{HostPath: "dri/card1", Type: Char, Major: 226, Minor: 0}
	render := Node{HostPath: "dri/renderD128", Type: Char, Major: 226, Minor: 1}
	card2 := Node{HostPath: "dri/card2", Type: Char, Major: 226, Minor: 2}
	ctl := Node{HostPath: "ctl", Type: Char, Major: 226, Minor: 3}
	vfioCtr := Node{HostPath: "vfio/vfio", Type: Char, Major: 226, Minor: 4}
	fd := &fakeDiscovery{}
	// The root port 00:01.0 is given its GPU's nodes; 02:00.0 has its own.
	// All three list ctl (a sharedNodes entry) and the VFIO container.
	fd.set(pciFound("0000:00:01.0", card1, render, ctl, vfioCtr), pciFound("0000:01:00.0", card1, render, ctl, vfioCtr),
		pciFound("0000:02:00.0", card2, ctl, vfioCtr))
	log, hook := test.NewNullLogger()
	src, err := NewSource(Options{DevRoot: root, IDPrefix: "gpu", NodeName: "n1", Discover: fd.discover, DiscoverKind: "pci",
		SharedNodes: []string{"ctl"}, Registry: filepath.Join(t.TempDir(), "registry.json"), Log: logrus.NewEntry(log)})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := src.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	got := byName(snap)
	for _, name := range []string{"gpu-n1-0", "gpu-n1-1"} {
		if d := got[name]; d.Healthy || d.Problem.Cause != CauseSharedNode {
			t.Errorf("%s: healthy %v, problem %q; want Unhealthy, shared_node", name, d.Healthy, d.Problem)
		}
	}
	if d := got["gpu-n1-2"]; !d.Healthy {
		t.Errorf("gpu-n1-2 shares only ctl (sharedNodes) and the VFIO container: %q", d.Problem)
	}
	if !logged(hook, "gpu-n1-0", "gpu-n1-1", filepath.Join(root, "dri", "card1")) {
		t.Errorf("no log line names both devices and the node:\n%s", entries(hook))
	}

	// The root port no longer takes the GPU's nodes: it is gone, and the
	// GPU is Healthy again.
	fd.set(pciFound("0000:01:00.0", card1, render, ctl, vfioCtr), pciFound("0000:02:00.0", card2, ctl, vfioCtr))
	got = byName(src.Refresh())
	if !got["gpu-n1-1"].Healthy || got["gpu-n1-0"].Problem.Cause != CauseMissing || !got["gpu-n1-2"].Healthy {
		t.Fatalf("overlap gone: %+v", got)
	}
}

func entries(hook *test.Hook) string {
	var b strings.Builder
	for _, e := range hook.AllEntries() {
		line, _ := e.String()
		b.WriteString(line)
	}
	return b.String()
}

// TestSharedNodeTwoResources: a node in devices of two
// resources of one process (sources sharing one Owners) makes both
// Unhealthy, each running in its own goroutine; when the second stops
// claiming it (its rescan, or it stops), the first is Healthy again
// without any event of its own. Simulated devices claim nothing.
func TestSharedNodeTwoResources(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	fn.make(t, filepath.Join(root, "ttyUSB0"), 188, 0)
	fn.make(t, filepath.Join(root, "ttyUSB1"), 188, 1)
	log, hook := test.NewNullLogger()
	owners := NewOwners(logrus.NewEntry(log))
	a, err := NewSource(Options{DevRoot: root, IDPrefix: "ser", HostGlobs: []string{"ttyUSB*"}, Owners: owners, Log: logrus.NewEntry(log)})
	if err != nil {
		t.Fatal(err)
	}
	fd := &fakeDiscovery{}
	fd.set(Found{Key: "1-1", Node: Node{HostPath: "ttyUSB0", Type: Char}, NUMANode: NoNUMA,
		Identity: Identity{USBVendor: "10c4", USBProduct: "ea60", USBSerial: "0001"}})
	rescan := make(chan func(), 1)
	b, err := NewSource(Options{DevRoot: root, IDPrefix: "cp210x", Discover: fd.discover, DiscoverKind: "usb", Owners: owners, Log: logrus.NewEntry(log),
		KernelEvents: func(_ context.Context, f func()) (func(), error) { rescan <- f; return func() {}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	sim, err := NewSource(Options{DevRoot: root, IDPrefix: "sim", Count: 2, FilePrefix: "sim", Type: Char, Major: 188, Owners: owners})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Prepare(); err != nil {
		t.Fatal(err)
	}
	// b's first scan makes a's device Unhealthy before a runs: what a
	// publishes first already says so.
	if _, err := b.Prepare(); err != nil {
		t.Fatal(err)
	}
	if _, err := sim.Prepare(); err != nil {
		t.Fatal(err)
	}
	shared := func(s *Snapshot, name string) bool {
		d, ok := byName(s)[name]
		return ok && !d.Healthy && d.Problem.Cause == CauseSharedNode
	}
	if s := a.Snapshot(); !shared(s, "ser-ttyUSB0") || !byName(s)["ser-ttyUSB1"].Healthy {
		t.Fatalf("a before it runs: %+v", s.Devices)
	}
	if s := b.Snapshot(); !shared(s, "cp210x-0") {
		t.Fatalf("b: %+v", s.Devices)
	}
	if s := sim.Snapshot(); s.Healthy() != 2 {
		t.Fatalf("simulated devices own their nodes: %+v", s.Devices)
	}
	if !logged(hook, "ser-ttyUSB0", "cp210x-0", filepath.Join(root, "ttyUSB0")) {
		t.Errorf("no log line names both devices and the node:\n%s", entries(hook))
	}
	outA := runSource(t, a)
	waitSnap(t, a, outA, 2*time.Second, "a runs", func(s *Snapshot) bool { return shared(s, "ser-ttyUSB0") })
	outB := make(chan *Snapshot, 1)
	stopB := goRun(t, b, outB)
	event := <-rescan

	// b's adapter now shows as ttyUSB1: a's ttyUSB0 is its own again, and
	// ttyUSB1 is shared.
	fd.set(Found{Key: "1-1", Node: Node{HostPath: "ttyUSB1", Type: Char}, NUMANode: NoNUMA,
		Identity: Identity{USBVendor: "10c4", USBProduct: "ea60", USBSerial: "0001"}})
	event()
	waitSnap(t, a, outA, 2*time.Second, "b moved to ttyUSB1", func(s *Snapshot) bool {
		return byName(s)["ser-ttyUSB0"].Healthy && shared(s, "ser-ttyUSB1")
	})
	// b stops: its claims go with it.
	stopB()
	waitSnap(t, a, outA, 2*time.Second, "b stopped", func(s *Snapshot) bool { return s.Healthy() == 2 })
	if !logged(hook, "one device again", filepath.Join(root, "ttyUSB1")) {
		t.Errorf("the end of the conflict is not said:\n%s", entries(hook))
	}
}

// goRun runs s until the returned stop, which waits for Run.
func goRun(t *testing.T, s *Source, out chan *Snapshot) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, out) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}
