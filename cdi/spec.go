// Package cdi builds CDI specs from device snapshots, validates them with the
// CDI library's parser and spec checks, and writes them atomically
// (Spec.Write, through internal/atomicfile). It knows nothing of gRPC.
package cdi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/inotify"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// Spec-level annotations that mark a spec as ours.
const (
	// OwnerAnnotation names the deployment that wrote the spec: the plugin
	// name, qualified by the namespace when it runs in a pod.
	OwnerAnnotation    = "cdi-device-plugin/owner"
	ResourceAnnotation = "cdi-device-plugin/resource"
	// StartedAnnotation is when the writing process started (Unix ns):
	// of two processes writing the same spec, the newer one wins.
	StartedAnnotation = "cdi-device-plugin/started"
	// SocketAnnotation is the plugin socket the writing process serves
	// for the resource (unique per process start): while nobody serves
	// it, the process is gone, and an older one may take the spec over.
	SocketAnnotation = "cdi-device-plugin/socket"
)

// specMode is the mode of written specs: containerd and tools running as
// other users must be able to read them.
const specMode = 0o644

// Kind is a validated CDI vendor and class.
type Kind struct {
	Vendor, Class string
}

// NewKind validates vendor and class.
func NewKind(vendor, class string) (Kind, error) {
	if err := parser.ValidateVendorName(vendor); err != nil {
		return Kind{}, err
	}
	if err := parser.ValidateClassName(class); err != nil {
		return Kind{}, err
	}
	return Kind{Vendor: vendor, Class: class}, nil
}

// KindFor derives the kind of an extended resource <domain>/<name>: the
// vendor is "k8s." + the domain and the class the name, so the plugin's
// specs never clash with a device vendor's own specs.
func KindFor(domain, name string) (Kind, error) { return NewKind("k8s."+domain, name) }

func (k Kind) String() string { return k.Vendor + "/" + k.Class }

// SpecName is the spec's file name (without extension).
func (k Kind) SpecName() string { return cdi.GenerateSpecName(k.Vendor, k.Class) }

// QualifiedName is the fully qualified CDI name of a device.
func (k Kind) QualifiedName(name string) (string, error) {
	if err := parser.ValidateDeviceName(name); err != nil {
		return "", err
	}
	return parser.QualifiedName(k.Vendor, k.Class, name), nil
}

// Resource is what the spec needs to know about a resource.
type Resource struct {
	// Name is the extended resource name.
	Name string
	Kind Kind
	// EnvPrefix, when set, adds <EnvPrefix>_<index>=<container path>.
	EnvPrefix string
	// StateRoot, when set, holds one state directory per device
	// (<StateRoot>/<device>), mounted read-only at
	// <ContainerStateRoot>/<device>.
	StateRoot string
	// NoStateMount, when set, names the devices whose state directory is
	// unusable (a symlink planted there): their spec mounts none, so that
	// it names no path that is missing or leads elsewhere.
	NoStateMount func(device string) bool
	// Socket is the plugin socket this process serves for the resource,
	// written into the spec (SocketAnnotation) so that an older process
	// can tell whether the newer one that wrote it still runs.
	Socket string
	// Siblings: another process may serve the resource from Socket's
	// directory at the same time (the old and the new instance of the DRA
	// driver during a rolling update), writing the same devices. A spec
	// such a sibling wrote with the devices this process last wrote is
	// taken for this process's own (Check: Intact): neither yields its
	// devices to the other, nor writes the file again.
	Siblings bool
}

// ContainerStateRoot is where device state directories appear in containers.
const ContainerStateRoot = "/run/cdi-device-plugin"

// DeviceEnv is the per-device variable a device carries (empty name when
// the resource has no env prefix).
func DeviceEnv(envPrefix string, d device.Device) (string, string) {
	if envPrefix == "" {
		return "", ""
	}
	return envPrefix + "_" + strconv.Itoa(d.Index), d.ContainerPath
}

// BuildSpec turns a snapshot into a CDI spec owned by owner, written by a
// process started at started (Unix ns).
func BuildSpec(owner string, started int64, r Resource, snap *device.Snapshot) (*specs.Spec, error) {
	spec := &specs.Spec{
		Kind: r.Kind.String(),
		Annotations: map[string]string{
			OwnerAnnotation: owner, ResourceAnnotation: r.Name, StartedAnnotation: strconv.FormatInt(started, 10),
		},
		Devices: make([]specs.Device, 0, len(snap.Devices)),
	}
	if r.Socket != "" {
		spec.Annotations[SocketAnnotation] = r.Socket
	}
	for _, d := range snap.Devices {
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			return nil, fmt.Errorf("device %q: %w", d.Name, err)
		}
		spec.Devices = append(spec.Devices, specs.Device{Name: d.Name, Annotations: d.Identity.Annotations(IdentityAnnotationPrefix), ContainerEdits: deviceEdits(r, d)})
	}
	v, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("spec version: %w", err)
	}
	spec.Version = v
	return spec, nil
}

// IdentityAnnotationPrefix starts the keys of the annotations of a device
// found by its identity: cdi-device-plugin/pci-address and so on.
const IdentityAnnotationPrefix = "cdi-device-plugin/"

// deviceEdits are the container edits of device d: its nodes (its own,
// its other ones, the shared ones), its variable and its state directory.
func deviceEdits(r Resource, d device.Device) specs.ContainerEdits {
	var edits specs.ContainerEdits
	for _, n := range d.AllNodes() {
		edits.DeviceNodes = append(edits.DeviceNodes, &specs.DeviceNode{
			Path:        n.ContainerPath,
			HostPath:    n.HostPath,
			Type:        string(n.Type),
			Major:       int64(n.Major),
			Minor:       int64(n.Minor),
			Permissions: "rw",
		})
	}
	if k, v := DeviceEnv(r.EnvPrefix, d); k != "" {
		edits.Env = []string{k + "=" + v}
	}
	if r.StateRoot != "" && (r.NoStateMount == nil || !r.NoStateMount(d.Name)) {
		edits.Mounts = []*specs.Mount{{
			Type:          "bind",
			HostPath:      filepath.Join(r.StateRoot, d.Name),
			ContainerPath: path.Join(ContainerStateRoot, d.Name),
			Options:       []string{"ro", "nosuid", "nodev", "noexec", "rbind"},
		}}
	}
	return edits
}

// Writer writes and removes the specs of one plugin deployment in one
// directory.
type Writer struct {
	dir     string
	owner   string
	started int64
}

// NewWriter returns a writer for dir; it touches nothing on disk. owner
// marks the specs as ours (it must be unique per deployment); started is
// when this process started (Unix ns), so that a newer process's spec is
// never overwritten by an older one.
func NewWriter(dir, owner string, started int64) *Writer {
	return &Writer{dir: dir, owner: owner, started: started}
}

// Path is the file the spec of kind k is written to.
func (w *Writer) Path(k Kind) string { return filepath.Join(w.dir, k.SpecName()+".json") }

// Spec returns the spec file of resource r.
func (w *Writer) Spec(r Resource) *Spec { return &Spec{w: w, r: r, path: w.Path(r.Kind)} }

// Write builds and writes the spec of r from snap (see Spec.Write).
func (w *Writer) Write(r Resource, snap *device.Snapshot) error { return w.Spec(r).Write(snap) }

// Spec is the spec file of one resource. It remembers what it wrote, so
// that a change by someone else can be told from our own write.
type Spec struct {
	w    *Writer
	r    Resource
	path string

	mu   sync.Mutex
	last []byte
	// empty: the last write had no device, so there is no file (the CDI
	// library refuses a spec without devices).
	empty bool
	// aliases: old names of an earlier version kept resolvable (see
	// SetAliases).
	aliases map[string]string
}

// Path is the spec's file.
func (s *Spec) Path() string { return s.path }

// TempPattern is the glob of the temp files a killed write may have left.
func (s *Spec) TempPattern() string { return atomicfile.TempPattern(s.path) }

// ErrMissingPath is returned when the spec would name a path that does not
// exist (a state directory to mount).
var ErrMissingPath = errors.New("the spec would name a missing path")

// Write builds the spec from snap and replaces the file atomically: the
// spec is checked with the CDI library's rules first, the file appears
// complete with mode 0644, and its content is durable when Write returns.
// Every mount source the spec names must exist (ErrMissingPath otherwise):
// a bind mount from a missing directory fails the container. Without
// devices there is no spec (the CDI library refuses an empty one): the
// file is removed.
func (s *Spec) Write(snap *device.Snapshot) error {
	if len(snap.Devices) == 0 {
		if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove the CDI spec of no devices: %w", err)
		}
		s.mu.Lock()
		s.last, s.empty = nil, true
		s.mu.Unlock()
		return nil
	}
	spec, err := BuildSpec(s.w.owner, s.w.started, s.r, snap)
	if err != nil {
		return err
	}
	s.mu.Lock()
	aliases := s.aliases
	s.mu.Unlock()
	extra, err := aliasDevices(s.r, snap, aliases)
	if err != nil {
		return err
	}
	spec.Devices = append(spec.Devices, extra...)
	if err := validate(spec); err != nil {
		return fmt.Errorf("CDI spec %s: %w", s.path, err)
	}
	for i := range spec.Devices {
		d := &spec.Devices[i]
		for _, m := range d.ContainerEdits.Mounts {
			if fi, err := os.Stat(m.HostPath); err != nil || !fi.IsDir() {
				return fmt.Errorf("device %s: mount source %s: %w", d.Name, m.HostPath, ErrMissingPath)
			}
		}
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("CDI spec %s: %w", s.path, err)
	}
	if err := makeDir(s.w.dir); err != nil {
		return fmt.Errorf("CDI dir: %w", err)
	}
	if err := atomicfile.WriteBytes(s.path, data, specMode); err != nil {
		return fmt.Errorf("write CDI spec: %w", err)
	}
	s.mu.Lock()
	s.last, s.empty = data, false
	s.mu.Unlock()
	return nil
}

// makeDir creates the CDI directory if it is missing, with mode 0755
// whatever the umask: every CDI consumer on the node reads it.
func makeDir(dir string) error {
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.Chmod(dir, 0o755)
}

// validate checks spec as the CDI library checks a spec it reads (version,
// vendor and class, container edits, device names, at least one device,
// no device twice), with the library's own validators, without encoding
// and parsing it again. Spec annotations are our constant keys.
func validate(spec *specs.Spec) error {
	if err := specs.ValidateVersion(spec); err != nil {
		return err
	}
	vendor, class := parser.ParseQualifier(spec.Kind)
	if err := parser.ValidateVendorName(vendor); err != nil {
		return err
	}
	if err := parser.ValidateClassName(class); err != nil {
		return err
	}
	if err := (&cdi.ContainerEdits{ContainerEdits: &spec.ContainerEdits}).Validate(); err != nil {
		return err
	}
	if len(spec.Devices) == 0 {
		return errors.New("no devices")
	}
	seen := make(map[string]bool, len(spec.Devices))
	for i := range spec.Devices {
		d := &spec.Devices[i]
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			return err
		}
		if seen[d.Name] {
			return fmt.Errorf("device %q twice", d.Name)
		}
		seen[d.Name] = true
		edits := &cdi.ContainerEdits{ContainerEdits: &d.ContainerEdits}
		if len(d.ContainerEdits.DeviceNodes)+len(d.ContainerEdits.Env)+len(d.ContainerEdits.Mounts) == 0 {
			return fmt.Errorf("device %q: no container edits", d.Name)
		}
		if err := edits.Validate(); err != nil {
			return fmt.Errorf("device %q: %w", d.Name, err)
		}
	}
	return nil
}

// Status is what Check found on disk.
type Status int

const (
	// Intact means the file holds what we last wrote.
	Intact Status = iota
	// Missing means there is no file (removed, or a reboot emptied the dir).
	Missing
	// Changed means the file holds something else: it must be written again.
	Changed
	// Superseded means a process that started after us (another instance of
	// this deployment during a rolling update, or another deployment
	// serving the same resource) wrote the file: leave it.
	Superseded
	// Orphaned means a process that started after us wrote the file, but
	// nobody serves the plugin socket it named: it is gone (or has not
	// served it yet), and the file may be taken over.
	Orphaned
)

func (st Status) String() string {
	switch st {
	case Intact:
		return "intact"
	case Missing:
		return "missing"
	case Changed:
		return "changed"
	case Superseded:
		return "superseded"
	case Orphaned:
		return "orphaned"
	}
	return "unknown"
}

// Check compares the file on disk with what we last wrote.
func (s *Spec) Check() (Status, string) {
	data, err := os.ReadFile(s.path)
	s.mu.Lock()
	last, empty := s.last, s.empty
	s.mu.Unlock()
	if errors.Is(err, fs.ErrNotExist) {
		if empty {
			return Intact, ""
		}
		return Missing, "removed"
	}
	if err == nil && last != nil && bytes.Equal(data, last) {
		return Intact, ""
	}
	if err != nil {
		return Changed, err.Error()
	}
	other, err := cdi.ParseSpec(data)
	if err != nil || other.Kind != s.r.Kind.String() {
		return Changed, "not our spec"
	}
	if s.r.Siblings && s.canJudge(other.Annotations[SocketAnnotation]) && sameDevices(other, last) {
		return Intact, ""
	}
	started, err := strconv.ParseInt(other.Annotations[StartedAnnotation], 10, 64)
	if err == nil && started > s.w.started {
		who := fmt.Sprintf("written by %q, started after us", other.Annotations[OwnerAnnotation])
		if sock := other.Annotations[SocketAnnotation]; s.canJudge(sock) && !served(sock) {
			return Orphaned, who + ", whose socket " + sock + " nobody serves"
		}
		return Superseded, who
	}
	return Changed, "changed by someone else"
}

// sameDevices reports whether spec describes the devices, with the same
// edits, as the spec last (what this process wrote last), whatever their
// annotations (their writer).
func sameDevices(spec *specs.Spec, last []byte) bool {
	if last == nil {
		return false
	}
	ours, err := cdi.ParseSpec(last)
	if err != nil {
		return false
	}
	return reflect.DeepEqual(spec.Devices, ours.Devices) && reflect.DeepEqual(spec.ContainerEdits, ours.ContainerEdits)
}

// canJudge reports whether the liveness of the process serving sock can be
// told here: a socket in our own plugin directory (a spec of an older
// version names none, and a process with another directory is not ours to
// judge).
func (s *Spec) canJudge(sock string) bool {
	return sock != "" && s.r.Socket != "" && filepath.IsAbs(sock) &&
		filepath.Dir(filepath.Clean(sock)) == filepath.Dir(s.r.Socket)
}

// served reports whether a process accepts connections on the unix socket
// sock. A missing file, or one nobody listens on, is not served.
func served(sock string) bool {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// Watch signals changed (without blocking; one pending signal is enough)
// whenever the spec file may have changed: created, written, removed,
// renamed, its mode changed, or the directory itself removed. It returns
// when ctx is done.
func (s *Spec) Watch(ctx context.Context, changed chan<- struct{}) error {
	signal := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	name := filepath.Base(s.path)
	if err := makeDir(s.w.dir); err != nil { // none yet: no spec was written
		return fmt.Errorf("CDI dir: %w", err)
	}
	w, err := inotify.Watch(ctx, inotify.EntryChanges|unix.IN_CLOSE_WRITE, s.w.dir)
	if err != nil {
		return err
	}
	defer w.Close()
	// The file may have changed between our first write and now, with no
	// watch to tell: look once.
	signal()
	retry := time.NewTimer(0)
	retry.Stop()
	defer retry.Stop()
	backoff := 10 * time.Millisecond
	for {
		select {
		case es, ok := <-w.Events():
			if !ok {
				if err := w.Err(); err != nil {
					return fmt.Errorf("watching %s: %w", s.w.dir, err)
				}
				return nil
			}
			for _, e := range es {
				if e.Name == name || e.Name == "" {
					signal()
				}
			}
			if !w.Watching(s.w.dir) {
				// The directory went away: it comes back with our next
				// write; watch it again then, and check once more.
				backoff = 10 * time.Millisecond
				retry.Reset(backoff)
			}
		case <-retry.C:
			if err := w.Add(s.w.dir); err != nil {
				backoff = min(2*backoff, time.Second)
				retry.Reset(backoff)
				continue
			}
			signal()
		}
	}
}

// specHead is what RemoveStale needs of a spec to pass it by.
type specHead struct {
	Kind        string            `json:"kind"`
	Annotations map[string]string `json:"annotations"`
}

// mayBeStale reports whether the JSON spec at p may be one of this
// owner's for a kind not kept, from its kind and annotations alone: most
// files of a node's CDI dir are per-claim specs and specs of kinds kept,
// and the CDI library's full read and check (ReadSpec) of each cost
// 0.3 ms at every start (BenchmarkRemoveStale). A file that cannot be
// decoded so is passed on to that full read, which decides.
func (w *Writer) mayBeStale(p string, kept map[string]bool) bool {
	data, err := os.ReadFile(p)
	if err != nil {
		return false
	}
	var h specHead
	if json.Unmarshal(data, &h) != nil {
		return true
	}
	return h.Annotations[OwnerAnnotation] == w.owner && !kept[h.Kind]
}

// RemoveStale deletes the specs in the directory that this owner wrote for
// kinds not in keep, and returns their paths. Specs of other owners, and
// files that are not valid specs, are left alone.
func (w *Writer) RemoveStale(keep []Kind) ([]string, error) {
	kept := map[string]bool{}
	for _, k := range keep {
		kept[k.String()] = true
	}
	entries, err := os.ReadDir(w.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if !e.Type().IsRegular() || (ext != ".json" && ext != ".yaml") {
			continue
		}
		p := filepath.Join(w.dir, e.Name())
		if ext == ".json" && !w.mayBeStale(p, kept) {
			continue
		}
		spec, err := cdi.ReadSpec(p, 0)
		if err != nil || spec.Annotations[OwnerAnnotation] != w.owner || kept[spec.Kind] {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}
