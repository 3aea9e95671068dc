package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
)

// AttrStateDir is the device metadata attribute (KEP-5304) that gives,
// for a device of a resource with prestart steps, where its state
// directory (state.json, read-only) is in the container. It is not
// published in the ResourceSlice: it tells a container about its own
// mounts.
const AttrStateDir = "stateDir"

// MetadataVersions are the device metadata API versions the driver writes
// (newest first): the kubeletplugin helper refuses to start without its
// latest one.
var MetadataVersions = []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}

// metadataFiles are the claims' device metadata (KEP-5304), when enabled
// (Options.DeviceMetadata): what each prepared device tells its
// containers, the helper's options to write it, and its removal for a
// claim the driver drops itself.
type metadataFiles struct {
	enabled bool
	// driver names the driver; pluginDir is its plugin directory, cdiDir
	// where the claims' CDI specs go.
	driver, pluginDir, cdiDir string
	devs                      *devices
}

// options are the helper's options for device metadata: the helper writes, at every successful
// NodePrepareResources, a metadata file per request of each claim below
// the driver's plugin directory
// (<plugin dir>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json)
// and a CDI spec beside the driver's (<CDI dir>/<driver>_metadata_<claim
// UID>_<request>.json) that mounts it into the claim's containers at
// /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json
// (resourceclaimtemplates/<pod claim name>/... for a claim made from a
// template); Unprepare removes both. The files are written whole (a temp
// file renamed in place) but not synced: they are written again at every
// Prepare, and after a crash of the node the kubelet prepares its claims
// again before their containers start.
func (m *metadataFiles) options() []kubeletplugin.Option {
	if !m.enabled {
		return nil
	}
	return []kubeletplugin.Option{
		kubeletplugin.EnableDeviceMetadata(m.enabled, MetadataVersions),
		kubeletplugin.CDIDirectory(m.cdiDir),
		kubeletplugin.MetadataFileOps(kubeletplugin.MetadataFileOperations{WriteFile: writeWhole}),
	}
}

// writeWhole writes data to name through a temp file in its directory
// renamed in place, without syncing (metadataFiles.options).
func writeWhole(name string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, name)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// add gives each device of the prepared claims in out its metadata
// (device), when device metadata is enabled.
func (m *metadataFiles) add(out map[types.UID]kubeletplugin.PrepareResult) {
	if !m.enabled {
		return
	}
	for _, r := range out {
		for i := range r.Devices {
			dv := &r.Devices[i]
			dv.Metadata = m.device(dv.PoolName, dv.DeviceName)
		}
	}
}

// device is what a container learns of a device from its metadata
// file: the attributes its ResourceSlice publishes (resource, index, CDI
// ID, NUMA node, identity: PCI address, vendor, device, class, driver, USB
// bus, device, vendor, product and serial, the firmware digest) and, for a
// resource with prestart steps, AttrStateDir. Nil for a device the driver
// does not know.
func (m *metadataFiles) device(pool, name string) *kubeletplugin.DeviceMetadata {
	r, dv, ok := m.devs.lookup(pool, name)
	if !ok {
		return nil
	}
	pub := Device(m.driver, Published{Resource: r.Name, Kind: r.Kind, IDPrefix: r.IDPrefix, FirmwareSHA256: r.firmware}, dv)
	attrs := make(map[string]resourceapi.DeviceAttribute, len(pub.Attributes)+1)
	for k, v := range pub.Attributes {
		attrs[string(k)] = v
	}
	if sd, ok := r.Runner.(stateDirs); ok && sd.HasSteps() && !sd.BadState(dv.Name) {
		p := filepath.Join(cdi.ContainerStateRoot, dv.Name)
		attrs[m.driver+"/"+AttrStateDir] = resourceapi.DeviceAttribute{StringValue: &p}
	}
	return &kubeletplugin.DeviceMetadata{Attributes: attrs}
}

// remove removes the device metadata files of claim uid and their CDI
// specs (those the helper writes: options), as the helper does when the
// kubelet unprepares the claim: for a claim the driver drops itself
// (cleanup), which the kubelet never unprepares. Whether or not device
// metadata is enabled now: an earlier run may have written them. The
// helper names a claim's directory by the claim's namespace and name,
// which a newer claim may have taken: only the request files that name
// uid go (and the directory once empty); one that cannot be read is
// left, and named in the error.
func (m *metadataFiles) remove(namespace, name string, uid types.UID) error {
	dir := filepath.Join(m.pluginDir, "dra-device-metadata", namespace+"_"+name)
	errs := []error{removeRequestsOf(dir, uid)}
	specs, err := filepath.Glob(filepath.Join(m.cdiDir, m.driver+"_metadata_"+string(uid)+"_*.json"))
	errs = append(errs, err)
	for _, p := range specs {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeRequestsOf removes the request directories below a claim's
// metadata directory dir whose metadata.json is claim uid's, then dir if
// nothing is left in it.
func removeRequestsOf(dir string, uid types.UID) error {
	reqs, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range reqs {
		p := filepath.Join(dir, r.Name())
		owner, err := metadataUID(filepath.Join(p, "metadata.json"))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// A request directory the helper left without its file.
		case err != nil:
			errs = append(errs, fmt.Errorf("device metadata %s: cannot tell its claim, left: %w", p, err))
			continue
		case owner != uid:
			continue // a newer claim's of the same name
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// metadataUID is the claim UID a metadata file names: the first object of
// its stream (one per API version, all of one claim).
func metadataUID(path string) (types.UID, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var obj struct {
		Metadata struct {
			UID types.UID `json:"uid"`
		} `json:"metadata"`
	}
	if err := json.NewDecoder(f).Decode(&obj); err != nil {
		return "", err
	}
	if obj.Metadata.UID == "" {
		return "", errors.New("no claim UID in it")
	}
	return obj.Metadata.UID, nil
}
