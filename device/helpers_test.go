package device

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// mkBlock makes a real block device node major:minor at p (parents
// included).
func mkBlock(t *testing.T, p string, major, minor uint32) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(p, unix.S_IFBLK|0o660, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatal(err)
	}
}

// link makes a symlink at p (parents included) pointing to target, as
// udev makes its by-id and by-path names.
func link(t *testing.T, target, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// prepared is a source of opts, prepared.
func prepared(t *testing.T, opts Options) *Source {
	t.Helper()
	src, err := NewSource(opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Prepare(); err != nil {
		t.Fatal(err)
	}
	return src
}

// specStandIn stands in for the resource's CDI spec (Options.Described):
// it describes devices; none (nil) is no spec (ErrNoSpec); err, when set,
// is a spec that cannot be trusted.
type specStandIn struct {
	devices []Described
	err     error
}

func (s *specStandIn) described() ([]Described, error) {
	switch {
	case s.err != nil:
		return nil, s.err
	case s.devices == nil:
		return nil, fmt.Errorf("%w /run/cdi/x.json", ErrNoSpec)
	}
	return s.devices, nil
}

// gpuOptions are the options of a resource of the GPUs fd finds by PCI
// identity, with its registry in a fresh directory and spec its CDI spec.
func gpuOptions(t *testing.T, root string, fd *fakeDiscovery, spec *specStandIn) Options {
	return Options{DevRoot: root, IDPrefix: "gpu", NodeName: "n1", Discover: fd.discover, DiscoverKind: "pci",
		Registry: filepath.Join(t.TempDir(), "resources", "registry.json"), Described: spec.described}
}

// pciAddrs is each device of snap by name: its PCI address when Healthy,
// else gone:<cause>.
func pciAddrs(snap *Snapshot) map[string]string {
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

// describe is what the spec written from snap describes (Options.
// Described): names, nodes, identities.
func describe(snap *Snapshot) []Described {
	var out []Described
	for _, d := range snap.Devices {
		out = append(out, Described{Name: d.Name, Index: -1, Node: Node{HostPath: d.HostPath, Type: d.Type, Major: d.Major, Minor: d.Minor}, Identity: d.Identity})
	}
	return out
}
