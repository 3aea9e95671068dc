package resource

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestPartitionWithItsDisk: a hostDevices resource tells a partition from
// its disk by the sysfs of --sys-root: with a glob matching sdb and sdb1,
// sdb1 is a node of sdb's device, in its CDI entry, and no device of its
// own.
func TestPartitionWithItsDisk(t *testing.T) {
	testutil.NeedMknod(t)
	base := t.TempDir()
	dev, sys, cdiDir, state := filepath.Join(base, "dev"), filepath.Join(base, "sys"), filepath.Join(base, "cdi"), filepath.Join(base, "state")
	write := func(p, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The kernel's sysfs of a disk and its partition: the partition's
	// directory, with its partition file, is in its disk's.
	disk := filepath.Join(sys, "devices", "pci0000:00", "0000:00:1f.2", "ata1", "host0", "target0:0:0", "0:0:0:0", "block", "sdb")
	write(filepath.Join(disk, "dev"), "8:16\n")
	write(filepath.Join(disk, "sdb1", "dev"), "8:17\n")
	write(filepath.Join(disk, "sdb1", "partition"), "1\n")
	for majmin, dir := range map[string]string{"8:16": disk, "8:17": filepath.Join(disk, "sdb1")} {
		p := filepath.Join(sys, "dev", "block", majmin)
		rel, err := filepath.Rel(filepath.Dir(p), dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(rel, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, minor := range map[string]uint32{"sdb": 16, "sdb1": 17} {
		if err := unix.Mknod(filepath.Join(dev, name), unix.S_IFBLK|0o660, int(unix.Mkdev(8, minor))); err != nil {
			t.Fatal(err)
		}
	}
	cfgFile := filepath.Join(base, "config.yaml")
	write(cfgFile, "resources:\n- name: example.com/disk\n  idPrefix: disk\n  hostDevices: [\"sdb*\"]\n")
	cfg, err := config.Load([]string{"--config", cfgFile, "--dev-root", dev, "--sys-root", sys, "--cdi-dir", cdiDir, "--state-dir", state, "--node-name", "n1"},
		func(string) (string, bool) { return "", false }, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Build(cfg, 0, Options{Writer: cdi.NewWriter(cdiDir, cfg.Owner(), 1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Prepare(); err != nil {
		t.Fatal(err)
	}
	devs := p.Source.Snapshot().Devices
	if len(devs) != 1 || devs[0].Name != "disk-n1-sdb" || !devs[0].Healthy || len(devs[0].Extra) != 1 ||
		devs[0].Extra[0].HostPath != filepath.Join(dev, "sdb1") || devs[0].Extra[0].Type != "b" || devs[0].Extra[0].Minor != 17 {
		t.Fatalf("devices %+v; want disk-n1-sdb alone, Healthy, with sdb1 (b 8:17) as its other node", devs)
	}
}
