package cdi

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// ErrLegacyID is returned when the kubelet holds a device ID of an earlier
// version (before host IDs escaped '_' and ':') that cannot be told apart:
// it is now the ID of another device, or several devices had it.
var ErrLegacyID = errors.New("the kubelet holds a device ID of an earlier version that names another device now")

// LegacyAliases decides which IDs of an earlier version (legacy: current
// device name -> its earlier ID, from device.Source.LegacyIDs) the spec
// must keep resolvable, because the kubelet still holds them (held: kubelet
// ID -> the containers holding it, "namespace/pod/container", from the
// PodResources API). The result maps each such old name to the name of the
// device it names, and is for Spec.SetAliases. A held ID that is an ID of
// this version is taken as such; one that no device had is not ours to
// resolve. A held ID that several devices had cannot be resolved to the
// device the container had: ErrLegacyID, naming the ID, the devices, the
// containers and what to do. So is, when earlier is set, a held ID that an
// earlier version gave to a device and that is now another device's ID.
// Set earlier only when a hold may date from an earlier version although
// the ID is one of this version: at the first start of this version for
// the resource, before it advertised anything. Later, such a hold is this
// version's own allocation.
func LegacyAliases(snap *device.Snapshot, legacy map[string]string, held map[string][]string, earlier bool) (map[string]string, error) {
	replicas := max(snap.Replicas, 1)
	current := make(map[string]int, len(snap.Devices)*replicas) // kubelet ID -> device
	byOld := map[string][]int{}                                 // earlier ID -> devices
	for i, d := range snap.Devices {
		for r := 0; r < replicas; r++ {
			current[device.ReplicaID(d.Name, r, snap.Replicas)] = i
		}
		if old, ok := legacy[d.Name]; ok {
			byOld[old] = append(byOld[old], i)
		}
	}
	ids := make([]string, 0, len(held))
	for id := range held {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	aliases := map[string]string{}
	var errs []error
	for _, id := range ids {
		holders := strings.Join(held[id], ", ")
		if i, ok := current[id]; ok {
			if !earlier {
				continue
			}
			name := snap.Devices[i].Name
			for _, j := range byOld[name] {
				if j == i {
					continue
				}
				errs = append(errs, fmt.Errorf("%w: device ID %q (held by %s) was %s (now %q) before host IDs escaped '_' and ':', and is now %s: "+
					"delete the pods that hold it (or drain the node), then start the plugin again",
					ErrLegacyID, id, holders, snap.Devices[j].HostPath, snap.Devices[j].Name, snap.Devices[i].HostPath))
			}
			continue
		}
		base := legacyBase(id, snap.Replicas)
		switch devs := byOld[base]; len(devs) {
		case 0:
		case 1:
			aliases[base] = snap.Devices[devs[0]].Name
		default:
			var was []string
			for _, j := range devs {
				was = append(was, fmt.Sprintf("%s (now %q)", snap.Devices[j].HostPath, snap.Devices[j].Name))
			}
			errs = append(errs, fmt.Errorf("%w: device ID %q (held by %s) was the ID of each of %s before host IDs escaped '_' and ':': "+
				"delete the pods that hold it (or drain the node), then start the plugin again",
				ErrLegacyID, id, holders, strings.Join(was, ", ")))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return aliases, nil
}

// legacyBase is the physical device name of kubelet ID id: without its
// replica suffix ("::<r>") when devices are advertised replicas times.
func legacyBase(id string, replicas int) string {
	if replicas <= 1 {
		return id
	}
	if k := strings.LastIndex(id, "::"); k >= 0 {
		if r, err := strconv.Atoi(id[k+2:]); err == nil && r >= 0 && r < replicas {
			return id[:k]
		}
	}
	return id
}

// SetAliases sets the old names (old name -> current device name, from
// LegacyAliases) that the next Write adds to the spec as devices of their
// own with the edits of the device they name. nil drops them all.
func (s *Spec) SetAliases(aliases map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.aliases = aliases
}

// aliasDevices are the spec's entries for aliases: for each old name whose
// device is in snap, that device's node and variable, and its state
// directory mounted where the old name would have put it (the container's
// checkpointed environment and annotations carry the old ID). Sorted by
// name; an alias whose device is gone is left out. A device that appeared
// with an alias's name is ErrLegacyID: the kubelet holds that name for a
// container that had another device, so the spec keeps the alias and the
// new device stays out of it (unhealthy) until the holders are gone and
// the plugin restarts.
func aliasDevices(r Resource, snap *device.Snapshot, aliases map[string]string) ([]specs.Device, error) {
	if len(aliases) == 0 {
		return nil, nil
	}
	byName := make(map[string]device.Device, len(snap.Devices))
	for _, d := range snap.Devices {
		byName[d.Name] = d
	}
	olds := make([]string, 0, len(aliases))
	for old := range aliases {
		olds = append(olds, old)
	}
	slices.Sort(olds)
	var out []specs.Device
	for _, old := range olds {
		d, ok := byName[aliases[old]]
		if !ok {
			continue // the device is gone
		}
		if other, taken := byName[old]; taken {
			return nil, fmt.Errorf("%w: device %s appeared with ID %q, which the kubelet holds for %s (now %q) from a version before host IDs escaped '_' and ':': "+
				"delete the pods that hold it, then restart the plugin", ErrLegacyID, other.HostPath, old, d.HostPath, d.Name)
		}
		edits := deviceEdits(r, d)
		for _, m := range edits.Mounts {
			m.ContainerPath = path.Join(ContainerStateRoot, old)
			m.HostPath = filepath.Join(r.StateRoot, d.Name)
		}
		out = append(out, specs.Device{Name: old, ContainerEdits: edits})
	}
	return out, nil
}
