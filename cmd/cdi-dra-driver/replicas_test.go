package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// startedDriver is the driver run in-process against a fake API server
// of node n1, registered with the kubelet stand-in.
type startedDriver struct {
	client kubernetes.Interface
	stderr *syncBuffer
	kl     *kubeletsim.DRA
}

// startDriver runs the driver with args and waits for its registration
// socket as driver (the name the kubelet would learn); the run is
// cancelled at the end of the test and must exit 0.
func startDriver(t *testing.T, d dirs, driver string, args ...string) *startedDriver {
	t.Helper()
	c, err := fakeClient()("")
	if err != nil {
		t.Fatal(err)
	}
	s := &startedDriver{client: c, stderr: &syncBuffer{}}
	client := func(string) (kubernetes.Interface, error) { return c, nil }
	ctx, cancel := context.WithCancel(context.Background())
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, d.args(args...), envOf(map[string]string{"NODE_NAME": "n1"}), s.stderr, clientsOf(client))
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-exit:
			if code != 0 {
				t.Errorf("exit %d", code)
			}
		case <-time.After(10 * time.Second):
			t.Error("no exit within 10s of the cancel")
		}
		if t.Failed() {
			t.Log(s.stderr.String())
		}
	})
	reg := filepath.Join(d.kubelet, "reg")
	end := time.Now().Add(10 * time.Second)
	for {
		kl, err := kubeletsim.RegisterDRA(context.Background(), filepath.Join(reg, driver+"-reg.sock"))
		if err == nil {
			s.kl = kl
			t.Cleanup(func() { _ = kl.Close() })
			return s
		}
		if time.Now().After(end) {
			entries, _ := os.ReadDir(reg)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Fatalf("no registration as %s within 10s (%v); %s holds %v", driver, err, reg, names)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// published is every device of the driver's ResourceSlices, by name.
func (s *startedDriver) published(t *testing.T) map[string]resourceapi.Device {
	t.Helper()
	list, err := s.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]resourceapi.Device{}
	for _, sl := range list.Items {
		for _, dev := range sl.Spec.Devices {
			out[sl.Spec.Driver+" "+dev.Name] = dev
		}
	}
	return out
}

func (s *startedDriver) waitFor(t *testing.T, what string, cond func(map[string]resourceapi.Device) bool) map[string]resourceapi.Device {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	for {
		p := s.published(t)
		if cond(p) {
			return p
		}
		if time.Now().After(end) {
			t.Fatalf("%s: not within 10s; published %v", what, keys(p))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func keys(m map[string]resourceapi.Device) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestReplicasPublished: of one config file, a resource with replicas
// above 1 is published beside the other (the driver's first versions
// published no such resource), each device once, allocatable to several
// claims with the capacity <driver>/shares of its replicas; the other
// resource's devices have neither. Publishing again (a device gone) keeps
// both.
func TestReplicasPublished(t *testing.T) {
	testutil.NeedMknod(t)
	d := newDirs(t)
	testutil.ServePodResources(t, d.podres)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(`resources:
- name: example.com/sim
  idPrefix: sim
  count: 2
- name: example.com/shared
  idPrefix: shared
  count: 2
  replicas: 2
`), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startDriver(t, d, "sim.example.com", "--config", cfg)
	want := []string{"sim.example.com shared-0", "sim.example.com shared-1", "sim.example.com sim-0", "sim.example.com sim-1"}
	p := s.waitFor(t, "4 devices published", func(p map[string]resourceapi.Device) bool { return len(p) == 4 })
	if got := keys(p); !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
	shares := resourceapi.QualifiedName("sim.example.com/shares")
	for name, dev := range p {
		r := dev.Attributes["sim.example.com/resource"].StringValue
		multi := dev.AllowMultipleAllocations != nil && *dev.AllowMultipleAllocations
		c, ok := dev.Capacity[shares]
		if strings.Contains(name, "shared") {
			if r == nil || *r != "example.com/shared" || !multi || !ok || c.Value.Value() != 2 {
				t.Errorf("%s: resource %v, allowMultipleAllocations %v, capacity %v; want example.com/shared, true, %s 2", name, r, multi, dev.Capacity, shares)
			}
		} else if r == nil || *r != "example.com/sim" || multi || len(dev.Capacity) > 0 {
			t.Errorf("%s: resource %v, allowMultipleAllocations %v, capacity %v; want example.com/sim, false, none", name, r, multi, dev.Capacity)
		}
	}
	if strings.Contains(s.stderr.String(), "not published through DRA") {
		t.Fatalf("a resource is said not published:\n%s", s.stderr.String())
	}

	// Published again: shared-1 gone, tainted unhealthy.
	if err := os.Remove(filepath.Join(d.dev, "shared-1")); err != nil {
		t.Fatal(err)
	}
	p = s.waitFor(t, "shared-1 tainted unhealthy", func(p map[string]resourceapi.Device) bool {
		return slices.ContainsFunc(p["sim.example.com shared-1"].Taints, func(t resourceapi.DeviceTaint) bool {
			return t.Key == "sim.example.com/unhealthy"
		})
	})
	if got := keys(p); !slices.Equal(got, want) {
		t.Fatalf("published again %v, want %v", got, want)
	}
}

// TestDefaultDriverNameSkipsReplicas: with no --driver-name,
// the driver is named after the first resource without replicas: the
// first resource has replicas, so the driver registers and publishes as
// sim.example.com, the second's <class>.<domain>, the name the device
// plugin's claim guard takes too (internal/dranames); it publishes both
// resources.
func TestDefaultDriverNameSkipsReplicas(t *testing.T) {
	testutil.NeedMknod(t)
	d := newDirs(t)
	testutil.ServePodResources(t, d.podres)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(`resources:
- name: example.com/shared
  idPrefix: shared
  replicas: 2
- name: example.com/sim
  idPrefix: sim
  count: 2
`), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startDriver(t, d, "sim.example.com", "--config", cfg)
	if want := filepath.Join(d.kubelet, "plugins", "sim.example.com", "dra.sock"); s.kl.Info.Name != "sim.example.com" || s.kl.Info.Endpoint != want {
		t.Fatalf("registered %+v, want sim.example.com at %s", s.kl.Info, want)
	}
	p := s.waitFor(t, "both resources published", func(p map[string]resourceapi.Device) bool { return len(p) == 4 })
	if got, want := keys(p), []string{"sim.example.com shared-0", "sim.example.com shared-1", "sim.example.com sim-0", "sim.example.com sim-1"}; !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
}
