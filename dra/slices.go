package dra

import (
	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// MaxDevicesPerSlice bounds the devices of one ResourceSlice: the limit
// for slices whose devices may carry taints. The driver taints devices
// (unhealthy, handover) at any time, so every slice keeps to it, and a
// taint never moves devices from one slice to another.
const MaxDevicesPerSlice = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures

// Published is one resource's devices as the driver publishes them.
type Published struct {
	// Resource is the extended resource name, Kind the CDI kind of its
	// devices, IDPrefix what their names in the slice start with.
	Resource string
	Kind     cdi.Kind
	IDPrefix string
	// Snapshot holds what the spec on disk describes (resource.Follower): a device
	// the spec does not describe yet is left out.
	Snapshot *device.Snapshot
	// Handover: the device plugin may still serve the resource on the
	// node; every device carries the handover taint.
	Handover bool
	// FirmwareSHA256 is the digest of the image the resource's reprogram
	// step loads ("" without one).
	FirmwareSHA256 string
	// Shares is the resource's replicas: above 1, each device is
	// published once, allocatable to several claims at once, with the
	// consumable capacity <driver>/shares of this many (Capacity).
	Shares int
	// PrepareBeforeBind: each device carries the binding condition
	// <driver>/prepared and the binding failure condition
	// <driver>/prepareFailed (Resource.PrepareBeforeBind).
	PrepareBeforeBind bool
}

// Pools are the pools of the devices of res on node: one per resource,
// named PoolName(node, its ID prefix), with its slices (Slices). A
// resource's pool is the unit the ResourceSlice controller rewrites: all
// slices of a pool share its generation and slice count, and a change
// that touches more than one slice of a pool, or adds or removes one,
// rewrites every slice of it. With a pool per resource, a change to one
// resource's devices leaves every other resource's slices as they are.
func Pools(driver, node string, res []Published) map[string]resourceslice.Pool {
	out := make(map[string]resourceslice.Pool, len(res))
	for _, p := range res {
		out[PoolName(node, p.IDPrefix)] = resourceslice.Pool{Slices: Slices(driver, p)}
	}
	return out
}

// Slices are the ResourceSlices of the devices of resource p, by index,
// at most MaxDevicesPerSlice each; at least one, so that a resource
// without devices (or none published yet) still shows its pool.
func Slices(driver string, p Published) []resourceslice.Slice {
	var devs []resourceapi.Device
	if p.Snapshot != nil {
		for _, d := range p.Snapshot.Devices {
			if d.Problem.Cause == device.CauseNotInSpec {
				continue // its CDI name would not resolve
			}
			devs = append(devs, Device(driver, p, d))
		}
	}
	var out []resourceslice.Slice
	for len(devs) > 0 {
		n := min(len(devs), MaxDevicesPerSlice)
		out = append(out, resourceslice.Slice{Devices: devs[:n:n]})
		devs = devs[n:]
	}
	if len(out) == 0 {
		out = append(out, resourceslice.Slice{})
	}
	return out
}

// Device is device d of resource p as the slice lists it: named by index,
// with its attributes and taints.
func Device(driver string, p Published, d device.Device) resourceapi.Device {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	q := func(name string) resourceapi.QualifiedName { return resourceapi.QualifiedName(driver + "/" + name) }
	str := func(name, v string) {
		// A longer value makes the apiserver refuse the whole slice.
		if v != "" && len(v) <= resourceapi.DeviceAttributeMaxValueLength {
			attrs[q(name)] = resourceapi.DeviceAttribute{StringValue: &v}
		}
	}
	num := func(name string, v int) {
		n := int64(v)
		attrs[q(name)] = resourceapi.DeviceAttribute{IntValue: &n}
	}
	str(AttrResource, p.Resource)
	num(AttrIndex, d.Index)
	if id, err := p.Kind.QualifiedName(d.Name); err == nil {
		str(AttrID, id)
	}
	if d.NUMANode != device.NoNUMA {
		num(AttrNUMANode, d.NUMANode)
		n := int64(d.NUMANode)
		attrs[deviceattribute.StandardDeviceAttributeNUMANode] = resourceapi.DeviceAttribute{IntValue: &n}
	}
	str(AttrFirmwareSHA256, p.FirmwareSHA256)
	id := d.Identity
	str(AttrPCIAddress, id.PCIAddress)
	if a := id.PCIAddress; a != "" {
		attrs[deviceattribute.StandardDeviceAttributePCIBusID] = resourceapi.DeviceAttribute{StringValue: &a}
	}
	str(AttrPCIVendor, id.PCIVendor)
	str(AttrPCIDevice, id.PCIDevice)
	str(AttrPCIClass, id.PCIClass)
	str(AttrPCIDriver, id.PCIDriver)
	if id.USBBus > 0 {
		num(AttrUSBBus, id.USBBus)
		num(AttrUSBDevice, id.USBDevice)
	}
	str(AttrUSBVendor, id.USBVendor)
	str(AttrUSBProduct, id.USBProduct)
	str(AttrUSBSerial, id.USBSerial)
	out := resourceapi.Device{Name: DeviceName(p.IDPrefix, d.Index), Attributes: attrs}
	if !d.Healthy {
		// NoExecute only when the problem asks for eviction (an injected
		// lost fault with noExecute): the eviction controller then evicts
		// the pods whose claims have the device.
		effect := resourceapi.DeviceTaintEffectNoSchedule
		if d.Problem.Evict {
			effect = resourceapi.DeviceTaintEffectNoExecute
		}
		out.Taints = append(out.Taints, resourceapi.DeviceTaint{Key: driver + "/" + TaintUnhealthy, Value: d.Problem.Cause.String(), Effect: effect})
	}
	if p.Handover {
		out.Taints = append(out.Taints, resourceapi.DeviceTaint{Key: driver + "/" + TaintHandover, Effect: resourceapi.DeviceTaintEffectNoSchedule})
	}
	if p.PrepareBeforeBind {
		out.BindingConditions = []string{driver + "/" + ConditionPrepared}
		out.BindingFailureConditions = []string{driver + "/" + ConditionPrepareFailed}
	}
	if p.Shares > 1 {
		out.AllowMultipleAllocations = new(bool)
		*out.AllowMultipleAllocations = true
		out.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{SharesCapacity(driver): Capacity(p.Shares)}
	}
	return out
}

// SharesCapacity is the name of the consumable capacity of a device of a
// resource with replicas: <driver>/shares. A claim's request asks for
// more than the default one share with capacity.requests of this name.
func SharesCapacity(driver string) resourceapi.QualifiedName {
	return resourceapi.QualifiedName(driver + "/" + CapacityShares)
}

// Capacity is the shares capacity of a device of a resource with n
// replicas (DRAConsumableCapacity): n shares; a request takes one unless
// it asks for more, from 1 to n in steps of 1. The scheduler allocates the
// device to claims until their shares add up to n, each allocation with a
// share ID of its own.
func Capacity(n int) resourceapi.DeviceCapacity {
	one := apiresource.MustParse("1")
	step := apiresource.MustParse("1")
	most := *apiresource.NewQuantity(int64(n), apiresource.DecimalSI)
	return resourceapi.DeviceCapacity{Value: most, RequestPolicy: &resourceapi.CapacityRequestPolicy{
		Default:    &one,
		ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &one, Max: &most, Step: &step},
	}}
}
