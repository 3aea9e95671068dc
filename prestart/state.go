// Package prestart prepares devices before every container start
// (PreStartContainer): an ordered list of steps (reset, reprogram, exec) per
// resource, run under a time budget, devices in parallel, with each
// device's state kept in a directory that is mounted read-only into the
// container.
package prestart

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
)

// Device status values.
const (
	StatusNew    = "new"
	StatusReady  = "ready"
	StatusFailed = "failed"
	// StatusUnprepared: a preparation was cancelled by its caller (the
	// kubelet went away, or a reload restarted the resource) and its steps
	// may have half-run. Not a fault: the device keeps its health, and the
	// next container start prepares it again.
	StatusUnprepared = "unprepared"
)

// StateFile is the state's file name in the device's state directory.
const StateFile = "state.json"

// Firmware is what a reprogram step loaded.
type Firmware struct {
	Name   string    `json:"name"`
	SHA256 string    `json:"sha256"`
	Size   int64     `json:"size"`
	At     time.Time `json:"loadedAt"`
}

// StateVersion is the version of the state file format. A file without a
// version was written by an older plugin, in this format.
const StateVersion = 1

// ErrStateVersion is returned for a state file of another format version
// (a newer plugin's, before a downgrade): it is neither read nor replaced.
var ErrStateVersion = errors.New("unknown device state version")

// State is a device's state as written to <dir>/state.json.
type State struct {
	Version  int    `json:"version"`
	Device   string `json:"device"`
	Resource string `json:"resource"`
	Status   string `json:"status"`
	// Generation counts successful preparations.
	Generation int64     `json:"generation"`
	ResetCount int64     `json:"resetCount"`
	LastReset  time.Time `json:"lastReset,omitzero"`
	Firmware   *Firmware `json:"firmware,omitempty"`
	// LastError is the cause of the last failed preparation ("" after a
	// successful one).
	LastError  string    `json:"lastError,omitempty"`
	PreparedAt time.Time `json:"preparedAt,omitzero"`
	UpdatedAt  time.Time `json:"updatedAt"`
}

// LoadState reads the state in dir; a missing file gives a new state.
func LoadState(dir string) (State, error) {
	data, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return State{Status: StatusNew}, nil
	}
	if err != nil {
		return State{}, err
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return State{}, fmt.Errorf("%s: %w", filepath.Join(dir, StateFile), err)
	}
	if s.Version != 0 && s.Version != StateVersion {
		return State{}, fmt.Errorf("%s: version %d: %w (this plugin reads version %d)", filepath.Join(dir, StateFile), s.Version, ErrStateVersion, StateVersion)
	}
	s.Version = StateVersion
	return s, nil
}

// Save writes the state atomically: a synced temp file renamed in place.
func (s *State) Save(dir string) error {
	s.Version = StateVersion
	s.UpdatedAt = time.Now().UTC()
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteBytes(filepath.Join(dir, StateFile), append(data, '\n'), 0o644)
}

// CorruptSuffix is appended to the name of an unreadable state file that
// is kept aside for inspection.
const CorruptSuffix = ".corrupt"

// loadOrAside reads the state in dir. An unreadable state file is not
// fatal, wherever it is met: it is logged, kept aside as
// state.json.corrupt (replacing an older one), and a new state is
// returned.
func loadOrAside(dir string, log *logrus.Entry) (State, error) {
	st, err := LoadState(dir)
	if err == nil || errors.Is(err, ErrStateVersion) {
		return st, err
	}
	p := filepath.Join(dir, StateFile)
	if rerr := os.Rename(p, p+CorruptSuffix); rerr != nil {
		return State{}, fmt.Errorf("%w (and keeping it aside: %w)", err, rerr)
	}
	log.WithError(err).WithField("kept", p+CorruptSuffix).Warn("unreadable device state; kept aside, starting afresh")
	return State{Status: StatusNew}, nil
}
