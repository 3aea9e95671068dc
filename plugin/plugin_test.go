package plugin

import (
	"context"
	"errors"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

const resourceName = "example.com/sim"

func testKind(t testing.TB) cdi.Kind {
	t.Helper()
	k, err := cdi.KindFor("example.com", "sim")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// snapshot makes n devices over numa NUMA nodes (0: none) with replicas.
func snapshot(n, numa, replicas int) *device.Snapshot {
	s := &device.Snapshot{Replicas: replicas}
	for i := 0; i < n; i++ {
		d := device.Device{
			Name: "sim-" + strconv.Itoa(i), Index: i, HostPath: "/host/dev/sim-" + strconv.Itoa(i), ContainerPath: "/dev/sim-" + strconv.Itoa(i),
			Type: device.Char, Major: 1, Minor: 3, NUMANode: device.NoNUMA, Healthy: true,
		}
		if numa > 0 {
			d.NUMANode = i * numa / n
		}
		s.Devices = append(s.Devices, d)
	}
	return s
}

// testLog sends the plugin's log to the test's log.
func testLog(t *testing.T) *logrus.Entry {
	l := logrus.New()
	l.SetOutput(tWriter{t})
	l.SetLevel(logrus.DebugLevel)
	return logrus.NewEntry(l)
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func newPlugin(t *testing.T, dir string, snap *device.Snapshot, mod func(*Options)) *Plugin {
	t.Helper()
	o := Options{ResourceName: resourceName, PluginName: "test", Dir: dir, SocketName: "test-sim.sock", Kind: testKind(t), Log: testLog(t)}
	if mod != nil {
		mod(&o)
	}
	p, err := New(o, snap)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startKubelet serves the kubelet stand-in in dir until the test ends.
func startKubelet(t *testing.T, dir string) *kubeletsim.Kubelet {
	t.Helper()
	k, err := kubeletsim.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	return k
}

// runPlugin runs p until the test ends and checks Run returned cleanly.
func runPlugin(t *testing.T, p *Plugin) context.CancelFunc {
	t.Helper()
	return testutil.Go(t, p.Run)
}

func TestRegistrationAndKubeletRestart(t *testing.T) {
	dir := testutil.ShortDir(t)
	k := startKubelet(t, dir)
	p := newPlugin(t, dir, snapshot(8, 0, 1), nil)
	runPlugin(t, p)

	reg, err := k.WaitRegistration(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r := reg.Request
	if r.Version != pluginapi.Version || r.ResourceName != resourceName || r.Endpoint != "test-sim.sock" ||
		!r.Options.GetPreferredAllocationAvailable || r.Options.PreStartRequired {
		t.Fatalf("registration %+v", r)
	}
	c, updates := testutil.Watch(context.Background(), t, dir, r.Endpoint)
	opts, err := c.GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable || opts.PreStartRequired {
		t.Fatalf("options %+v %v", opts, err)
	}
	if _, err := kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 8 && len(u.Devices) == 8 }); err != nil {
		t.Fatal(err)
	}

	// A kubelet restart wipes the directory (our socket too) and serves
	// kubelet.sock again: the plugin serves a new socket and registers.
	for i := 0; i < 3; i++ {
		if _, err := k.Restart(); err != nil {
			t.Fatal(err)
		}
		reg, err := k.WaitRegistration(5 * time.Second)
		if err != nil {
			t.Fatalf("restart %d: %v", i, err)
		}
		if _, err := os.Stat(filepath.Join(dir, reg.Request.Endpoint)); err != nil {
			t.Fatalf("restart %d: socket not served again: %v", i, err)
		}
		_, u := testutil.Watch(context.Background(), t, dir, reg.Request.Endpoint)
		if _, err := kubeletsim.WaitFor(u, 5*time.Second, func(u kubeletsim.Update) bool { return len(u.Devices) == 8 }); err != nil {
			t.Fatalf("restart %d: %v", i, err)
		}
		// One restart, one registration: stale events are not acted on.
		select {
		case dup := <-k.Regs:
			t.Fatalf("restart %d: second registration %+v", i, dup.Request)
		case <-time.After(100 * time.Millisecond):
		}
	}
	// The old stream ended with the old server.
	if err := kubeletsim.WaitEnded(updates, 5*time.Second); err != nil {
		t.Fatalf("old stream: %v", err)
	}
}

func TestRegistersWhenKubeletComesLater(t *testing.T) {
	dir := testutil.ShortDir(t)
	p := newPlugin(t, dir, snapshot(2, 0, 1), nil)
	runPlugin(t, p)
	time.Sleep(50 * time.Millisecond) // the first attempt fails: no kubelet
	k := startKubelet(t, dir)
	if _, err := k.WaitRegistration(5 * time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestShutdownRemovesSocket(t *testing.T) {
	dir := testutil.ShortDir(t)
	k := startKubelet(t, dir)
	p := newPlugin(t, dir, snapshot(2, 0, 1), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	if _, err := k.WaitRegistration(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	_, updates := testutil.Watch(context.Background(), t, dir, "test-sim.sock")
	<-updates
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.SocketPath()); !os.IsNotExist(err) {
		t.Fatalf("socket still there: %v", err)
	}
	// An open ListAndWatch stream does not hold up the shutdown, and ends.
	if err := kubeletsim.WaitEnded(updates, 2*time.Second); err != nil {
		t.Fatalf("stream after shutdown: %v", err)
	}
}

func TestListAndWatchSendsUpdates(t *testing.T) {
	dir := testutil.ShortDir(t)
	p := newPlugin(t, dir, snapshot(3, 0, 1), nil)
	runPlugin(t, p)
	k := startKubelet(t, dir)
	if _, err := k.WaitRegistration(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	_, updates := testutil.Watch(context.Background(), t, dir, "test-sim.sock")
	first, err := kubeletsim.WaitFor(updates, 5*time.Second, func(kubeletsim.Update) bool { return true })
	if err != nil || first.Healthy() != 3 {
		t.Fatalf("first list %+v %v", first, err)
	}
	s := snapshot(3, 0, 1)
	s.Devices[2].SetProblem(device.Problem{Cause: device.CauseMissing})
	if err := p.Update(s); err != nil {
		t.Fatal(err)
	}
	u, err := kubeletsim.WaitFor(updates, 5*time.Second, func(kubeletsim.Update) bool { return true })
	if err != nil || u.Health("sim-2") != pluginapi.Unhealthy || u.Healthy() != 2 {
		t.Fatalf("update %+v %v", u, err)
	}
}

func allocate(t *testing.T, p *Plugin, ids ...[]string) (*pluginapi.AllocateResponse, error) {
	t.Helper()
	req := &pluginapi.AllocateRequest{}
	for _, c := range ids {
		req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: c})
	}
	return p.Allocate(context.Background(), req)
}

func TestAllocateStrategies(t *testing.T) {
	mounts := []*pluginapi.Mount{{HostPath: "/opt/fw", ContainerPath: "/fw", ReadOnly: true}}
	cases := []struct {
		name                string
		strategies          config.Strategies
		wantCDI             []string
		wantCDIAnnotation   string
		wantSpecs           []string
		wantPerDeviceEnvVar bool
	}{
		{name: "cdi-cri", strategies: config.Strategies{config.StrategyCDICRI}, wantCDI: []string{"k8s.example.com/sim=sim-1", "k8s.example.com/sim=sim-3"}},
		{name: "cdi-annotations", strategies: config.Strategies{config.StrategyCDIAnnotations}, wantCDIAnnotation: "k8s.example.com/sim=sim-1,k8s.example.com/sim=sim-3"},
		{name: "device-specs", strategies: config.Strategies{config.StrategyDeviceSpecs}, wantSpecs: []string{"/dev/sim-1", "/dev/sim-3"}, wantPerDeviceEnvVar: true},
		{name: "all", strategies: config.Strategies{config.StrategyCDICRI, config.StrategyCDIAnnotations, config.StrategyDeviceSpecs},
			wantCDI:           []string{"k8s.example.com/sim=sim-1", "k8s.example.com/sim=sim-3"},
			wantCDIAnnotation: "k8s.example.com/sim=sim-1,k8s.example.com/sim=sim-3",
			wantSpecs:         []string{"/dev/sim-1", "/dev/sim-3"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newPlugin(t, testutil.ShortDir(t), snapshot(4, 0, 1), func(o *Options) {
				o.Strategies = c.strategies
				o.EnvPrefix, o.AnnotationPrefix, o.Mounts = "SIM", "example.com/sim", mounts
			})
			resp, err := allocate(t, p, []string{"sim-1", "sim-3"}, []string{"sim-0"})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.ContainerResponses) != 2 {
				t.Fatalf("%d responses", len(resp.ContainerResponses))
			}
			r := resp.ContainerResponses[0]
			var cdiNames []string
			for _, d := range r.CdiDevices {
				cdiNames = append(cdiNames, d.Name)
			}
			if !slices.Equal(cdiNames, c.wantCDI) {
				t.Errorf("CDI devices %v, want %v", cdiNames, c.wantCDI)
			}
			if got := r.Annotations["cdi.k8s.io/test_example.com_sim"]; got != c.wantCDIAnnotation {
				t.Errorf("CDI annotation %q, want %q (all: %v)", got, c.wantCDIAnnotation, r.Annotations)
			}
			var paths []string
			for _, d := range r.Devices {
				paths = append(paths, d.ContainerPath)
				if d.HostPath != "/host"+d.ContainerPath || d.Permissions != "rw" {
					t.Errorf("device spec %+v", d)
				}
			}
			if !slices.Equal(paths, c.wantSpecs) {
				t.Errorf("device specs %v, want %v", paths, c.wantSpecs)
			}
			if r.Envs["SIM_DEVICES"] != "sim-1,sim-3" {
				t.Errorf("env %v", r.Envs)
			}
			if _, ok := r.Envs["SIM_1"]; ok != c.wantPerDeviceEnvVar {
				t.Errorf("per-device env present=%v, want %v: %v", ok, c.wantPerDeviceEnvVar, r.Envs)
			}
			if c.wantPerDeviceEnvVar && r.Envs["SIM_3"] != "/dev/sim-3" {
				t.Errorf("env %v", r.Envs)
			}
			if r.Annotations["example.com/sim-1"] != "sim-1" || r.Annotations["example.com/sim-3"] != "sim-3" || r.Annotations["example.com/sim-0"] != "" {
				t.Errorf("annotations %v", r.Annotations)
			}
			if len(r.Mounts) != 1 || r.Mounts[0].ContainerPath != "/fw" || !r.Mounts[0].ReadOnly {
				t.Errorf("mounts %v", r.Mounts)
			}
			if r2 := resp.ContainerResponses[1]; r2.Envs["SIM_DEVICES"] != "sim-0" {
				t.Errorf("second container %v", r2.Envs)
			}
		})
	}
}

func TestAllocateWithoutPrefixes(t *testing.T) {
	p := newPlugin(t, testutil.ShortDir(t), snapshot(2, 0, 1), nil)
	resp, err := allocate(t, p, []string{"sim-0"})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.ContainerResponses[0]
	if len(r.Envs) != 0 || len(r.Annotations) != 0 || len(r.Devices) != 0 || len(r.CdiDevices) != 1 {
		t.Fatalf("no prefixes, cdi-cri only: %+v", r)
	}
}

func TestAllocateReplicasShareOneCDIDevice(t *testing.T) {
	p := newPlugin(t, testutil.ShortDir(t), snapshot(2, 0, 3), nil)
	resp, err := allocate(t, p, []string{"sim-1::0", "sim-1::2", "sim-0::1"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range resp.ContainerResponses[0].CdiDevices {
		names = append(names, d.Name)
	}
	if !slices.Equal(names, []string{"k8s.example.com/sim=sim-1", "k8s.example.com/sim=sim-0"}) {
		t.Fatalf("names %v", names)
	}
}

func TestAllocateRejects(t *testing.T) {
	s := snapshot(3, 0, 1)
	s.Devices[1].SetProblem(device.Problem{Cause: device.CauseMissing})
	p := newPlugin(t, testutil.ShortDir(t), s, nil)
	for _, c := range []struct {
		name, bad string
		ids       []string
	}{
		{"unknown", "sim-9", []string{"sim-0", "sim-9"}},
		{"unhealthy", "sim-1", []string{"sim-1"}},
		{"replica suffix unknown without replicas", "sim-0::0", []string{"sim-0::0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := allocate(t, p, []string{"sim-2"}, c.ids)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("code %v (%v)", status.Code(err), err)
			}
			if !strings.Contains(err.Error(), `"`+c.bad+`"`) {
				t.Fatalf("error %q does not name %q", err, c.bad)
			}
		})
	}
}

func TestPreferredAllocation(t *testing.T) {
	ids := func(s *device.Snapshot) []string {
		var out []string
		for _, d := range s.Devices {
			for r := 0; r < s.Replicas; r++ {
				out = append(out, device.ReplicaID(d.Name, r, s.Replicas))
			}
		}
		return out
	}
	unhealthy := snapshot(4, 0, 1)
	unhealthy.Devices[0].Healthy = false
	cases := []struct {
		name      string
		snap      *device.Snapshot
		available []string // nil: all
		must      []string
		size      int
		want      []string
	}{
		{name: "first devices", snap: snapshot(4, 0, 1), size: 2, want: []string{"sim-0", "sim-1"}},
		{name: "must include kept first", snap: snapshot(4, 0, 1), must: []string{"sim-3"}, size: 2, want: []string{"sim-3", "sim-0"}},
		{name: "one NUMA node", snap: snapshot(8, 2, 1), available: []string{"sim-0", "sim-4", "sim-5", "sim-6"}, size: 2, want: []string{"sim-4", "sim-5"}},
		{name: "best fit NUMA node", snap: snapshot(8, 2, 1), available: []string{"sim-0", "sim-1", "sim-4", "sim-5", "sim-6"}, size: 2, want: []string{"sim-0", "sim-1"}},
		{name: "NUMA node of must include", snap: snapshot(8, 2, 1), must: []string{"sim-6"}, size: 3, want: []string{"sim-6", "sim-4", "sim-5"}},
		{name: "spill to second node", snap: snapshot(8, 2, 1), available: []string{"sim-0", "sim-4", "sim-5"}, size: 3, want: []string{"sim-4", "sim-5", "sim-0"}},
		{name: "replicas spread over devices", snap: snapshot(3, 0, 2), size: 3, want: []string{"sim-0::0", "sim-1::0", "sim-2::0"}},
		{name: "replicas least loaded first", snap: snapshot(2, 0, 2), available: []string{"sim-0::1", "sim-1::0", "sim-1::1"}, size: 1, want: []string{"sim-1::0"}},
		{name: "replicas avoid device of must include", snap: snapshot(2, 0, 2), must: []string{"sim-0::0"}, size: 2, want: []string{"sim-0::0", "sim-1::0"}},
		{name: "skips unhealthy", snap: unhealthy, size: 2, want: []string{"sim-1", "sim-2"}},
		{name: "order of available does not matter", snap: snapshot(4, 0, 1), available: []string{"sim-3", "sim-2", "sim-1"}, size: 2, want: []string{"sim-1", "sim-2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newPlugin(t, testutil.ShortDir(t), c.snap, nil)
			avail := c.available
			if avail == nil {
				avail = ids(c.snap)
			}
			req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
				AvailableDeviceIDs: avail, MustIncludeDeviceIDs: c.must, AllocationSize: int32(c.size),
			}}}
			for i := 0; i < 3; i++ { // deterministic
				resp, err := p.GetPreferredAllocation(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				if got := resp.ContainerResponses[0].DeviceIDs; !slices.Equal(got, c.want) {
					t.Fatalf("got %v, want %v", got, c.want)
				}
			}
		})
	}
	p := newPlugin(t, testutil.ShortDir(t), snapshot(2, 0, 1), nil)
	_, err := p.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: []string{"sim-0"}, MustIncludeDeviceIDs: []string{"nope"}, AllocationSize: 1,
	}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("unknown must-include: %v", err)
	}
}

func TestTopologyReported(t *testing.T) {
	p := newPlugin(t, testutil.ShortDir(t), snapshot(4, 2, 1), nil)
	v := p.state.Load()
	for i, d := range v.list {
		want := int64(i * 2 / 4)
		if d.Topology == nil || len(d.Topology.Nodes) != 1 || d.Topology.Nodes[0].ID != want {
			t.Fatalf("device %s topology %+v, want node %d", d.ID, d.Topology, want)
		}
	}
	p = newPlugin(t, testutil.ShortDir(t), snapshot(2, 0, 1), nil)
	if p.state.Load().list[0].Topology != nil {
		t.Fatal("topology without NUMA nodes")
	}
}

// recorder is a Preparer that records calls and fails on demand.
type recorder struct {
	mu    sync.Mutex
	calls [][]string
	err   error
}

func (*recorder) Steps() []string { return []string{"record"} }

func (r *recorder) Prepare(_ context.Context, devs []device.Device) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	r.calls = append(r.calls, names)
	return r.err
}

func TestPreStartContainer(t *testing.T) {
	dir := testutil.ShortDir(t)
	k := startKubelet(t, dir)
	rec := &recorder{}
	p := newPlugin(t, dir, snapshot(3, 0, 2), func(o *Options) { o.Preparer = rec })
	runPlugin(t, p)
	reg, err := k.WaitRegistration(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !reg.Request.Options.PreStartRequired {
		t.Fatal("PreStartRequired not advertised with a preparer")
	}
	c, _ := testutil.Watch(context.Background(), t, dir, reg.Request.Endpoint)
	ctx := context.Background()
	// Two replicas of sim-1 and one of sim-2: each physical device once.
	if _, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"sim-1::0", "sim-2::1", "sim-1::1"}}); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	calls := slices.Clone(rec.calls)
	rec.mu.Unlock()
	if len(calls) != 1 || strings.Join(calls[0], ",") != "sim-1,sim-2" {
		t.Fatalf("calls %v", calls)
	}
	_, err = c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"sim-7::0"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "sim-7::0") {
		t.Fatalf("unknown ID: %v", err)
	}
	rec.mu.Lock()
	rec.err = errors.New("device sim-1: step reset: disk on fire")
	rec.mu.Unlock()
	_, err = c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"sim-1::0"}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "device sim-1: step reset: disk on fire") {
		t.Fatalf("failure: %v", err)
	}
}

// hangingKubelet accepts connections on kubelet.sock but never answers
// Register, as a wedged kubelet would.
type hangingKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	srv *grpc.Server
}

func (hangingKubelet) Register(ctx context.Context, _ *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func startHangingKubelet(t *testing.T, dir string) *hangingKubelet {
	t.Helper()
	lis, err := net.Listen("unix", filepath.Join(dir, KubeletSocket))
	if err != nil {
		t.Fatal(err)
	}
	h := &hangingKubelet{srv: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(h.srv, h)
	go func() { _ = h.srv.Serve(lis) }()
	t.Cleanup(h.srv.Stop)
	return h
}

// TestHungRegistrationDoesNotBlock: while a Register
// call hangs, the plugin still serves a new socket when its own is
// removed, and registers at once with a kubelet that comes back.
func TestHungRegistrationDoesNotBlock(t *testing.T) {
	dir := testutil.ShortDir(t)
	h := startHangingKubelet(t, dir)
	p := newPlugin(t, dir, snapshot(2, 0, 1), nil)
	runPlugin(t, p)
	sock := filepath.Join(dir, "test-sim.sock")
	waitFile := func(what string, d time.Duration) {
		t.Helper()
		deadline := time.Now().Add(d)
		for {
			if _, err := os.Stat(sock); err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: socket not served within %s", what, d)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFile("start", 2*time.Second)
	time.Sleep(100 * time.Millisecond) // Register is hanging now
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	waitFile("socket removed while Register hangs", time.Second)

	// The kubelet restarts properly: one registration, promptly.
	h.srv.Stop()
	_ = os.Remove(filepath.Join(dir, KubeletSocket))
	k := startKubelet(t, dir)
	if _, err := k.WaitRegistration(2 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestAnnotationsWithReplicas: with replicas, the per-device
// annotation does not depend on the order of the requested IDs.
func TestAnnotationsWithReplicas(t *testing.T) {
	p := newPlugin(t, testutil.ShortDir(t), snapshot(2, 0, 2), func(o *Options) { o.AnnotationPrefix = "example.com/dev" })
	a, err := allocate(t, p, []string{"sim-0::0", "sim-0::1", "sim-1::1"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := allocate(t, p, []string{"sim-1::1", "sim-0::1", "sim-0::0"})
	if err != nil {
		t.Fatal(err)
	}
	x, y := a.ContainerResponses[0].Annotations, b.ContainerResponses[0].Annotations
	if len(x) != 2 || !maps.Equal(x, y) {
		t.Fatalf("annotations depend on request order: %v vs %v", x, y)
	}
	if x["example.com/dev-0"] != "sim-0::0,sim-0::1" || x["example.com/dev-1"] != "sim-1::1" {
		t.Fatalf("annotations %v", x)
	}
}

// slowPreparer holds Prepare until released, whatever its context says (a
// step finishing its work within its budget), and records when it ended.
type slowPreparer struct {
	entered, release chan struct{}
	ended            atomic.Bool
}

func (s *slowPreparer) Steps() []string { return []string{"slow"} }
func (s *slowPreparer) Prepare(context.Context, []device.Device) error {
	close(s.entered)
	<-s.release
	s.ended.Store(true)
	return nil
}

// TestStopWaitsForHandlers: a PreStartContainer in flight
// when the plugin stops (a reload restarting the resource) has ended when
// Run returns, so that no preparation outlives its server and overlaps
// one of the replacement's.
func TestStopWaitsForHandlers(t *testing.T) {
	dir := testutil.ShortDir(t)
	k := startKubelet(t, dir)
	prep := &slowPreparer{entered: make(chan struct{}), release: make(chan struct{})}
	p := newPlugin(t, dir, snapshot(1, 0, 1), func(o *Options) { o.Preparer = prep })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	reg, err := k.WaitRegistration(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := testutil.Watch(context.Background(), t, dir, reg.Request.Endpoint)
	rpcDone := make(chan struct{})
	go func() {
		defer close(rpcDone)
		_, _ = c.PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: []string{"sim-0"}})
	}()
	<-prep.entered
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while PreStartContainer still ran", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(prep.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !prep.ended.Load() {
		t.Fatal("Run returned before the handler ended")
	}
	<-rpcDone
}
