package device

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/inotify"
)

// simulated devices are Count nodes <DevRoot>/<FilePrefix>-<i> that the
// source makes itself: device i is node i, healthy while that node is
// there with the configured type and numbers. An event naming one node
// re-checks that device alone (nodePatcher).
type simulated struct{}

// prepare creates the nodes (idempotently): a correct node is kept, a
// missing or wrong one made again.
func (simulated) prepare(s *Source) error {
	created := 0
	for i := 0; i < s.opts.Count; i++ {
		rel := simRel(s, i)
		wrote, err := EnsureNode(s.root, rel, s.opts.Type, s.opts.Major, s.opts.Minor)
		if err != nil {
			return fmt.Errorf("device node %s: %w", rel, err)
		}
		if wrote {
			created++
			s.log.WithField("device", s.deviceName(strconv.Itoa(i))).Debugf("created device node %s", filepath.Join(s.root, rel))
		}
	}
	if created > 0 {
		s.log.WithField("created", created).WithField("devices", s.opts.Count).Info("device nodes created or repaired")
	}
	return nil
}

func (simulated) scan(s *Source, snap *Snapshot) *Snapshot {
	snap.Devices = make([]Device, s.opts.Count)
	for i := range snap.Devices {
		rel := simRel(s, i)
		d := Device{
			Name:          s.deviceName(strconv.Itoa(i)),
			Index:         i,
			HostPath:      filepath.Join(s.root, rel),
			ContainerPath: filepath.Join(s.opts.ContainerDevRoot, rel),
			Type:          s.opts.Type,
			Major:         s.opts.Major,
			Minor:         s.opts.Minor,
			NUMANode:      NoNUMA,
		}
		if s.opts.NUMANodes > 0 {
			d.NUMANode = i * s.opts.NUMANodes / s.opts.Count
		}
		d.SetProblem(nodeStatus(d.HostPath, d.Type, d.Major, d.Minor))
		snap.Devices[i] = d
	}
	return snap
}

// watchDirs: the directory of the nodes.
func (simulated) watchDirs(s *Source) []string { return []string{simDir(s)} }

// tempPattern globs the temp nodes a killed run may have left beside the
// nodes.
func (simulated) tempPattern(s *Source) string {
	return atomicfile.TempPattern(filepath.Join(s.root, s.opts.FilePrefix+"-*"))
}

// nodeEvents: events naming nodes in the nodes' directory give their
// devices; any other event that may matter (the directory itself, another
// directory, an overflow) asks for a full rescan. Entries of the nodes'
// directory that are no node (temp files, other devices) change nothing.
func (simulated) nodeEvents(s *Source, evs []inotify.Event) ([]int, bool) {
	nodeDir := simDir(s)
	var idx []int
	for _, e := range evs {
		if e.Mask&unix.IN_Q_OVERFLOW != 0 || e.Dir != nodeDir || e.Name == "" {
			return nil, false
		}
		if i, ok := simIndex(s, e.Name); ok && !slices.Contains(idx, i) {
			idx = append(idx, i)
		}
	}
	return idx, true
}

// nodeHealth: device d's node as it is now.
func (simulated) nodeHealth(_ *Source, d Device) Problem {
	return nodeStatus(d.HostPath, d.Type, d.Major, d.Minor)
}

// simRel is node i, relative to the dev root.
func simRel(s *Source, i int) string { return s.opts.FilePrefix + "-" + strconv.Itoa(i) }

// simDir is the directory of the nodes.
func simDir(s *Source) string { return filepath.Dir(filepath.Join(s.root, s.opts.FilePrefix)) }

// simIndex is the index of the node named name in its directory (<base of
// FilePrefix>-<i>, 0 <= i < Count).
func simIndex(s *Source, name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, filepath.Base(s.opts.FilePrefix)+"-")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || i >= s.opts.Count || strconv.Itoa(i) != rest {
		return 0, false
	}
	return i, true
}
