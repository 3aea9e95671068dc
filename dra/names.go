// Package dra is the DRA (Dynamic Resource Allocation) kubelet plugin of
// the configured resources: it publishes their devices in ResourceSlices
// (a pool per resource, <node>/<idPrefix>), prepares the devices of allocated claims with the
// same prestart steps and device state as the device plugin, hands out CDI
// IDs from the same spec file (plus a per-claim spec for claim-level
// variables), checkpoints prepared claims, streams device health to the
// kubelet, and taints devices while the device plugin still serves their
// resource on the node (the handover guard). It builds on
// k8s.io/dynamic-resource-allocation's kubeletplugin and resourceslice.
package dra

import (
	"fmt"
	"math"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/dranames"
)

// Taint keys, below the driver name: <driver>/unhealthy on a device that
// is not healthy, <driver>/handover on every device of a resource that
// the device plugin may still serve on the node.
const (
	TaintUnhealthy = "unhealthy"
	TaintHandover  = "handover"
)

// Attribute names, qualified by the driver name as domain
// (<driver>/resource, ...). Identity attributes appear only when known.
const (
	AttrResource       = "resource"       // string: the extended resource name
	AttrIndex          = "index"          // int: the device's index in its resource
	AttrID             = "id"             // string: the qualified CDI device name
	AttrNUMANode       = "numaNode"       // int
	AttrFirmwareSHA256 = "firmwareSHA256" // string: digest of the reprogram image
	AttrPCIAddress     = "pciAddress"
	AttrPCIVendor      = "pciVendor"
	AttrPCIDevice      = "pciDevice"
	AttrPCIClass       = "pciClass"
	AttrPCIDriver      = "pciDriver"
	AttrUSBBus         = "usbBus"    // int
	AttrUSBDevice      = "usbDevice" // int
	AttrUSBVendor      = "usbVendor"
	AttrUSBProduct     = "usbProduct"
	AttrUSBSerial      = "usbSerial"
)

// The binding conditions of the devices of a resource with
// PrepareBeforeBind, below the driver name (<driver>/prepared,
// <driver>/prepareFailed): the scheduler binds a pod once the claim's
// status.devices has the first True for each device, and sends it
// elsewhere when the second turns True.
const (
	ConditionPrepared      = "prepared"
	ConditionPrepareFailed = "prepareFailed"
)

// CapacityShares is the consumable capacity of a device of a resource
// with replicas, below the driver name (<driver>/shares; SharesCapacity):
// the device's replicas, of which a claim takes one unless it asks for
// more.
const CapacityShares = "shares"

// DefaultDriverName is the driver name when none is given: <class>.<domain>
// of the first resource without replicas above 1, else of the first
// (sim.example.com for example.com/sim; dranames.DefaultDriverName).
func DefaultDriverName(cfg *config.Config) string { return dranames.DefaultDriverName(cfg) }

// CheckDriverName checks a driver name: a DNS subdomain of at most 63
// characters (resource.k8s.io's limit; it is also the domain of the
// attribute names). The error is a FieldError naming field.
func CheckDriverName(field, name string) error {
	if len(name) > resourceapi.DriverNameMaxLength {
		return &config.FieldError{Field: field, Value: name, Reason: fmt.Sprintf("must be at most %d characters", resourceapi.DriverNameMaxLength)}
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return &config.FieldError{Field: field, Value: name, Reason: "must be a DNS subdomain (lowercase letters, digits, '-' and '.'): " + strings.Join(errs, "; ")}
	}
	return nil
}

// DeviceName is the name of a device in the ResourceSlice: its resource's
// ID prefix and its index (sim-0), made a DNS label (dranames.DeviceName:
// the device plugin recognises the driver's claims by it too).
func DeviceName(idPrefix string, index int) string { return dranames.DeviceName(idPrefix, index) }

// PoolName is the pool of a resource's devices on node: <node>/<the ID
// prefix as a DNS label> (n1/sim; dranames.PoolName: the device plugin
// recognises the driver's claims by it too).
func PoolName(node, idPrefix string) string { return dranames.PoolName(node, idPrefix) }

// checkPoolName checks that a pool name fits resource.k8s.io's limit.
func checkPoolName(pool string) error {
	if len(pool) > resourceapi.PoolNameMaxLength {
		return fmt.Errorf("the pool name %s is longer than %d characters", pool, resourceapi.PoolNameMaxLength)
	}
	return nil
}

// CheckDeviceNames checks that no two resources (the driver publishes
// them all) give a device one name, comparing the names as the
// slices publish them (DeviceName: the ID prefix made a DNS label, cut to
// fit with the index), at every length of index: ID prefixes that differ
// only in case or punctuation, or only beyond the characters a name
// keeps. The error is a FieldError naming the idPrefix field of the later
// resource, and says both resources and the first name they share. It
// also checks that the node name leaves room for the resources' pool
// names (PoolName; a FieldError naming node-name).
func CheckDeviceNames(cfg *config.Config) error {
	for i := range cfg.Resources {
		ri := &cfg.Resources[i]
		if cfg.NodeName != "" {
			if err := checkPoolName(PoolName(cfg.NodeName, ri.IDPrefix)); err != nil {
				return &config.FieldError{Field: "node-name", Value: cfg.NodeName, Reason: fmt.Sprintf("too long for the pool of %s: %v", ri.Name, err)}
			}
		}
		for j := range i {
			rj := &cfg.Resources[j]
			if name, clash := sameName(rj.IDPrefix, ri.IDPrefix); clash {
				return &config.FieldError{Field: cfg.ResourceField(i, "idPrefix"), Value: ri.IDPrefix,
					Reason: fmt.Sprintf("resources[%d] (%s, idPrefix %q) and resources[%d] (%s) would both publish the device name %q in the ResourceSlice",
						j, rj.Name, rj.IDPrefix, i, ri.Name, name)}
			}
		}
	}
	return nil
}

// firstIndexes holds the smallest index of every length (0, 10, 100, ...
// up to the 19 digits of the largest int64): where a name is cut depends
// on the index's length only.
var firstIndexes = func() []int {
	out := []int{0}
	for n := 10; ; n *= 10 {
		out = append(out, n)
		if n > math.MaxInt64/10 {
			return out
		}
	}
}()

// sameName reports whether ID prefixes a and b give some device one name,
// and the first such name. Names of one index length share a cut, and a
// name ends in -<index>; so two prefixes share a name exactly when they
// do at the smallest index of some length.
func sameName(a, b string) (string, bool) {
	for _, i := range firstIndexes {
		if n := DeviceName(a, i); n == DeviceName(b, i) {
			return n, true
		}
	}
	return "", false
}
