package device

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/inotify"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/latest"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
)

// ErrDeviceName is returned by NewSource when the device IDs it would make
// are not valid CDI device names (an ID prefix or node name the CDI
// library refuses).
var ErrDeviceName = errors.New("not a valid CDI device name")

// Options configure the source of one resource.
type Options struct {
	// DevRoot is where nodes live on the host.
	DevRoot string
	// ContainerDevRoot is where they appear in containers (default /dev).
	ContainerDevRoot string
	// IDPrefix and NodeName make the device IDs.
	IDPrefix, NodeName string
	// Replicas per device (>= 1).
	Replicas int

	// Simulated devices: Count nodes <DevRoot>/<FilePrefix>-<i>.
	Count        int
	FilePrefix   string
	Type         NodeType
	Major, Minor uint32
	NUMANodes    int

	// HostGlobs, relative to DevRoot: existing nodes to expose instead.
	HostGlobs []string
	// Discover, when set, finds the host devices by identity (PCI, USB)
	// instead of HostGlobs; it is called on every rescan. DiscoverKind
	// names it ("pci", "usb") in registry keys and logs.
	Discover     func() ([]Found, error)
	DiscoverKind string
	// KernelEvents, when set, tells Run of changes the directory watch
	// cannot see (a PCI function bound, unbound or removed: kernel
	// uevents): Run opens it with its context and a function to call on
	// each (it rescans), and calls the returned stop before it returns.
	KernelEvents func(ctx context.Context, changed func()) (stop func(), err error)
	// ForgetAfter, when above 0, forgets a host device gone this long that
	// no container holds (Holders): its ID and index leave the registry
	// and the snapshot, so a churny bus does not grow them without bound.
	// One a container holds, or while Holders cannot tell, stays,
	// Unhealthy.
	ForgetAfter time.Duration
	// Holders returns the device IDs containers hold (as advertised, with
	// replicas; the kubelet's PodResources).
	Holders func(ctx context.Context) ([]string, error)
	// SharedNodes, relative to DevRoot: nodes every host device gets, when
	// they exist (/dev/nvidiactl).
	SharedNodes []string
	// NUMAOf, when set, gives host glob devices their NUMA node from
	// their numbers (sysfs.NUMAOfNode); NoNUMA when unknown.
	NUMAOf func(t NodeType, major, minor uint32) int
	// DiskOf, when set, tells a partition from its disk: for the block
	// node major:minor, the numbers of the disk it is a partition of, and
	// true; false for a whole disk or what it cannot tell (sysfs.DiskOf).
	// A partition belongs to its disk: within one resource it is a node of
	// its disk's device, across resources it and its disk are one node
	// (Owners).
	DiskOf func(major, minor uint32) (diskMajor, diskMinor uint32, ok bool)
	// ContainerPath, when set, says where the own node (rel, relative to
	// DevRoot) of host device index appears in containers.
	ContainerPath func(index int, rel string) string
	// Registry, when set, is the file where the host devices ever seen are
	// remembered (ID, index, node), so that IDs and indexes stay stable
	// and vanished devices stay known across restarts.
	Registry string
	// Described, when set, reads the devices the resource's CDI spec on
	// disk describes (an earlier run's), to rebuild a registry file that
	// does not parse; its error says why the spec cannot be trusted (none,
	// not ours), and Prepare then refuses with ErrRegistry.
	Described func() ([]Described, error)
	// Resource names the resource in what the owners say of its nodes
	// (shared_node problems, logs); unset, its IDs do (<prefix>-*).
	Resource string
	// Owners, when set, is the registry of node owners shared by every
	// source of the process: a host node claimed by devices of two
	// resources makes both Unhealthy (CauseSharedNode). Unset, the source
	// has one of its own, so the devices of one resource are checked
	// against each other all the same.
	Owners *Owners

	Log *logrus.Entry
}

// Source owns the devices of one resource. Prepare once, then Run; the
// snapshots it publishes are immutable.
type Source struct {
	opts Options
	root string
	log  *logrus.Entry
	// kind finds the devices: simulated, globs, pci or usb.
	kind discoverer
	// disc is the finder behind a kind of host devices (globs,
	// identified), which scanHost and the registry ask; nil for
	// simulated devices.
	disc finder

	mu      sync.Mutex
	current *Snapshot
	// host devices ever seen, by relative path: a vanished one stays
	// (unhealthy) so that IDs the kubelet holds remain known. Indexes are
	// given in order of first sight and never reused.
	known map[string]Device
	// nextIndex is the index the next new host device gets.
	nextIndex int
	// recovered: known may hold devices rebuilt from the spec that wait for
	// their hardware (adopt).
	recovered bool
	// notDevices are the names the globs match that are no device
	// (globs.find): another name of a device's node, or a partition of
	// its disk. A known device of such a name is not found (missing).
	notDevices map[string]notDevice
	// goneSince is when a known host device was first seen gone, by key.
	goneSince map[string]time.Time
	// noHolders is set while Holders cannot tell (logged once).
	noHolders bool
	// faults reported by others (a failed preparation), by device name.
	faults map[string]Problem
	// injected: faults injected on purpose (SetInjected), by device name;
	// apart from faults, so that a preparation's success never clears one.
	injected map[string]Problem
	// holds: devices held elsewhere (DRA claims), by device name
	// (SetHolds); apart from faults, which their owners set and clear.
	holds map[string]Problem
	// poke asks Run to publish after a fault changed; rescan to rescan
	// every device after a kernel event.
	poke, rescan chan struct{}
	// matchedNone: the last discovery found nothing (logged once).
	matchedNone atomic.Bool
	// fullScans counts the rescans of every device Run made (tests).
	fullScans atomic.Int64
	// owners knows the nodes every source of the process claims;
	// sharedPaths are the nodes this source's devices may share
	// (absolute); made the nodes its simulated devices make.
	owners      *Owners
	sharedPaths map[string]bool
	made        []madeNode
	// running is set once Run publishes (s.mu); before, a change of the
	// conflicts updates current at once and sets resend, so that Run's
	// first publish sends what it finds even if current says it already.
	running, resend bool
}

// NewSource checks the options; it touches nothing on disk but resolving
// the dev root.
func NewSource(o Options) (*Source, error) {
	root, err := filepath.EvalSymlinks(o.DevRoot)
	if err != nil {
		return nil, fmt.Errorf("dev root: %w", err)
	}
	if o.ContainerDevRoot == "" {
		o.ContainerDevRoot = "/dev"
	}
	if o.Replicas < 1 {
		o.Replicas = 1
	}
	if o.Log == nil {
		o.Log = logs.Discard()
	}
	if len(o.HostGlobs) == 0 && o.Discover == nil && o.Count < 1 {
		return nil, errors.New("a source needs a count, host globs or a discovery")
	}
	// The longest ID must be a valid CDI device name (host device IDs are
	// checked one by one as they appear).
	longest := ID(o.IDPrefix, o.NodeName, strconv.Itoa(max(o.Count-1, 0)))
	if err := parser.ValidateDeviceName(longest); err != nil {
		return nil, fmt.Errorf("device IDs like %q: %w: %w", longest, ErrDeviceName, err)
	}
	kind, disc := newDiscoverer(o)
	owners := o.Owners
	if owners == nil {
		owners = NewOwners(o.Log)
	}
	s := &Source{opts: o, root: root, log: o.Log, kind: kind, disc: disc, known: map[string]Device{}, goneSince: map[string]time.Time{}, faults: map[string]Problem{}, injected: map[string]Problem{},
		poke: make(chan struct{}, 1), rescan: make(chan struct{}, 1), owners: owners, sharedPaths: sharedPaths(root, o)}
	s.made = madeNodes(root, o, s.deviceName)
	return s, nil
}

// Prepare readies the devices (the discoverer creates the simulated nodes,
// idempotently, or loads the host devices seen before) and returns the
// first snapshot.
func (s *Source) Prepare() (*Snapshot, error) {
	if err := s.kind.prepare(s); err != nil {
		return nil, err
	}
	snap := s.Refresh()
	s.logUnhealthyAtStart(snap)
	return snap, nil
}

// logUnhealthyAtStart says, in one line, which devices are unhealthy in
// the first snapshot and why (later changes are logged one by one as they
// happen): the first few with their problem, and how many in all.
func (s *Source) logUnhealthyAtStart(snap *Snapshot) {
	const shown = 5
	var some []string
	n := 0
	for _, d := range snap.Devices {
		if d.Healthy {
			continue
		}
		n++
		if n <= shown {
			some = append(some, d.Name+" ("+d.Problem.String()+")")
		}
	}
	if n > 0 {
		s.log.WithField("unhealthy", n).WithField("devices", len(snap.Devices)).WithField("first", strings.Join(some, ", ")).
			Warn("devices unhealthy at start")
	}
}

// SetFault marks a device unhealthy for p, or healthy again (as far as
// its node allows) when p is none. Run publishes the change.
func (s *Source) SetFault(name string, p Problem) { s.setProblem(s.faults, name, p) }

// SetInjected marks a device unhealthy for a fault injected on purpose,
// or clears it (p none); the device's node and its other faults still
// come first and stay. Run publishes the change.
func (s *Source) SetInjected(name string, p Problem) { s.setProblem(s.injected, name, p) }

// setProblem sets name's problem in m (faults or injected), or deletes it
// when p is none, and pokes Run when that changed anything.
func (s *Source) setProblem(m map[string]Problem, name string, p Problem) {
	s.mu.Lock()
	if m[name] == p {
		s.mu.Unlock()
		return
	}
	if p.None() {
		delete(m, name)
	} else {
		m[name] = p
	}
	s.mu.Unlock()
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// SetHolds replaces the devices held elsewhere than through this resource
// (by a DRA claim), by device name, each with its problem: a held device
// whose node is fine and that has no fault is unhealthy for its hold.
// Holds are kept apart from faults: setting or clearing one never touches
// the other. Run publishes a change.
func (s *Source) SetHolds(holds map[string]Problem) {
	s.mu.Lock()
	if maps.Equal(s.holds, holds) {
		s.mu.Unlock()
		return
	}
	s.holds = maps.Clone(holds)
	s.mu.Unlock()
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// Refresh rescans now and makes the result the current snapshot (for use
// before Run, e.g. after faults were restored).
func (s *Source) Refresh() *Snapshot {
	snap := s.scan()
	s.mu.Lock()
	snap = s.withConflicts(snap)
	s.current = snap
	s.mu.Unlock()
	return snap
}

// Snapshot returns the latest snapshot.
func (s *Source) Snapshot() *Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current
}

// TempPattern is the glob of the temp nodes a killed run may have left
// beside the nodes the source makes (simulated); "" for host devices.
func (s *Source) TempPattern() string {
	if m, ok := s.kind.(nodeMaker); ok {
		return m.tempPattern(s)
	}
	return ""
}

func (s *Source) deviceName(suffix string) string {
	return ID(s.opts.IDPrefix, s.opts.NodeName, suffix)
}

// scan builds a snapshot from the disk as it is now, and the faults; the
// source's stake in the host's nodes is given to the owners (the nodes
// of its host devices, its shared nodes, the nodes it makes), whose
// conflicts the caller adds (withConflicts) when it makes the snapshot
// current.
func (s *Source) scan() *Snapshot {
	snap := s.scanNodes()
	s.owners.set(s, s.stake(snap), false)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range snap.Devices {
		s.applyFault(&snap.Devices[i])
	}
	return snap
}

// applyFault reports a device whose node is fine unhealthy when a fault is
// injected (SetInjected), else when one is set for it, else when something
// holds it (SetHolds). The caller holds
// s.mu.
func (s *Source) applyFault(d *Device) {
	if f := s.injected[d.Name]; !f.None() && d.Healthy {
		d.SetProblem(f)
	}
	if f := s.faults[d.Name]; !f.None() && d.Healthy {
		d.SetProblem(f)
	}
	if h := s.holds[d.Name]; !h.None() && d.Healthy {
		d.SetProblem(h)
	}
}

func (s *Source) scanNodes() *Snapshot {
	return s.kind.scan(s, &Snapshot{Replicas: s.opts.Replicas})
}

// HostSuffix turns a host device path relative to the dev root into the
// last part of its device ID, injectively: '/' becomes '_', and the
// characters that could make two paths look alike are escaped with ':'
// ('_' as ":_", ':' as "::"). net/tun gives net_tun, net_tun gives net:_tun.
func HostSuffix(rel string) string {
	if !strings.ContainsAny(rel, "/_:") {
		return rel
	}
	// Byte by byte: a name that is not UTF-8 keeps its bytes (ranging
	// over runes would turn every invalid byte into U+FFFD, and two such
	// paths into one ID).
	var b strings.Builder
	for i := 0; i < len(rel); i++ {
		switch c := rel[i]; c {
		case '/':
			b.WriteByte('_')
		case '_':
			b.WriteString(":_")
		case ':':
			b.WriteString("::")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// LegacyHostSuffix is the last part of a host device's ID as versions
// before the ':' escaping (commit 654f80e, the one that added the device
// registry) wrote it: '/' became '_' and nothing was escaped, so /dev/a_b
// and /dev/a/b were both a_b. Only to recognise IDs in kubelet checkpoints
// of those versions.
func LegacyHostSuffix(rel string) string { return strings.ReplaceAll(rel, "/", "_") }

// LegacyIDs maps the ID of every known host device whose ID an earlier
// version wrote differently (see LegacyHostSuffix) to that earlier ID.
func (s *Source) LegacyIDs() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for rel, d := range s.known {
		if old := s.deviceName(LegacyHostSuffix(rel)); old != d.Name {
			out[d.Name] = old
		}
	}
	return out
}

// watchDirs are the directories whose entries decide the snapshot: the dev
// root, the shared nodes' directories, and those the discoverer names (the
// directory of the simulated nodes; for host globs every existing
// directory that a directory part of the glob matches, at every depth: for
// bus*/n*, every bus* directory).
func (s *Source) watchDirs() []string {
	dirs := map[string]bool{s.root: true}
	for _, rel := range s.opts.SharedNodes {
		dirs[filepath.Dir(filepath.Join(s.root, rel))] = true
	}
	for _, d := range s.kind.watchDirs(s) {
		dirs[d] = true
	}
	out := make([]string, 0, len(dirs))
	for d := range dirs {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Run watches the nodes and publishes a snapshot on out whenever devices
// or their health change, until ctx is done. Only the latest snapshot
// matters, so a consumer that falls behind gets the newest one.
func (s *Source) Run(ctx context.Context, out chan *Snapshot) error {
	w, err := inotify.Watch(ctx, inotify.EntryChanges)
	if err != nil {
		return err
	}
	defer w.Close()
	addWatches := func() {
		for _, d := range s.watchDirs() {
			if w.Watching(d) {
				continue
			}
			if err := w.Add(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				s.log.WithError(err).Warn("cannot watch directory")
			}
		}
	}
	addWatches()
	// Its claims on host nodes go when it stops.
	defer s.Close()
	if s.Snapshot() == nil {
		if _, err := s.Prepare(); err != nil {
			return err
		}
	}
	if s.opts.KernelEvents != nil {
		stop, err := s.opts.KernelEvents(ctx, func() {
			select {
			case s.rescan <- struct{}{}:
			default: // one pending rescan covers them all
			}
		})
		if err != nil {
			// Health still follows the nodes on disk.
			s.log.WithError(err).Warn("no kernel events; devices that change without a node change are seen at the next rescan")
		} else {
			defer stop()
		}
	}
	// A change between Prepare and the watches being in place is caught
	// here; so is a change of conflicts made to the current snapshot after
	// whoever started before Run read it (resend).
	s.mu.Lock()
	s.running = true
	force := s.resend
	s.mu.Unlock()
	s.publishAll(out, force)
	var forget <-chan time.Time
	if s.opts.ForgetAfter > 0 && s.opts.Holders != nil {
		t := time.NewTicker(min(max(s.opts.ForgetAfter/4, 10*time.Millisecond), time.Minute))
		defer t.Stop()
		forget = t.C
	}
	for {
		select {
		case <-forget:
			if s.forget(ctx) {
				s.publish(out)
			}
		case <-s.poke:
			s.publish(out)
		case <-s.rescan:
			addWatches() // a device's node directory may be new
			s.publish(out)
		case evs, ok := <-w.Events():
			if !ok {
				if err := w.Err(); err != nil {
					return fmt.Errorf("watching devices: %w", err)
				}
				return nil
			}
			// Take what else has been read, so a burst is published once;
			// past maxPendingEvents every device is rescanned.
			full := false
		drain:
			for {
				select {
				case more, ok := <-w.Events():
					if !ok {
						break drain
					}
					if evs = append(evs, more...); len(evs) > maxPendingEvents {
						evs, full = nil, true
					}
				default:
					break drain
				}
			}
			addWatches()
			s.publishEvents(out, evs, full)
		}
	}
}

// maxPendingEvents bounds the events queued between two publishes; past
// it every device is rescanned.
const maxPendingEvents = 4096

// publishEvents publishes what the events change: a discoverer that can
// place them on its devices' nodes (nodePatcher) has those devices alone
// re-checked; any other event, or a burst past maxPendingEvents (full),
// rescans every device.
func (s *Source) publishEvents(out chan *Snapshot, evs []inotify.Event, full bool) {
	p, ok := s.kind.(nodePatcher)
	if full || !ok {
		s.publish(out)
		return
	}
	idx, ok := p.nodeEvents(s, evs)
	if !ok {
		s.publish(out)
		return
	}
	if len(idx) > 0 {
		s.publishNodes(out, p, idx)
	}
}

// publishNodes re-checks the devices at positions idx of the current
// snapshot and publishes the snapshot with their health if it changed: the
// other devices are copied from the current snapshot, not looked at
// again.
func (s *Source) publishNodes(out chan *Snapshot, p nodePatcher, idx []int) {
	s.mu.Lock()
	prev := s.current
	s.mu.Unlock()
	if prev == nil || slices.Max(idx) >= len(prev.Devices) {
		s.publish(out)
		return
	}
	status := make([]Problem, len(idx))
	for k, i := range idx {
		status[k] = p.nodeHealth(s, prev.Devices[i])
	}
	s.mu.Lock()
	if s.current != prev {
		s.mu.Unlock()
		s.publish(out) // not ours to patch: someone else replaced it
		return
	}
	var snap *Snapshot
	for k, i := range idx {
		d := prev.Devices[i]
		d.SetProblem(status[k])
		s.applyFault(&d)
		if d.Problem == prev.Devices[i].Problem {
			continue
		}
		if snap == nil {
			snap = &Snapshot{Replicas: prev.Replicas, Devices: slices.Clone(prev.Devices)}
		}
		snap.Devices[i] = d
	}
	if snap == nil {
		s.mu.Unlock()
		return
	}
	s.current = snap
	s.mu.Unlock()
	for _, i := range idx {
		s.logHealth(prev, snap, i)
	}
	latest.Send(out, snap)
}

// logHealth logs device i of snap when its health differs from prev's.
func (s *Source) logHealth(prev, snap *Snapshot, i int) {
	d := snap.Devices[i]
	if prev != nil && i < len(prev.Devices) && prev.Devices[i].Name == d.Name && prev.Devices[i].Healthy == d.Healthy {
		return
	}
	l := s.log.WithField("device", d.Name)
	if d.Healthy {
		l.Info("device healthy")
	} else {
		l.WithField("cause", d.Problem.Cause.String()).WithField("reason", d.Problem.String()).Warn("device unhealthy")
	}
}

// publish rescans every device and sends the snapshot if it differs from
// the last one.
func (s *Source) publish(out chan *Snapshot) { s.publishAll(out, false) }

// publishAll rescans every device and sends the snapshot if it differs
// from the last one, or if force.
func (s *Source) publishAll(out chan *Snapshot, force bool) {
	s.fullScans.Add(1)
	snap := s.scan()
	s.mu.Lock()
	snap = s.withConflicts(snap)
	prev := s.current
	if !force && Equal(prev, snap) {
		s.mu.Unlock()
		return
	}
	s.current = snap
	s.mu.Unlock()
	for i := range snap.Devices {
		s.logHealth(prev, snap, i)
	}
	latest.Send(out, snap)
}
