package dra

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// TestWholeHoldIsEveryShare: a claim prepared on a device before its
// resource had replicas holds it whole (Shares 0 in the checkpoint): after
// replicas are set, that hold is every share, and no share claim is
// prepared on the device until it is released.
func TestWholeHoldIsEveryShare(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	whole := h.claim("whole", "sim-0")
	if r := h.prepare(whole)[whole.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	h.stop()
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(sharedConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	h.extraEnv = map[string]string{"CONFIG_FILE": file}
	h.start()
	s1 := h.sharedClaim("s1", share{"sim-0", "s-1", 1})
	if r := h.prepare(s1)[s1.Uid]; !strings.Contains(r.Error, "device held by claim default/whole") {
		t.Fatalf("a share of a device a claim holds whole: %q, want it held by claim default/whole", r.Error)
	}
	if _, ok := h.checkpointed()[types.UID(s1.Uid)]; ok {
		t.Fatal("the share claim was checkpointed")
	}
	if r := h.unprepare(whole)[whole.Uid]; r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	if r := h.prepare(s1)[s1.Uid]; r.Error != "" {
		t.Fatalf("a share once the whole hold is released: %s", r.Error)
	}
}

// TestEveryShareAsksPodResources: each share of a device is checked
// against the kubelet's PodResources, not only the first: a device that a
// device-plugin container got after a first share was prepared is not
// prepared for a second one.
func TestEveryShareAsksPodResources(t *testing.T) {
	h := newSharedHarness(t)
	h.start()
	a := h.sharedClaim("a", share{"sim-0", "s-a", 1})
	if r := h.prepare(a)[a.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	h.podres.Set(&podresourcesapi.PodResources{Name: "dp-pod", Namespace: "default", Containers: []*podresourcesapi.ContainerResources{{
		Name: "ctr", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: resName, DeviceIds: []string{"sim-n1-0"}}}}}})
	b := h.sharedClaim("b", share{"sim-0", "s-b", 1})
	if r := h.prepare(b)[b.Uid]; !strings.Contains(r.Error, "by a container through the device plugin") {
		t.Fatalf("a second share of a device a device-plugin container holds: %q, want it refused", r.Error)
	}
}

// gate is a runner whose Prepare waits, once armed, until it is let go:
// a long preparation that a second call waits behind.
type gate struct {
	Runner
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
	release chan struct{}
}

func (g *gate) Prepare(ctx context.Context, devs []device.Device) error {
	g.mu.Lock()
	armed := g.armed
	g.armed = false
	g.mu.Unlock()
	if armed {
		close(g.entered)
		<-g.release
	}
	return g.Runner.Prepare(ctx, devs)
}

// TestPrefetchNotAfterWait: the PodResources List a NodePrepareResources
// call starts when it arrives is used only if no other Prepare or
// Unprepare ran since: a call that waited behind a long preparation asks
// again, and does not prepare a device a device-plugin container got
// during the wait.
func TestPrefetchNotAfterWait(t *testing.T) {
	h := newHarness(t, nil)
	g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
	h.wrap = func(r Runner) Runner { g.Runner = r; return g }
	h.start()
	a, b := h.claim("a", "sim-0"), h.claim("b", "sim-1")
	g.mu.Lock()
	g.armed = true
	g.mu.Unlock()
	first := make(chan string, 1)
	go func() { first <- h.prepare(a)[a.Uid].Error }()
	<-g.entered
	calls := h.podres.Calls()
	second := make(chan string, 1)
	go func() { second <- h.prepare(b)[b.Uid].Error }()
	h.waitFor("the second call's List", func() bool { return h.podres.Calls() > calls })
	// During the wait, the kubelet gives b's device to a device-plugin
	// container.
	h.podres.Set(&podresourcesapi.PodResources{Name: "dp-pod", Namespace: "default", Containers: []*podresourcesapi.ContainerResources{{
		Name: "ctr", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: resName, DeviceIds: []string{"sim-n1-1"}}}}}})
	close(g.release)
	if err := <-first; err != "" {
		t.Fatal(err)
	}
	if err := <-second; !strings.Contains(err, "by a container through the device plugin") {
		t.Fatalf("a call that waited behind another used its List from before the wait: %q, want sim-1 refused", err)
	}
}

// TestLastShareReleaseAfterCrash: a driver that crashed while it released
// the last share of a device (the claim marked as being unprepared, the
// device's reset begun) leaves that claim in its checkpoint until the
// kubelet asks again; meanwhile it holds nothing. A new share prepared on
// the device and released before that retry resets the device, and the
// retry does not reset it again.
func TestLastShareReleaseAfterCrash(t *testing.T) {
	h := newSharedHarness(t)
	crash := h.crashAfter(afterReset)
	h.start()
	a := h.sharedClaim("a", share{"sim-0", "s-a", 1})
	if r := h.prepare(a)[a.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if r := h.unprepare(a)[a.Uid]; r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	h.stop()
	crash.restore()
	h.wrap = nil
	h.start()
	c := h.sharedClaim("c", share{"sim-0", "s-c", 1})
	if r := h.prepare(c)[c.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	// The preparation's own reset step counts too: count from here.
	before := h.deviceState("sim-n1-0").ResetCount
	if r := h.unprepare(c)[c.Uid]; r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	if n := h.deviceState("sim-n1-0").ResetCount - before; n != 1 {
		t.Fatalf("%d resets at the release of c, the device's last share after the crash; want 1", n)
	}
	if r := h.unprepare(a)[a.Uid]; r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	if n := h.deviceState("sim-n1-0").ResetCount - before; n != 1 {
		t.Errorf("%d resets after the retried release of a, want 1", n)
	}
	if len(h.checkpointed()) != 0 {
		t.Errorf("checkpoint: %+v", h.checkpointed())
	}
}
