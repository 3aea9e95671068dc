package device

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRebuiltRegistry: devices found by identity, whose
// registry does not parse, keep their IDs and indexes from the devices the
// spec describes, however discovery orders them now; a new one gets the
// next index. A described device that is not there waits (Unhealthy,
// missing) for its hardware, across a restart too, and then takes its ID
// and index back; it is never given to other hardware.
func TestRebuiltRegistry(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	for i := range uint32(4) {
		fn.make(t, filepath.Join(root, "nvidia"+itoa(i)), 195, i)
	}
	fd := &fakeDiscovery{}
	spec := &specStandIn{}
	opts := gpuOptions(t, root, fd, spec)
	start := func() *Snapshot {
		t.Helper()
		return prepared(t, opts).Snapshot()
	}
	fd.set(gpu("0000:41:00.0", 1, 0), gpu("0000:01:00.0", 0, 0), gpu("0000:81:00.0", 2, 0))
	snap := start()
	// The spec the follower wrote from it.
	spec.devices = describe(snap)
	before := pciAddrs(snap)
	if err := os.WriteFile(opts.Registry, []byte("{\"version\": 1, \"dev"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Found in another order, 81:00.0 gone for now, a new one beside.
	fd.set(gpu("0000:01:00.0", 0, 0), gpu("0000:c1:00.0", 3, 0), gpu("0000:41:00.0", 1, 0))
	got := pciAddrs(start())
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
	got = pciAddrs(start())
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
	spec.devices = nil
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

// TestLostRegistryRebuilt: a registry that is gone (a state directory
// cleaned), or that lists no device, while the resource's CDI spec
// describes devices, is missing state, not a first start: it is rebuilt
// from the spec, and every device keeps its ID and index however
// discovery orders them now. With no spec it is a first start; with a
// spec that cannot be trusted the start is refused (ErrRegistry), saying
// what to do.
func TestLostRegistryRebuilt(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	for i := range uint32(2) {
		fn.make(t, filepath.Join(root, "nvidia"+itoa(i)), 195, i)
	}
	fd := &fakeDiscovery{}
	spec := &specStandIn{}
	opts := gpuOptions(t, root, fd, spec)
	start := func() (*Snapshot, error) {
		t.Helper()
		src, err := NewSource(opts)
		if err != nil {
			t.Fatal(err)
		}
		return src.Prepare()
	}
	fd.set(gpu("0000:41:00.0", 1, 0), gpu("0000:01:00.0", 0, 0))
	snap, err := start()
	if err != nil {
		t.Fatal(err)
	}
	spec.devices = describe(snap)
	want := map[string]string{"gpu-n1-0": "0000:41:00.0", "gpu-n1-1": "0000:01:00.0"}
	for _, lost := range []struct {
		name string
		file string // "": removed
	}{
		{"removed", ""},
		{"no devices", `{"version": 1}`},
		{"an empty list", `{"version": 1, "devices": []}`},
	} {
		t.Run(lost.name, func(t *testing.T) {
			if err := os.Remove(opts.Registry); err != nil {
				t.Fatal(err)
			}
			if lost.file != "" {
				if err := os.WriteFile(opts.Registry, []byte(lost.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			// Discovery finds them in the other order now.
			fd.set(gpu("0000:01:00.0", 0, 0), gpu("0000:41:00.0", 1, 0))
			snap, err := start()
			if err != nil {
				t.Fatal(err)
			}
			if got := pciAddrs(snap); len(got) != len(want) || got["gpu-n1-0"] != want["gpu-n1-0"] || got["gpu-n1-1"] != want["gpu-n1-1"] {
				t.Fatalf("after the registry was lost: %v, want %v", got, want)
			}
		})
	}

	// The spec cannot be read: refused, nothing written.
	if err := os.Remove(opts.Registry); err != nil {
		t.Fatal(err)
	}
	spec.err = errors.New("CDI spec /run/cdi/x.json: unexpected end of JSON input")
	if _, err := start(); !errors.Is(err, ErrRegistry) || !strings.Contains(err.Error(), opts.Registry) || !strings.Contains(err.Error(), "is missing") ||
		!strings.Contains(err.Error(), "end of JSON") || !strings.Contains(err.Error(), "no pod holds") {
		t.Fatalf("a spec that cannot be read: %v, want %v naming the registry, why and what to do", err, ErrRegistry)
	}
	if _, err := os.Stat(opts.Registry); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused start wrote the registry: %v", err)
	}

	// No spec of its own (none; another deployment's): a first start, in
	// discovery order.
	for _, other := range []error{nil, fmt.Errorf("%w: /run/cdi/x.json (owner %q)", ErrForeignSpec, "another")} {
		spec.err, spec.devices = other, nil
		_ = os.Remove(opts.Registry)
		snap, err = start()
		if err != nil {
			t.Fatal(err)
		}
		if got := pciAddrs(snap); got["gpu-n1-0"] != "0000:01:00.0" || got["gpu-n1-1"] != "0000:41:00.0" {
			t.Fatalf("a first start (%v): %v, want discovery order", other, got)
		}
	}
}

// TestRepeatedRegistryEntries: a registry that gives one index, or one
// ID, or one key, to two entries is not used as it is (two Healthy
// devices would get one ID): it is rebuilt from the spec, or, without
// one, the start is refused (ErrRegistry) naming the entries, and the
// file is left as it is.
func TestRepeatedRegistryEntries(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	for i := range uint32(2) {
		fn.make(t, filepath.Join(root, "nvidia"+itoa(i)), 195, i)
	}
	fd := &fakeDiscovery{}
	fd.set(gpu("0000:41:00.0", 1, 0), gpu("0000:01:00.0", 0, 0))
	spec := &specStandIn{}
	opts := gpuOptions(t, root, fd, spec)
	if err := os.MkdirAll(filepath.Dir(opts.Registry), 0o700); err != nil {
		t.Fatal(err)
	}
	entry := func(addr string, index int, minor uint32) registryEntry {
		return registryEntry{Path: "pci/" + addr, ID: "gpu-n1-" + itoa(uint32(index)), Index: index, Type: Char, Major: 195, Minor: minor, Node: "nvidia" + itoa(minor),
			Identity: &recordedIdentity{PCIVendor: "10de", PCIDevice: "2330", PCIDriver: "nvidia"}}
	}
	for _, c := range []struct {
		name    string
		entries []registryEntry
		says    string
	}{
		{"one index twice", []registryEntry{entry("0000:41:00.0", 0, 1), entry("0000:01:00.0", 0, 0)}, "index 0"},
		{"one key twice", []registryEntry{entry("0000:41:00.0", 0, 1), entry("0000:41:00.0", 1, 1)}, "pci/0000:41:00.0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			data, err := json.Marshal(registryFile{Version: RegistryVersion, Devices: c.entries})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(opts.Registry, data, 0o600); err != nil {
				t.Fatal(err)
			}
			spec.devices = nil
			src, err := NewSource(opts)
			if err != nil {
				t.Fatal(err)
			}
			snap, err := src.Prepare()
			if !errors.Is(err, ErrRegistry) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("without a spec: %v (devices %v), want %v saying %q", err, snap, ErrRegistry, c.says)
			}
			if kept, _ := os.ReadFile(opts.Registry); !bytes.Equal(kept, data) {
				t.Fatalf("the refused registry was changed: %s", kept)
			}
			// With the spec: rebuilt, each device its own ID.
			spec.devices = []Described{
				{Name: "gpu-n1-0", Index: -1, Node: Node{HostPath: filepath.Join(root, "nvidia1"), Type: Char, Major: 195, Minor: 1}, Identity: gpu("0000:41:00.0", 1, 0).Identity},
				{Name: "gpu-n1-1", Index: -1, Node: Node{HostPath: filepath.Join(root, "nvidia0"), Type: Char, Major: 195, Minor: 0}, Identity: gpu("0000:01:00.0", 0, 0).Identity},
			}
			if got := pciAddrs(prepared(t, opts).Snapshot()); len(got) != 2 || got["gpu-n1-0"] != "0000:41:00.0" || got["gpu-n1-1"] != "0000:01:00.0" {
				t.Fatalf("rebuilt: %v", got)
			}
		})
	}
}
