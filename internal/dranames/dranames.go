// Package dranames holds the names the DRA driver gives what it publishes
// that the device plugin must recognise too (the devices of the driver's
// claims, in the kubelet's PodResources): the default driver name, the
// pools and the devices' names in the ResourceSlices. It imports no Kubernetes library,
// so the device plugin's binary links none of the DRA driver's.
package dranames

import (
	"strconv"
	"strings"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
)

// MaxLabel is the longest DNS label (a ResourceSlice device name).
const MaxLabel = 63

// DefaultDriverName is the driver name when none is given: <class>.<domain>
// of the first resource without replicas above 1 (sim.example.com for
// example.com/sim), else of the first resource; "" without resources.
// Earlier versions published no resource with replicas and named the
// driver after the first they published: the rule is kept so that an
// upgrade does not rename the driver (the kubelet unprepares a claim
// through the name that prepared it).
func DefaultDriverName(cfg *config.Config) string {
	if len(cfg.Resources) == 0 {
		return ""
	}
	r := &cfg.Resources[0]
	for i := range cfg.Resources {
		if cfg.Resources[i].ReplicaCount() <= 1 {
			r = &cfg.Resources[i]
			break
		}
	}
	return r.Class + "." + r.Domain
}

// DeviceName is the name of a device in the ResourceSlice: its resource's
// ID prefix and its index (sim-0), made a DNS label: lowercase, every
// other character than a letter, digit or '-' written as '-', the prefix
// cut so that the name fits 63 characters.
func DeviceName(idPrefix string, index int) string {
	suffix := "-" + strconv.Itoa(index)
	prefix := NamePrefix(idPrefix)
	if n := MaxLabel - len(suffix); len(prefix) > n {
		prefix = strings.TrimRight(prefix[:n], "-")
	}
	return prefix + suffix
}

// PoolName is the pool of a resource's devices on a node: the node name
// and the resource's ID prefix as a DNS label (n1/sim). Each resource has
// a pool of its own, so that a change to one resource's devices rewrites
// only its own ResourceSlices; the device names are unique across the
// pools all the same. A pool name is a path of DNS subdomains.
func PoolName(node, idPrefix string) string { return node + "/" + NamePrefix(idPrefix) }

// NamePrefix is idPrefix as the start of a DNS label.
func NamePrefix(idPrefix string) string {
	b := make([]byte, 0, len(idPrefix))
	for _, r := range strings.ToLower(idPrefix) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b = append(b, byte(r))
		default:
			b = append(b, '-')
		}
	}
	if p := strings.Trim(string(b), "-"); p != "" {
		return p
	}
	return "device"
}
