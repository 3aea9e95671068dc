// Package device discovers the devices of one resource: it creates the
// simulated device nodes, finds host device nodes, and turns both into
// immutable snapshots whose health follows the nodes on disk (inotify, internal/inotify).
package device

import (
	"fmt"
	"strconv"
	"strings"
)

// NodeType is the type of a device node, as CDI spells it.
type NodeType string

const (
	// Char is a character device.
	Char NodeType = "c"
	// Block is a block device.
	Block NodeType = "b"
)

// NoNUMA marks a device without NUMA affinity.
const NoNUMA = -1

// Device is one physical device. Snapshots hold values; never mutate a
// Device reachable from a published snapshot.
type Device struct {
	// Name is the physical device ID: the CDI device name and, without
	// replicas, the ID advertised to the kubelet.
	Name string
	// Index numbers the device within the resource: simulated device i has
	// index i; host devices are numbered in order of first sight, and a
	// device keeps its index for as long as the resource knows it.
	Index int
	// HostPath is the absolute path of the node on the host.
	HostPath string
	// ContainerPath is where the node appears in the container.
	ContainerPath string
	Type          NodeType
	Major, Minor  uint32
	// NUMANode is the device's NUMA node, or NoNUMA.
	NUMANode int
	// Extra are the device's other nodes (a GPU's render node, a USB
	// adapter's tty), Shared the nodes every device of the resource
	// shares (/dev/nvidiactl): both go into its CDI entry.
	Extra, Shared []Node
	// Identity is what identifies it on its bus (PCI, USB).
	Identity Identity
	// Healthy is true when the node exists and is what it should be, and
	// nothing else (a failed preparation, the spec) holds it back: when
	// Problem is none. Set both with SetProblem.
	Healthy bool
	// Problem says why the device is unhealthy.
	Problem Problem
}

// Snapshot is an immutable view of a resource's devices.
type Snapshot struct {
	// Devices are ordered by Index.
	Devices []Device
	// Replicas is how many times each device is advertised.
	Replicas int
}

// ID is the ID of a physical device: <prefix>-<node>-<suffix>, or
// <prefix>-<suffix> without a node name.
func ID(prefix, node, suffix string) string {
	if node == "" {
		return prefix + "-" + suffix
	}
	return prefix + "-" + node + "-" + suffix
}

// ReplicaID is the kubelet device ID of replica r of device d. Without
// replicas it is the device name, so IDs stay stable when replicas are
// turned off and on.
func ReplicaID(name string, r, replicas int) string {
	if replicas <= 1 {
		return name
	}
	return name + "::" + strconv.Itoa(r)
}

// HeldBy reports whether ids (kubelet device IDs) name the physical device
// name: the device itself or one of its replicas, <name>::<n>.
func HeldBy(name string, ids []string) bool {
	for _, id := range ids {
		if id == name {
			return true
		}
		n, ok := strings.CutPrefix(id, name+"::")
		if ok && n != "" && strings.Trim(n, "0123456789") == "" {
			return true
		}
	}
	return false
}

// SameDevices reports whether a and b describe the same device set (names,
// paths, numbers, NUMA), ignoring health: a CDI spec only changes then.
func SameDevices(a, b *Snapshot) bool {
	if a == nil || b == nil {
		return a == b
	}
	if len(a.Devices) != len(b.Devices) {
		return false
	}
	for i := range a.Devices {
		if !SameDevice(a.Devices[i], b.Devices[i]) {
			return false
		}
	}
	return true
}

// Equal reports whether a and b are the same including health.
func Equal(a, b *Snapshot) bool {
	if !SameDevices(a, b) || a == nil {
		return a == b
	}
	if a.Replicas != b.Replicas {
		return false
	}
	for i := range a.Devices {
		if a.Devices[i].Healthy != b.Devices[i].Healthy || a.Devices[i].Problem != b.Devices[i].Problem {
			return false
		}
	}
	return true
}

// Healthy counts the healthy devices.
func (s *Snapshot) Healthy() int {
	n := 0
	for _, d := range s.Devices {
		if d.Healthy {
			n++
		}
	}
	return n
}

func (d Device) String() string {
	return fmt.Sprintf("%s(%s %s %d:%d)", d.Name, d.HostPath, d.Type, d.Major, d.Minor)
}
