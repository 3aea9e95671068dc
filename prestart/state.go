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
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Device status values.
const (
	StatusNew    = "new"
	StatusReady  = "ready"
	StatusFailed = "failed"
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

// State is a device's state as written to <dir>/state.json.
type State struct {
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
	return s, nil
}

// Save writes the state atomically: a synced temp file renamed in place.
func (s *State) Save(dir string) error {
	s.UpdatedAt = time.Now().UTC()
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, StateFile), append(data, '\n'), 0o644)
}

// writeAtomic writes data to path through a synced temp file and rename,
// so readers see the old or the new content, never a part.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	return replaceFile(path, mode, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// replaceFile replaces path with what fill writes: a temp file in the same
// directory, synced, given mode, renamed over path. On any error the temp
// file is removed and path is untouched.
func replaceFile(path string, mode os.FileMode, fill func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	werr := fill(f)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp, mode)
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, werr)
	}
	return nil
}
