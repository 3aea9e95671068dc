package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestNodeInTwoResourcesTainted: a host node in devices
// of two resources the driver publishes (ttyR1, matched by both globs) is
// no device's: both devices are tainted unhealthy in the ResourceSlices
// with the cause shared_node, while the device of a node of its own
// (ttyR0) is published untainted.
func TestNodeInTwoResourcesTainted(t *testing.T) {
	testutil.NeedMknod(t)
	d := newDirs(t)
	testutil.ServePodResources(t, d.podres)
	testutil.Mknod(t, filepath.Join(d.dev, "ttyR0"), 4, 64)
	testutil.Mknod(t, filepath.Join(d.dev, "ttyR1"), 4, 65)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(`resources:
- name: example.com/a
  idPrefix: a
  hostDevices: ["ttyR*"]
- name: example.com/b
  idPrefix: b
  hostDevices: ["ttyR1"]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startDriver(t, d, "a.example.com", "--config", cfg)
	taint := func(dev resourceapi.Device) string {
		for _, tn := range dev.Taints {
			if tn.Key == "a.example.com/unhealthy" {
				return tn.Value
			}
		}
		return ""
	}
	s.waitFor(t, "a-0, a-1 and b-0 published", func(p map[string]resourceapi.Device) bool {
		return p["a.example.com a-0"].Name != "" && p["a.example.com a-1"].Name != "" && p["a.example.com b-0"].Name != ""
	})
	p := s.waitFor(t, "a-1 and b-0 tainted shared_node", func(p map[string]resourceapi.Device) bool {
		return taint(p["a.example.com a-1"]) == "shared_node" && taint(p["a.example.com b-0"]) == "shared_node"
	})
	if got := taint(p["a.example.com a-0"]); got != "" {
		t.Errorf("a-0 (ttyR0, its own node) tainted %q", got)
	}
	if got := keys(p); !slices.Equal(got, []string{"a.example.com a-0", "a.example.com a-1", "a.example.com b-0"}) {
		t.Errorf("published %v", got)
	}
}
