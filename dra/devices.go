package dra

import (
	"context"
	"slices"
	"sync/atomic"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/resource"
)

// Runner prepares and resets devices (prestart.Runner), and recovers
// failed ones in the background (Run).
type Runner interface {
	Prepare(ctx context.Context, devs []device.Device) error
	Reset(ctx context.Context, devs []device.Device) error
	HasReset() bool
	FirmwareSHA256() (string, error)
	Run(ctx context.Context) error
}

// Resource is one configured resource as the driver serves it: the same
// device source, spec and prestart runner as the device plugin's (see
// resource.Build).
type Resource struct {
	// Name is the extended resource name, Kind the CDI kind of its devices.
	Name string
	Kind cdi.Kind
	// IDPrefix names its devices in the slice (DeviceName).
	IDPrefix string
	// EnvPrefix, when set, gives a claim's containers
	// <EnvPrefix>_DEVICES=<the claim's device IDs of the resource>.
	EnvPrefix string
	// Mounts are given to a claim's containers.
	Mounts []cdi.Mount
	Source resource.DeviceSource
	Spec   resource.SpecFile
	Runner Runner
	// Faults, optional, injects faults as time passes (fault.Injector).
	Faults interface {
		Run(ctx context.Context) error
	}

	// Replicas, above 1, makes each device shareable by that many claims
	// at once (Published.Shares; see shares.go).
	Replicas int
	// PrepareBeforeBind publishes the devices with binding conditions:
	// the driver runs the steps of a claim's devices once it is allocated,
	// before the scheduler binds its pod (prebind.go).
	PrepareBeforeBind bool
}

// running is a Resource running: its follower publishes the snapshots
// that its spec describes to it.
type running struct {
	Resource
	follower *resource.Follower
	// pool is the pool of its devices (PoolName).
	pool string
	// snap is what the spec describes now (resource.Gate).
	snap     atomic.Pointer[device.Snapshot]
	firmware string
	// changed is told, without blocking, of every snapshot.
	changed chan<- struct{}
}

// Update takes a snapshot from the follower (resource.Publisher).
func (r *running) Update(s *device.Snapshot) error {
	r.snap.Store(s)
	select {
	case r.changed <- struct{}{}:
	default:
	}
	return nil
}

// identityEnv is the variable that tells a container which bus devices
// of the resource it got (device.IdentityEnv, as Allocate gives it), for
// the devices ids.
func (r *running) identityEnv(ids []string) (string, string) {
	s := r.snap.Load()
	if s == nil {
		return "", ""
	}
	var idts []device.Identity
	for _, id := range ids {
		if i := slices.IndexFunc(s.Devices, func(x device.Device) bool { return x.Name == id }); i >= 0 {
			idts = append(idts, s.Devices[i].Identity)
		}
	}
	return device.IdentityEnv(r.Name, idts)
}

// published is the resource's devices as they are to be published now;
// handover: its handover guard is up.
func (r *running) published(handover bool) Published {
	return Published{Resource: r.Name, Kind: r.Kind, IDPrefix: r.IDPrefix, Snapshot: r.snap.Load(), Handover: handover,
		FirmwareSHA256: r.firmware, Shares: r.Replicas, PrepareBeforeBind: r.PrepareBeforeBind}
}

// devices are the driver's resources, in the configuration's order: where
// every part of the driver looks a device up. Made once by New; the
// snapshots inside change, the list does not.
type devices struct {
	// node is the node's name: the pool of the driver's versions before a
	// pool per resource.
	node string
	res  []*running
}

// lookup finds the device an allocation names: its pool and its name.
// The pool is its resource's (PoolName); the node's name is taken too,
// the one pool of the driver's versions before a pool per resource, so
// that a claim allocated before an upgrade is still prepared (the device
// names are unique across the resources either way).
func (ds *devices) lookup(pool, name string) (*running, device.Device, bool) {
	for _, r := range ds.res {
		if pool != r.pool && pool != ds.node {
			continue
		}
		s := r.snap.Load()
		if s == nil {
			continue
		}
		for _, dv := range s.Devices {
			if DeviceName(r.IDPrefix, dv.Index) == name {
				return r, dv, true
			}
		}
	}
	return nil, device.Device{}, false
}

// byName is the resource named name.
func (ds *devices) byName(name string) *running {
	for _, r := range ds.res {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// names are the resources' names, in order.
func (ds *devices) names() []string {
	out := make([]string, len(ds.res))
	for i, r := range ds.res {
		out[i] = r.Name
	}
	return out
}

// published is every resource's devices as they are to be published now;
// handover(i) tells whether resource i's handover guard is up.
func (ds *devices) published(handover func(i int) bool) []Published {
	out := make([]Published, len(ds.res))
	for i, r := range ds.res {
		out[i] = r.published(handover(i))
	}
	return out
}
