package device

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestRebuiltRegistry (issue 27, item 9): devices found by identity, whose
// registry does not parse, keep their IDs and indexes from the devices the
// spec describes, however discovery orders them now; a new one gets the
// next index. A described device that is not there waits (Unhealthy,
// missing) for its hardware, across a restart too, and then takes its ID
// and index back; it is never given to other hardware.
func TestRebuiltRegistry(t *testing.T) {
	fn := useFakeNodes(t)
	root, state := t.TempDir(), t.TempDir()
	for i := range uint32(4) {
		fn.make(t, filepath.Join(root, "nvidia"+itoa(i)), 195, i)
	}
	fd := &fakeDiscovery{}
	var described []Described
	opts := Options{DevRoot: root, IDPrefix: "gpu", NodeName: "n1", Discover: fd.discover, DiscoverKind: "pci",
		Registry: filepath.Join(state, "registry.json"),
		Described: func() ([]Described, error) {
			if described == nil {
				return nil, errors.New("no CDI spec /run/cdi/x.json")
			}
			return described, nil
		}}
	start := func() *Snapshot {
		t.Helper()
		src, err := NewSource(opts)
		if err != nil {
			t.Fatal(err)
		}
		snap, err := src.Prepare()
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	addrs := func(snap *Snapshot) map[string]string {
		out := map[string]string{}
		for _, d := range snap.Devices {
			addr := d.Identity.PCIAddress
			if !d.Healthy {
				addr = "gone:" + d.Problem.Cause.String()
			}
			out[d.Name] = addr
		}
		return out
	}
	fd.set(gpu("0000:41:00.0", 1, 0), gpu("0000:01:00.0", 0, 0), gpu("0000:81:00.0", 2, 0))
	snap := start()
	// The spec the follower wrote from it: names, nodes, identities.
	for _, d := range snap.Devices {
		described = append(described, Described{Name: d.Name, Index: -1, Node: Node{HostPath: d.HostPath, Type: d.Type, Major: d.Major, Minor: d.Minor}, Identity: d.Identity})
	}
	before := addrs(snap)
	if err := os.WriteFile(opts.Registry, []byte("{\"version\": 1, \"dev"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Found in another order, 81:00.0 gone for now, a new one beside.
	fd.set(gpu("0000:01:00.0", 0, 0), gpu("0000:c1:00.0", 3, 0), gpu("0000:41:00.0", 1, 0))
	got := addrs(start())
	want := map[string]string{"gpu-n1-0": "0000:41:00.0", "gpu-n1-1": "0000:01:00.0", "gpu-n1-2": "gone:missing", "gpu-n1-3": "0000:c1:00.0"}
	if len(got) != len(want) {
		t.Fatalf("before %v; after the rebuild %v, want %v", before, got, want)
	}
	for name, addr := range want {
		if got[name] != addr {
			t.Errorf("after the rebuild %s is %s, want %s (before %v; all %v)", name, got[name], addr, before, got)
		}
	}
	// A restart reads the rebuilt registry; 81:00.0 is back and takes its
	// ID and index.
	fd.set(gpu("0000:81:00.0", 2, 0), gpu("0000:01:00.0", 0, 0), gpu("0000:c1:00.0", 3, 0), gpu("0000:41:00.0", 1, 0))
	got = addrs(start())
	want["gpu-n1-2"] = "0000:81:00.0"
	for name, addr := range want {
		if got[name] != addr {
			t.Errorf("after a restart %s is %s, want %s (all %v)", name, got[name], addr, got)
		}
	}
	if len(got) != 4 {
		t.Errorf("devices after a restart: %v", got)
	}

	// Without a spec to trust: refused, the file left as it is.
	described = nil
	if err := os.WriteFile(opts.Registry, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Prepare(); !errors.Is(err, ErrRegistry) {
		t.Fatalf("no spec: %v, want %v", err, ErrRegistry)
	}
}
