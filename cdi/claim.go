package cdi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
)

// ClaimAnnotation marks the per-claim spec of a DRA claim: the claim's
// <namespace>/<name>. Per-claim specs carry no OwnerAnnotation, so that
// RemoveStale never takes them for specs of removed resources; the DRA
// driver removes them itself (RemoveClaimSpec, RemoveStaleClaimSpecs).
const ClaimAnnotation = "cdi-device-plugin/claim"

// ClaimClass is the CDI class of per-claim specs.
const ClaimClass = "claim"

// ClaimKind is the kind of the per-claim specs of the DRA driver named
// driver: k8s.<driver>/claim.
func ClaimKind(driver string) (Kind, error) { return NewKind("k8s."+driver, ClaimClass) }

// Claim is what a prepared DRA claim gives its containers besides the
// edits of its devices (which come from the resources' specs): variables
// (<envPrefix>_DEVICES, as the device plugin's Allocate sets them) and
// mounts.
type Claim struct {
	// UID names the spec's one device; Namespace and Name the claim.
	UID, Namespace, Name string
	// Env are NAME=value pairs.
	Env    []string
	Mounts []Mount
}

// Mount is a bind mount of a claim spec.
type Mount struct {
	HostPath, ContainerPath string
	ReadOnly                bool
}

// ClaimSpecPath is the file of the per-claim spec of claim uid:
// <dir>/<vendor>-claim_<uid>.json.
func (w *Writer) ClaimSpecPath(k Kind, uid string) string {
	return filepath.Join(w.dir, cdi.GenerateTransientSpecName(k.Vendor, k.Class, uid)+".json")
}

// ErrNoEdits is returned by WriteClaimSpec for a claim with nothing to
// give: the CDI library refuses a device without edits.
var ErrNoEdits = errors.New("no container edits")

// WriteClaimSpec writes the spec of claim c, of kind k (ClaimKind): one
// device named by the claim's UID, with the claim's variables and mounts,
// checked with the CDI library's rules, written atomically with mode 0644
// and synced. It returns the device's qualified CDI name and the file.
func (w *Writer) WriteClaimSpec(k Kind, c Claim) (name, path string, err error) {
	if len(c.Env)+len(c.Mounts) == 0 {
		return "", "", fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, ErrNoEdits)
	}
	name, err = k.QualifiedName(c.UID)
	if err != nil {
		return "", "", fmt.Errorf("claim %s/%s: UID %q: %w", c.Namespace, c.Name, c.UID, err)
	}
	var edits specs.ContainerEdits
	edits.Env = c.Env
	for _, m := range c.Mounts {
		opts := []string{"rbind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append([]string{"ro"}, opts...)
		}
		edits.Mounts = append(edits.Mounts, &specs.Mount{Type: "bind", HostPath: m.HostPath, ContainerPath: m.ContainerPath, Options: opts})
	}
	spec := &specs.Spec{
		Kind:        k.String(),
		Annotations: map[string]string{ClaimAnnotation: c.Namespace + "/" + c.Name},
		Devices:     []specs.Device{{Name: c.UID, ContainerEdits: edits}},
	}
	if spec.Version, err = specs.MinimumRequiredVersion(spec); err != nil {
		return "", "", fmt.Errorf("spec version: %w", err)
	}
	path = w.ClaimSpecPath(k, c.UID)
	if err := validate(spec); err != nil {
		return "", "", fmt.Errorf("CDI spec %s: %w", path, err)
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return "", "", fmt.Errorf("CDI spec %s: %w", path, err)
	}
	if err := makeDir(w.dir); err != nil {
		return "", "", fmt.Errorf("CDI dir: %w", err)
	}
	if err := atomicfile.WriteBytes(path, data, specMode); err != nil {
		return "", "", fmt.Errorf("write CDI spec: %w", err)
	}
	return name, path, nil
}

// RemoveClaimSpec removes the per-claim spec of claim uid; one that is
// not there is no error.
func (w *Writer) RemoveClaimSpec(k Kind, uid string) error {
	if err := parser.ValidateDeviceName(uid); err != nil {
		return fmt.Errorf("claim UID %q: %w", uid, err)
	}
	if err := os.Remove(w.ClaimSpecPath(k, uid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the claim's CDI spec: %w", err)
	}
	return nil
}

// ClaimSpec is a per-claim spec on disk.
type ClaimSpec struct {
	// Path is its file, UID the claim UID its name gives.
	Path, UID string
	// Claim is the claim's <namespace>/<name> (ClaimAnnotation); "" when
	// the file cannot be read as a spec that names one.
	Claim string
}

// ClaimSpecs are the per-claim specs of kind k on disk (not the temp
// files of writes under way), in file name order.
func (w *Writer) ClaimSpecs(k Kind) ([]ClaimSpec, error) {
	prefix := cdi.GenerateTransientSpecName(k.Vendor, k.Class, "")
	matches, err := filepath.Glob(filepath.Join(w.dir, prefix+"*.json"))
	if err != nil {
		return nil, err
	}
	out := make([]ClaimSpec, 0, len(matches))
	for _, p := range matches {
		c := ClaimSpec{Path: p, UID: strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), prefix), ".json")}
		if data, err := os.ReadFile(p); err == nil {
			var spec specs.Spec
			if json.Unmarshal(data, &spec) == nil {
				c.Claim = spec.Annotations[ClaimAnnotation]
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// RemoveStaleClaimSpecs removes the per-claim specs of kind k whose claim
// UID keep does not want (claims no longer prepared: a driver stopped
// between writing a claim's spec and its checkpoint), and the temp files
// of claim spec writes a killed process left (atomicfile.RemoveStaleTemps:
// not this process's), and returns their paths.
func (w *Writer) RemoveStaleClaimSpecs(k Kind, keep func(uid string) bool) ([]string, error) {
	prefix := cdi.GenerateTransientSpecName(k.Vendor, k.Class, "")
	removed, err := atomicfile.RemoveStaleTemps(atomicfile.TempPattern(filepath.Join(w.dir, prefix+"*.json")))
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	found, err := w.ClaimSpecs(k)
	if err != nil {
		return removed, errors.Join(append(errs, err)...)
	}
	for _, c := range found {
		if keep(c.UID) {
			continue
		}
		if err := os.Remove(c.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, c.Path)
	}
	return removed, errors.Join(errs...)
}
