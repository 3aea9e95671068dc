package device

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Node is one device node of a device.
type Node struct {
	// HostPath is the absolute path of the node on the host;
	// ContainerPath where it appears in the container.
	HostPath, ContainerPath string
	Type                    NodeType
	Major, Minor            uint32
}

// Identity is what identifies a device on its bus, as discovery found it
// (empty for simulated devices and host globs). The DRA driver publishes
// it as device attributes; the CDI spec carries it as annotations.
type Identity struct {
	// PCI: the function's address (0000:00:06.0), vendor and device IDs (4
	// hex digits), class (6 hex digits), bound driver and IOMMU group.
	PCIAddress, PCIVendor, PCIDevice, PCIClass, PCIDriver, IOMMUGroup string
	// USB: bus and device numbers, vendor and product IDs, serial.
	USBBus, USBDevice                int
	USBVendor, USBProduct, USBSerial string
	// USBPort is the USB device's port, its topology path ("1-1.2"), what
	// tells apart devices that share vendor, product and serial (the
	// source matches USB devices with those it remembers by it). Not
	// published: it is no attribute or annotation.
	USBPort string
}

// annotated are the string fields of the identity with their annotation
// keys (below a prefix), for Annotations and its inverse.
func (id *Identity) annotated() []struct {
	key   string
	field *string
} {
	return []struct {
		key   string
		field *string
	}{
		{"pci-address", &id.PCIAddress}, {"pci-vendor", &id.PCIVendor}, {"pci-device", &id.PCIDevice},
		{"pci-class", &id.PCIClass}, {"pci-driver", &id.PCIDriver}, {"iommu-group", &id.IOMMUGroup},
		{"usb-vendor", &id.USBVendor}, {"usb-product", &id.USBProduct}, {"usb-serial", &id.USBSerial},
	}
}

// Annotations are the identity as CDI device annotations (keys below
// prefix, only those known).
func (id Identity) Annotations(prefix string) map[string]string {
	a := map[string]string{}
	set := func(k, v string) {
		if v != "" {
			a[prefix+k] = v
		}
	}
	for _, f := range id.annotated() {
		set(f.key, *f.field)
	}
	if id.USBBus > 0 {
		set("usb-bus", strconv.Itoa(id.USBBus))
		set("usb-device", strconv.Itoa(id.USBDevice))
	}
	if len(a) == 0 {
		return nil
	}
	return a
}

// IdentityFromAnnotations is the identity whose Annotations(prefix) are a
// (a spec an earlier run wrote, read back); the port is not among them.
func IdentityFromAnnotations(prefix string, a map[string]string) Identity {
	var id Identity
	for _, f := range id.annotated() {
		*f.field = a[prefix+f.key]
	}
	id.USBBus, _ = strconv.Atoi(a[prefix+"usb-bus"])
	id.USBDevice, _ = strconv.Atoi(a[prefix+"usb-device"])
	return id
}

// USBSerialKey is the key (Found.Key) of a USB device whose serial
// identifies it among the devices there now: its vendor, product and
// serial ("0403:6001:A10K").
func USBSerialKey(id Identity) string { return id.USBVendor + ":" + id.USBProduct + ":" + id.USBSerial }

// USBPortKey is the key (Found.Key) of a USB device known by its port
// ("port:1-1.2").
func USBPortKey(port string) string { return usbPortPrefix + port }

const usbPortPrefix = "port:"

// AllNodes are the device's own node, its other nodes and the shared
// ones, in that order.
func (d *Device) AllNodes() []Node {
	out := make([]Node, 0, 1+len(d.Extra)+len(d.Shared))
	out = append(out, Node{HostPath: d.HostPath, ContainerPath: d.ContainerPath, Type: d.Type, Major: d.Major, Minor: d.Minor})
	out = append(out, d.Extra...)
	return append(out, d.Shared...)
}

// SameDevice reports whether a and b describe the same device (name,
// index, nodes, NUMA, identity), ignoring health.
func SameDevice(a, b Device) bool {
	return a.Name == b.Name && a.Index == b.Index && a.HostPath == b.HostPath && a.ContainerPath == b.ContainerPath &&
		a.Type == b.Type && a.Major == b.Major && a.Minor == b.Minor && a.NUMANode == b.NUMANode &&
		a.Identity == b.Identity && slices.Equal(a.Extra, b.Extra) && slices.Equal(a.Shared, b.Shared)
}

// recordedIdentity is what must stay the same for a device found by its
// identity to be the device it was (the registry keeps it): for PCI the
// vendor and device IDs and the bound driver; for USB the vendor, product
// and serial. Not its key (address, port), the numbers a replug changes
// (USB bus and device), nor the class or IOMMU group.
type recordedIdentity struct {
	PCIVendor  string `json:"pciVendor,omitempty"`
	PCIDevice  string `json:"pciDevice,omitempty"`
	PCIDriver  string `json:"pciDriver,omitempty"`
	USBVendor  string `json:"usbVendor,omitempty"`
	USBProduct string `json:"usbProduct,omitempty"`
	USBSerial  string `json:"usbSerial,omitempty"`
}

func (id Identity) recorded() recordedIdentity {
	return recordedIdentity{PCIVendor: id.PCIVendor, PCIDevice: id.PCIDevice, PCIDriver: id.PCIDriver,
		USBVendor: id.USBVendor, USBProduct: id.USBProduct, USBSerial: id.USBSerial}
}

// set puts r into id.
func (r recordedIdentity) set(id *Identity) {
	id.PCIVendor, id.PCIDevice, id.PCIDriver = r.PCIVendor, r.PCIDevice, r.PCIDriver
	id.USBVendor, id.USBProduct, id.USBSerial = r.USBVendor, r.USBProduct, r.USBSerial
}

// identityChange says how now differs from the identity was of a known
// device, field by field ("driver nvidia, now vfio-pci"); "" when it does
// not, or when nothing was recorded (a glob device; an entry of a registry
// written before identities were kept: the first found is taken).
func identityChange(was, now Identity) string {
	w, n := was.recorded(), now.recorded()
	if w == (recordedIdentity{}) || w == n {
		return ""
	}
	var parts []string
	for _, f := range []struct{ name, was, now string }{
		{"PCI vendor", w.PCIVendor, n.PCIVendor}, {"PCI device", w.PCIDevice, n.PCIDevice}, {"driver", w.PCIDriver, n.PCIDriver},
		{"USB vendor", w.USBVendor, n.USBVendor}, {"product", w.USBProduct, n.USBProduct}, {"serial", w.USBSerial, n.USBSerial},
	} {
		if f.was != f.now {
			parts = append(parts, f.name+" "+orNone(f.was)+", now "+orNone(f.now))
		}
	}
	return strings.Join(parts, "; ")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// IdentityEnv is the variable that tells a container which bus devices of
// resource it got, for the device plugin's Allocate and the DRA driver's
// claims alike: PCI_RESOURCE_<RESOURCE> with their PCI addresses
// (KubeVirt's convention), or USB_RESOURCE_<RESOURCE> with their
// bus:device numbers, comma-separated in the order of the devices; none
// ("") for other devices.
func IdentityEnv(resource string, ids []Identity) (string, string) {
	var pci, usb []string
	for _, id := range ids {
		switch {
		case id.PCIAddress != "":
			pci = append(pci, id.PCIAddress)
		case id.USBBus > 0:
			usb = append(usb, fmt.Sprintf("%03d:%03d", id.USBBus, id.USBDevice))
		}
	}
	switch {
	case len(pci) > 0:
		return "PCI_RESOURCE_" + envName(resource), strings.Join(pci, ",")
	case len(usb) > 0:
		return "USB_RESOURCE_" + envName(resource), strings.Join(usb, ",")
	}
	return "", ""
}

// envName turns a resource name into the end of a variable name:
// example.com/gpu gives EXAMPLE_COM_GPU.
func envName(resource string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z':
			return r - 'a' + 'A'
		case 'A' <= r && r <= 'Z', '0' <= r && r <= '9':
			return r
		}
		return '_'
	}, resource)
}
