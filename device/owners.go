package device

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
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
// name of one node are one node, and a partition is a node of its disk.
// A node the devices of a resource share (sharedNodes), or one a
// simulated resource makes, is no device's own: a host device claiming
// it is Unhealthy (CauseSharedNode), and the devices sharing it, or the
// simulated device, are not. Make one with NewOwners per process and
// give it to every source; it is safe for concurrent use.
//
// A source says at every scan what it has of the host's nodes (a stake):
// the nodes its host devices claim, the shared nodes there now, or, for
// simulated devices, the nodes it makes. A device claims its own and its
// other nodes when it is there (not missing, not of another identity),
// except its other nodes that are the resource's sharedNodes and the VFIO
// container, which are made to be shared. When the stake of one source
// changes, every other source whose conflicts changed is woken (it
// publishes again), so a device is Healthy again as soon as the other
// device lets its node go. A source's stake goes when its Run returns, or
// with Close.
type Owners struct {
	log *logrus.Entry

	mu sync.Mutex
	// stakes are what each source has of the host's nodes now.
	stakes map[*Source]stake
	// conflicts are the shared_node problems of each source's devices,
	// by device name, as the stakes give them now.
	conflicts map[*Source]map[string]Problem
	// shared are the nodes claimed by more than one device now, by node,
	// with those devices and the paths they name it by; unowned the shared
	// and simulated devices' nodes that a device claims (for the log).
	shared, unowned map[nodeKey]sharedLog
}

// stake is what a source has of the host's nodes: the nodes its devices
// claim, the nodes they share (its sharedNodes there now), the nodes it
// makes (simulated devices).
type stake struct {
	claims []nodeClaim
	shares []nodeKey
	made   []madeNode
}

func (a stake) equal(b stake) bool {
	return slices.Equal(a.claims, b.claims) && slices.Equal(a.shares, b.shares) && slices.Equal(a.made, b.made)
}

// madeNode is the node of a simulated device: its path (absolute) and
// the device.
type madeNode struct{ path, device string }

// sharedLog is what the log says of a node with more than one owner: the
// devices claiming it and the paths they name it by, and who else has it
// (a resource sharing it, the simulated device that has it).
type sharedLog struct{ devices, paths, with string }

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
// (absolute) the device names it by and the file it resolves to, and, for
// a partition, its disk (Options.DiskOf; zero otherwise).
type nodeClaim struct {
	key, disk          nodeKey
	path, real, device string
}

// NewOwners returns an empty registry of node owners; log gets a line
// when a node comes to belong to two devices, and when it belongs to one
// again (nil: nothing is logged).
func NewOwners(log *logrus.Entry) *Owners {
	if log == nil {
		log = logs.Discard()
	}
	return &Owners{log: log, stakes: map[*Source]stake{}, conflicts: map[*Source]map[string]Problem{},
		shared: map[nodeKey]sharedLog{}, unowned: map[nodeKey]sharedLog{}}
}

// vfioContainer is the VFIO container, relative to the dev root: every
// vfio-pci function has it, and it is made to be opened by them all.
const vfioContainer = "vfio/vfio"

// stake is what the source has of the host's nodes with snap, its scan:
// the nodes its host devices claim and the shared nodes there now, or
// the nodes it makes (simulated).
func (s *Source) stake(snap *Snapshot) stake {
	if s.disc == nil {
		return stake{made: s.made}
	}
	var shares []nodeKey
	for _, n := range s.sharedNodes() {
		if k := keyOf(n); !slices.Contains(shares, k) {
			shares = append(shares, k)
		}
	}
	return stake{claims: s.nodeClaims(snap, shares), shares: shares}
}

// nodeClaims are the claims of snap's devices (their node health, before
// faults): a device that is there claims its own and other nodes, but its
// other nodes that are shared (its sharedNodes, by path or, when they are
// there now, shares, by node; the VFIO container).
func (s *Source) nodeClaims(snap *Snapshot, shares []nodeKey) []nodeClaim {
	var out []nodeClaim
	for i := range snap.Devices {
		d := &snap.Devices[i]
		if c := d.Problem.Cause; c == CauseMissing || c == CauseIdentityChanged {
			continue
		}
		own := Node{HostPath: d.HostPath, Type: d.Type, Major: d.Major, Minor: d.Minor}
		for j, n := range append([]Node{own}, d.Extra...) {
			k := keyOf(n)
			if n.HostPath == filepath.Join(s.root, vfioContainer) || (j > 0 && (s.sharedPaths[n.HostPath] || slices.Contains(shares, k))) {
				continue
			}
			file, err := filepath.EvalSymlinks(n.HostPath)
			if err != nil {
				file = n.HostPath
			}
			out = append(out, nodeClaim{key: k, disk: s.diskOf(n), path: n.HostPath, real: file, device: d.Name})
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

// madeNodes are the nodes the simulated devices of a source with options
// o and dev root root make.
func madeNodes(root string, o Options, name func(string) string) []madeNode {
	if len(o.HostGlobs) > 0 || o.Discover != nil {
		return nil
	}
	out := make([]madeNode, o.Count)
	for i := range out {
		out[i] = madeNode{path: filepath.Join(root, o.FilePrefix+"-"+strconv.Itoa(i)), device: name(strconv.Itoa(i))}
	}
	return out
}

// set makes st the stake of s (gone: s has none any more) and wakes every
// other source whose conflicts this changed. It takes no lock of a source
// while holding its own.
func (o *Owners) set(s *Source, st stake, gone bool) {
	o.mu.Lock()
	prev, had := o.stakes[s]
	if gone {
		if !had {
			o.mu.Unlock()
			return
		}
		delete(o.stakes, s)
	} else {
		if had && prev.equal(st) {
			o.mu.Unlock()
			return
		}
		o.stakes[s] = st
	}
	next := o.compute()
	var wake []*Source
	for src := range o.stakes {
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

// problems are the shared_node problems of the devices of each source,
// by device name: the first a device gets is its own.
type problems map[*Source]map[string]Problem

func (ps problems) give(ow owner, p Problem) {
	m := ps[ow.src]
	if m == nil {
		m = map[string]Problem{}
		ps[ow.src] = m
	}
	if _, first := m[ow.device]; !first {
		m[ow.device] = p
	}
}

// compute gives each device with a node of another device its problem
// (claimed), then each device with a node no device may claim
// (unclaimable), and logs the nodes that came to have more than one
// owner, and those that have one again. o.mu is held.
func (o *Owners) compute() map[*Source]map[string]Problem {
	out := problems{}
	shared := o.claimed(out)
	unowned := o.unclaimable(out)
	for _, c := range []struct {
		was, now    map[nodeKey]sharedLog
		came, ended string
	}{
		{o.shared, shared, "a host node belongs to more than one device; none of them is handed out (shared_node) until it belongs to one",
			"the host node belongs to one device again"},
		{o.unowned, unowned, "a host node that no device may have as its own (a shared node, or a simulated device's node) is a device's; that device is not handed out (shared_node)",
			"the shared or simulated device's node is no other device's any more"},
	} {
		for n, l := range c.now {
			if c.was[n] != l {
				o.log.WithField("node", n.String()).WithField("paths", l.paths).WithField("devices", l.devices).WithField("with", l.with).Warn(c.came)
			}
		}
		for n, l := range c.was {
			if _, still := c.now[n]; !still {
				o.log.WithField("node", n.String()).WithField("paths", l.paths).WithField("devices", l.devices).WithField("with", l.with).Info(c.ended)
			}
		}
	}
	o.shared, o.unowned = shared, unowned
	return out
}

// claimed finds the nodes claimed by more than one device, a disk as a
// node of one device and a partition of it as another's, and gives each
// of those devices its problem: the first such node (by its numbers) and
// the other devices claiming it, with the paths they name it by when
// another than its own. It returns those nodes with what the log says of
// them.
func (o *Owners) claimed(out problems) map[nodeKey]sharedLog {
	// byNode are the devices claiming each node; partsOf those claiming a
	// partition of it (a disk), but not the disk itself.
	byNode, partsOf := map[nodeKey][]owner{}, map[nodeKey][]owner{}
	add := func(m map[nodeKey][]owner, k nodeKey, ow owner) {
		if !slices.ContainsFunc(m[k], ow.same) {
			m[k] = append(m[k], ow)
		}
	}
	for src, st := range o.stakes {
		for _, c := range st.claims {
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
	byDevice := func(a, b owner) int { return strings.Compare(a.device, b.device) }
	shared := map[nodeKey]sharedLog{}
	for _, n := range nodes {
		ows, parts := byNode[n], partsOf[n]
		slices.SortFunc(ows, byDevice)
		slices.SortFunc(parts, byDevice)
		shared[n] = logOf(append(slices.Clone(ows), parts...), "")
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
			out.give(ow, Problemf(CauseSharedNode, "%s (%s) is also a node of %s", ow.path, n, strings.Join(others, ", ")))
		}
		for _, p := range parts {
			var disk []string
			for _, ow := range ows {
				disk = append(disk, ow.describe(""))
			}
			out.give(p, Problemf(CauseSharedNode, "%s is a partition of %s, a node of %s: whoever has the disk can write it", p.path, n, strings.Join(disk, ", ")))
		}
	}
	return shared
}

// unclaimable gives each device claiming a node that the devices of a
// resource share (or a partition of one), or the node of a simulated
// device (the file it resolves to), its problem. It returns those nodes
// with what the log says of them.
func (o *Owners) unclaimable(out problems) map[nodeKey]sharedLog {
	sharedBy := map[nodeKey][]string{}
	madeBy := map[string]string{}
	for src, st := range o.stakes {
		for _, k := range st.shares {
			if !slices.Contains(sharedBy[k], src.label()) {
				sharedBy[k] = append(sharedBy[k], src.label())
			}
		}
		for _, m := range st.made {
			madeBy[m.path] = m.device
		}
	}
	if len(sharedBy) == 0 && len(madeBy) == 0 {
		return nil
	}
	type held struct {
		ow owner
		c  nodeClaim
	}
	var all []held
	for src, st := range o.stakes {
		for _, c := range st.claims {
			all = append(all, held{owner{src, c.device, c.path}, c})
		}
	}
	slices.SortFunc(all, func(a, b held) int {
		return strings.Compare(a.ow.device+"\x00"+a.c.key.sortKey()+"\x00"+a.ow.src.label(), b.ow.device+"\x00"+b.c.key.sortKey()+"\x00"+b.ow.src.label())
	})
	byNode := map[nodeKey][]owner{}
	with := map[nodeKey]string{}
	for _, h := range all {
		var p Problem
		k := h.c.key
		switch c := h.c; {
		case len(sharedBy[c.key]) > 0:
			slices.Sort(sharedBy[c.key])
			with[c.key] = "sharedNodes of " + strings.Join(sharedBy[c.key], ", ")
			p = Problemf(CauseSharedNode, "%s (%s) is a shared node of %s (sharedNodes): no device's own", c.path, c.key, strings.Join(sharedBy[c.key], ", "))
		case c.disk != (nodeKey{}) && len(sharedBy[c.disk]) > 0:
			slices.Sort(sharedBy[c.disk])
			with[c.key] = "sharedNodes of " + strings.Join(sharedBy[c.disk], ", ")
			p = Problemf(CauseSharedNode, "%s is a partition of %s, a shared node of %s (sharedNodes): no device's own", c.path, c.disk, strings.Join(sharedBy[c.disk], ", "))
		case madeBy[c.real] != "":
			// A simulated device's node is its file (they have one
			// type and numbers, /dev/null's by default).
			k = nodeKey{t: c.key.t, path: c.real}
			with[k] = "simulated device " + madeBy[c.real]
			p = Problemf(CauseSharedNode, "%s is %s, the node of simulated device %s: no other device's", c.path, c.real, madeBy[c.real])
		default:
			continue
		}
		out.give(h.ow, p)
		byNode[k] = append(byNode[k], h.ow)
	}
	unowned := map[nodeKey]sharedLog{}
	for n, ows := range byNode {
		unowned[n] = logOf(ows, with[n])
	}
	return unowned
}

// logOf is what the log says of a node that ows claim, and that with
// has (who else).
func logOf(ows []owner, with string) sharedLog {
	names, paths := make([]string, len(ows)), []string{}
	for i, ow := range ows {
		names[i] = ow.device
		if !slices.Contains(paths, ow.path) {
			paths = append(paths, ow.path)
		}
	}
	slices.Sort(paths)
	return sharedLog{devices: strings.Join(names, ", "), paths: strings.Join(paths, ", "), with: with}
}

// label names the source's resource in problems and logs.
func (s *Source) label() string {
	if s.opts.Resource != "" {
		return s.opts.Resource
	}
	return s.deviceName("*")
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

// Close drops the source's stake in the host's nodes (Options.Owners), so
// that the devices of other sources sharing its nodes may be Healthy
// again. Run does it when it returns; call it for a prepared source that
// will not run. Idempotent.
func (s *Source) Close() {
	s.owners.set(s, stake{}, true)
}
