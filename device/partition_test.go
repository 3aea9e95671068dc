package device

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// diskOf is Options.DiskOf of a sysfs whose partitions are parts
// (partition's numbers -> its disk's).
func diskOf(parts map[[2]uint32][2]uint32) func(uint32, uint32) (uint32, uint32, bool) {
	return func(major, minor uint32) (uint32, uint32, bool) {
		d, ok := parts[[2]uint32{major, minor}]
		return d[0], d[1], ok
	}
}

// disks makes sdb (8:16) with partitions sdb1 and sdb2, and sdc (8:32),
// real block nodes below root, udev's by-id names of sdb and sdb1, and the
// sysfs that tells their partitions.
func disks(t *testing.T, root string) func(uint32, uint32) (uint32, uint32, bool) {
	t.Helper()
	mkBlock(t, filepath.Join(root, "sdb"), 8, 16)
	mkBlock(t, filepath.Join(root, "sdb1"), 8, 17)
	mkBlock(t, filepath.Join(root, "sdb2"), 8, 18)
	mkBlock(t, filepath.Join(root, "sdc"), 8, 32)
	link(t, "../../sdb", filepath.Join(root, "disk", "by-id", "ata-ST4000NM0035_ZC11ABCD"))
	link(t, "../../sdb1", filepath.Join(root, "disk", "by-id", "ata-ST4000NM0035_ZC11ABCD-part1"))
	return diskOf(map[[2]uint32][2]uint32{{8, 17}: {8, 16}, {8, 18}: {8, 16}, {8, 19}: {8, 16}})
}

// TestPartitionOfItsDisk: within one resource a partition is a node of
// its disk's device (the container that gets the disk can write the
// partition through it, and gets its node too), not a device of its own;
// a partition whose disk the resource does not have is a device. A
// partition that appears under a device (a pod partitions its disk) joins
// it; the device keeps its ID and index and stays Healthy.
func TestPartitionOfItsDisk(t *testing.T) {
	testutil.NeedMknod(t)
	root := t.TempDir()
	parts := disks(t, root)
	start := func(globs ...string) *Source {
		t.Helper()
		return prepared(t, Options{DevRoot: root, IDPrefix: "disk", HostGlobs: globs, DiskOf: parts, Registry: filepath.Join(t.TempDir(), "registry.json")})
	}
	// nodes says each device: health and its own and other nodes, by
	// path relative to root.
	nodes := func(snap *Snapshot) map[string]string {
		out := map[string]string{}
		for _, d := range snap.Devices {
			rel, _ := filepath.Rel(root, d.HostPath)
			s := rel
			for _, n := range d.Extra {
				r, _ := filepath.Rel(root, n.HostPath)
				s += " " + r + "=" + n.ContainerPath
			}
			if !d.Healthy {
				s += " " + d.Problem.String()
			}
			out[d.Name] = s
		}
		return out
	}
	same := func(what string, got, want map[string]string) {
		t.Helper()
		if len(got) != len(want) {
			t.Errorf("%s: %q, want %q", what, got, want)
			return
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %q, want %q", what, got, want)
				return
			}
		}
	}
	src := start("sd*")
	same("sd*", nodes(src.Snapshot()), map[string]string{"disk-sdb": "sdb sdb1=/dev/sdb1 sdb2=/dev/sdb2", "disk-sdc": "sdc"})
	same("disk/by-id/*", nodes(start("disk/by-id/*").Snapshot()), map[string]string{
		"disk-disk_by-id_ata-ST4000NM0035:_ZC11ABCD": "disk/by-id/ata-ST4000NM0035_ZC11ABCD disk/by-id/ata-ST4000NM0035_ZC11ABCD-part1=/dev/disk/by-id/ata-ST4000NM0035_ZC11ABCD-part1",
	})
	same("sdb1 alone", nodes(start("sdb1", "sdc").Snapshot()), map[string]string{"disk-sdb1": "sdb1", "disk-sdc": "sdc"})

	// A partition appears below the disk of a device.
	mkBlock(t, filepath.Join(root, "sdb3"), 8, 19)
	same("sdb3 made", nodes(src.Refresh()), map[string]string{"disk-sdb": "sdb sdb1=/dev/sdb1 sdb2=/dev/sdb2 sdb3=/dev/sdb3", "disk-sdc": "sdc"})
	if d := byName(src.Snapshot())["disk-sdb"]; d.Index != 0 {
		t.Errorf("disk-sdb index %d, want 0", d.Index)
	}
}

// TestPartitionInTwoResources: a disk in one resource and a partition of
// it in another are one node: the disk's device can write the partition.
// Neither is handed out (shared_node), and the problem says which is the
// partition of which. Two partitions of one disk, in two devices, are
// two nodes.
func TestPartitionInTwoResources(t *testing.T) {
	testutil.NeedMknod(t)
	root := t.TempDir()
	parts := disks(t, root)
	log, hook := test.NewNullLogger()
	owners := NewOwners(logrus.NewEntry(log))
	source := func(prefix string, globs ...string) *Source {
		t.Helper()
		return prepared(t, Options{DevRoot: root, IDPrefix: prefix, HostGlobs: globs, DiskOf: parts, Owners: owners, Log: logrus.NewEntry(log)})
	}
	whole := source("whole", "sdb", "sdc")
	part := source("part", "sdb[12]")
	for _, d := range []Device{byName(whole.Snapshot())["whole-sdb"], byName(part.Snapshot())["part-sdb1"], byName(part.Snapshot())["part-sdb2"]} {
		if d.Name == "" || d.Healthy || d.Problem.Cause != CauseSharedNode {
			t.Errorf("%s: healthy %v, problem %q; want Unhealthy, shared_node (whole %+v, part %+v)", d.Name, d.Healthy, d.Problem, whole.Snapshot().Devices, part.Snapshot().Devices)
		}
	}
	if p := byName(part.Snapshot())["part-sdb1"].Problem; !strings.Contains(p.Message, "partition") || !strings.Contains(p.Message, "whole-sdb") {
		t.Errorf("part-sdb1's problem %q does not say it is a partition of whole-sdb's node", p)
	}
	if p := byName(whole.Snapshot())["whole-sdb"].Problem; !strings.Contains(p.Message, "part-sdb1") || !strings.Contains(p.Message, "part-sdb2") {
		t.Errorf("whole-sdb's problem %q does not name both partitions' devices", p)
	}
	if !byName(whole.Snapshot())["whole-sdc"].Healthy {
		t.Errorf("sdc has no partition in another resource: %+v", whole.Snapshot().Devices)
	}
	if !logged(hook, "whole-sdb", "part-sdb1", "part-sdb2") {
		t.Errorf("no log line names the disk's and the partitions' devices:\n%s", entries(hook))
	}
	// The disk's resource goes: the partitions are two nodes of their own.
	whole.Close()
	if s := part.Refresh(); s.Healthy() != 2 {
		t.Errorf("without the disk's device: %+v", s.Devices)
	}
}
