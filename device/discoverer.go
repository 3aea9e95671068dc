package device

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/inotify"
)

// discoverer finds the devices of a resource, one kind per source:
// simulated nodes the source makes, nodes matched by globs over the dev
// root, or devices found by their bus identity (Options.Discover: PCI,
// USB). It is all the source's one watch-and-publish loop asks of a kind;
// faults, holds, forgetting and publishing are the same for all.
type discoverer interface {
	// prepare readies the devices before the first scan: simulated
	// nodes are made (idempotently), the host devices seen before are
	// loaded from the registry.
	prepare(s *Source) error
	// scan fills snap with the devices as they are now, in index order,
	// with the health of their nodes (faults and holds are the
	// source's), and returns it.
	scan(s *Source, snap *Snapshot) *Snapshot
	// watchDirs are the directories besides the dev root and the shared
	// nodes' whose entries change what scan finds.
	watchDirs(s *Source) []string
}

// nodeMaker is a discoverer that makes its devices' nodes (simulated), each
// through a temp file beside it that a killed run may leave: tempPattern
// globs those.
type nodeMaker interface {
	discoverer
	tempPattern(s *Source) string
}

// nodePatcher is a discoverer that can answer an event naming one of its
// nodes by re-checking that device alone (simulated): the source patches
// its snapshot instead of rescanning every device.
type nodePatcher interface {
	discoverer
	// nodeEvents places a burst of directory events: the positions, in
	// the snapshot, of the devices whose nodes they name; ok is false when
	// one may change more than its node (the directory itself, another
	// directory, an overflow), and every device is rescanned. Entries that
	// are no node (temp files, other devices) give nothing.
	nodeEvents(s *Source, evs []inotify.Event) (idx []int, ok bool)
	// nodeHealth is the health of the nodes of d, a device of the
	// snapshot, as they are now.
	nodeHealth(s *Source, d Device) Problem
}

// finder finds the host devices of a resource (globs, identified); the
// registry remembers what it found (remembered makes it a discoverer).
type finder interface {
	// find returns the devices found now by registry key, and their keys
	// in the order new devices get their indexes in; a nil map: it failed,
	// what is known stays as it is.
	find(s *Source) (map[string]candidate, []string)
	// health is the health of a device that find found.
	health(s *Source, d Device) Problem
	// registered reports whether a registry entry is one the
	// configuration still gives, and entryNode its own node, relative to
	// the dev root; node is what saveRegistry records for d.
	registered(s *Source, e registryEntry) bool
	entryNode(e registryEntry) string
	node(s *Source, d Device) string
	// watchDirs are the directories besides the dev root whose entries
	// change what it finds.
	watchDirs(s *Source) []string
}

// newDiscoverer is the discoverer the options ask for and, for host
// devices, the finder behind it (which scanHost and the registry ask).
func newDiscoverer(o Options) (discoverer, finder) {
	switch {
	case o.Discover != nil:
		return remembered{}, identified{}
	case len(o.HostGlobs) > 0:
		return remembered{}, globs{}
	}
	return simulated{}, nil
}

// globs finds existing nodes matched by HostGlobs; a device is its node,
// keyed by the path it takes, and healthy while it is there. The aliases
// of one node (udev's by-id and by-path names, the kernel's name: one
// type and major:minor) are one device: it takes the name it is known by
// (the registry; of two, the one with the lower index), else the first
// name the globs match (globs in order, each one's matches sorted). A
// partition whose disk the globs match too (Options.DiskOf) is a node of
// its disk's device, not a device: whoever has the disk can write it.
type globs struct{}

func (globs) find(s *Source) (map[string]candidate, []string) {
	out := map[string]candidate{}
	var order []string
	// byNode is the name each node found so far takes; aliases the other
	// names of a node, by the name it takes.
	byNode := map[nodeKey]string{}
	var aliases map[string][]string
	for _, g := range s.opts.HostGlobs {
		matches, _ := filepath.Glob(filepath.Join(s.root, g))
		for _, m := range matches {
			rel, err := filepath.Rel(s.root, m)
			if err != nil || strings.HasPrefix(rel, "..") {
				continue
			}
			if _, dup := out[rel]; dup {
				continue
			}
			t, major, minor, err := hostNode(s.root, m)
			if err != nil {
				s.mu.Lock()
				_, known := s.known[rel]
				s.mu.Unlock()
				if !known {
					s.log.WithError(err).Debugf("skipping %s", m)
				}
				continue
			}
			key := keyOf(Node{HostPath: m, Type: t, Major: major, Minor: minor})
			if first, ok := byNode[key]; ok {
				if aliases == nil {
					aliases = map[string][]string{}
				}
				aliases[first] = append(aliases[first], rel)
				continue
			}
			byNode[key] = rel
			numa := NoNUMA
			if s.opts.NUMAOf != nil {
				numa = s.opts.NUMAOf(t, major, minor)
			}
			out[rel] = candidate{key: rel, suffix: HostSuffix(rel), node: Node{HostPath: rel, Type: t, Major: major, Minor: minor}, numa: numa}
			order = append(order, rel)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notDevices = nil
	for first, others := range aliases {
		names := append([]string{first}, others...)
		name := s.knownAlias(names)
		if name != first {
			c := out[first]
			delete(out, first)
			c.key, c.suffix, c.node.HostPath = name, HostSuffix(name), name
			out[name] = c
			order[slices.Index(order, first)] = name
			byNode[keyOf(Node{HostPath: filepath.Join(s.root, name), Type: c.node.Type, Major: c.node.Major, Minor: c.node.Minor})] = name
		}
		for _, a := range names {
			if a != name {
				s.notDevice(a, name, false)
			}
		}
	}
	order = s.foldPartitions(out, order, byNode)
	return out, order
}

// foldPartitions makes each partition found (cands, in order) whose disk
// is found too (byNode: the name each node takes) a node of its disk's
// device, and returns the order without them. s.mu is held.
func (s *Source) foldPartitions(cands map[string]candidate, order []string, byNode map[nodeKey]string) []string {
	if s.opts.DiskOf == nil {
		return order
	}
	kept := order[:0:0]
	for _, rel := range order {
		c := cands[rel]
		if c.node.Type == Block {
			if major, minor, ok := s.opts.DiskOf(c.node.Major, c.node.Minor); ok {
				if disk, found := byNode[nodeKey{t: Block, major: major, minor: minor}]; found {
					d := cands[disk]
					d.extra = append(d.extra, c.node)
					cands[disk] = d
					delete(cands, rel)
					s.notDevice(rel, disk, true)
					continue
				}
			}
		}
		kept = append(kept, rel)
	}
	return kept
}

// notDevice records that name, which the globs match, is no device: it is
// another name of the node of device of (an alias), or a partition of
// the disk of device of. s.mu is held.
func (s *Source) notDevice(name, of string, partition bool) {
	if s.notDevices == nil {
		s.notDevices = map[string]notDevice{}
	}
	s.notDevices[name] = notDevice{of: of, partition: partition}
}

// knownAlias is the name, of names (aliases of one node, the first the
// globs matched first), that the node's device takes: the one known with
// the lowest index, else the first. s.mu is held.
func (s *Source) knownAlias(names []string) string {
	best, index := names[0], -1
	for _, n := range names {
		if d, ok := s.known[n]; ok && (index < 0 || d.Index < index) {
			best, index = n, d.Index
		}
	}
	return best
}

func (globs) health(*Source, Device) Problem { return Problem{} }

func (globs) registered(s *Source, e registryEntry) bool {
	return s.matchesGlob(e.Path) && e.ID == s.deviceName(HostSuffix(e.Path))
}

func (globs) entryNode(e registryEntry) string { return e.Path }

func (globs) node(*Source, Device) string { return "" }

// watchDirs: every existing directory that a directory part of a glob
// matches, at every depth (for bus*/n*: every bus* directory).
func (globs) watchDirs(s *Source) []string {
	var dirs []string
	for _, g := range s.opts.HostGlobs {
		parts := strings.Split(filepath.Dir(g), string(os.PathSeparator))
		for k := 1; k <= len(parts); k++ {
			if parts[0] == "." {
				break
			}
			matches, _ := filepath.Glob(filepath.Join(s.root, filepath.Join(parts[:k]...)))
			for _, m := range matches {
				if fi, err := os.Lstat(m); err == nil && fi.IsDir() {
					dirs = append(dirs, m)
				}
			}
		}
	}
	return dirs
}

// identified finds devices by their bus identity (Options.Discover); a
// device is healthy while its nodes are what the discovery says.
type identified struct{}

func (identified) find(s *Source) (map[string]candidate, []string) {
	found, err := s.opts.Discover()
	if err != nil {
		s.log.WithError(err).Warn("device discovery failed; keeping what is known")
		return nil, nil
	}
	// Matching nothing is no error: said once, until something matches.
	if none := len(found) == 0; s.matchedNone.Swap(none) != none && none {
		s.log.WithField("discovery", s.opts.DiscoverKind).Info("no device matches the selector; the resource advertises none")
	}
	out := map[string]candidate{}
	var order []string
	for _, f := range found {
		k := s.opts.DiscoverKind + "/" + f.Key
		if _, dup := out[k]; dup {
			continue
		}
		extra := make([]Node, len(f.Extra))
		for i, n := range f.Extra {
			extra[i] = s.numbers(n)
		}
		out[k] = candidate{key: k, node: s.numbers(f.Node), extra: extra, numa: f.NUMANode, identity: f.Identity}
		order = append(order, k)
	}
	return out, order
}

func (identified) health(s *Source, d Device) Problem { return s.nodesStatus(d) }

func (identified) registered(s *Source, e registryEntry) bool {
	return strings.HasPrefix(e.Path, s.opts.DiscoverKind+"/") && e.ID == s.deviceName(strconv.Itoa(e.Index)) &&
		e.Node != "" && !filepath.IsAbs(e.Node) && filepath.Clean(e.Node) == e.Node && !strings.HasPrefix(e.Node, "../")
}

func (identified) entryNode(e registryEntry) string { return e.Node }

func (identified) node(s *Source, d Device) string {
	rel, _ := filepath.Rel(s.root, d.HostPath)
	return rel
}

// watchDirs: the directories of the known devices' nodes.
func (identified) watchDirs(s *Source) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var dirs []string
	for _, d := range s.known {
		dirs = append(dirs, filepath.Dir(d.HostPath))
		for _, n := range d.Extra {
			dirs = append(dirs, filepath.Dir(n.HostPath))
		}
	}
	return dirs
}
