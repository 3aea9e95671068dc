package device

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
)

// RegistryVersion is the version of the registry file format.
const RegistryVersion = 1

// ErrRegistryVersion is returned for a registry written by another version
// of the format (a newer plugin, before a downgrade).
var ErrRegistryVersion = errors.New("unknown registry version")

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
}

// loadRegistry restores the host devices seen by earlier runs. A missing
// file is an empty registry; an unreadable one is logged, kept aside as
// <file>.corrupt, and replaced. Entries that the configuration no longer
// gives (another ID prefix or node name, a path no glob matches) are
// dropped, but their indexes are not given to anyone else.
func (s *Source) loadRegistry() error {
	if s.opts.Registry == "" {
		return nil
	}
	data, err := os.ReadFile(s.opts.Registry)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("device registry: %w", err)
	}
	var f registryFile
	if err := json.Unmarshal(data, &f); err != nil {
		aside := s.opts.Registry + ".corrupt"
		s.log.WithError(err).WithField("kept", aside).Warn("unreadable device registry; starting afresh")
		if err := os.Rename(s.opts.Registry, aside); err != nil {
			return fmt.Errorf("device registry: %w", err)
		}
		return nil
	}
	if f.Version != RegistryVersion {
		return fmt.Errorf("device registry %s: version %d: %w (this plugin reads version %d)", s.opts.Registry, f.Version, ErrRegistryVersion, RegistryVersion)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range f.Devices {
		s.nextIndex = max(s.nextIndex, e.Index+1)
		if !s.disc.registered(s, e) || e.Index < 0 || (e.Type != Char && e.Type != Block) {
			s.log.WithField("device", e.ID).WithField("path", e.Path).Info("forgetting a host device the configuration no longer gives")
			continue
		}
		if _, dup := s.known[e.Path]; dup {
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
		s.known[e.Path] = d
	}
	return nil
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
		e := registryEntry{Path: rel, ID: d.Name, Index: d.Index, Type: d.Type, Major: d.Major, Minor: d.Minor, Node: s.disc.node(s, d)}
		if id := d.Identity.recorded(); id != (recordedIdentity{}) {
			e.Identity = &id
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
