package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Discovery says where a resource's devices come from.
type Discovery string

// DefaultForgetAfter is how long a vanished host device that no container
// holds is kept (Unhealthy) before it is forgotten.
const DefaultForgetAfter = 10 * time.Minute

// Discoveries.
const (
	// DiscoverSimulated: nodes the plugin creates (count).
	DiscoverSimulated Discovery = "simulated"
	// DiscoverGlobs: existing nodes matched by hostDevices.
	DiscoverGlobs Discovery = "globs"
	// DiscoverPCI: PCI functions matched by pci, with their nodes.
	DiscoverPCI Discovery = "pci"
	// DiscoverUSB: USB devices matched by usb, with their nodes.
	DiscoverUSB Discovery = "usb"
)

// DefaultSysRoot and DefaultProcRoot are where sysfs and procfs are read.
const (
	DefaultSysRoot  = "/sys"
	DefaultProcRoot = "/proc"
)

// PCISelector finds PCI functions by identity. Values are hexadecimal, in
// any case, with or without 0x; Load normalises them to lowercase without
// 0x. Vendor is required, the rest optional.
type PCISelector struct {
	// Vendor is the 4-digit vendor ID ("10de").
	Vendor string `json:"vendor"`
	// Device lists 4-digit device IDs (one string or a list); empty: any.
	Device StringList `json:"device,omitempty"`
	// Class is a prefix of the 6-digit class code: 2 (class), 4 (and
	// subclass) or 6 digits (and programming interface).
	Class string `json:"class,omitempty"`
	// Driver is the name of the bound driver ("nvidia", "vfio-pci").
	Driver string `json:"driver,omitempty"`
}

// USBSelector finds USB devices by identity. Vendor is required.
type USBSelector struct {
	Vendor  string `json:"vendor"`
	Product string `json:"product,omitempty"`
	Serial  string `json:"serial,omitempty"`
}

// StringList is a list of strings that YAML may also give as one string.
type StringList []string

// UnmarshalJSON accepts "a" as well as ["a", "b"].
func (l *StringList) UnmarshalJSON(b []byte) error {
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte(`"`)) {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*l = StringList{s}
		return nil
	}
	var ss []string
	if err := json.Unmarshal(b, &ss); err != nil {
		return fmt.Errorf("must be a string or a list of strings, got %s", b)
	}
	*l = ss
	return nil
}

// Discovery says where the resource's devices come from.
func (r *Resource) Discovery() Discovery {
	switch {
	case r.PCI != nil:
		return DiscoverPCI
	case r.USB != nil:
		return DiscoverUSB
	case len(r.HostDevices) > 0:
		return DiscoverGlobs
	}
	return DiscoverSimulated
}

// ContainerPathOf is where node path hostRel (relative to the dev root) of
// device index appears in the container: ContainerPath with the index, or
// the same path below /dev.
func (r *Resource) ContainerPathOf(index int, hostRel string) string {
	if r.ContainerPath == "" {
		return path.Join("/dev", hostRel)
	}
	return strings.ReplaceAll(r.ContainerPath, indexField, strconv.Itoa(index))
}

// indexField is the one field a containerPath may name.
const indexField = "{{.Index}}"

// hex reports whether s (without 0x, lowercase) is n hexadecimal digits.
func isHex(s string, n ...int) bool {
	ok := false
	for _, m := range n {
		ok = ok || len(s) == m
	}
	if !ok {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// normHex lowercases v and removes a 0x prefix.
func normHex(v string) string {
	v = strings.ToLower(strings.TrimSpace(v))
	return strings.TrimPrefix(v, "0x")
}

var driverNameOK = func(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '-' && c != '.' {
			return false
		}
	}
	return true
}

// validateDiscovered checks a pci or usb resource (f names its fields).
func validateDiscovered(f func(string) string, r *Resource) error {
	if r.PCI != nil && r.USB != nil {
		return fieldErr(f("usb"), r.USB.Vendor, "pci and usb exclude each other")
	}
	sel := "pci"
	if r.USB != nil {
		sel = "usb"
	}
	switch {
	case r.Count != nil:
		return fieldErr(f("count"), fmt.Sprint(*r.Count), "count and %s exclude each other", sel)
	case len(r.HostDevices) > 0:
		return fieldErr(f("hostDevices"), strings.Join(r.HostDevices, ","), "hostDevices and %s exclude each other", sel)
	case r.DeviceFilePrefix != "" || r.DeviceNode != (DeviceNode{}):
		return fieldErr(f(sel), sel, "%s excludes deviceFilePrefix and deviceNode", sel)
	case r.NUMANodes != 0:
		return fieldErr(f("numaNodes"), fmt.Sprint(r.NUMANodes), "simulated NUMA nodes apply to simulated devices only (%s devices report their own)", sel)
	}
	if p := r.PCI; p != nil {
		p.Vendor = normHex(p.Vendor)
		if !isHex(p.Vendor, 4) {
			return fieldErr(f("pci.vendor"), p.Vendor, "must be 4 hexadecimal digits, like 10de")
		}
		for j := range p.Device {
			p.Device[j] = normHex(p.Device[j])
			if !isHex(p.Device[j], 4) {
				return fieldErr(fmt.Sprintf("%s[%d]", f("pci.device"), j), p.Device[j], "must be 4 hexadecimal digits, like 2330")
			}
		}
		if p.Class != "" {
			p.Class = normHex(p.Class)
			if !isHex(p.Class, 2, 4, 6) {
				return fieldErr(f("pci.class"), p.Class, "must be 2, 4 or 6 hexadecimal digits (class, subclass, interface), like 0302")
			}
		}
		if p.Driver != "" && !driverNameOK(p.Driver) {
			return fieldErr(f("pci.driver"), p.Driver, "must be a kernel driver name (letters, digits, '_', '-', '.')")
		}
	}
	if u := r.USB; u != nil {
		u.Vendor, u.Product = normHex(u.Vendor), normHex(u.Product)
		if !isHex(u.Vendor, 4) {
			return fieldErr(f("usb.vendor"), u.Vendor, "must be 4 hexadecimal digits, like 0403")
		}
		if u.Product != "" && !isHex(u.Product, 4) {
			return fieldErr(f("usb.product"), u.Product, "must be 4 hexadecimal digits, like 6001")
		}
		if strings.ContainsAny(u.Serial, "\x00\n") {
			return fieldErr(f("usb.serial"), u.Serial, "must be one line")
		}
	}
	return nil
}

// validateNodes checks sharedNodes, containerPath and forgetAfter, the
// fields of resources whose devices are found on the host.
func validateNodes(f func(string) string, r *Resource) error {
	r.SharedRel = make([]string, len(r.SharedNodes))
	for j, n := range r.SharedNodes {
		rel := strings.TrimPrefix(n, "/dev/")
		if err := ValidateRelPath(rel); err != nil {
			return fieldErr(fmt.Sprintf("%s[%d]", f("sharedNodes"), j), n, "must be a path below the dev root (/dev/ optional): %s", err)
		}
		r.SharedRel[j] = rel
	}
	if r.ContainerPath != "" {
		p := strings.ReplaceAll(r.ContainerPath, indexField, "0")
		if strings.Contains(p, "{{") || strings.Contains(p, "}}") {
			return fieldErr(f("containerPath"), r.ContainerPath, "the only field it may name is %s", indexField)
		}
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return fieldErr(f("containerPath"), r.ContainerPath, "must give a clean absolute path, gives %q", p)
		}
	}
	if r.ForgetAfter != nil && (r.ForgetAfter.Duration < time.Second || r.ForgetAfter.Duration > 7*24*time.Hour) {
		return fieldErr(f("forgetAfter"), r.ForgetAfter.String(), "must be between 1s and 168h")
	}
	return nil
}

// ForgetAfterOrDefault is ForgetAfter, or DefaultForgetAfter when unset.
func (r *Resource) ForgetAfterOrDefault() time.Duration {
	if r.ForgetAfter == nil {
		return DefaultForgetAfter
	}
	return r.ForgetAfter.Duration
}
