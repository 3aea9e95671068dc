package podresources

import (
	"slices"
	"strings"

	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Resources is one List folded: the devices that device-plugin
// containers hold and those that DRA claims hold. It does not change;
// every accessor returns values the caller may keep and change.
type Resources struct {
	devices []Device
	claims  []ClaimDevice
}

// Device is a device that a container holds through a device plugin.
type Device struct {
	Namespace, Pod, Container string
	// Resource is the extended resource name, ID the device ID as
	// advertised to the kubelet (replica IDs included).
	Resource, ID string
}

// Holder is the container holding d, "namespace/pod/container".
func (d Device) Holder() string { return d.Namespace + "/" + d.Pod + "/" + d.Container }

// ClaimDevice is a device that a DRA claim of a container holds, as the
// kubelet's PodResources API lists it.
type ClaimDevice struct {
	// Claim is the claim's namespace/name.
	Claim string
	// Driver, Pool and Device name the device as the driver published it.
	Driver, Pool, Device string
	// CDIDevices are the qualified CDI device names the driver gave for
	// the device.
	CDIDevices []string
}

// fold reads resp in one pass.
func fold(resp *podresourcesapi.ListPodResourcesResponse) *Resources {
	r := &Resources{}
	// A kubelet before 1.31 names no driver, pool or device: the CDI
	// names tell its devices apart.
	type key struct{ claim, driver, pool, device, cdi string }
	seen := map[key]bool{}
	for _, pod := range resp.GetPodResources() {
		for _, c := range pod.GetContainers() {
			for _, d := range c.GetDevices() {
				for _, id := range d.GetDeviceIds() {
					r.devices = append(r.devices, Device{Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: c.GetName(), Resource: d.GetResourceName(), ID: id})
				}
			}
			for _, dr := range c.GetDynamicResources() {
				claim := dr.GetClaimNamespace() + "/" + dr.GetClaimName()
				for _, cr := range dr.GetClaimResources() {
					d := ClaimDevice{Claim: claim, Driver: cr.GetDriverName(), Pool: cr.GetPoolName(), Device: cr.GetDeviceName()}
					for _, n := range cr.GetCdiDevices() {
						d.CDIDevices = append(d.CDIDevices, n.GetName())
					}
					// A claim that several containers share counts once.
					k := key{claim, d.Driver, d.Pool, d.Device, strings.Join(d.CDIDevices, ",")}
					if seen[k] {
						continue
					}
					seen[k] = true
					r.claims = append(r.claims, d)
				}
			}
		}
	}
	return r
}

// Devices are the devices that containers hold through device plugins
// (DRA devices are not among them), in the order List gives them.
func (r *Resources) Devices() []Device { return slices.Clone(r.devices) }

// Held returns the device IDs of resource that containers hold through
// device plugins, in the order List gives them; nil when none.
func (r *Resources) Held(resource string) []string {
	var out []string
	for _, d := range r.devices {
		if d.Resource == resource {
			out = append(out, d.ID)
		}
	}
	return out
}

// HeldByResource returns, by resource name, the device IDs that
// containers hold through device plugins.
func (r *Resources) HeldByResource() map[string][]string {
	out := map[string][]string{}
	for _, d := range r.devices {
		out[d.Resource] = append(out[d.Resource], d.ID)
	}
	return out
}

// Holders returns the device IDs of resource that containers hold
// through device plugins, each with the containers holding it
// ("namespace/pod/container", Device.Holder); empty, not nil, when none.
func (r *Resources) Holders(resource string) map[string][]string {
	out := map[string][]string{}
	for _, d := range r.devices {
		if d.Resource == resource {
			out[d.ID] = append(out[d.ID], d.Holder())
		}
	}
	return out
}

// Claims returns the devices that DRA claims of containers hold, once per
// claim and device (a claim that several containers share counts once;
// for a kubelet before 1.31, which names no driver, pool or device, its
// CDI names tell devices apart), in the order List gives them.
func (r *Resources) Claims() []ClaimDevice {
	out := slices.Clone(r.claims)
	for i := range out {
		out[i].CDIDevices = slices.Clone(out[i].CDIDevices)
	}
	return out
}
