package device

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
)

// RegistryVersion is the version of the registry file format.
const RegistryVersion = 1

// ErrRegistryVersion is returned for a registry written by another version
// of the format (a newer plugin, before a downgrade).
var ErrRegistryVersion = errors.New("unknown registry version")

// ErrRegistry is returned by Prepare for a registry file that cannot be
// used as it is (it does not parse, or repeats an index, ID or key; or it
// is missing or lists no device while the resource's CDI spec may
// describe devices) and cannot be rebuilt from the resource's CDI spec
// (Options.Described): handing its IDs and indexes out again in discovery
// order could give an ID a container holds to other hardware, so the
// source refuses to start, and leaves the file as it is.
var ErrRegistry = errors.New("unusable device registry")

// ErrNoSpec is what Options.Described's error wraps when the resource has
// no CDI spec on disk: nothing describes its devices.
var ErrNoSpec = errors.New("no CDI spec")

// ErrForeignSpec is what Options.Described's error wraps when the CDI spec
// on disk is not the resource's own (another deployment's, another
// owner's: a plugin renamed, or run in a namespace since): what it
// describes are not its devices.
var ErrForeignSpec = errors.New("a CDI spec that is not ours")

// Described is a device as the resource's CDI spec on disk describes it,
// written by an earlier run (Options.Described).
type Described struct {
	// Name is its ID.
	Name string
	// Index is its index when the spec says it (its <envPrefix>_<index>
	// variable), else -1. A device found by identity has it in its name.
	Index int
	// Node is its own node (absolute host path, type, numbers).
	Node Node
	// Identity is what its annotations say (devices found by identity).
	Identity Identity
}

// recoveredKey is the registry key of a device rebuilt from the spec whose
// discovery key is not known yet: it is adopted by the first device found
// that is the same hardware (sameHardware). No discovery key starts so.
const recoveredKey = "recovered:"

// registryFile is what Options.Registry holds: every host device a
// resource has seen, with the ID and index it was given.
type registryFile struct {
	Version int             `json:"version"`
	Devices []registryEntry `json:"devices"`
}

type registryEntry struct {
	// Path is relative to the dev root.
	Path  string   `json:"path"`
	ID    string   `json:"id"`
	Index int      `json:"index"`
	Type  NodeType `json:"type"`
	Major uint32   `json:"major"`
	Minor uint32   `json:"minor"`
	// Node is the own node of a discovered device (pci, usb), relative
	// to the dev root; Path is then its key, "<kind>/<key>".
	Node string `json:"node,omitempty"`
	// Identity is what a discovered device must stay (see
	// recordedIdentity); absent in registries of earlier versions, and
	// then taken from the first found.
	Identity *recordedIdentity `json:"identity,omitempty"`
	// Port is the port a USB device was last found at (Identity.USBPort),
	// which tells it from others with its vendor, product and serial
	// (matchUSB); absent in registries of earlier versions.
	Port string `json:"port,omitempty"`
	// Described is the whole identity of a device rebuilt from the spec
	// that waits for its hardware (a key starting recoveredKey), which
	// sameHardware compares.
	Described *Identity `json:"described,omitempty"`
}

// loadRegistry restores the host devices seen by earlier runs. A registry
// that is missing, or that lists no device, is no first start while the
// resource's CDI spec describes devices: it is rebuilt from the spec
// (rebuildRegistry), as one that does not parse, or that gives one index,
// ID or key to two entries; or refused (ErrRegistry). Entries that the
// configuration no longer gives (another ID prefix or node name, a path
// no glob matches) are dropped, but their indexes are not given to anyone
// else.
func (s *Source) loadRegistry() error {
	if s.opts.Registry == "" {
		return nil
	}
	data, err := os.ReadFile(s.opts.Registry)
	if errors.Is(err, fs.ErrNotExist) {
		return s.rebuildRegistry(lostRegistry{why: "is missing"})
	}
	if err != nil {
		return fmt.Errorf("device registry: %w", err)
	}
	var f registryFile
	if err := json.Unmarshal(data, &f); err != nil {
		return s.rebuildRegistry(lostRegistry{why: fmt.Sprintf("does not parse (%v)", err), present: true, broken: true})
	}
	if f.Version != RegistryVersion {
		return fmt.Errorf("device registry %s: version %d: %w (this plugin reads version %d)", s.opts.Registry, f.Version, ErrRegistryVersion, RegistryVersion)
	}
	if len(f.Devices) == 0 {
		return s.rebuildRegistry(lostRegistry{why: "lists no device", present: true})
	}
	if why := repeated(f.Devices); why != "" {
		return s.rebuildRegistry(lostRegistry{why: why, present: true, broken: true})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range f.Devices {
		s.nextIndex = max(s.nextIndex, e.Index+1)
		if !s.disc.registered(s, e) || e.Index < 0 || (e.Type != Char && e.Type != Block) {
			s.log.WithField("device", e.ID).WithField("path", e.Path).Info("forgetting a host device the configuration no longer gives")
			continue
		}
		rel := s.disc.entryNode(e)
		d := Device{
			Name: e.ID, Index: e.Index, HostPath: filepath.Join(s.root, rel), ContainerPath: s.containerPath(e.Index, rel),
			Type: e.Type, Major: e.Major, Minor: e.Minor, NUMANode: NoNUMA,
		}
		if e.Identity != nil {
			e.Identity.set(&d.Identity)
		}
		d.Identity.USBPort = e.Port
		if e.Described != nil && strings.HasPrefix(e.Path, s.opts.DiscoverKind+"/"+recoveredKey) {
			d.Identity, s.recovered = *e.Described, true
		}
		s.known[e.Path] = d
	}
	return nil
}

// repeated says which index, ID or key two entries of a registry have
// ("" when none): such a registry would give one ID to two devices.
func repeated(entries []registryEntry) string {
	index, id, key := map[int]string{}, map[string]bool{}, map[string]bool{}
	for _, e := range entries {
		switch {
		case index[e.Index] != "":
			return fmt.Sprintf("gives index %d to %s and %s", e.Index, index[e.Index], e.Path)
		case id[e.ID]:
			return fmt.Sprintf("gives ID %s to two entries", e.ID)
		case key[e.Path]:
			return fmt.Sprintf("lists %s twice", e.Path)
		}
		index[e.Index], id[e.ID], key[e.Path] = e.Path, true, true
	}
	return ""
}

// matchesGlob reports whether rel is a clean path inside the root that one
// of the host globs matches.
func (s *Source) matchesGlob(rel string) bool {
	if rel == "" || filepath.IsAbs(rel) || filepath.Clean(rel) != rel || rel == ".." || strings.HasPrefix(rel, "../") {
		return false
	}
	for _, g := range s.opts.HostGlobs {
		if ok, _ := filepath.Match(g, rel); ok {
			return true
		}
	}
	return false
}

// saveRegistry writes the known host devices (s.mu held). A failure is
// logged: the devices are still served, their indexes may then differ
// after a restart.
func (s *Source) saveRegistry() {
	if s.opts.Registry == "" {
		return
	}
	f := registryFile{Version: RegistryVersion, Devices: make([]registryEntry, 0, len(s.known))}
	for rel, d := range s.known {
		e := registryEntry{Path: rel, ID: d.Name, Index: d.Index, Type: d.Type, Major: d.Major, Minor: d.Minor, Node: s.disc.node(s, d), Port: d.Identity.USBPort}
		if id := d.Identity.recorded(); id != (recordedIdentity{}) {
			e.Identity = &id
		}
		if strings.HasPrefix(rel, s.opts.DiscoverKind+"/"+recoveredKey) {
			id := d.Identity
			e.Described = &id
		}
		f.Devices = append(f.Devices, e)
	}
	slices.SortFunc(f.Devices, func(a, b registryEntry) int { return a.Index - b.Index })
	data, err := json.MarshalIndent(f, "", "  ")
	if err == nil {
		// Only the plugin reads its registry.
		if err = os.MkdirAll(filepath.Dir(s.opts.Registry), 0o700); err == nil {
			err = atomicfile.WriteBytes(s.opts.Registry, append(data, '\n'), 0o600)
		}
	}
	if err != nil {
		s.log.WithError(err).Warn("saving the device registry failed; indexes may change after a restart")
	}
}

// lostRegistry is why the registry cannot be used as it is: why (said
// after its name), whether the file is there (present), and whether it is
// broken (it does not parse, or repeats an entry): a registry that is
// missing or lists no device is a first start when nothing describes
// devices; a broken one never is.
type lostRegistry struct {
	why             string
	present, broken bool
}

// rebuildRegistry rebuilds a registry that cannot be used as it is (lost
// says why) from the devices the resource's CDI spec on disk describes
// (Options.Described), which name every device an earlier run
// advertised, and so every ID a container can hold: each keeps its ID and
// index, and new devices get indexes above theirs. A glob device is keyed
// by its node; a device found by identity waits, as a vanished one, for
// the first device found that is the same hardware (sameHardware), which
// takes its ID and index. A file that is there is kept aside as
// <file>.corrupt. A registry that is missing or lists no device, with no
// spec of the resource's own (ErrNoSpec, ErrForeignSpec) or one that
// describes none of the resource's devices, is a first start. Otherwise,
// without a spec that can be trusted (none, not ours, one that does not
// parse, an index it does not say), it refuses with ErrRegistry and
// touches nothing.
func (s *Source) rebuildRegistry(lost lostRegistry) error {
	refuse := func(why string) error {
		out := "only if no pod holds a device of this resource, remove the resource's CDI spec, then start again"
		if lost.present {
			out = fmt.Sprintf("only if no pod holds a device of this resource, remove %s and the resource's CDI spec, then start again", s.opts.Registry)
		}
		return fmt.Errorf("device registry %s %s, and cannot be rebuilt: %s: %w; it keeps the IDs and indexes that containers hold: %s",
			s.opts.Registry, lost.why, why, ErrRegistry, out)
	}
	if s.opts.Described == nil {
		if !lost.broken {
			return nil // nothing describes devices: a first start
		}
		return refuse("no CDI spec to rebuild it from")
	}
	descs, err := s.opts.Described()
	if (errors.Is(err, ErrNoSpec) || errors.Is(err, ErrForeignSpec)) && !lost.broken {
		if errors.Is(err, ErrForeignSpec) {
			s.log.WithError(err).WithField("registry", s.opts.Registry).WithField("reason", lost.why).
				Warn("the device registry is lost and the resource's CDI spec is not ours: a first start")
		}
		return nil
	}
	if err != nil {
		return refuse(err.Error())
	}
	known := map[string]Device{}
	indexes := map[int]string{}
	next := 0
	for _, ds := range descs {
		rel, err := filepath.Rel(s.root, ds.Node.HostPath)
		if err != nil || rel == "." || filepath.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") {
			return refuse(fmt.Sprintf("the spec's device %s has its node %s outside the dev root", ds.Name, ds.Node.HostPath))
		}
		key, index := "", ds.Index
		if s.opts.Discover != nil {
			n, err := strconv.Atoi(strings.TrimPrefix(ds.Name, s.deviceName("")))
			if err != nil || n < 0 || s.deviceName(strconv.Itoa(n)) != ds.Name {
				continue // not one of ours (another ID prefix or node name)
			}
			key, index = s.opts.DiscoverKind+"/"+recoveredKey+ds.Name, n
		} else {
			if ds.Name != s.deviceName(HostSuffix(rel)) {
				continue // an earlier version's ID kept resolvable, or not ours
			}
			if index < 0 {
				return refuse(fmt.Sprintf("the spec does not say the index of %s (a resource without envPrefix)", ds.Name))
			}
			key = rel
		}
		if other, dup := indexes[index]; dup {
			return refuse(fmt.Sprintf("the spec gives index %d to %s and %s", index, other, ds.Name))
		}
		indexes[index] = ds.Name
		next = max(next, index+1)
		known[key] = Device{
			Name: ds.Name, Index: index, HostPath: ds.Node.HostPath, ContainerPath: s.containerPath(index, rel),
			Type: ds.Node.Type, Major: ds.Node.Major, Minor: ds.Node.Minor, NUMANode: NoNUMA, Identity: ds.Identity,
		}
	}
	if len(known) == 0 && !lost.broken {
		return nil // the spec describes none of ours: a first start
	}
	log := s.log.WithField("reason", lost.why).WithField("devices", len(known))
	if lost.present {
		aside := s.opts.Registry + ".corrupt"
		if err := os.Rename(s.opts.Registry, aside); err != nil {
			return fmt.Errorf("device registry: %w", err)
		}
		log = log.WithField("kept", aside)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.known, s.nextIndex, s.recovered = known, next, true
	s.saveRegistry()
	log.Warn("the device registry could not be used as it is; rebuilt from the CDI spec, every device keeps its ID and index")
	return nil
}

// adopt gives a device found under key k, unknown, the ID and index of the
// device rebuilt from the spec that is the same hardware, if exactly one
// is; s.mu is held.
func (s *Source) adopt(k string, c candidate) (Device, bool) {
	if !s.recovered {
		return Device{}, false
	}
	var match string
	waiting := false
	for key, d := range s.known {
		if !strings.HasPrefix(key, s.opts.DiscoverKind+"/"+recoveredKey) {
			continue
		}
		waiting = true
		if !s.sameHardware(d, c) {
			continue
		}
		if match != "" {
			return Device{}, false // two could be it: neither is
		}
		match = key
	}
	s.recovered = waiting
	if match == "" {
		return Device{}, false
	}
	d := s.known[match]
	delete(s.known, match)
	delete(s.goneSince, match)
	s.log.WithField("device", d.Name).WithField("key", k).Info("a device of the rebuilt registry found again")
	return d, true
}

// sameHardware reports whether found device c is d, a device the spec
// described: the same PCI address; the same USB vendor, product, serial
// and bus and device numbers; or else the same own node and identity.
func (s *Source) sameHardware(d Device, c candidate) bool {
	was, now := d.Identity, c.identity
	switch {
	case was.PCIAddress != "":
		return was.PCIAddress == now.PCIAddress
	case was.USBBus > 0:
		return was.USBVendor == now.USBVendor && was.USBProduct == now.USBProduct && was.USBSerial == now.USBSerial &&
			was.USBBus == now.USBBus && was.USBDevice == now.USBDevice
	}
	return d.HostPath == filepath.Join(s.root, c.node.HostPath) && was.recorded() == now.recorded()
}
