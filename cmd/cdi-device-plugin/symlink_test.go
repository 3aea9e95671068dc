package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
)

// TestPlantedSymlinks: symlinks planted where the plugin writes (the
// spec, a node, a state file, a firmware image, an entry of the CDI dir)
// point outside the configured roots. The plugin replaces the links, never
// writes through them, and the files outside are unchanged.
func TestPlantedSymlinks(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	outside := t.TempDir()
	victims := map[string][]byte{}
	victim := func(name string) string {
		p := filepath.Join(outside, name)
		victims[p] = []byte("precious " + name + "\n")
		if err := os.WriteFile(p, victims[p], 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	plant := func(link, target string) {
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	spec := filepath.Join(d.cdi, "k8s.example.com-sim.json")
	node := filepath.Join(d.dev, "sim-1")
	state := filepath.Join(d.state, "devices", "sim-0", prestart.StateFile)
	fw := filepath.Join(d.state, "devices", "sim-0", prestart.FirmwareFile)
	stray := filepath.Join(d.cdi, "k8s.example.com-old.json")
	plant(spec, victim("spec"))
	plant(node, victim("node"))
	plant(state, victim("state"))
	plant(fw, victim("firmware"))
	plant(stray, victim("stray"))

	r := startRun(t, d, nil, map[string]string{"NUMBER_DEVICES": "2", "RESOURCE_NAME": "example.com/sim", "DEVICE_ID_PREFIX": "sim"})
	waitResolves(t, r, d, 5*time.Second, "sim-0", "sim-1")
	if _, err := r.c.PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: []string{"sim-0", "sim-1"}}); err != nil {
		t.Fatalf("%v; log:\n%s", err, r.stderr.String())
	}
	for _, p := range []string{spec, node, state, fw} {
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode()&os.ModeSymlink != 0 {
			t.Errorf("%s: still a symlink or gone: %v %v", p, fi, err)
		}
	}
	for p, want := range victims {
		got, err := os.ReadFile(p)
		fi, _ := os.Stat(p)
		if err != nil || !bytes.Equal(got, want) || fi.Mode().Perm() != 0o600 {
			t.Errorf("outside file %s changed: %q %v %v", p, got, fi.Mode(), err)
		}
	}
	// A link in the CDI dir that is not ours is left alone.
	if fi, err := os.Lstat(stray); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("stray link: %v %v", fi, err)
	}
}

// TestPlantedStateDirSymlink: a symlink planted at one
// device's state directory holds back no other device: the others are
// advertised healthy, resolve and are prepared; that one is Unhealthy,
// the log names the path, and its spec entry mounts nothing (no path that
// leads elsewhere).
func TestPlantedStateDirSymlink(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	outside := t.TempDir()
	bad := filepath.Join(d.state, "devices", "sim-1")
	if err := os.MkdirAll(filepath.Dir(bad), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, bad); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, "resources:\n- name: example.com/sim\n  count: 3\n  idPrefix: sim\n  prestart:\n    steps: [{type: reset}]\n")
	r := startRun(t, d, []string{"--config", cfg}, nil)
	if _, err := r.wait(5*time.Second, func(u kubeletsim.Update) bool {
		return u.Health("sim-0") == pluginapi.Healthy && u.Health("sim-2") == pluginapi.Healthy && u.Health("sim-1") == pluginapi.Unhealthy
	}); err != nil {
		t.Fatalf("%v; log:\n%s", err, r.stderr.String())
	}
	if spec := waitResolves(t, r, d, 5*time.Second, "sim-0", "sim-2"); len(spec.Mounts) != 2 {
		t.Fatalf("state mounts %+v", spec.Mounts)
	}
	if _, err := r.c.PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: []string{"sim-0", "sim-2"}}); err != nil {
		t.Fatalf("%v; log:\n%s", err, r.stderr.String())
	}
	// The unhealthy device is still in the spec (a pod that holds it
	// keeps a name that resolves), without its state mount.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(d.cdi), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	dev := cache.GetDevice("k8s.example.com/sim=sim-1")
	if dev == nil || len(dev.ContainerEdits.Mounts) != 0 || len(dev.ContainerEdits.DeviceNodes) != 1 {
		t.Fatalf("sim-1 in the spec: %+v", dev)
	}
	if !strings.Contains(r.stderr.String(), bad) {
		t.Fatalf("log does not name %s:\n%s", bad, r.stderr.String())
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("written through the link: %v", entries)
	}
}
