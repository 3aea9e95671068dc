// Package cdi builds CDI specs from device snapshots and writes them through
// the CDI library's cache. It knows nothing of gRPC.
package cdi

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// Spec-level annotations that mark a spec as ours.
const (
	OwnerAnnotation    = "cdi-device-plugin/owner"
	ResourceAnnotation = "cdi-device-plugin/resource"
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

// KindForResource derives the kind of an extended resource: the vendor is
// "k8s." + the resource domain and the class the name part, so the plugin's
// specs never clash with a device vendor's own specs.
func KindForResource(resource string) (Kind, error) {
	domain, name, ok := strings.Cut(resource, "/")
	if !ok {
		return Kind{}, fmt.Errorf("resource %q has no domain", resource)
	}
	return NewKind("k8s."+domain, name)
}

func (k Kind) String() string { return k.Vendor + "/" + k.Class }

// SpecName is the spec's file name (without extension).
func (k Kind) SpecName() string { return cdi.GenerateSpecName(k.Vendor, k.Class) }

// QualifiedName is the fully qualified CDI name of a device.
func (k Kind) QualifiedName(device string) (string, error) {
	if err := parser.ValidateDeviceName(device); err != nil {
		return "", err
	}
	return parser.QualifiedName(k.Vendor, k.Class, device), nil
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

// BuildSpec turns a snapshot into a CDI spec owned by owner.
func BuildSpec(owner string, r Resource, snap *device.Snapshot) (*specs.Spec, error) {
	spec := &specs.Spec{
		Kind:        r.Kind.String(),
		Annotations: map[string]string{OwnerAnnotation: owner, ResourceAnnotation: r.Name},
		Devices:     make([]specs.Device, 0, len(snap.Devices)),
	}
	for _, d := range snap.Devices {
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			return nil, fmt.Errorf("device %q: %w", d.Name, err)
		}
		node := &specs.DeviceNode{
			Path:        d.ContainerPath,
			HostPath:    d.HostPath,
			Type:        string(d.Type),
			Major:       int64(d.Major),
			Minor:       int64(d.Minor),
			Permissions: "rw",
		}
		edits := specs.ContainerEdits{DeviceNodes: []*specs.DeviceNode{node}}
		if k, v := DeviceEnv(r.EnvPrefix, d); k != "" {
			edits.Env = []string{k + "=" + v}
		}
		if r.StateRoot != "" {
			edits.Mounts = []*specs.Mount{{
				Type:          "bind",
				HostPath:      filepath.Join(r.StateRoot, d.Name),
				ContainerPath: path.Join(ContainerStateRoot, d.Name),
				Options:       []string{"ro", "nosuid", "nodev", "noexec", "rbind"},
			}}
		}
		spec.Devices = append(spec.Devices, specs.Device{Name: d.Name, ContainerEdits: edits})
	}
	v, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("spec version: %w", err)
	}
	spec.Version = v
	return spec, nil
}

// Writer writes and removes the specs of one plugin in one directory.
type Writer struct {
	dir   string
	owner string
	cache *cdi.Cache
}

// NewWriter returns a writer for dir; owner marks the specs as ours.
func NewWriter(dir, owner string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("CDI dir: %w", err)
	}
	c, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache for %s: %w", dir, err)
	}
	return &Writer{dir: dir, owner: owner, cache: c}, nil
}

// Path is the file the spec of kind k is written to.
func (w *Writer) Path(k Kind) string { return filepath.Join(w.dir, k.SpecName()+".json") }

// Write builds and atomically writes the spec of r from snap, mode 0644.
func (w *Writer) Write(r Resource, snap *device.Snapshot) error {
	spec, err := BuildSpec(w.owner, r, snap)
	if err != nil {
		return err
	}
	name := r.Kind.SpecName() + ".json"
	// WriteSpec validates, writes a temp file and renames it in place.
	if err := w.cache.WriteSpec(spec, name); err != nil {
		return fmt.Errorf("write CDI spec %s: %w", name, err)
	}
	if err := os.Chmod(filepath.Join(w.dir, name), specMode); err != nil {
		return fmt.Errorf("chmod CDI spec %s: %w", name, err)
	}
	return nil
}

// Remove deletes the spec of kind k; a missing spec is not an error.
func (w *Writer) Remove(k Kind) error {
	return w.cache.RemoveSpec(k.SpecName() + ".json")
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
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".json" && ext != ".yaml") {
			continue
		}
		p := filepath.Join(w.dir, e.Name())
		spec, err := cdi.ReadSpec(p, 0)
		if err != nil || spec.Annotations[OwnerAnnotation] != w.owner || kept[spec.Kind] {
			continue
		}
		if err := w.cache.RemoveSpec(e.Name()); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}
