package device

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestAliasInTwoResources: a node named by udev's alias in one resource
// (serial/by-id/*) and by its kernel name in another (ttyUSB*) is one
// node: neither device is handed out (shared_node), and the problem and
// the log name the node by its numbers and both paths.
func TestAliasInTwoResources(t *testing.T) {
	testutil.NeedMknod(t)
	root := t.TempDir()
	testutil.Mknod(t, filepath.Join(root, "ttyUSB0"), 188, 0)
	testutil.Mknod(t, filepath.Join(root, "ttyUSB1"), 188, 1)
	link(t, "../../ttyUSB0", filepath.Join(root, "serial", "by-id", "usb-FTDI_FT232R_A10K1-if00-port0"))
	log, hook := test.NewNullLogger()
	owners := NewOwners(logrus.NewEntry(log))
	a := prepared(t, Options{DevRoot: root, IDPrefix: "tty", HostGlobs: []string{"ttyUSB*"}, Owners: owners, Log: logrus.NewEntry(log)})
	b := prepared(t, Options{DevRoot: root, IDPrefix: "ftdi", HostGlobs: []string{"serial/by-id/*"}, Owners: owners, Log: logrus.NewEntry(log)})
	byID := filepath.Join(root, "serial", "by-id", "usb-FTDI_FT232R_A10K1-if00-port0")
	da, db := byName(a.Snapshot())["tty-ttyUSB0"], byName(b.Snapshot())["ftdi-serial_by-id_usb-FTDI:_FT232R:_A10K1-if00-port0"]
	for _, d := range []Device{da, db} {
		if d.Name == "" || d.Healthy || d.Problem.Cause != CauseSharedNode {
			t.Errorf("%s: healthy %v, problem %q; want Unhealthy, shared_node (a: %+v; b: %+v)", d.Name, d.Healthy, d.Problem, a.Snapshot().Devices, b.Snapshot().Devices)
		}
	}
	if !strings.Contains(da.Problem.Message, "188:0") || !strings.Contains(da.Problem.Message, byID) {
		t.Errorf("a's problem %q does not name the node's numbers and the other device's path", da.Problem)
	}
	if d := byName(a.Snapshot())["tty-ttyUSB1"]; !d.Healthy {
		t.Errorf("ttyUSB1 has no alias in b: %q", d.Problem)
	}
	if !logged(hook, "tty-ttyUSB0", db.Name, "188:0") {
		t.Errorf("no log line names both devices and the node:\n%s", entries(hook))
	}
}

// TestAliasesOneDevice: within one resource the aliases of one node are
// one device. It takes the name a glob matches first (globs in order,
// each one's matches sorted); once known (the registry), the device keeps
// its name while that alias is there, whatever alias appears beside it;
// a registry of an earlier version that made two devices of two aliases
// keeps the first (the lower index), and the other is not handed out.
func TestAliasesOneDevice(t *testing.T) {
	testutil.NeedMknod(t)
	root := t.TempDir()
	reg := filepath.Join(t.TempDir(), "registry.json")
	mkBlock(t, filepath.Join(root, "sdb"), 8, 16)
	mkBlock(t, filepath.Join(root, "sdc"), 8, 32)
	byID := filepath.Join(root, "disk", "by-id")
	link(t, "../../sdb", filepath.Join(byID, "wwn-0x5000c500a1b2c3d4"))
	link(t, "../../sdb", filepath.Join(byID, "ata-ST4000NM0035_ZC11ABCD"))
	link(t, "../../sdc", filepath.Join(byID, "wwn-0x5000c500a1b2c3d5"))
	start := func(globs ...string) *Snapshot {
		t.Helper()
		return prepared(t, Options{DevRoot: root, IDPrefix: "disk", HostGlobs: globs, Registry: reg}).Snapshot()
	}
	names := func(snap *Snapshot) map[string]bool {
		out := map[string]bool{}
		for _, d := range snap.Devices {
			out[d.Name] = d.Healthy
		}
		return out
	}
	ata, wwnB, wwnC := "disk-disk_by-id_ata-ST4000NM0035:_ZC11ABCD", "disk-disk_by-id_wwn-0x5000c500a1b2c3d4", "disk-disk_by-id_wwn-0x5000c500a1b2c3d5"
	snap := start("disk/by-id/*")
	if got := names(snap); len(got) != 2 || !got[ata] || !got[wwnC] {
		t.Fatalf("disk/by-id/*: %v; want %s (sdb, its first name) and %s (sdc), both Healthy", got, ata, wwnC)
	}
	for _, d := range snap.Devices {
		if d.Name == ata && (d.HostPath != filepath.Join(byID, "ata-ST4000NM0035_ZC11ABCD") || d.Type != Block || d.Major != 8 || d.Minor != 16) {
			t.Errorf("sdb's device: %+v", d)
		}
	}

	// A name that sorts first appears for sdb: the device keeps the name
	// it has.
	link(t, "../../sdb", filepath.Join(byID, "ata-AAA_first"))
	if got := names(start("disk/by-id/*")); len(got) != 2 || !got[ata] || !got[wwnC] {
		t.Fatalf("after a new alias: %v; want %s kept", got, ata)
	}

	// Two globs: the first glob's match names the node.
	if err := os.Remove(reg); err != nil {
		t.Fatal(err)
	}
	if got := names(start("sd[bc]", "disk/by-id/*")); len(got) != 2 || !got["disk-sdb"] || !got["disk-sdc"] {
		t.Fatalf("sd[bc] before disk/by-id/*: %v; want disk-sdb and disk-sdc", got)
	}

	// An earlier version's registry with sdb twice, under two names: the
	// first keeps it, the other is not handed out.
	f := registryFile{Version: RegistryVersion, Devices: []registryEntry{
		{Path: "disk/by-id/wwn-0x5000c500a1b2c3d4", ID: wwnB, Index: 0, Type: Block, Major: 8, Minor: 16},
		{Path: "disk/by-id/ata-ST4000NM0035_ZC11ABCD", ID: ata, Index: 1, Type: Block, Major: 8, Minor: 16},
	}}
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(reg, data, 0o600); err != nil {
		t.Fatal(err)
	}
	snap = start("disk/by-id/*")
	got := names(snap)
	if healthy, known := got[ata]; !known || healthy || !got[wwnB] || !got[wwnC] || len(got) != 3 {
		t.Fatalf("earlier registry: %v; want %s Healthy, %s listed and Unhealthy, %s Healthy", got, wwnB, ata, wwnC)
	}
}
