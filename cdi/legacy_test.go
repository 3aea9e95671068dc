package cdi

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// hostSource makes real char nodes at rels below a fresh dev root, each
// a node of its own (1:3, 1:4, ... in order: one node is one device,
// whatever its names), and returns the first snapshot of a host-device
// source matching globs.
func hostSource(t *testing.T, globs []string, rels ...string) (*device.Source, *device.Snapshot) {
	t.Helper()
	root := t.TempDir()
	for i, rel := range rels {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3+uint32(i)))); err != nil {
			t.Skipf("cannot create device nodes here (%v): run as root", err)
		}
	}
	src, err := device.NewSource(device.Options{DevRoot: root, IDPrefix: "x", NodeName: "n1", HostGlobs: globs, ContainerDevRoot: "/dev"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := src.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	return src, snap
}

// TestLegacyAliasRoundTrip: a kubelet checkpoint from a version before the
// ':' escaping holds x-n1-a_b for /dev/a_b (now x-n1-a:_b). The spec keeps
// the old name as an alias of the same device, and a fresh CDI cache (as
// containerd builds one) injects /dev/a_b for it.
func TestLegacyAliasRoundTrip(t *testing.T) {
	src, snap := hostSource(t, []string{"a_b", "c"}, "a_b", "c")
	if got := src.LegacyIDs(); got["x-n1-a:_b"] != "x-n1-a_b" || len(got) != 1 {
		t.Fatalf("legacy IDs %v, want x-n1-a:_b -> x-n1-a_b only", got)
	}
	held := map[string][]string{"x-n1-a_b": {"ns/p/c"}, "x-n1-c": {"ns/q/c"}}
	aliases, err := LegacyAliases(snap, src.LegacyIDs(), held, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(aliases) != 1 || aliases["x-n1-a_b"] != "x-n1-a:_b" {
		t.Fatalf("aliases %v", aliases)
	}
	cdiDir := filepath.Join(t.TempDir(), "cdi")
	res := testResource(t)
	spec := NewWriter(cdiDir, "test-plugin", 1).Spec(res)
	spec.SetAliases(aliases)
	if err := spec.Write(snap); err != nil {
		t.Fatal(err)
	}
	fresh := testutil.FreshCDICache(t, cdiDir)
	for _, c := range []struct {
		name, path string
		minor      int64
	}{
		{"x-n1-a_b", "/dev/a_b", 3},  // the checkpointed name of an earlier version
		{"x-n1-a:_b", "/dev/a_b", 3}, // the current name
		{"x-n1-c", "/dev/c", 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			q, err := res.Kind.QualifiedName(c.name)
			if err != nil {
				t.Fatal(err)
			}
			oc := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
			unresolved, err := fresh.InjectDevices(oc, q)
			if err != nil || len(unresolved) != 0 {
				t.Fatalf("inject %s: %v %v", q, unresolved, err)
			}
			if len(oc.Linux.Devices) != 1 || oc.Linux.Devices[0].Path != c.path || oc.Linux.Devices[0].Major != 1 || oc.Linux.Devices[0].Minor != c.minor {
				t.Fatalf("devices %+v, want %s 1:%d", oc.Linux.Devices, c.path, c.minor)
			}
		})
	}
	// The alias goes once no container holds the old ID: the next write
	// has no entry of that name.
	spec.SetAliases(nil)
	if err := spec.Write(snap); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(spec.Path())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), `"x-n1-a_b"`) {
		t.Fatalf("alias kept after release: %s", data)
	}
}

// TestLegacyAliasConflicts: an old ID that the kubelet holds but that now
// names another device (/dev/a/b is x-n1-a_b, the old ID of /dev/a_b), or
// that several devices had, is refused with the IDs, the holders and what
// to do; IDs of this version and IDs nobody had are no conflict.
func TestLegacyAliasConflicts(t *testing.T) {
	for _, c := range []struct {
		name    string
		globs   []string
		rels    []string
		held    map[string][]string
		earlier bool     // the first start of this version
		want    []string // in the message; none: no error
	}{
		{
			name: "old ID is now another device's ID", globs: []string{"a_b", "a/*"}, rels: []string{"a_b", "a/b"},
			held: map[string][]string{"x-n1-a_b": {"ns/p/c"}}, earlier: true,
			want: []string{`"x-n1-a_b"`, `"x-n1-a:_b"`, "ns/p/c", "/a/b", "/a_b", "delete the pods"},
		},
		{
			// After the first start, a hold of a current ID is this
			// version's own allocation.
			name: "current ID held after the first start", globs: []string{"a_b", "a/*"}, rels: []string{"a_b", "a/b"},
			held: map[string][]string{"x-n1-a_b": {"ns/p/c"}},
		},
		{
			name: "old ID of two devices", globs: []string{"a_b/*", "a/*"}, rels: []string{"a_b/c", "a/b_c"},
			held: map[string][]string{"x-n1-a_b_c": {"ns/p/c", "ns/r/c"}},
			want: []string{`"x-n1-a_b_c"`, `"x-n1-a:_b_c"`, `"x-n1-a_b:_c"`, "ns/p/c", "ns/r/c", "delete the pods"},
		},
		{
			name: "current IDs held", globs: []string{"a_b", "a/*"}, rels: []string{"a_b", "a/b"},
			held: map[string][]string{"x-n1-a:_b": {"ns/p/c"}},
		},
		{
			name: "an ID no device had", globs: []string{"a_b"}, rels: []string{"a_b"},
			held: map[string][]string{"x-n1-zz": {"ns/p/c"}},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			src, snap := hostSource(t, c.globs, c.rels...)
			_, err := LegacyAliases(snap, src.LegacyIDs(), c.held, c.earlier)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrLegacyID) {
				t.Fatalf("err %v, want ErrLegacyID", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestLegacyAliasKeptWhenItsNameAppears: a device that appears with the
// name of a live alias (/dev/a/b is x-n1-a_b, which the kubelet holds for
// /dev/a_b) fails the write with ErrLegacyID, and the spec on disk still
// resolves the old name to the device the container had.
func TestLegacyAliasKeptWhenItsNameAppears(t *testing.T) {
	src, snap := hostSource(t, []string{"a_b", "a/*"}, "a_b")
	aliases, err := LegacyAliases(snap, src.LegacyIDs(), map[string][]string{"x-n1-a_b": {"ns/p/c"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	res := testResource(t)
	cdiDir := filepath.Join(t.TempDir(), "cdi")
	spec := NewWriter(cdiDir, "test-plugin", 1).Spec(res)
	spec.SetAliases(aliases)
	if err := spec.Write(snap); err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(snap.Devices[0].HostPath)
	if err := os.MkdirAll(filepath.Join(root, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(root, "a", "b"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 5))); err != nil {
		t.Fatal(err)
	}
	next := src.Refresh()
	if len(next.Devices) != 2 {
		t.Fatalf("devices %v", next.Devices)
	}
	err = spec.Write(next)
	if !errors.Is(err, ErrLegacyID) || !strings.Contains(err.Error(), `"x-n1-a_b"`) || !strings.Contains(err.Error(), "delete the pods") {
		t.Fatalf("write: %v, want ErrLegacyID naming x-n1-a_b", err)
	}
	fresh, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	oc := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := fresh.InjectDevices(oc, "k8s.example.com/fpga=x-n1-a_b"); err != nil {
		t.Fatal(err)
	}
	if len(oc.Linux.Devices) != 1 || oc.Linux.Devices[0].Path != "/dev/a_b" || oc.Linux.Devices[0].Minor != 3 {
		t.Fatalf("devices %+v, want /dev/a_b 1:3", oc.Linux.Devices)
	}
}
