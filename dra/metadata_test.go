package dra

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
)

// TestDeviceMetadata: with device metadata enabled, a
// prepared claim's containers get, through the CDI IDs of its answer, a
// read-only mount of the request's metadata file at the path of
// KEP-5304; the file lists each device of the request with the
// attributes its ResourceSlice publishes (resource, index, CDI ID) and
// the container path of its state directory, which the same containers
// get mounted. Unprepare removes the file and its spec. Disabled, the
// answer carries no metadata.
func TestDeviceMetadata(t *testing.T) {
	for _, enabled := range []bool{true, false} {
		name := map[bool]string{true: "enabled", false: "disabled"}[enabled]
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.options = func(o *Options) { o.DeviceMetadata = enabled }
			h.start()
			c1 := h.claim("c1", "sim-1", "sim-3")
			r := h.prepare(c1)[c1.Uid]
			if r.Error != "" {
				t.Fatal(r.Error)
			}
			metaID := testDriver + "/metadata=" + c1.Uid + "_req"
			if got := slices.Contains(allIDs(r), metaID); got != enabled {
				t.Fatalf("CDI IDs %v: metadata ID %s there %v, want %v", allIDs(r), metaID, got, enabled)
			}
			if !enabled {
				if _, err := os.Stat(filepath.Join(h.plugins, testDriver, "dra-device-metadata")); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("metadata written while disabled: %v", err)
				}
				return
			}
			spec := h.inject(allIDs(r))
			at := metadata.ResourceClaimFilePath(testDriver, "c1", "req")
			var src string
			var stateMounts []string
			for _, m := range spec.Mounts {
				switch {
				case m.Destination == at:
					src = m.Source
					if !slices.Contains(m.Options, "ro") {
						t.Errorf("metadata mounted %v, want ro", m.Options)
					}
				case filepath.Dir(m.Destination) == cdi.ContainerStateRoot:
					stateMounts = append(stateMounts, m.Destination)
				}
			}
			if src == "" {
				t.Fatalf("no mount at %s in %+v", at, spec.Mounts)
			}
			data, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			var md metadata.DeviceMetadata
			if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &md); err != nil {
				t.Fatalf("%s: %v\n%s", src, err, data)
			}
			if md.Name != "c1" || md.Namespace != claimNS || string(md.UID) != c1.Uid || len(md.Requests) != 1 || md.Requests[0].Name != "req" {
				t.Fatalf("metadata %+v", md)
			}
			devs := md.Requests[0].Devices
			if len(devs) != 2 {
				t.Fatalf("devices %+v", devs)
			}
			for i, d := range devs {
				idx := []int64{1, 3}[i]
				id := []string{"sim-n1-1", "sim-n1-3"}[i]
				q := func(n string) resourceapi.QualifiedName { return resourceapi.QualifiedName(testDriver + "/" + n) }
				a := d.Attributes
				str := func(n string) string {
					if v, ok := a[q(n)]; ok && v.StringValue != nil {
						return *v.StringValue
					}
					return ""
				}
				if d.Driver != testDriver || d.Pool != simPool || d.Name != []string{"sim-1", "sim-3"}[i] {
					t.Errorf("device %d: %s/%s/%s", i, d.Driver, d.Pool, d.Name)
				}
				if str(AttrResource) != resName || a[q(AttrIndex)].IntValue == nil || *a[q(AttrIndex)].IntValue != idx ||
					str(AttrID) != "k8s.example.com/sim="+id || str(AttrFirmwareSHA256) == "" {
					t.Errorf("device %d: attributes %+v", i, a)
				}
				state := filepath.Join(cdi.ContainerStateRoot, id)
				if str(AttrStateDir) != state || !slices.Contains(stateMounts, state) {
					t.Errorf("device %d: %s %q, want %s, mounted: %v", i, AttrStateDir, str(AttrStateDir), state, stateMounts)
				}
			}
			h.unprepare(c1)
			if _, err := os.Stat(src); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("metadata left after unprepare: %v", err)
			}
			if m, _ := filepath.Glob(filepath.Join(h.cdiDir, testDriver+"_metadata_*")); len(m) > 0 {
				t.Errorf("metadata specs left after unprepare: %v", m)
			}
		})
	}
}
