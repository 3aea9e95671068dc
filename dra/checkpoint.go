package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
)

// CheckpointVersion is the version of the checkpoint file format.
const CheckpointVersion = 1

// ErrCheckpoint is returned for a checkpoint file that cannot be read (of
// another version, or not JSON): the driver does not start rather than
// forget which claims it prepared.
var ErrCheckpoint = errors.New("unreadable claim checkpoint")

// checkpointFile is the checkpoint on disk.
type checkpointFile struct {
	Version int                         `json:"version"`
	Claims  map[types.UID]PreparedClaim `json:"claims"`
}

// PreparedClaim is a claim the driver prepared, as the checkpoint keeps
// it: enough to answer a second Prepare without running the steps again,
// and to unprepare it after a restart.
type PreparedClaim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// BootID is the kernel's boot ID when it was prepared: after a reboot
	// the devices are prepared again.
	BootID string `json:"bootID,omitempty"`
	// ClaimSpec is the per-claim CDI spec ("" for none).
	ClaimSpec string `json:"claimSpec,omitempty"`
	// PrepareAgain: the driver found the claim's spec gone when it started
	// (the CDI dir, a tmpfs, was emptied: a reboot, also one the boot ID
	// does not tell); its devices are prepared again at the next Prepare.
	PrepareAgain bool             `json:"prepareAgain,omitempty"`
	Devices      []PreparedDevice `json:"devices"`
}

// PreparedDevice is one allocated device of a prepared claim.
type PreparedDevice struct {
	// Resource is the extended resource, ID the device's ID (its CDI
	// device name in the resource's spec).
	Resource string `json:"resource"`
	ID       string `json:"id"`
	// Pool, Device and Requests are the allocation result's.
	Pool     string   `json:"pool"`
	Device   string   `json:"device"`
	Requests []string `json:"requests"`
	// CDIDeviceIDs are what Prepare returned for it.
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	// AdminAccess: the claim has admin access; the device is neither
	// prepared nor reset for it, and others may hold it.
	AdminAccess bool `json:"adminAccess,omitempty"`
}

// Checkpoint is the claims the driver prepared, kept in a file (atomicfile:
// complete, with its mode, durable once a save returns) so that they
// survive driver restarts and reboots. Its methods may be called from any
// goroutine.
type Checkpoint struct {
	path string

	mu     sync.Mutex
	claims map[types.UID]PreparedClaim
}

// NewCheckpoint returns the checkpoint kept in path; it touches nothing on
// disk (Load reads it).
func NewCheckpoint(path string) *Checkpoint {
	return &Checkpoint{path: path, claims: map[types.UID]PreparedClaim{}}
}

// Path is the checkpoint's file.
func (c *Checkpoint) Path() string { return c.path }

// TempPattern is the glob of the temp files a killed save may have left.
func (c *Checkpoint) TempPattern() string { return atomicfile.TempPattern(c.path) }

// Load reads the file; a missing one is an empty checkpoint.
func (c *Checkpoint) Load() error {
	data, err := os.ReadFile(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("claim checkpoint: %w", err)
	}
	var f checkpointFile
	if err := json.Unmarshal(data, &f); err != nil {
		return fmt.Errorf("%w %s: %w", ErrCheckpoint, c.path, err)
	}
	if f.Version != CheckpointVersion {
		return fmt.Errorf("%w %s: version %d, this driver reads %d", ErrCheckpoint, c.path, f.Version, CheckpointVersion)
	}
	if f.Claims == nil {
		f.Claims = map[types.UID]PreparedClaim{}
	}
	c.mu.Lock()
	c.claims = f.Claims
	c.mu.Unlock()
	return nil
}

// Claims returns a copy of the prepared claims.
func (c *Checkpoint) Claims() map[types.UID]PreparedClaim {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[types.UID]PreparedClaim, len(c.claims))
	for k, v := range c.claims {
		out[k] = v
	}
	return out
}

// Save replaces the prepared claims with claims, on disk first: when Save
// fails, nothing changed.
func (c *Checkpoint) Save(claims map[types.UID]PreparedClaim) error {
	data, err := json.MarshalIndent(checkpointFile{Version: CheckpointVersion, Claims: claims}, "", "  ")
	if err != nil {
		return fmt.Errorf("claim checkpoint: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(c.path), 0o700); err != nil {
		return fmt.Errorf("claim checkpoint: %w", err)
	}
	if err := atomicfile.WriteBytes(c.path, data, 0o600); err != nil {
		return fmt.Errorf("claim checkpoint: %w", err)
	}
	c.mu.Lock()
	c.claims = claims
	c.mu.Unlock()
	return nil
}

// Held returns the IDs of the devices of resource that prepared claims
// hold, sorted (for background recovery and forgetting: see
// resource.Options.Holders).
func (c *Checkpoint) Held(resource string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, pc := range c.claims {
		for _, d := range pc.Devices {
			if d.Resource == resource {
				out = append(out, d.ID)
			}
		}
	}
	sort.Strings(out)
	return out
}
