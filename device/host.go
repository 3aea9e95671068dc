package device

import (
	"context"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"tags.cncf.io/container-device-interface/pkg/parser"
)

// Found is a host device as a discovery (Options.Discover) finds it.
type Found struct {
	// Key identifies the device across rescans and restarts, within its
	// discovery: the PCI address; for a USB device (Identity.USBPort set)
	// USBSerialKey when its serial identifies it among the devices there
	// now, else USBPortKey, and the source decides which device it
	// remembers it is (matchUSB). The registry keeps the ID and index
	// given to it.
	Key string
	// Node is its own node, Extra its other ones; paths relative to the
	// dev root ("nvidia0", "vfio/42"), ContainerPath ignored; numbers 0:0
	// are taken from the node on disk.
	Node  Node
	Extra []Node
	// NUMANode is its NUMA node, or NoNUMA.
	NUMANode int
	Identity Identity
}

// candidate is one host device found by this scan, before it is matched
// with the devices known.
type candidate struct {
	key      string // registry key
	suffix   string // the end of its ID for a new device ("" : its index)
	node     Node   // own node, HostPath relative to the root
	extra    []Node
	numa     int
	identity Identity
}

// numbers fills in the type and numbers of a found node that the
// discovery leaves to the disk (0:0, as for /dev/vfio/<group>): those of
// the node there now, if any.
func (s *Source) numbers(n Node) Node {
	if n.Major != 0 || n.Minor != 0 {
		return n
	}
	if t, major, minor, err := hostNode(s.root, filepath.Join(s.root, n.HostPath)); err == nil {
		n.Type, n.Major, n.Minor = t, major, minor
	}
	return n
}

// containerPath is where the own node rel of device index appears.
func (s *Source) containerPath(index int, rel string) string {
	if s.opts.ContainerPath != nil {
		return s.opts.ContainerPath(index, rel)
	}
	return filepath.Join(s.opts.ContainerDevRoot, rel)
}

// sharedNodes are the shared nodes that exist now.
func (s *Source) sharedNodes() []Node {
	var out []Node
	for _, rel := range s.opts.SharedNodes {
		p := filepath.Join(s.root, rel)
		t, major, minor, err := hostNode(s.root, p)
		if err != nil {
			continue // absent ones are skipped
		}
		out = append(out, Node{HostPath: p, ContainerPath: filepath.Join(s.opts.ContainerDevRoot, rel), Type: t, Major: major, Minor: minor})
	}
	return out
}

// sharedBeside is shared without the nodes that are d's own or other
// nodes already, by path or by node (sharedNodes naming /dev/vfio/vfio,
// which a vfio-pci function has of its own): a node appears once in a
// device.
func sharedBeside(shared []Node, d *Device) []Node {
	same := func(a, b Node) bool { return a.HostPath == b.HostPath || keyOf(a) == keyOf(b) }
	mine := func(n Node) bool {
		return same(n, Node{HostPath: d.HostPath, Type: d.Type, Major: d.Major, Minor: d.Minor}) ||
			slices.ContainsFunc(d.Extra, func(e Node) bool { return same(e, n) })
	}
	if !slices.ContainsFunc(shared, mine) {
		return shared
	}
	return slices.DeleteFunc(slices.Clone(shared), mine)
}

// absNodes makes the candidate's other nodes absolute on both sides.
func (s *Source) absNodes(ns []Node) []Node {
	if len(ns) == 0 {
		return nil
	}
	out := make([]Node, len(ns))
	for i, n := range ns {
		out[i] = Node{HostPath: filepath.Join(s.root, n.HostPath), ContainerPath: filepath.Join(s.opts.ContainerDevRoot, n.HostPath), Type: n.Type, Major: n.Major, Minor: n.Minor}
	}
	return out
}

// scanHost matches the devices found now with those known (a new one gets
// the next index; a vanished one stays, Unhealthy; one found with another
// identity than it had stays as it was, Unhealthy) and returns them with
// their health: a found glob device is healthy; a discovered one when its
// nodes are what the discovery says.
func (s *Source) scanHost(snap *Snapshot) *Snapshot {
	cands, keys := s.disc.find(s)
	shared := s.sharedNodes()
	s.mu.Lock()
	defer s.mu.Unlock()
	if cands != nil {
		cands, keys = s.matchUSB(cands, keys)
	}
	changed := false
	// rebound: known devices found with another identity, by key, with
	// how it differs. They keep their nodes and count as gone (the way
	// out of a rebinding on purpose is forgetAfter).
	var rebound map[string]string
	for _, k := range keys {
		c := cands[k]
		d, ok := s.known[k]
		if ok {
			if why := identityChange(d.Identity, c.identity); why != "" {
				if rebound == nil {
					rebound = map[string]string{}
				}
				rebound[k] = why
				continue
			}
		}
		adopted := false
		if !ok {
			d, adopted = s.adopt(k, c)
			ok = adopted
		}
		if !ok {
			suffix := c.suffix
			if suffix == "" {
				suffix = strconv.Itoa(s.nextIndex)
			}
			name := s.deviceName(suffix)
			if err := parser.ValidateDeviceName(name); err != nil {
				s.log.WithError(err).Warnf("skipping host device %s: no valid device name", k)
				continue
			}
			d = Device{Name: name, Index: s.nextIndex, NUMANode: NoNUMA}
			s.nextIndex++
		}
		next := d
		next.HostPath, next.ContainerPath = filepath.Join(s.root, c.node.HostPath), s.containerPath(d.Index, c.node.HostPath)
		next.Type, next.Major, next.Minor = c.node.Type, c.node.Major, c.node.Minor
		next.Extra, next.NUMANode, next.Identity = s.absNodes(c.extra), c.numa, c.identity
		if !ok || adopted || !SameDevice(d, next) {
			s.known[k] = next
			changed = true
		}
	}
	if changed {
		s.saveRegistry()
	}
	snap.Devices = make([]Device, 0, len(s.known))
	now := time.Now()
	for k, d := range s.known {
		d.Shared = sharedBeside(shared, &d)
		_, found := cands[k]
		why, wrong := rebound[k]
		found = found && !wrong
		switch {
		case found || cands == nil:
			delete(s.goneSince, k)
		case s.goneSince[k].IsZero():
			s.goneSince[k] = now
		}
		switch {
		case cands == nil:
			// The discovery failed: health as the disk says.
			d.SetProblem(s.nodesStatus(d))
		case wrong:
			d.SetProblem(Problem{Cause: CauseIdentityChanged, Message: why})
		case !found:
			d.SetProblem(s.notFound(k))
		default:
			d.SetProblem(s.disc.health(s, d))
		}
		snap.Devices = append(snap.Devices, d)
	}
	sort.Slice(snap.Devices, func(i, j int) bool { return snap.Devices[i].Index < snap.Devices[j].Index })
	return snap
}

// notDevice is why a name the globs match is no device: it names the node
// of device of (another name of it), or, with partition, a partition of
// the disk that is the node of device of.
type notDevice struct {
	of        string
	partition bool
}

// notFound is the problem of known device k that the scan did not find:
// missing, and for a name that is now another device's node (an alias) or
// a partition of it, that said. s.mu is held.
func (s *Source) notFound(k string) Problem {
	nd, ok := s.notDevices[k]
	if !ok {
		return Problem{Cause: CauseMissing}
	}
	what := "an alias of"
	if nd.partition {
		what = "a partition of"
	}
	of := filepath.Join(s.root, nd.of)
	if d, known := s.known[nd.of]; known {
		return Problemf(CauseMissing, "%s is %s %s, the node of %s: a node of that device", filepath.Join(s.root, k), what, of, d.Name)
	}
	return Problemf(CauseMissing, "%s is %s %s: a node of its device", filepath.Join(s.root, k), what, of)
}

// nodesStatus checks a discovered device's own and other nodes on disk.
func (s *Source) nodesStatus(d Device) Problem {
	if p := nodeStatus(d.HostPath, d.Type, d.Major, d.Minor); !p.None() {
		p.Message = strings.TrimSpace(d.HostPath + " " + p.Message)
		return p
	}
	for _, n := range d.Extra {
		if p := nodeStatus(n.HostPath, n.Type, n.Major, n.Minor); !p.None() {
			p.Message = strings.TrimSpace(n.HostPath + " " + p.Message)
			return p
		}
	}
	return Problem{}
}

// forget drops the host devices gone for ForgetAfter that no container
// holds, and reports whether it dropped any. Their indexes are not given
// again.
func (s *Source) forget(ctx context.Context) bool {
	s.mu.Lock()
	var due []string
	for k, since := range s.goneSince {
		if _, known := s.known[k]; known && time.Since(since) >= s.opts.ForgetAfter {
			due = append(due, k)
		}
	}
	s.mu.Unlock()
	if len(due) == 0 {
		return false
	}
	held, err := s.opts.Holders(ctx)
	if err != nil {
		if !s.noHolders {
			s.log.WithError(err).Warn("cannot tell which vanished devices containers hold; keeping them")
		}
		s.noHolders = true
		return false
	}
	s.noHolders = false
	s.mu.Lock()
	defer s.mu.Unlock()
	dropped := false
	for _, k := range due {
		d, ok := s.known[k]
		if !ok || heldID(held, d.Name) {
			continue
		}
		delete(s.known, k)
		delete(s.goneSince, k)
		dropped = true
		s.log.WithField("device", d.Name).WithField("key", k).Info("forgetting a device gone for longer than forgetAfter that no container holds")
	}
	if dropped {
		s.saveRegistry()
	}
	return dropped
}

// heldID reports whether held names device name or one of its replicas.
func heldID(held []string, name string) bool {
	for _, h := range held {
		if h == name || strings.HasPrefix(h, name+"::") {
			return true
		}
	}
	return false
}
