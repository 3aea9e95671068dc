package device

import (
	"slices"
	"strconv"
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
	set("pci-address", id.PCIAddress)
	set("pci-vendor", id.PCIVendor)
	set("pci-device", id.PCIDevice)
	set("pci-class", id.PCIClass)
	set("pci-driver", id.PCIDriver)
	set("iommu-group", id.IOMMUGroup)
	if id.USBBus > 0 {
		set("usb-bus", strconv.Itoa(id.USBBus))
		set("usb-device", strconv.Itoa(id.USBDevice))
	}
	set("usb-vendor", id.USBVendor)
	set("usb-product", id.USBProduct)
	set("usb-serial", id.USBSerial)
	if len(a) == 0 {
		return nil
	}
	return a
}

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
