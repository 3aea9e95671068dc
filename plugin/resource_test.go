package plugin

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/latest"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// fakeSource publishes the snapshots the test sends.
type fakeSource struct {
	first *device.Snapshot
	in    chan *device.Snapshot
}

func (s *fakeSource) Snapshot() *device.Snapshot { return s.first }
func (s *fakeSource) Run(ctx context.Context, out chan *device.Snapshot) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case snap := <-s.in:
			latest.Send(out, snap)
		}
	}
}

// flakySpec fails its writes while fail is set, and remembers what it
// wrote last.
type flakySpec struct {
	mu      sync.Mutex
	fail    bool
	written *device.Snapshot
	writes  int
	changed chan struct{}
	status  cdi.Status
}

func (s *flakySpec) Write(snap *device.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	if s.fail {
		return errors.New("disk full")
	}
	s.written = snap
	return nil
}

func (s *flakySpec) set(fail bool) {
	s.mu.Lock()
	s.fail = fail
	s.mu.Unlock()
}

func (s *flakySpec) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes
}

func (s *flakySpec) Check() (cdi.Status, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status, "test"
}

func (s *flakySpec) Watch(ctx context.Context, changed chan<- struct{}) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.changed:
			changed <- struct{}{}
		}
	}
}

// TestResourceHoldsBackUnwrittenDevices: a device the spec on disk does
// not describe is advertised Unhealthy with the write's error, the write
// is retried with a backoff, and the device is Healthy once it succeeds.
// A spec taken over by a newer process holds every device back.
func TestResourceHoldsBackUnwrittenDevices(t *testing.T) {
	dir := testutil.ShortDir(t)
	k := startKubelet(t, dir)
	first := snapshot(1, 0, 1)
	src := &fakeSource{first: first, in: make(chan *device.Snapshot)}
	spec := &flakySpec{changed: make(chan struct{})}
	r := &Resource{Source: src, Spec: spec, Plugin: newPlugin(t, dir, nil, nil), Log: testLog(t), RetryMin: 10 * time.Millisecond, RetryMax: 40 * time.Millisecond}
	wait := runResource(t, dir, k, r)
	wait("first device", func(u kubeletsim.Update) bool { return u.Health("sim-0") == pluginapi.Healthy })

	spec.set(true)
	src.in <- snapshot(2, 0, 1)
	wait("new device held back", func(u kubeletsim.Update) bool {
		return u.Health("sim-1") == pluginapi.Unhealthy && u.Health("sim-0") == pluginapi.Healthy
	})
	if _, err := allocate(t, r.Plugin, []string{"sim-1"}); err == nil {
		t.Fatal("allocated a device the spec does not describe")
	}
	before := spec.count()
	time.Sleep(200 * time.Millisecond)
	if n := spec.count() - before; n < 3 || n > 10 {
		t.Fatalf("%d retries in 200ms with a 10-40ms backoff", n)
	}
	spec.set(false)
	wait("written at last", func(u kubeletsim.Update) bool { return u.Healthy() == 2 })

	// Taken over: no more writes, every device held back.
	spec.mu.Lock()
	spec.status = cdi.Superseded
	spec.mu.Unlock()
	spec.changed <- struct{}{}
	wait("superseded", func(u kubeletsim.Update) bool { return u.Healthy() == 0 && len(u.Devices) == 2 })
	n := spec.count()
	src.in <- snapshot(3, 0, 1)
	wait("third device, held back", func(u kubeletsim.Update) bool { return len(u.Devices) == 3 && u.Healthy() == 0 })
	if spec.count() != n {
		t.Fatal("wrote a spec that a newer process owns")
	}
}

// TestResourceTakesBackAnOrphanedSpec: a newer process
// takes the spec over (our devices are held back) and keeps it while it
// serves its socket; once it is gone, leaving its spec behind, this one
// takes the spec back without any file event and its devices are Healthy.
func TestResourceTakesBackAnOrphanedSpec(t *testing.T) {
	dir, cdiDir := testutil.ShortDir(t), t.TempDir()
	k := startKubelet(t, dir)
	first := snapshot(2, 0, 1)
	for i := range first.Devices {
		first.Devices[i].HostPath = "/dev/null"
	}
	p := newPlugin(t, dir, nil, nil)
	res := cdi.Resource{Name: resourceName, Kind: testKind(t), Socket: p.SocketPath()}
	spec := cdi.NewWriter(cdiDir, "ns/plugin", 100).Spec(res)
	src := &fakeSource{first: first, in: make(chan *device.Snapshot)}
	r := &Resource{Source: src, Spec: spec, Plugin: p, Log: testLog(t), YieldRecheck: 20 * time.Millisecond}
	wait := runResource(t, dir, k, r)
	wait("ours", func(u kubeletsim.Update) bool { return u.Healthy() == 2 })
	owner := func() string {
		t.Helper()
		s, err := cdiapi.ReadSpec(spec.Path(), 0)
		if err != nil {
			t.Fatal(err)
		}
		return s.Annotations[cdi.SocketAnnotation]
	}

	newerSock := filepath.Join(dir, "test-sim-newer.sock")
	l, err := net.Listen("unix", newerSock)
	if err != nil {
		t.Fatal(err)
	}
	newer := res
	newer.Socket = newerSock
	if err := cdi.NewWriter(cdiDir, "ns/plugin", 200).Write(newer, first); err != nil {
		t.Fatal(err)
	}
	wait("yielded", func(u kubeletsim.Update) bool { return u.Healthy() == 0 })
	// The devices say why, with the cause metrics and logs read.
	for _, d := range p.state.Load().snap.Devices {
		if d.Problem.Cause != device.CauseYielded || !strings.Contains(d.Problem.Message, "taken over") {
			t.Fatalf("%s: problem %q, want yielded to the newer process", d.Name, d.Problem)
		}
	}
	// Rechecked many times while the newer process serves its socket: it
	// keeps the spec.
	time.Sleep(20 * r.YieldRecheck)
	if got := owner(); got != newerSock {
		t.Fatalf("spec taken back from a live newer process: socket %q", got)
	}
	_ = l.Close() // the newer process exits; its spec stays
	wait("taken back", func(u kubeletsim.Update) bool { return u.Healthy() == 2 })
	if got := owner(); got != p.SocketPath() {
		t.Fatalf("spec after taking it back names socket %q, want ours %q", got, p.SocketPath())
	}
}

// runResource runs r until the test ends (checking that Run returned
// cleanly), waits for its registration with the kubelet stand-in k and
// returns a wait for a condition on its ListAndWatch stream.
func runResource(t *testing.T, dir string, k *kubeletsim.Kubelet, r *Resource) func(what string, cond func(kubeletsim.Update) bool) {
	t.Helper()
	testutil.Go(t, r.Run)
	reg, err := k.WaitRegistration(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, updates := testutil.Watch(context.Background(), t, dir, reg.Request.Endpoint)
	return func(what string, cond func(kubeletsim.Update) bool) {
		t.Helper()
		if _, err := kubeletsim.WaitFor(updates, 5*time.Second, cond); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
}
