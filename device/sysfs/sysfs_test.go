package sysfs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// fixture is a real machine's sysfs and procfs (see its README.md): a
// cloud VM with one NVIDIA H100 at 0000:00:06.0, driver nvidia, no NUMA.
const fixture = "testdata/nvidia-h100-vm"

func TestFixtureH100(t *testing.T) {
	sys, proc := filepath.Join(fixture, "sys"), filepath.Join(fixture, "proc")
	fns, skipped, err := PCIFunctions(sys, proc)
	if err != nil || len(skipped) != 0 {
		t.Fatal(err, skipped)
	}
	if len(fns) != 7 {
		t.Fatalf("%d functions, want the fixture's 7: %+v", len(fns), fns)
	}
	found, err := Discover(sys, proc, PCISelector{Vendor: "10de"}, nil)()
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 1 {
		t.Fatalf("found %+v, want the H100 alone", found)
	}
	f := found[0]
	want := device.Found{
		Key:      "0000:00:06.0",
		Node:     device.Node{HostPath: "nvidia0", Type: device.Char, Major: 195, Minor: 0},
		NUMANode: device.NoNUMA,
		Identity: device.Identity{PCIAddress: "0000:00:06.0", PCIVendor: "10de", PCIDevice: "2330", PCIClass: "030200", PCIDriver: "nvidia"},
	}
	if f.Key != want.Key || f.Node != want.Node || len(f.Extra) != 0 || f.NUMANode != want.NUMANode || f.Identity != want.Identity {
		t.Fatalf("found %+v\nwant  %+v", f, want)
	}
	for _, c := range []struct {
		name string
		sel  PCISelector
		n    int
	}{
		{"vendor, device, class, driver", PCISelector{Vendor: "10de", Device: []string{"2335", "2330"}, Class: "0302", Driver: "nvidia"}, 1},
		{"class of two digits", PCISelector{Vendor: "10de", Class: "03"}, 1},
		{"other device", PCISelector{Vendor: "10de", Device: []string{"2335"}}, 0},
		{"other driver", PCISelector{Vendor: "10de", Driver: "vfio-pci"}, 0},
		{"other class", PCISelector{Vendor: "10de", Class: "0300"}, 0},
		{"virtio (no nodes)", PCISelector{Vendor: "1af4"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			found, err := Discover(sys, proc, c.sel, nil)()
			if err != nil || len(found) != c.n {
				t.Fatalf("found %d (%v), want %d", len(found), err, c.n)
			}
		})
	}
}

func TestMadeTrees(t *testing.T) {
	tr := newTree(t)
	// Two GPUs over two NUMA nodes.
	tr.function("pci0000:00", "0000:01:00.0", "10de", "2330", "030200", "nvidia", 0)
	tr.function("pci0000:80", "0000:81:00.0", "10de", "2330", "030200", "nvidia", 1)
	tr.file(filepath.Join(tr.proc, "driver", "nvidia", "gpus", "0000:01:00.0", "information"), "Model: \t H100\nDevice Minor: \t 0\n")
	tr.file(filepath.Join(tr.proc, "driver", "nvidia", "gpus", "0000:81:00.0", "information"), "Model: \t H100\nDevice Minor: \t 1\n")
	// A function bound to vfio-pci, IOMMU group 42.
	vf := tr.function("pci0000:00", "0000:3b:00.2", "8086", "154c", "020000", "vfio-pci", 0)
	_ = os.MkdirAll(filepath.Join(tr.sys, "kernel", "iommu_groups", "42"), 0o755)
	tr.link(filepath.Join(vf, "iommu_group"), "../../../kernel/iommu_groups/42")
	// A GPU of another vendor with its DRM nodes (and a link out of it that
	// must not be followed).
	amd := tr.function("pci0000:00", "0000:c1:00.0", "1002", "74a1", "038000", "amdgpu", -1)
	tr.registered(amd, "drm", "card1", "dri/card1", "226:1")
	tr.registered(amd, "drm", "renderD128", "dri/renderD128", "226:128")
	tr.link(filepath.Join(amd, "physfn"), "../0000:3b:00.2")

	sys, proc := tr.sys, tr.proc
	for _, c := range []struct {
		name string
		sel  PCISelector
		want []device.Found
	}{
		{"GPUs over two NUMA nodes", PCISelector{Vendor: "10de"}, []device.Found{
			{Key: "0000:01:00.0", Node: device.Node{HostPath: "nvidia0", Type: device.Char, Major: 195, Minor: 0}, NUMANode: 0},
			{Key: "0000:81:00.0", Node: device.Node{HostPath: "nvidia1", Type: device.Char, Major: 195, Minor: 1}, NUMANode: 1},
		}},
		{"vfio-pci", PCISelector{Vendor: "8086", Driver: "vfio-pci"}, []device.Found{
			{Key: "0000:3b:00.2", Node: device.Node{HostPath: "vfio/42", Type: device.Char},
				Extra: []device.Node{{HostPath: "vfio/vfio", Type: device.Char}}, NUMANode: 0},
		}},
		{"DRM card and render node", PCISelector{Vendor: "1002", Class: "03"}, []device.Found{
			{Key: "0000:c1:00.0", Node: device.Node{HostPath: "dri/card1", Type: device.Char, Major: 226, Minor: 1},
				Extra: []device.Node{{HostPath: "dri/renderD128", Type: device.Char, Major: 226, Minor: 128}}, NUMANode: device.NoNUMA},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			found, err := Discover(sys, proc, c.sel, nil)()
			if err != nil {
				t.Fatal(err)
			}
			if len(found) != len(c.want) {
				t.Fatalf("found %+v, want %+v", found, c.want)
			}
			for i, w := range c.want {
				f := found[i]
				if f.Key != w.Key || f.Node != w.Node || !slices.Equal(f.Extra, w.Extra) || f.NUMANode != w.NUMANode || f.Identity.PCIAddress != w.Key {
					t.Errorf("found %+v\nwant  %+v", f, w)
				}
			}
		})
	}
	fns, _, _ := PCIFunctions(sys, proc)
	if len(fns) != 4 || fns[1].Address != "0000:3b:00.2" || fns[1].IOMMUGroup != "42" || fns[1].Driver != "vfio-pci" {
		t.Errorf("functions in address order, the vfio one second with its group: %+v", fns)
	}

	// The NUMA node of a char node, through /sys/dev/char.
	tr.link(filepath.Join(sys, "dev", "char", "195:1"), "../../devices/pci0000:80/0000:81:00.0")
	for _, c := range []struct {
		major, minor uint32
		want         int
	}{{195, 1, 1}, {226, 128, device.NoNUMA}, {4, 64, device.NoNUMA}} {
		if got := NUMAOfNode(sys, device.Char, c.major, c.minor); got != c.want {
			t.Errorf("NUMA of %d:%d = %d, want %d", c.major, c.minor, got, c.want)
		}
	}
}

func TestMalformed(t *testing.T) {
	tr := newTree(t)
	tr.function("pci0000:00", "0000:01:00.0", "10de", "2330", "030200", "nvidia", 0)
	tr.file(filepath.Join(tr.proc, "driver", "nvidia", "gpus", "0000:01:00.0", "information"), "Device Minor: \t zero\n")
	if fns, skipped, err := PCIFunctions(tr.sys, tr.proc); err != nil || len(fns) != 0 || len(skipped) != 1 || skipped[0].Name != "0000:01:00.0" {
		t.Errorf("a Device Minor that is no number: %+v %v %v", fns, skipped, err)
	}
	tr2 := newTree(t)
	dir := tr2.function("pci0000:00", "0000:01:00.0", "10de", "2330", "030200", "", 0)
	tr2.file(filepath.Join(dir, "vendor"), "0x10dex\n")
	if _, skipped, err := PCIFunctions(tr2.sys, tr2.proc); err != nil || len(skipped) != 1 || !strings.Contains(skipped[0].Error(), "0000:01:00.0") {
		t.Errorf("a vendor of 5 digits: %v %v", skipped, err)
	}
	if fns, _, err := PCIFunctions(filepath.Join(t.TempDir(), "none"), ""); err != nil || len(fns) != 0 {
		t.Errorf("no PCI bus: %v %v", fns, err)
	}
}

// TestUnreadableSkipped: a PCI function or USB device that
// cannot be read does not hold back the others of its bus: it is skipped
// with a warning that names it, said once while it stays so (not on every
// rescan), again if it breaks again after it was read; one whose vendor
// says it is not the selector's is skipped quietly.
func TestUnreadableSkipped(t *testing.T) {
	tr := newTree(t)
	tr.function("pci0000:00", "0000:01:00.0", "10de", "2330", "030200", "nvidia", 0)
	tr.file(filepath.Join(tr.proc, "driver", "nvidia", "gpus", "0000:01:00.0", "information"), "Device Minor: \t 0\n")
	tr.function("pci0000:00", "0000:02:00.0", "10de", "2330", "030200", "nvidia", 0)
	bad := filepath.Join(tr.proc, "driver", "nvidia", "gpus", "0000:02:00.0", "information")
	tr.file(bad, "Device Minor: \t zero\n")
	other := tr.function("pci0000:00", "0000:03:00.0", "8086", "154c", "020000", "", 0)
	tr.file(filepath.Join(other, "class"), "0x02\n")

	log, hook := test.NewNullLogger()
	warned := func() []string {
		var out []string
		for _, e := range hook.AllEntries() {
			if e.Level == logrus.WarnLevel {
				out = append(out, fmt.Sprint(e.Data["pci"], " ", e.Data[logrus.ErrorKey]))
			}
		}
		return out
	}
	discover := Discover(tr.sys, tr.proc, PCISelector{Vendor: "10de"}, logrus.NewEntry(log))
	for range 2 {
		found, err := discover()
		if err != nil || len(found) != 1 || found[0].Key != "0000:01:00.0" {
			t.Fatalf("found %+v %v, want the readable GPU", found, err)
		}
	}
	if w := warned(); len(w) != 1 || !strings.HasPrefix(w[0], "0000:02:00.0 ") || !strings.Contains(w[0], "zero") {
		t.Fatalf("warned %q, want once, naming 0000:02:00.0 and why", w)
	}
	tr.file(bad, "Device Minor: \t 1\n")
	if found, err := discover(); err != nil || len(found) != 2 {
		t.Fatalf("readable again: %+v %v", found, err)
	}
	tr.file(bad, "Device Minor: \t zero\n")
	_, _ = discover()
	if w := warned(); len(w) != 2 {
		t.Fatalf("warned %q, want again once broken again", w)
	}

	// USB: an adapter whose product cannot be read beside one that can.
	utr := newTree(t)
	for i, product := range []string{"6001", "60x1"} {
		name := "1-" + itoa(i+1)
		d := filepath.Join(utr.sys, "devices", "pci0000:00", "0000:00:14.0", "usb1", name)
		for k, v := range map[string]string{"busnum": "1", "devnum": itoa(i + 2), "idVendor": "0403", "idProduct": product,
			"dev": "189:" + itoa(i+2), "uevent": "DEVNAME=bus/usb/001/00" + itoa(i+2)} {
			utr.file(filepath.Join(d, k), v+"\n")
		}
		utr.link(filepath.Join(utr.sys, "bus", "usb", "devices", name), "../../../devices/pci0000:00/0000:00:14.0/usb1/"+name)
	}
	hook.Reset()
	discoverUSB := DiscoverUSB(utr.sys, USBSelector{Vendor: "0403"}, logrus.NewEntry(log))
	for range 2 {
		found, err := discoverUSB()
		if err != nil || len(found) != 1 || found[0].Key != "port:1-1" {
			t.Fatalf("USB found %+v %v, want the readable adapter", found, err)
		}
	}
	if n := len(hook.AllEntries()); n != 1 || hook.LastEntry().Data["usb"] != "1-2" {
		t.Fatalf("USB warned %d times (%+v), want once naming 1-2", n, hook.LastEntry())
	}
}

func TestUSB(t *testing.T) {
	tr := newTree(t)
	ctrl := tr.function("pci0000:00", "0000:00:14.0", "8086", "a0ed", "0c0330", "xhci_hcd", 1)
	root := tr.usbDevice(ctrl, "usb1", 1, 1, "1d6b", "0002", "")
	hub := tr.usbDevice(root, "1-1", 1, 2, "05e3", "0610", "")
	ftdi := tr.usbDevice(hub, "1-1.2", 1, 4, "0403", "6001", "A10K")
	// Its interface, with the tty the kernel registers below it.
	tr.registered(tr.usbInterface(ftdi, "1-1.2:1.0"), "tty", "ttyUSB0", "ttyUSB0", "188:0")

	devs, _, err := USBDevices(tr.sys)
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 3 {
		t.Fatalf("%d devices, want the root hub, the hub and the adapter (no interface): %+v", len(devs), devs)
	}
	found, err := DiscoverUSB(tr.sys, USBSelector{Vendor: "0403", Product: "6001"}, nil)()
	if err != nil || len(found) != 1 {
		t.Fatalf("found %+v %v", found, err)
	}
	f := found[0]
	if f.Key != "0403:6001:A10K" || f.Node != (device.Node{HostPath: "ttyUSB0", Type: device.Char, Major: 188, Minor: 0}) ||
		len(f.Extra) != 1 || f.Extra[0] != (device.Node{HostPath: "bus/usb/001/004", Type: device.Char, Major: 189, Minor: 3}) || f.NUMANode != 1 {
		t.Fatalf("adapter %+v", f)
	}
	if id := f.Identity; id.USBBus != 1 || id.USBDevice != 4 || id.USBSerial != "A10K" || id.USBVendor != "0403" {
		t.Fatalf("identity %+v", id)
	}
	// The hub's nodes are its own, not its child's.
	hubs, _ := DiscoverUSB(tr.sys, USBSelector{Vendor: "05e3"}, nil)()
	if len(hubs) != 1 || hubs[0].Node.HostPath != "bus/usb/001/002" || len(hubs[0].Extra) != 0 {
		t.Fatalf("hub %+v", hubs)
	}
	if other, _ := DiscoverUSB(tr.sys, USBSelector{Vendor: "0403", Serial: "B20"}, nil)(); len(other) != 0 {
		t.Fatalf("another serial matched: %+v", other)
	}
}

func itoa(n int) string {
	if n < 0 {
		return "-1"
	}
	return string(rune('0' + n))
}

// TestDiskOf: a partition (its sysfs directory has a partition file) is
// told from its disk, whose directory holds it; a whole disk, a char
// node and a node sysfs does not know are no partition.
func TestDiskOf(t *testing.T) {
	tr := newTree(t)
	disk := filepath.Join(tr.sys, "devices", "pci0000:00", "0000:00:1f.2", "ata1", "host0", "target0:0:0", "0:0:0:0", "block", "sdb")
	tr.classDevice(disk, "block", "sdb", "block", 8, 16)
	tr.file(filepath.Join(disk, "sdb1", "partition"), "1\n")
	tr.classDevice(filepath.Join(disk, "sdb1"), "block", "sdb1", "block", 8, 17)
	nvme := filepath.Join(tr.sys, "devices", "pci0000:00", "0000:01:00.0", "nvme", "nvme0", "nvme0n1")
	tr.classDevice(nvme, "block", "nvme0n1", "block", 259, 0)
	tr.file(filepath.Join(nvme, "nvme0n1p1", "partition"), "1\n")
	tr.classDevice(filepath.Join(nvme, "nvme0n1p1"), "block", "nvme0n1p1", "block", 259, 1)
	for _, c := range []struct {
		major, minor   uint32
		dMajor, dMinor uint32
		partition      bool
		what           string
	}{
		{8, 17, 8, 16, true, "sdb1"},
		{259, 1, 259, 0, true, "nvme0n1p1"},
		{8, 16, 0, 0, false, "sdb, a disk"},
		{8, 99, 0, 0, false, "a node sysfs does not know"},
	} {
		if ma, mi, ok := DiskOf(tr.sys, c.major, c.minor); ok != c.partition || ma != c.dMajor || mi != c.dMinor {
			t.Errorf("%s: DiskOf(%d:%d) = %d:%d %v, want %d:%d %v", c.what, c.major, c.minor, ma, mi, ok, c.dMajor, c.dMinor, c.partition)
		}
	}
}
