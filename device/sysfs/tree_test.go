package sysfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// tree builds a sysfs and procfs below a temporary directory, laid out as
// the kernel lays them out: every device is a directory below
// sys/devices, nested under its parent device (a function behind a bridge
// under the bridge, a USB device under its hub), with its subsystem link
// (a bus device's to sys/bus/<bus>, a class device's to
// sys/class/<class>), linked back from sys/bus/<bus>/devices or
// sys/class/<class>, and a node's device from sys/dev/{char,block}.
type tree struct {
	t               *testing.T
	sys, proc, root string
}

func newTree(t *testing.T) *tree {
	root := t.TempDir()
	return &tree{t: t, root: root, sys: filepath.Join(root, "sys"), proc: filepath.Join(root, "proc")}
}

func (tr *tree) file(p, content string) {
	tr.t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr *tree) link(p, target string) {
	tr.t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		tr.t.Fatal(err)
	}
}

// relLink links p to the absolute path target with a relative link, as
// sysfs links are.
func (tr *tree) relLink(p, target string) {
	tr.t.Helper()
	rel, err := filepath.Rel(filepath.Dir(p), target)
	if err != nil {
		tr.t.Fatal(err)
	}
	tr.link(p, rel)
}

// busDevice makes dir a device of bus: its subsystem link, its
// sys/bus/<bus>/devices link and its uevent (env, one KEY=VALUE a line).
func (tr *tree) busDevice(dir, bus string, env ...string) string {
	tr.t.Helper()
	_ = os.MkdirAll(filepath.Join(tr.sys, "bus", bus, "drivers"), 0o755)
	tr.relLink(filepath.Join(dir, "subsystem"), filepath.Join(tr.sys, "bus", bus))
	tr.relLink(filepath.Join(tr.sys, "bus", bus, "devices", filepath.Base(dir)), dir)
	tr.file(filepath.Join(dir, "uevent"), strings.Join(env, "\n")+"\n")
	return dir
}

// pciID is what a function says of itself.
type pciID struct {
	vendor, device, class, driver string
	numa                          int
}

// pciBelow makes PCI function addr below the device directory parent (a
// root bus pci0000:xx, or a bridge's function) and returns its directory.
func (tr *tree) pciBelow(parent, addr string, id pciID) string {
	tr.t.Helper()
	dir := filepath.Join(parent, addr)
	tr.file(filepath.Join(dir, "vendor"), "0x"+id.vendor+"\n")
	tr.file(filepath.Join(dir, "device"), "0x"+id.device+"\n")
	tr.file(filepath.Join(dir, "class"), "0x"+id.class+"\n")
	tr.file(filepath.Join(dir, "numa_node"), strconv.Itoa(id.numa)+"\n")
	env := []string{"PCI_CLASS=" + strings.TrimLeft(id.class, "0"), "PCI_ID=" + strings.ToUpper(id.vendor+":"+id.device), "PCI_SLOT_NAME=" + addr}
	if id.driver != "" {
		env = append([]string{"DRIVER=" + id.driver}, env...)
		_ = os.MkdirAll(filepath.Join(tr.sys, "bus", "pci", "drivers", id.driver), 0o755)
		tr.relLink(filepath.Join(dir, "driver"), filepath.Join(tr.sys, "bus", "pci", "drivers", id.driver))
	}
	return tr.busDevice(dir, "pci", env...)
}

// function makes PCI function addr on root bus bus (pci0000:xx).
func (tr *tree) function(bus, addr, vendor, dev, class, driver string, numa int) string {
	return tr.pciBelow(filepath.Join(tr.sys, "devices", bus), addr, pciID{vendor, dev, class, driver, numa})
}

// classDevice makes a device of class at dir that registers a node
// (devname below /dev, kind char or block, major:minor): its dev file and
// uevent, its subsystem link and the links to it from sys/class/<class>,
// sys/dev/<kind> (and sys/block for a disk).
func (tr *tree) classDevice(dir, class, devname, kind string, major, minor int) string {
	tr.t.Helper()
	majmin := fmt.Sprintf("%d:%d", major, minor)
	tr.file(filepath.Join(dir, "dev"), majmin+"\n")
	tr.file(filepath.Join(dir, "uevent"), fmt.Sprintf("MAJOR=%d\nMINOR=%d\nDEVNAME=%s\n", major, minor, devname))
	tr.relLink(filepath.Join(dir, "subsystem"), filepath.Join(tr.sys, "class", class))
	tr.relLink(filepath.Join(tr.sys, "class", class, filepath.Base(dir)), dir)
	tr.relLink(filepath.Join(tr.sys, "dev", kind, majmin), dir)
	if class == "block" {
		if _, err := os.Lstat(filepath.Join(dir, "partition")); err != nil {
			tr.relLink(filepath.Join(tr.sys, "block", filepath.Base(dir)), dir)
		}
	}
	return dir
}

// registered makes a char node of class the kernel registers below the
// device at dir, in the class's directory there (drm/card1).
func (tr *tree) registered(dir, class, name, devname, majmin string) {
	tr.t.Helper()
	majs, mins, _ := strings.Cut(majmin, ":")
	major, _ := strconv.Atoi(majs)
	minor, _ := strconv.Atoi(mins)
	tr.classDevice(filepath.Join(dir, class, name), class, devname, "char", major, minor)
}

// usbDevice makes USB device name (usb1 for a root hub, 1-1.2 behind
// hubs) below the device directory parent, with its node
// bus/usb/BBB/DDD; serial "" for none. It returns its directory.
func (tr *tree) usbDevice(parent, name string, bus, dev int, vendor, product, serial string) string {
	tr.t.Helper()
	dir := filepath.Join(parent, name)
	tr.file(filepath.Join(dir, "busnum"), strconv.Itoa(bus)+"\n")
	tr.file(filepath.Join(dir, "devnum"), strconv.Itoa(dev)+"\n")
	tr.file(filepath.Join(dir, "idVendor"), vendor+"\n")
	tr.file(filepath.Join(dir, "idProduct"), product+"\n")
	if serial != "" {
		tr.file(filepath.Join(dir, "serial"), serial+"\n")
	}
	minor := (bus-1)*128 + dev - 1
	tr.file(filepath.Join(dir, "dev"), fmt.Sprintf("189:%d\n", minor))
	tr.busDevice(dir, "usb", "MAJOR=189", fmt.Sprintf("MINOR=%d", minor), fmt.Sprintf("DEVNAME=bus/usb/%03d/%03d", bus, dev),
		"DEVTYPE=usb_device", "PRODUCT="+vendor+"/"+product)
	tr.relLink(filepath.Join(tr.sys, "dev", "char", fmt.Sprintf("189:%d", minor)), dir)
	return dir
}

// usbInterface makes interface name (1-1.2:1.0; 1-0:1.0 of root hub usb1)
// of the USB device at dev and returns its directory.
func (tr *tree) usbInterface(dev, name string) string {
	return tr.busDevice(filepath.Join(dev, name), "usb", "DEVTYPE=usb_interface", "INTERFACE=255/0/0")
}

// unplug removes the device at dir as the kernel does: its directory
// and every link that pointed into it.
func (tr *tree) unplug(dir string) {
	tr.t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		tr.t.Fatal(err)
	}
	err := filepath.WalkDir(tr.sys, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink == 0 {
			return err
		}
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			return os.Remove(p)
		}
		return nil
	})
	if err != nil {
		tr.t.Fatal(err)
	}
}

// server is a tree laid out as an Intel server's: the directories of its
// devices.
type server struct {
	*tree
	rootPort, upstream, down0, down1, gpu, nvme, rootPort2, xhci string
	roothub, hub, adapter1, adapter2, hid                        string
}

// newServer makes an Intel server's sysfs: every bridge and the USB
// controller Intel (8086).
//
//	pci0000:00
//	  0000:00:00.0 host bridge
//	  0000:00:01.0 root port
//	    0000:01:00.0 PCIe switch, upstream port
//	      0000:02:00.0 downstream port
//	        0000:03:00.0 AMD GPU (amdgpu): drm/card1, drm/renderD128, i2c-5 with i2c-dev/i2c-5
//	      0000:02:01.0 downstream port
//	        0000:04:00.0 NVMe (nvme): nvme/nvme0, nvme0/nvme0n1, nvme0n1/nvme0n1p1
//	  0000:00:1c.0 root port, nothing behind
//	  0000:00:02.0 virtio-blk (virtio-pci): virtio1 (virtio)/block/vda, as on a real VM
//	  0000:00:1d.0 root port
//	    0000:3b:00.0 ConnectX (mlx5_core): mlx5_core.rdma.0 (auxiliary)/infiniband_verbs/uverbs0
//	  0000:00:14.0 xHCI (xhci_hcd)
//	    usb1 root hub (1d6b:0002), interface 1-0:1.0
//	      1-1 hub (05e3:0610), interface 1-1:1.0
//	        1-1.1 CP210x (10c4:ea60, serial 0001): 1-1.1:1.0/ttyUSB0 (usb-serial)/tty/ttyUSB0
//	        1-1.2 CP210x (10c4:ea60, serial 0001): 1-1.2:1.0/ttyUSB1 (usb-serial)/tty/ttyUSB1
//	      1-2 Logitech receiver (046d:c52b): 1-2:1.0/0003:046D:C52B.0001 (hid)/hidraw/hidraw0
func newServer(t *testing.T) *server {
	s := &server{tree: newTree(t)}
	root := filepath.Join(s.sys, "devices", "pci0000:00")
	bridge := pciID{"8086", "2030", "060400", "pcieport", 0}
	s.pciBelow(root, "0000:00:00.0", pciID{"8086", "2020", "060000", "", 0})
	s.rootPort = s.pciBelow(root, "0000:00:01.0", bridge)
	s.upstream = s.pciBelow(s.rootPort, "0000:01:00.0", pciID{"8086", "4fa0", "060400", "pcieport", 0})
	s.down0 = s.pciBelow(s.upstream, "0000:02:00.0", pciID{"8086", "4fa4", "060400", "pcieport", 0})
	s.down1 = s.pciBelow(s.upstream, "0000:02:01.0", pciID{"8086", "4fa4", "060400", "pcieport", 0})
	// A root port's PCIe service (bus pci_express), no node.
	s.busDevice(filepath.Join(s.rootPort, "0000:00:01.0:pcie001"), "pci_express")

	s.gpu = s.pciBelow(s.down0, "0000:03:00.0", pciID{"1002", "74a1", "038000", "amdgpu", 0})
	s.registered(s.gpu, "drm", "card1", "dri/card1", "226:1")
	s.registered(s.gpu, "drm", "renderD128", "dri/renderD128", "226:128")
	// An I2C bus of the GPU's (a device of bus i2c: the chips on it are
	// devices of their own), with its i2c-dev node.
	i2c := s.busDevice(filepath.Join(s.gpu, "i2c-5"), "i2c")
	s.registered(i2c, "i2c-dev", "i2c-5", "i2c-5", "89:5")

	s.nvme = s.pciBelow(s.down1, "0000:04:00.0", pciID{"144d", "a80a", "010802", "nvme", 0})
	ctrl := s.classDevice(filepath.Join(s.nvme, "nvme", "nvme0"), "nvme", "nvme0", "char", 240, 0)
	disk := s.classDevice(filepath.Join(ctrl, "nvme0n1"), "block", "nvme0n1", "block", 259, 0)
	s.file(filepath.Join(disk, "nvme0n1p1", "partition"), "1\n")
	s.classDevice(filepath.Join(disk, "nvme0n1p1"), "block", "nvme0n1p1", "block", 259, 1)

	s.rootPort2 = s.pciBelow(root, "0000:00:1c.0", bridge)

	virtio := s.pciBelow(root, "0000:00:02.0", pciID{"1af4", "1001", "010000", "virtio-pci", 0})
	blk := s.busDevice(filepath.Join(virtio, "virtio1"), "virtio")
	s.classDevice(filepath.Join(blk, "block", "vda"), "block", "vda", "block", 253, 0)

	port := s.pciBelow(root, "0000:00:1d.0", bridge)
	nic := s.pciBelow(port, "0000:3b:00.0", pciID{"15b3", "101b", "020700", "mlx5_core", 0})
	rdma := s.busDevice(filepath.Join(nic, "mlx5_core.rdma.0"), "auxiliary")
	s.registered(rdma, "infiniband_verbs", "uverbs0", "infiniband/uverbs0", "231:192")

	s.xhci = s.pciBelow(root, "0000:00:14.0", pciID{"8086", "a0ed", "0c0330", "xhci_hcd", 0})
	s.roothub = s.usbDevice(s.xhci, "usb1", 1, 1, "1d6b", "0002", "0000:00:14.0")
	s.usbInterface(s.roothub, "1-0:1.0")
	s.hub = s.usbDevice(s.roothub, "1-1", 1, 2, "05e3", "0610", "")
	s.usbInterface(s.hub, "1-1:1.0")
	s.adapter1 = s.adapter("1-1.1", 3, 0)
	s.adapter2 = s.adapter("1-1.2", 4, 1)
	s.hid = s.usbDevice(s.roothub, "1-2", 1, 5, "046d", "c52b", "")
	hid := s.busDevice(filepath.Join(s.usbInterface(s.hid, "1-2:1.0"), "0003:046D:C52B.0001"), "hid")
	s.registered(hid, "hidraw", "hidraw0", "hidraw0", "241:0")
	return s
}

// adapter plugs a CP210x with serial 0001 into port name of the hub, as
// device dev, its tty ttyUSB<tty>; it returns its directory.
func (s *server) adapter(name string, dev, tty int) string {
	d := s.usbDevice(s.hub, name, 1, dev, "10c4", "ea60", "0001")
	port := s.busDevice(filepath.Join(s.usbInterface(d, name+":1.0"), "ttyUSB"+strconv.Itoa(tty)), "usb-serial")
	s.registered(port, "tty", "ttyUSB"+strconv.Itoa(tty), "ttyUSB"+strconv.Itoa(tty), "188:"+strconv.Itoa(tty))
	return d
}
