package sysfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// USBSelector picks USB devices: Vendor always, the rest when set; IDs
// lowercase hexadecimal (config normalises them).
type USBSelector struct {
	Vendor, Product, Serial string
}

// USBDevice is one USB device as sysfs describes it.
type USBDevice struct {
	// Name is its sysfs name, the port path ("1-1.2").
	Name                    string
	Bus, Dev                int
	Vendor, Product, Serial string
	// NUMANode is the NUMA node of its host controller, or device.NoNUMA.
	NUMANode int
	// Nodes: those registered below its interfaces (ttyUSB*, ttyACM*,
	// hidraw*) first, then its /dev/bus/usb/BBB/DDD node; paths relative
	// to the dev root.
	Nodes []device.Node
}

// Match reports whether d is what s picks.
func (s USBSelector) Match(d USBDevice) bool {
	return d.Vendor == s.Vendor && (s.Product == "" || d.Product == s.Product) && (s.Serial == "" || d.Serial == s.Serial)
}

// USBDevices reads every USB device (not interface) of sysRoot with its
// nodes, by name; a device that cannot be read is skipped and returned in
// skipped (one that went away meanwhile is not). err: the bus cannot be
// listed.
func USBDevices(sysRoot string) (devs []USBDevice, skipped []*Unreadable, err error) {
	return usbDevices(sysRoot, func(USBDevice) bool { return true })
}

// usbDevices is USBDevices of the devices want picks by their identity:
// the nodes of the others are not looked for.
func usbDevices(sysRoot string, want func(USBDevice) bool) (devs []USBDevice, skipped []*Unreadable, err error) {
	dir := filepath.Join(sysRoot, "bus", "usb", "devices")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil // no USB bus
	}
	if err != nil {
		return nil, nil, err
	}
	for _, e := range entries {
		name := e.Name()
		if strings.Contains(name, ":") {
			continue // an interface (1-1:1.0)
		}
		p := filepath.Join(dir, name)
		d, ok, err := readUSB(p, name)
		if err == nil && ok {
			if !want(d) {
				continue
			}
			err = d.readNodes(sysRoot, p)
		}
		if err != nil {
			if !gone(p) {
				skipped = append(skipped, &Unreadable{Name: name, Vendor: d.Vendor, Err: err})
			}
			continue
		}
		if ok {
			devs = append(devs, d)
		}
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].Name < devs[j].Name })
	return devs, skipped, nil
}

// readUSB reads the identity of the device at p; false for an entry that
// is no device (no busnum, as a device that went away meanwhile).
func readUSB(p, name string) (USBDevice, bool, error) {
	d := USBDevice{Name: name, NUMANode: device.NoNUMA}
	bus, err := intAttr(p, "busnum")
	if errors.Is(err, fs.ErrNotExist) {
		return d, false, nil
	}
	if err != nil {
		return d, false, err
	}
	if d.Dev, err = intAttr(p, "devnum"); err != nil {
		return d, false, err
	}
	d.Bus = bus
	if d.Vendor, err = hexAttr(p, "idVendor", 4); err != nil {
		return d, false, err
	}
	if d.Product, err = hexAttr(p, "idProduct", 4); err != nil {
		return d, false, err
	}
	if b, err := os.ReadFile(filepath.Join(p, "serial")); err == nil {
		d.Serial = strings.TrimSpace(string(b))
	}
	return d, true, nil
}

// readNodes finds the NUMA node and the nodes of the device at p: those
// registered below it, its interfaces and what the kernel hangs below
// them (a usb-serial port's tty, a HID device's hidraw, a disk), but not
// those of the USB devices behind it (a hub's), then its own.
func (d *USBDevice) readNodes(sysRoot, p string) error {
	dir, err := filepath.EvalSymlinks(p)
	if err != nil {
		return fmt.Errorf("sysfs: %w", err)
	}
	d.NUMANode = numaUp(sysRoot, dir)
	sub, err := ownNodes(dir, func(child, bus string) bool { return bus != "usb" || usbInterface(child) })
	if err != nil {
		return err
	}
	d.Nodes = sub
	if n, ok := nodeOf(dir); ok {
		d.Nodes = append(d.Nodes, n)
	} else if d.Bus > 0 && d.Dev > 0 {
		d.Nodes = append(d.Nodes, device.Node{HostPath: fmt.Sprintf("bus/usb/%03d/%03d", d.Bus, d.Dev), Type: device.Char})
	}
	return nil
}

// usbInterface reports whether the device at dir, of bus usb, is an
// interface (DEVTYPE usb_interface; without a DEVTYPE, a name with a
// colon, 1-1.2:1.0, as the kernel names interfaces and no device), not a
// USB device.
func usbInterface(dir string) bool {
	if t := ueventValue(filepath.Join(dir, "uevent"), "DEVTYPE"); t != "" {
		return t == "usb_interface"
	}
	return strings.Contains(filepath.Base(dir), ":")
}

// intAttr reads a decimal attribute.
func intAttr(dir, name string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("sysfs: %s: %q is not a number", filepath.Join(dir, name), strings.TrimSpace(string(b)))
	}
	return n, nil
}

// numaUp is the numa_node of dir or the nearest parent below sysRoot that
// has one (a USB device's host controller), device.NoNUMA when none.
func numaUp(sysRoot, dir string) int {
	root, err := filepath.EvalSymlinks(sysRoot)
	if err != nil {
		return device.NoNUMA
	}
	for ; strings.HasPrefix(dir, root+string(filepath.Separator)); dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "numa_node")); err == nil {
			return numaAttr(filepath.Join(dir, "numa_node"))
		}
	}
	return device.NoNUMA
}

// usbKeys are the keys (device.Found.Key) of devs, the devices the
// selector picks now (with nodes or not), by port: device.USBSerialKey, its vendor, product
// and serial ("0403:6001:A10K"), when its serial identifies it among them,
// that is when no other has the same (cheap adapters share serials such as
// 0001) and no device that might have it could not be read (doubt), else
// device.USBPortKey ("port:1-1.2"). They say what the devices there now
// tell; the source, which knows the devices remembered, decides with the
// port (device.Identity.USBPort) which known device each is.
func usbKeys(devs []USBDevice, doubt bool) map[string]string {
	serials := map[string]int{}
	for _, d := range devs {
		serials[usbID(d)]++
	}
	out := make(map[string]string, len(devs))
	for _, d := range devs {
		out[d.Name] = device.USBPortKey(d.Name)
		if d.Serial != "" && serials[usbID(d)] == 1 && !doubt {
			out[d.Name] = usbID(d)
		}
	}
	return out
}

// usbID is the vendor, product and serial of d.
func usbID(d USBDevice) string {
	return device.USBSerialKey(device.Identity{USBVendor: d.Vendor, USBProduct: d.Product, USBSerial: d.Serial})
}

// DiscoverUSB returns the discovery of a resource whose devices are the
// USB devices sel picks (device.Options.Discover), keyed as usbKeys says,
// with their port. A device that cannot be read is skipped with a warning on log (nil:
// none) that names it, said once while it stays so.
func DiscoverUSB(sysRoot string, sel USBSelector, log *logrus.Entry) func() ([]device.Found, error) {
	say := newSayOnce(log, "usb")
	return func() ([]device.Found, error) {
		devs, skipped, err := usbDevices(sysRoot, sel.Match)
		if err != nil {
			return nil, err
		}
		say.skipped(skipped, sel.Vendor)
		// One that could not be read may share a serial.
		doubt := false
		for _, u := range skipped {
			doubt = doubt || u.Vendor == "" || u.Vendor == sel.Vendor
		}
		var picked []USBDevice
		for _, d := range devs {
			if len(d.Nodes) > 0 {
				picked = append(picked, d)
			}
		}
		// Keyed among all it picks: one without nodes yet may share a serial.
		key := usbKeys(devs, doubt)
		out := make([]device.Found, 0, len(picked))
		for _, d := range picked {
			out = append(out, device.Found{
				Key: key[d.Name], Node: d.Nodes[0], Extra: d.Nodes[1:], NUMANode: d.NUMANode,
				Identity: device.Identity{USBBus: d.Bus, USBDevice: d.Dev, USBVendor: d.Vendor, USBProduct: d.Product, USBSerial: d.Serial, USBPort: d.Name},
			})
		}
		return out, nil
	}
}
