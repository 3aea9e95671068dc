package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// servePodResources serves the kubelet's PodResources API on a socket in
// d.plugins, where pod ns/p container c holds ids of resource.
func servePodResources(t *testing.T, d dirs, resource string, ids ...string) string {
	t.Helper()
	sock := filepath.Join(d.plugins, "pod-resources.sock")
	testutil.ServePodResources(t, sock, &podresourcesapi.PodResources{
		Name: "p", Namespace: "ns",
		Containers: []*podresourcesapi.ContainerResources{{Name: "c", Devices: []*podresourcesapi.ContainerDevices{
			{ResourceName: resource, DeviceIds: ids},
		}}},
	})
	return sock
}

// TestLegacyHostIDs: a kubelet checkpoint of a version
// before the ':' escaping holds tun-net_tun for /dev/net_tun (now
// tun-net:_tun).
func TestLegacyHostIDs(t *testing.T) {
	const tunConfig = "resources:\n- name: example.com/tun\n  idPrefix: tun\n  hostDevices: [\"net_tun\", \"net/*\"]\n"
	for _, c := range []struct{ name, cfg string }{
		{"the old name resolves to the same device", tunConfig},
		// With steps, the spec mounts the device's state directory, and
		// the kubelet calls PreStartContainer with the checkpointed ID.
		{"the old name resolves to the same device, with steps", tunConfig + "  prestart:\n    steps: [{type: exec, command: [/bin/true]}]\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newDirs(t)
			testutil.NeedMknod(t)
			mknod(t, d, "net_tun", 10, 201)
			sock := servePodResources(t, d, "example.com/tun", "tun-net_tun")
			r := startRun(t, d, []string{"--config", writeConfig(t, c.cfg), "--pod-resources-socket", sock}, nil)
			waitResolves(t, r, d, 5*time.Second, "tun-net:_tun")
			if last := r.last; last == nil || len(last.Devices) != 1 || last.Devices[0].ID != "tun-net:_tun" {
				t.Fatalf("advertised %+v, want tun-net:_tun only (the old name is not advertised)", r.last)
			}
			// As containerd does for a restarted container: a fresh cache,
			// the checkpointed CDI name.
			cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(d.cdi), cdiapi.WithAutoRefresh(false))
			if err != nil {
				t.Fatal(err)
			}
			spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
			if _, err := cache.InjectDevices(spec, "k8s.example.com/tun=tun-net_tun"); err != nil {
				t.Fatalf("%v; log:\n%s", err, r.stderr.String())
			}
			if len(spec.Linux.Devices) != 1 || spec.Linux.Devices[0].Path != "/dev/net_tun" || spec.Linux.Devices[0].Minor != 201 {
				t.Fatalf("devices %+v, want /dev/net_tun 10:201", spec.Linux.Devices)
			}
			if !strings.Contains(c.cfg, "prestart") {
				return
			}
			var mounted bool
			for _, m := range spec.Mounts {
				if m.Destination == "/run/cdi-device-plugin/tun-net_tun" && m.Source == filepath.Join(d.state, "devices", "tun-net:_tun") {
					mounted = true
				}
			}
			if !mounted {
				t.Fatalf("mounts %+v, want the state of tun-net:_tun at /run/cdi-device-plugin/tun-net_tun", spec.Mounts)
			}
			if _, err := r.c.PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: []string{"tun-net_tun"}}); err != nil {
				t.Fatalf("PreStartContainer with the checkpointed ID: %v", err)
			}
		})
	}
	t.Run("an old name that is another device's now is refused", func(t *testing.T) {
		d := newDirs(t)
		testutil.NeedMknod(t)
		mknod(t, d, "net_tun", 10, 201)
		mknod(t, d, "net/tun", 10, 200) // tun-net_tun now
		sock := servePodResources(t, d, "example.com/tun", "tun-net_tun")
		args := d.args("--config", writeConfig(t, tunConfig), "--pod-resources-socket", sock)
		for attempt := range 2 { // the refusal does not go away by itself
			var stderr syncBuffer
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			code := run(ctx, args, envOf(nil), &stderr)
			cancel()
			log := stderr.String()
			if code == 0 || !strings.Contains(log, "tun-net_tun") || !strings.Contains(log, "tun-net:_tun") || !strings.Contains(log, "ns/p/c") || !strings.Contains(log, "delete the pods") {
				t.Fatalf("start %d: exit %d; log:\n%s", attempt, code, log)
			}
			if _, err := os.Stat(filepath.Join(d.cdi, "k8s.example.com-tun.json")); err == nil {
				t.Fatalf("start %d: a spec was written", attempt)
			}
		}
	})
}
