package device

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
)

// Owners knows which device claims which host node, for every source of a
// process (Options.Owners): a host node that two devices claim, in one
// resource or in two, makes both Unhealthy (CauseSharedNode), so that
// neither is handed out while discovery, or the configuration, gives one
// node to two devices. A node is what it is, not the path that names it:
// claims are keyed by the node's type and numbers (nodeKey), so udev's
// aliases (/dev/serial/by-id/..., /dev/disk/by-id/...) and the kernel's
// name of one node are one node. Make one with NewOwners per process and
// give it to every source; it is safe for concurrent use.
//
// A source claims the nodes of its host devices at every scan (simulated
// devices own the nodes they make and claim none). A device claims its own
// and its other nodes when it is there (not missing, not of another
// identity), except the resource's sharedNodes and the VFIO container,
// which are made to be shared. When the claims of one source change, every
// other source whose conflicts changed is woken (it publishes again), so a
// device is Healthy again as soon as the other device lets its node go. A
// source's claims go when its Run returns, or with Close.
type Owners struct {
	log *logrus.Entry

	mu sync.Mutex
	// claims are the nodes each source's devices claim, in its scan's
	// order.
	claims map[*Source][]nodeClaim
	// conflicts are the shared_node problems of each source's devices,
	// by device name, as the claims give them now.
	conflicts map[*Source]map[string]Problem
	// shared are the nodes claimed by more than one device now, by node,
	// with those devices and the paths they name it by (for the log).
	shared map[nodeKey]sharedLog
}

// sharedLog is what the log says of a node claimed by more than one
// device: the devices and the paths they name it by.
type sharedLog struct{ devices, paths string }

// nodeKey is what a host node is, whatever path names it: its type and
// numbers. A node whose numbers are not known (0:0: a discovered node not
// there now) is its path, so that two such nodes are never one.
type nodeKey struct {
	t            NodeType
	major, minor uint32
	path         string
}

// keyOf is the key of node n (absolute host path).
func keyOf(n Node) nodeKey {
	if n.Major == 0 && n.Minor == 0 {
		return nodeKey{t: n.Type, path: n.HostPath}
	}
	return nodeKey{t: n.Type, major: n.Major, minor: n.Minor}
}

func (k nodeKey) String() string {
	if k.path != "" {
		return k.path
	}
	return fmt.Sprintf("%s %d:%d", k.t, k.major, k.minor)
}

// nodeClaim is a device's claim on a host node: the node, the path
// (absolute) the device names it by, and, for a partition, its disk
// (Options.DiskOf; zero otherwise).
type nodeClaim struct {
	key, disk    nodeKey
	path, device string
}

// NewOwners returns an empty registry of node owners; log gets a line
// when a node comes to belong to two devices, and when it belongs to one
// again (nil: nothing is logged).
func NewOwners(log *logrus.Entry) *Owners {
	if log == nil {
		log = logs.Discard()
	}
	return &Owners{log: log, claims: map[*Source][]nodeClaim{}, conflicts: map[*Source]map[string]Problem{}, shared: map[nodeKey]sharedLog{}}
}

// vfioContainer is the VFIO container, relative to the dev root: every
// vfio-pci function has it, and it is made to be opened by them all.
const vfioContainer = "vfio/vfio"

// nodeClaims are the claims of snap's devices (their node health, before
// faults): a device that is there claims its own and other nodes but the
// shared ones.
func (s *Source) nodeClaims(snap *Snapshot) []nodeClaim {
	var out []nodeClaim
	for i := range snap.Devices {
		d := &snap.Devices[i]
		if c := d.Problem.Cause; c == CauseMissing || c == CauseIdentityChanged {
			continue
		}
		own := Node{HostPath: d.HostPath, Type: d.Type, Major: d.Major, Minor: d.Minor}
		for _, n := range append([]Node{own}, d.Extra...) {
			if !s.sharedPaths[n.HostPath] {
				out = append(out, nodeClaim{key: keyOf(n), disk: s.diskOf(n), path: n.HostPath, device: d.Name})
			}
		}
	}
	return out
}

// diskOf is the disk of n when it is a partition (Options.DiskOf), else
// the zero key.
func (s *Source) diskOf(n Node) nodeKey {
	if n.Type != Block || s.opts.DiskOf == nil || (n.Major == 0 && n.Minor == 0) {
		return nodeKey{}
	}
	if major, minor, ok := s.opts.DiskOf(n.Major, n.Minor); ok {
		return nodeKey{t: Block, major: major, minor: minor}
	}
	return nodeKey{}
}

// sharedPaths are the absolute paths of the nodes the devices of a source
// with options o and dev root root may share: its sharedNodes and the VFIO
// container.
func sharedPaths(root string, o Options) map[string]bool {
	out := map[string]bool{filepath.Join(root, vfioContainer): true}
	for _, rel := range o.SharedNodes {
		out[filepath.Join(root, rel)] = true
	}
	return out
}

// claim makes claims the claims of s (nil with gone: s has none any more)
// and wakes every other source whose conflicts this changed. It takes no
// lock of a source while holding its own.
func (o *Owners) claim(s *Source, claims []nodeClaim, gone bool) {
	o.mu.Lock()
	prev, had := o.claims[s]
	if gone {
		if !had {
			o.mu.Unlock()
			return
		}
		delete(o.claims, s)
	} else {
		if had && slices.Equal(prev, claims) {
			o.mu.Unlock()
			return
		}
		o.claims[s] = claims
	}
	next := o.compute()
	var wake []*Source
	for src := range o.claims {
		if src != s && !maps.Equal(o.conflicts[src], next[src]) {
			wake = append(wake, src)
		}
	}
	o.conflicts = next
	o.mu.Unlock()
	for _, src := range wake {
		src.conflictsChanged()
	}
}

// owner is a device claiming a node, and the path it names the node by.
type owner struct {
	src          *Source
	device, path string
}

// same reports whether ow and b are one device.
func (ow owner) same(b owner) bool { return ow.src == b.src && ow.device == b.device }

// describe names device ow (of others) to a device claiming its node by
// path: by name, with the path it names it by when another one.
func (ow owner) describe(path string) string {
	if ow.path == path {
		return ow.device
	}
	return ow.device + " as " + ow.path
}

// compute finds the nodes claimed by more than one device, a disk as a
// node of one device and a partition of it as another's, and gives each
// of those devices its problem: the first such node (by its numbers) and
// the other devices claiming it, with the paths they name it by when
// another than its own. It logs the nodes that became shared, and those
// that are no more. o.mu is held.
func (o *Owners) compute() map[*Source]map[string]Problem {
	// byNode are the devices claiming each node; partsOf those claiming a
	// partition of it (a disk), but not the disk itself.
	byNode, partsOf := map[nodeKey][]owner{}, map[nodeKey][]owner{}
	add := func(m map[nodeKey][]owner, k nodeKey, ow owner) {
		if !slices.ContainsFunc(m[k], ow.same) {
			m[k] = append(m[k], ow)
		}
	}
	for src, cs := range o.claims {
		for _, c := range cs {
			add(byNode, c.key, owner{src, c.device, c.path})
			if c.disk != (nodeKey{}) {
				add(partsOf, c.disk, owner{src, c.device, c.path})
			}
		}
	}
	nodes := make([]nodeKey, 0, len(byNode))
	for n, ows := range byNode {
		parts := slices.DeleteFunc(slices.Clone(partsOf[n]), func(p owner) bool { return slices.ContainsFunc(ows, p.same) })
		partsOf[n] = parts
		if len(ows) > 1 || len(parts) > 0 {
			nodes = append(nodes, n)
		}
	}
	slices.SortFunc(nodes, func(a, b nodeKey) int { return strings.Compare(a.sortKey(), b.sortKey()) })
	out := map[*Source]map[string]Problem{}
	give := func(ow owner, p Problem) {
		m := out[ow.src]
		if m == nil {
			m = map[string]Problem{}
			out[ow.src] = m
		}
		if _, first := m[ow.device]; !first { // else an earlier node already says it
			m[ow.device] = p
		}
	}
	byDevice := func(a, b owner) int { return strings.Compare(a.device, b.device) }
	shared := map[nodeKey]sharedLog{}
	for _, n := range nodes {
		ows, parts := byNode[n], partsOf[n]
		slices.SortFunc(ows, byDevice)
		slices.SortFunc(parts, byDevice)
		all := append(slices.Clone(ows), parts...)
		names, paths := make([]string, len(all)), []string{}
		for i, ow := range all {
			names[i] = ow.device
			if !slices.Contains(paths, ow.path) {
				paths = append(paths, ow.path)
			}
		}
		slices.Sort(paths)
		shared[n] = sharedLog{devices: strings.Join(names, ", "), paths: strings.Join(paths, ", ")}
		for _, ow := range ows {
			var others []string
			for _, other := range ows {
				if other != ow {
					others = append(others, other.describe(ow.path))
				}
			}
			for _, p := range parts {
				others = append(others, p.device+" as "+p.path+", a partition of it")
			}
			give(ow, Problemf(CauseSharedNode, "%s (%s) is also a node of %s", ow.path, n, strings.Join(others, ", ")))
		}
		for _, p := range parts {
			var disk []string
			for _, ow := range ows {
				disk = append(disk, ow.describe(""))
			}
			give(p, Problemf(CauseSharedNode, "%s is a partition of %s, a node of %s: whoever has the disk can write it", p.path, n, strings.Join(disk, ", ")))
		}
	}
	for _, n := range nodes {
		if o.shared[n] != shared[n] {
			o.log.WithField("node", n.String()).WithField("paths", shared[n].paths).WithField("devices", shared[n].devices).
				Warn("a host node belongs to more than one device; none of them is handed out (shared_node) until it belongs to one")
		}
	}
	for n, was := range o.shared {
		if _, still := shared[n]; !still {
			o.log.WithField("node", n.String()).WithField("paths", was.paths).WithField("devices", was.devices).Info("the host node belongs to one device again")
		}
	}
	o.shared = shared
	return out
}

// sortKey orders nodes: by type, then numbers, then path.
func (k nodeKey) sortKey() string {
	return fmt.Sprintf("%s %010d:%010d %s", k.t, k.major, k.minor, k.path)
}

// conflictsOf are the shared_node problems of the devices of s now, by
// device name.
func (o *Owners) conflictsOf(s *Source) map[string]Problem {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.conflicts[s]
}

// withConflicts returns snap with the shared_node problems the owners give
// now: a conflicted device that is otherwise healthy gets its problem, one
// that has it and is no longer conflicted is healthy again (shared_node is
// only ever given to a device otherwise healthy). snap itself is not
// changed; it is returned when nothing changes. s.mu is held.
func (s *Source) withConflicts(snap *Snapshot) *Snapshot {
	if s.disc == nil || snap == nil {
		return snap
	}
	c := s.owners.conflictsOf(s)
	var out *Snapshot
	for i, d := range snap.Devices {
		p, conflicted := c[d.Name]
		switch {
		case conflicted && (d.Healthy || d.Problem.Cause == CauseSharedNode) && d.Problem != p:
		case !conflicted && d.Problem.Cause == CauseSharedNode:
			p = Problem{}
		default:
			continue
		}
		if out == nil {
			out = &Snapshot{Replicas: snap.Replicas, Devices: slices.Clone(snap.Devices)}
		}
		out.Devices[i].SetProblem(p)
	}
	if out == nil {
		return snap
	}
	return out
}

// conflictsChanged is called by the owners when the conflicts of s
// changed through another source's claims: before Run, the current
// snapshot is brought up to date at once (what is published first says
// it); Run publishes again.
func (s *Source) conflictsChanged() {
	s.mu.Lock()
	var prev, next *Snapshot
	if !s.running && s.current != nil {
		if next = s.withConflicts(s.current); next != s.current {
			prev, s.current, s.resend = s.current, next, true
		}
	}
	s.mu.Unlock()
	if prev != nil {
		for i := range next.Devices {
			s.logHealth(prev, next, i)
		}
	}
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// Close drops the source's claims on host nodes (Options.Owners), so that
// the devices of other sources sharing its nodes may be Healthy again. Run
// does it when it returns; call it for a prepared source that will not
// run. Idempotent.
func (s *Source) Close() {
	if s.disc != nil {
		s.owners.claim(s, nil, true)
	}
}
