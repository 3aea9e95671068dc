package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
)

// CheckpointVersion is the version of the checkpoint file format the
// driver writes. Version 2 adds the driver name and the state of an
// Unprepare under way; version-1 files are read as they are (no driver
// name: the driver that starts takes them over).
const CheckpointVersion = 2

// checkpointVersionsRead are the versions Load reads.
var checkpointVersionsRead = []int{1, CheckpointVersion}

// ErrCheckpoint is returned for a checkpoint file that cannot be read (of
// another version, or not JSON): the driver does not start rather than
// forget which claims it prepared.
var ErrCheckpoint = errors.New("unreadable claim checkpoint")

// ErrCheckpointLost is returned by Run when the checkpoint file is gone
// while prepared claims of the driver are still on the node.
var ErrCheckpointLost = errors.New("the claim checkpoint is missing, but prepared claims of the driver remain on the node")

// ErrOtherDriver is returned by Adopt for a checkpoint whose prepared
// claims were prepared under another driver name: the kubelet knows them
// by that name and would unprepare them through it, never through this
// one.
var ErrOtherDriver = errors.New("the claim checkpoint holds claims prepared under another driver name")

// checkpointFile is the checkpoint on disk.
type checkpointFile struct {
	Version int `json:"version"`
	// DriverName is the driver the claims were prepared by ("" in
	// version 1).
	DriverName string                      `json:"driverName,omitempty"`
	Claims     map[types.UID]PreparedClaim `json:"claims"`
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
	PrepareAgain bool `json:"prepareAgain,omitempty"`
	// Unpreparing: an Unprepare of the claim began (recorded, durably,
	// before it reset a device or removed the claim's spec). A driver that
	// stopped during it finds the claim so at its next start: its spec
	// missing is no reboot, and the retried Unprepare completes it.
	Unpreparing bool `json:"unpreparing,omitempty"`
	// PreBind: the driver prepared the claim before the scheduler bound
	// its pod (a resource with PrepareBeforeBind), and the kubelet has not
	// asked for it yet: a claim deallocated meanwhile is released by the
	// driver (prebind.go). The kubelet's Prepare clears it.
	PreBind bool `json:"preBind,omitempty"`
	// PreBinding: its steps are under way (recorded before they start): a
	// driver that stopped in between completes them at its next start,
	// not again on devices they completed on (PreparedDevice.GenBefore).
	PreBinding bool             `json:"preBinding,omitempty"`
	Devices    []PreparedDevice `json:"devices"`
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
	// Reset: the device's reset ran, or began, in an Unprepare of the
	// claim (recorded before it ran): a retried Unprepare does not run it
	// again.
	Reset bool `json:"reset,omitempty"`
	// ShareID is the allocation result's share ID, for a device of a
	// resource with replicas (several claims hold it at once); Shares is
	// how many of its shares the claim takes (0: a device without
	// replicas, held whole). Both are absent from files of drivers that
	// did not publish such devices.
	ShareID string `json:"shareID,omitempty"`
	Shares  int    `json:"shares,omitempty"`
	// GenBefore, for a claim prepared before binding (PreBinding), is the
	// device's preparation count (its state's generation) before its
	// steps ran: a larger one at a restart means they completed.
	GenBefore int64 `json:"genBefore,omitempty"`
}

// Checkpoint is the claims the driver prepared, kept in a file (atomicfile:
// complete, with its mode, durable once a save returns) so that they
// survive driver restarts and reboots. Its methods may be called from any
// goroutine.
type Checkpoint struct {
	path string

	mu sync.Mutex
	// missing: Load found no file (a first start, or a lost one).
	missing bool
	// seen is the file as this instance last read or wrote it (Refresh).
	seen os.FileInfo
	// driver is the driver name recorded (Load) or taken over (Adopt).
	driver string
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

// Load reads the file; a missing one is an empty checkpoint, and Missing
// says so until the first Save: a first start, or a file lost (the
// driver tells them apart by what remains on the node: checkNotLost).
func (c *Checkpoint) Load() error {
	fi, _ := os.Stat(c.path)
	data, err := os.ReadFile(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		c.mu.Lock()
		c.missing = true
		c.mu.Unlock()
		return nil
	}
	if err != nil {
		return fmt.Errorf("claim checkpoint: %w", err)
	}
	var f checkpointFile
	if err := json.Unmarshal(data, &f); err != nil {
		return fmt.Errorf("%w %s: %w", ErrCheckpoint, c.path, err)
	}
	if !slices.Contains(checkpointVersionsRead, f.Version) {
		return fmt.Errorf("%w %s: version %d, this driver reads %v", ErrCheckpoint, c.path, f.Version, checkpointVersionsRead)
	}
	if f.Claims == nil {
		f.Claims = map[types.UID]PreparedClaim{}
	}
	c.mu.Lock()
	c.driver, c.claims, c.seen = f.DriverName, f.Claims, fi
	c.mu.Unlock()
	return nil
}

// Refresh reads the file again when it changed since this instance last
// read or wrote it (another file at the path, or another size or time):
// during a rolling update two instances of the driver share it, and the
// kubelet may ask either, so each call starts from what the other saved
// (the helper serialises their calls). A file gone keeps the claims as
// they are: the next Save writes them back.
func (c *Checkpoint) Refresh() error {
	fi, err := os.Stat(c.path)
	if err != nil {
		return nil //nolint:nilerr // gone: keep what is known
	}
	c.mu.Lock()
	same := c.seen != nil && os.SameFile(c.seen, fi) && c.seen.Size() == fi.Size() && c.seen.ModTime().Equal(fi.ModTime())
	c.mu.Unlock()
	if same {
		return nil
	}
	return c.Load()
}

// Missing reports whether Load found no file and nothing was saved since.
func (c *Checkpoint) Missing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.missing
}

// DriverName is the driver name the checkpoint records ("" for a version-1
// file, or a new checkpoint, not adopted yet).
func (c *Checkpoint) DriverName() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.driver
}

// Adopt makes driver the checkpoint's driver name, which the next Save
// records, after Load: a checkpoint of no name (version 1, or none on
// disk), of the same name, or of another name that holds no claim is
// taken over. One that holds claims prepared under another name is
// refused with ErrOtherDriver and a message saying what to do: the
// kubelet unprepares a claim through the driver name that prepared it,
// so under a new name those claims would hold their devices forever.
// The default driver name (DefaultDriverName) changes when the
// configuration's resources are reordered.
func (c *Checkpoint) Adopt(driver string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.driver != "" && c.driver != driver && len(c.claims) > 0 {
		var names []string
		for _, pc := range c.claims {
			names = append(names, pc.Namespace+"/"+pc.Name)
		}
		sort.Strings(names)
		return fmt.Errorf("%w: %s holds %d claims prepared by driver %q (%s), and this driver is named %q "+
			"(the default name is that of the first resource published: were the resources reordered?): "+
			"start it with --driver-name %s (DRIVER_NAME) until those claims are unprepared (their pods gone), "+
			"or drain the node, then start it under the new name",
			ErrOtherDriver, c.path, len(names), c.driver, strings.Join(names, ", "), driver, c.driver)
	}
	c.driver = driver
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
	c.mu.Lock()
	driver := c.driver
	c.mu.Unlock()
	data, err := json.MarshalIndent(checkpointFile{Version: CheckpointVersion, DriverName: driver, Claims: claims}, "", "  ")
	if err != nil {
		return fmt.Errorf("claim checkpoint: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(c.path), 0o700); err != nil {
		return fmt.Errorf("claim checkpoint: %w", err)
	}
	if err := atomicfile.WriteBytes(c.path, data, 0o600); err != nil {
		return fmt.Errorf("claim checkpoint: %w", err)
	}
	fi, _ := os.Stat(c.path)
	c.mu.Lock()
	// A copy: the caller may go on changing its map (Unprepare saves a
	// mark, then drops the claim from the same map), which Claims must
	// not see until it is saved.
	c.claims, c.missing, c.seen = maps.Clone(claims), false, fi
	c.mu.Unlock()
	return nil
}

// Held returns the IDs of the devices of resource that prepared claims
// hold, sorted, each once (for background recovery and forgetting: see
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
	return slices.Compact(out) // a shared device held by several claims: once
}
