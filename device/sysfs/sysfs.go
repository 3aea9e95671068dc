// Package sysfs finds real devices by their identity in a sysfs tree and
// a procfs tree (both roots are parameters, so tests and e2e point them at
// a fixture): PCI functions with the device nodes that belong to them, and
// the NUMA node of a device node. It only reads.
//
// The nodes of a PCI function, found without configuration:
//   - bound to vfio-pci: /dev/vfio/<IOMMU group>, then /dev/vfio/vfio (the
//     VFIO container, which every function needs and shares);
//   - bound to nvidia: /dev/nvidia<Device Minor> (char 195), the minor from
//     <procRoot>/driver/nvidia/gpus/<address>/information: the NVIDIA
//     driver registers its nodes in /proc/devices only, nowhere in sysfs;
//   - any driver: the character and block devices the kernel registers
//     for the function (a "dev" file holding major:minor in its sysfs
//     directory), named by the DEVNAME of the "uevent" beside it: DRM
//     card* and renderD*, accel*, InfiniBand uverbs*, an NVMe
//     controller's nvme<N> and the namespaces (disks, partitions) the
//     kernel registers below it. The walk stops at every child device of
//     a bus (a directory whose "subsystem" link points to /sys/bus/<bus>):
//     a function behind a bridge or switch port, a USB controller's
//     devices, a disk behind a storage controller (scsi), the chips on a
//     GPU's I2C bus are devices of their own, not the function's. Only the
//     buses on which the kernel puts parts of the one function (pciParts:
//     auxiliary, serial-base) are walked into. Links out of the function's
//     directory (driver, subsystem, iommu_group, physfn, virtfn*, ...)
//     are not followed.
//
// A function's nodes are looked for only when the selector picks it.
package sysfs

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
)

// PCISelector picks PCI functions: Vendor always, the rest when set.
// Values are lowercase hexadecimal without 0x (config normalises them).
type PCISelector struct {
	Vendor string
	// Device: any of these device IDs; empty: any.
	Device []string
	// Class: a prefix of the 6-digit class ("0302" matches "030200").
	Class string
	// Driver: the name of the bound driver.
	Driver string
}

// PCIFunction is one function as sysfs describes it.
type PCIFunction struct {
	Address, Vendor, Device, Class, Driver, IOMMUGroup string
	// NUMANode is the function's NUMA node, device.NoNUMA when none.
	NUMANode int
	// Nodes are its device nodes, paths relative to the dev root.
	Nodes []device.Node
}

// Match reports whether f is what s picks.
func (s PCISelector) Match(f PCIFunction) bool {
	if f.Vendor != s.Vendor || !strings.HasPrefix(f.Class, s.Class) || (s.Driver != "" && f.Driver != s.Driver) {
		return false
	}
	if len(s.Device) == 0 {
		return true
	}
	for _, d := range s.Device {
		if d == f.Device {
			return true
		}
	}
	return false
}

// Unreadable is a PCI function or USB device that could not be read: it
// is skipped, the others of its bus are found without it.
type Unreadable struct {
	// Name is its address (0000:01:00.0) or port path (1-2); Vendor its
	// vendor ID when that could be read ("" when not).
	Name, Vendor string
	Err          error
}

func (u *Unreadable) Error() string { return u.Name + ": " + u.Err.Error() }
func (u *Unreadable) Unwrap() error { return u.Err }

// PCIFunctions reads every PCI function of sysRoot with its nodes, in
// address order; a function that cannot be read is skipped and returned
// in skipped (one that went away meanwhile is not). err: the bus cannot
// be listed.
func PCIFunctions(sysRoot, procRoot string) (fns []PCIFunction, skipped []*Unreadable, err error) {
	return pciFunctions(sysRoot, procRoot, func(PCIFunction) bool { return true })
}

// pciFunctions is PCIFunctions of the functions want picks by their
// identity: the nodes of the others are not looked for.
func pciFunctions(sysRoot, procRoot string, want func(PCIFunction) bool) (fns []PCIFunction, skipped []*Unreadable, err error) {
	dir := filepath.Join(sysRoot, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil // no PCI bus
	}
	if err != nil {
		return nil, nil, err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		f, err := readFunction(p, e.Name())
		if err == nil {
			if !want(f) {
				continue
			}
			err = f.readNodes(p, procRoot)
		}
		if err != nil {
			if !gone(p) {
				skipped = append(skipped, &Unreadable{Name: e.Name(), Vendor: f.Vendor, Err: err})
			}
			continue
		}
		fns = append(fns, f)
	}
	sort.Slice(fns, func(i, j int) bool { return fns[i].Address < fns[j].Address })
	return fns, skipped, nil
}

// gone reports whether the device at p (its bus link) is no more.
func gone(p string) bool {
	_, err := os.Stat(p)
	return errors.Is(err, fs.ErrNotExist)
}

// sayOnce warns of each unreadable device of a discovery once while it
// stays unreadable (not on every rescan), again if it breaks again after
// it was read.
type sayOnce struct {
	mu   sync.Mutex
	log  *logrus.Entry
	bus  string // the log field that names the device: pci, usb
	said map[string]bool
}

func newSayOnce(log *logrus.Entry, bus string) *sayOnce {
	if log == nil {
		log = logs.Discard()
	}
	return &sayOnce{log: log, bus: bus, said: map[string]bool{}}
}

// skipped says those of skipped not said yet whose vendor, when read, is
// vendor (another vendor's are no device of the resource).
func (s *sayOnce) skipped(skipped []*Unreadable, vendor string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := make(map[string]bool, len(skipped))
	for _, u := range skipped {
		if u.Vendor != "" && u.Vendor != vendor {
			continue
		}
		now[u.Name] = true
		if !s.said[u.Name] {
			s.log.WithField(s.bus, u.Name).WithError(u.Err).Warn("skipping a device that cannot be read; the others are found")
		}
	}
	s.said = now
}

// readFunction reads the identity of the function at p (its
// bus/pci/devices link): IDs, class, driver, IOMMU group, NUMA node.
func readFunction(p, addr string) (PCIFunction, error) {
	f := PCIFunction{Address: addr, NUMANode: device.NoNUMA}
	var err error
	if f.Vendor, err = hexAttr(p, "vendor", 4); err != nil {
		return f, err
	}
	if f.Device, err = hexAttr(p, "device", 4); err != nil {
		return f, err
	}
	if f.Class, err = hexAttr(p, "class", 6); err != nil {
		return f, err
	}
	f.Driver = linkBase(filepath.Join(p, "driver"))
	f.IOMMUGroup = linkBase(filepath.Join(p, "iommu_group"))
	f.NUMANode = numaAttr(filepath.Join(p, "numa_node"))
	return f, nil
}

// readNodes finds the nodes of the function at p (see the package doc).
func (f *PCIFunction) readNodes(p, procRoot string) error {
	switch f.Driver {
	case "vfio-pci":
		if f.IOMMUGroup != "" {
			if n, ok := vfioNode(f.IOMMUGroup); ok {
				f.Nodes = append(f.Nodes, n, vfioContainer)
			}
		}
	case "nvidia":
		n, err := nvidiaNode(procRoot, f.Address)
		if err != nil {
			return err
		}
		if n != nil {
			f.Nodes = append(f.Nodes, *n)
		}
	}
	root, err := filepath.EvalSymlinks(p)
	if err != nil {
		return fmt.Errorf("sysfs: %w", err)
	}
	sub, err := ownNodes(root, func(_, bus string) bool { return pciParts[bus] })
	if err != nil {
		return err
	}
	f.Nodes = append(f.Nodes, sub...)
	return nil
}

// pciParts are the buses on which the kernel puts parts of one PCI
// function, not devices of their own: the auxiliary bus, on which a
// driver splits its function among drivers (mlx5, ice, sof), and
// serial-base, which holds the serial ports of a serial card (Linux 6.5
// and later: <function>/<function>:0/<function>:0.0/tty/ttyS4).
var pciParts = map[string]bool{"auxiliary": true, "serial-base": true}

// hexAttr reads a 0x-prefixed hexadecimal attribute of n digits.
func hexAttr(dir, name string, n int) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", fmt.Errorf("sysfs: %w", err)
	}
	v := strings.TrimPrefix(strings.ToLower(strings.TrimSpace(string(b))), "0x")
	if len(v) != n {
		return "", fmt.Errorf("sysfs: %s: %q is not %d hexadecimal digits", filepath.Join(dir, name), strings.TrimSpace(string(b)), n)
	}
	if _, err := strconv.ParseUint(v, 16, 32); err != nil {
		return "", fmt.Errorf("sysfs: %s: %q is not %d hexadecimal digits", filepath.Join(dir, name), strings.TrimSpace(string(b)), n)
	}
	return v, nil
}

// linkBase is the last element of the link at p ("" when there is none).
func linkBase(p string) string {
	t, err := os.Readlink(p)
	if err != nil {
		return ""
	}
	return filepath.Base(t)
}

// numaAttr reads a numa_node file; -1, a missing or unreadable file: none.
func numaAttr(p string) int {
	b, err := os.ReadFile(p)
	if err != nil {
		return device.NoNUMA
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return device.NoNUMA
	}
	return n
}

// vfioNode is the node of IOMMU group g; numbers are read from the node
// itself by the device source, so they are left zero here.
func vfioNode(g string) (device.Node, bool) {
	if _, err := strconv.Atoi(g); err != nil {
		return device.Node{}, false
	}
	return device.Node{HostPath: "vfio/" + g, Type: device.Char}, true
}

// vfioContainer is /dev/vfio/vfio, the VFIO container every vfio-pci
// function needs beside its group's node (numbers read from the node).
var vfioContainer = device.Node{HostPath: "vfio/vfio", Type: device.Char}

// nvidiaMajor is the NVIDIA driver's character major (/proc/devices).
const nvidiaMajor = 195

// nvidiaNode reads the Device Minor of the GPU at addr from the NVIDIA
// driver's procfs; none when the driver reports no such GPU.
func nvidiaNode(procRoot, addr string) (*device.Node, error) {
	p := filepath.Join(procRoot, "driver", "nvidia", "gpus", addr, "information")
	file, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("procfs: %w", err)
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "Device Minor" {
			continue
		}
		m, err := strconv.ParseUint(strings.TrimSpace(v), 10, 20)
		if err != nil {
			return nil, fmt.Errorf("procfs: %s: Device Minor %q: %w", p, strings.TrimSpace(v), err)
		}
		return &device.Node{HostPath: "nvidia" + strconv.FormatUint(m, 10), Type: device.Char, Major: nvidiaMajor, Minor: uint32(m)}, nil
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("procfs: %s: %w", p, err)
	}
	return nil, fmt.Errorf("procfs: %s: no Device Minor line", p)
}

// ownNodes are the device nodes the kernel registers for the device at
// the real directory root: every "dev" file of its subtree (no link
// followed), named by the DEVNAME of the uevent beside it, but none of a
// child device of a bus (a directory whose subsystem link points to
// <sys>/bus/<bus>) unless part(dir, bus) says it is part of the device:
// another device's nodes are its own.
func ownNodes(root string, part func(dir, bus string) bool) ([]device.Node, error) {
	var out []device.Node
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a file that went away meanwhile
		}
		if d.IsDir() && path != root {
			if bus := busOf(path); bus != "" && !part(path, bus) {
				return filepath.SkipDir
			}
		}
		if d.Type()&fs.ModeSymlink != 0 || d.Name() != "dev" || d.IsDir() {
			return nil
		}
		dir := filepath.Dir(path)
		if dir == root {
			return nil // the device's own dev, if any, is not walked for
		}
		n, ok := nodeOf(dir)
		if ok {
			out = append(out, n)
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].HostPath < out[j].HostPath })
	return out, err
}

// busOf is the bus of the device directory dir, the last element of its
// subsystem link when that points into <sys>/bus ("../../../bus/pci":
// pci); "" for a class device (subsystem <sys>/class/<class>) or a
// directory that is no device.
func busOf(dir string) string {
	t, err := os.Readlink(filepath.Join(dir, "subsystem"))
	if err != nil || filepath.Base(filepath.Dir(t)) != "bus" {
		return ""
	}
	return filepath.Base(t)
}

// nodeOf reads the node a sysfs device directory registers: major:minor
// from dev, the name from DEVNAME in uevent, block when its subsystem is.
func nodeOf(dir string) (device.Node, bool) {
	major, minor, ok := devNumbers(dir)
	if !ok {
		return device.Node{}, false
	}
	name := ueventValue(filepath.Join(dir, "uevent"), "DEVNAME")
	if name == "" || strings.HasPrefix(name, "/") || strings.Contains(name, "..") {
		return device.Node{}, false
	}
	t := device.Char
	if linkBase(filepath.Join(dir, "subsystem")) == "block" {
		t = device.Block
	}
	return device.Node{HostPath: name, Type: t, Major: major, Minor: minor}, true
}

// devNumbers reads the major:minor of the node a sysfs device directory
// registers (its dev file).
func devNumbers(dir string) (uint32, uint32, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "dev"))
	if err != nil {
		return 0, 0, false
	}
	majs, mins, ok := strings.Cut(strings.TrimSpace(string(b)), ":")
	major, err1 := strconv.ParseUint(majs, 10, 12)
	minor, err2 := strconv.ParseUint(mins, 10, 20)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return uint32(major), uint32(minor), true
}

// ueventValue is KEY's value in a uevent file ("" when absent).
func ueventValue(p, key string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// NUMAOfNode is the NUMA node of the device behind a node's numbers:
// <sysRoot>/dev/{char,block}/<major>:<minor>/device, then its parents,
// until one has a numa_node; device.NoNUMA when none says.
func NUMAOfNode(sysRoot string, t device.NodeType, major, minor uint32) int {
	kind := "char"
	if t == device.Block {
		kind = "block"
	}
	p, err := filepath.EvalSymlinks(filepath.Join(sysRoot, "dev", kind, fmt.Sprintf("%d:%d", major, minor)))
	if err != nil {
		return device.NoNUMA
	}
	return numaUp(sysRoot, p)
}

// DiskOf tells a partition from its disk (device.Options.DiskOf): for the
// block node major:minor, the numbers of the disk it is a partition of.
// The kernel gives a partition a partition file in its sysfs directory
// (<sysRoot>/dev/block/<major>:<minor>), which is in its disk's
// (block/sdb/sdb1, nvme0n1/nvme0n1p1). A whole disk, and a node sysfs does
// not know, is no partition.
func DiskOf(sysRoot string, major, minor uint32) (uint32, uint32, bool) {
	dir, err := filepath.EvalSymlinks(filepath.Join(sysRoot, "dev", "block", fmt.Sprintf("%d:%d", major, minor)))
	if err != nil {
		return 0, 0, false
	}
	if _, err := os.Stat(filepath.Join(dir, "partition")); err != nil {
		return 0, 0, false
	}
	return devNumbers(filepath.Dir(dir))
}

// Discover returns the discovery of a resource whose devices are the PCI
// functions sel picks (device.Options.Discover): each function is a
// device keyed by its address, its first node its own, the others extra.
// A function with no node is skipped (nothing to give a container); one
// sel does not pick is read no further than its identity (its nodes are
// not looked for). A function that cannot be read is skipped with a warning on log (nil:
// none) that names it, said once while it stays so.
func Discover(sysRoot, procRoot string, sel PCISelector, log *logrus.Entry) func() ([]device.Found, error) {
	say := newSayOnce(log, "pci")
	return func() ([]device.Found, error) {
		fns, skipped, err := pciFunctions(sysRoot, procRoot, sel.Match)
		if err != nil {
			return nil, err
		}
		say.skipped(skipped, sel.Vendor)
		var out []device.Found
		for _, f := range fns {
			if len(f.Nodes) == 0 {
				continue
			}
			out = append(out, device.Found{
				Key: f.Address, Node: f.Nodes[0], Extra: f.Nodes[1:], NUMANode: f.NUMANode,
				Identity: device.Identity{PCIAddress: f.Address, PCIVendor: f.Vendor, PCIDevice: f.Device, PCIClass: f.Class, PCIDriver: f.Driver, IOMMUGroup: f.IOMMUGroup},
			})
		}
		return out, nil
	}
}
