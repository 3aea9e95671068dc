package device

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestSharedNodeIsNoOnesOwn: a node that the devices of a resource share
// (sharedNodes) is no device's own, nor is a node a simulated resource
// makes. What only discovery shows (a function whose own node is a
// sharedNodes entry, a glob of another resource matching a shared node or
// a simulated device's node through a symlink) makes the device that
// claims it Unhealthy (shared_node); the devices that share the node, and
// the simulated device, stay Healthy. When the claim goes, the node is
// just a node again.
func TestSharedNodeIsNoOnesOwn(t *testing.T) {
	testutil.NeedMknod(t)
	root := t.TempDir()
	testutil.Mknod(t, filepath.Join(root, "nvidia0"), 195, 0)
	testutil.Mknod(t, filepath.Join(root, "nvidia1"), 195, 1)
	testutil.Mknod(t, filepath.Join(root, "nvidiactl"), 195, 255)
	link(t, "nvidiactl", filepath.Join(root, "ctl-link"))
	link(t, "../sim-0", filepath.Join(root, "byname", "first"))
	log, hook := test.NewNullLogger()
	owners := NewOwners(logrus.NewEntry(log))
	fd := &fakeDiscovery{}
	fd.set(gpu("0000:01:00.0", 0, 0), gpu("0000:41:00.0", 1, 0))
	gpus := prepared(t, Options{DevRoot: root, IDPrefix: "gpu", NodeName: "n1", Discover: fd.discover, DiscoverKind: "pci",
		SharedNodes: []string{"nvidia0", "nvidiactl"}, Owners: owners, Log: logrus.NewEntry(log)})
	sim := prepared(t, Options{DevRoot: root, IDPrefix: "sim", Count: 2, FilePrefix: "sim", Type: Char, Major: 1, Minor: 3, Owners: owners})
	other := prepared(t, Options{DevRoot: root, IDPrefix: "x", HostGlobs: []string{"ctl-link", "byname/*"}, Owners: owners, Log: logrus.NewEntry(log)})
	unowned := func(d Device, what string) {
		t.Helper()
		if d.Name == "" || d.Healthy || d.Problem.Cause != CauseSharedNode || !strings.Contains(d.Problem.Message, what) {
			t.Errorf("%s: healthy %v, problem %q; want Unhealthy, shared_node, saying %q", d.Name, d.Healthy, d.Problem, what)
		}
	}
	unowned(byName(gpus.Snapshot())["gpu-n1-0"], "shared node")
	unowned(byName(other.Snapshot())["x-ctl-link"], "shared node")
	unowned(byName(other.Snapshot())["x-byname_first"], "sim-0")
	if d := byName(gpus.Snapshot())["gpu-n1-1"]; !d.Healthy {
		t.Errorf("gpu-n1-1 shares nvidia0 and nvidiactl as configured: %q", d.Problem)
	}
	if s := sim.Snapshot(); s.Healthy() != 2 {
		t.Errorf("the simulated devices own their nodes: %+v", s.Devices)
	}
	if !logged(hook, "x-ctl-link", filepath.Join(root, "ctl-link")) || !logged(hook, "x-byname_first", "sim-0") {
		t.Errorf("the log does not name the devices and the nodes:\n%s", entries(hook))
	}

	// The simulated resource and the GPUs go: their nodes are just nodes.
	sim.Close()
	gpus.Close()
	if s := other.Refresh(); s.Healthy() != 2 {
		t.Errorf("no one shares or makes the nodes: %+v", s.Devices)
	}
}

// TestPartitionOfASharedNode: a partition of a disk that the devices of a
// resource share is no device's own either.
func TestPartitionOfASharedNode(t *testing.T) {
	testutil.NeedMknod(t)
	root := t.TempDir()
	parts := disks(t, root)
	owners := NewOwners(nil)
	sharer := prepared(t, Options{DevRoot: root, IDPrefix: "s", HostGlobs: []string{"sdc"}, SharedNodes: []string{"sdb"}, DiskOf: parts, Owners: owners})
	part := prepared(t, Options{DevRoot: root, IDPrefix: "part", HostGlobs: []string{"sdb1"}, DiskOf: parts, Owners: owners})
	if d := byName(part.Snapshot())["part-sdb1"]; d.Healthy || d.Problem.Cause != CauseSharedNode || !strings.Contains(d.Problem.Message, "partition") {
		t.Errorf("part-sdb1: healthy %v, problem %q; want shared_node, a partition of a shared node", d.Healthy, d.Problem)
	}
	if s := sharer.Snapshot(); s.Healthy() != 1 || len(s.Devices[0].Shared) != 1 {
		t.Errorf("s-sdc shares sdb: %+v", s.Devices)
	}
}
