package dra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
	"github.com/cdi-device-plugin/cdi-device-plugin/resource"
)

const (
	node     = "n1"
	resName  = "example.com/sim"
	claimNS  = "default"
	bootOne  = "boot-1"
	deadline = 10 * time.Second
	// simPool is the pool of the devices of resName on node.
	simPool = node + "/sim"
)

// harness runs the driver on real files and sockets: simulated device
// nodes, CDI specs, device state and the claim checkpoint in temporary
// directories, the kubelet's registration and DRA calls over the sockets
// the helper serves, the API in client-go's fake clientset and the
// kubelet's PodResources in a stand-in.
type harness struct {
	t                           testing.TB
	dev, cdiDir, state          string
	registrar, plugins, podSock string
	podres                      *testutil.PodResources
	client                      *fake.Clientset
	boot                        string
	extraEnv                    map[string]string
	// wrap, when set, wraps each resource's runner (a stop point in
	// Unprepare); options, when set, edits the driver's options.
	wrap    func(Runner) Runner
	options func(*Options)
	// logs is everything the driver logged, across restarts.
	logs syncBuffer

	driver *Driver
	cancel context.CancelFunc
	done   chan error
	kl     *kubeletsim.DRA
}

func newHarness(t testing.TB, env map[string]string) *harness {
	t.Helper()
	testutil.NeedMknod(t)
	short := testutil.ShortDir(t)
	base := t.TempDir()
	h := &harness{t: t, dev: filepath.Join(base, "dev"), cdiDir: filepath.Join(base, "cdi"), state: filepath.Join(base, "state"),
		registrar: filepath.Join(short, "reg"), plugins: filepath.Join(short, "plugins"), podSock: filepath.Join(short, "podres.sock"),
		boot: bootOne, extraEnv: env}
	if err := os.Mkdir(h.dev, 0o755); err != nil {
		t.Fatal(err)
	}
	h.podres = testutil.ServePodResources(t, h.podSock)
	h.client = fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})
	nameGenerated(h.client)
	statusOfExisting(h.client)
	t.Cleanup(h.stop)
	return h
}

func (h *harness) config() *config.Config {
	h.t.Helper()
	env := map[string]string{"RESOURCE_NAME": resName, "NUMBER_DEVICES": "4", "DEVICE_ID_PREFIX": "sim", "ENV_PREFIX": "SIM"}
	for k, v := range h.extraEnv {
		env[k] = v
	}
	cfg, err := config.Load([]string{"--dev-root", h.dev, "--cdi-dir", h.cdiDir, "--state-dir", h.state, "--node-name", node,
		"--pod-resources-socket", h.podSock}, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	return cfg
}

// start builds the driver as cmd/cdi-dra-driver does, runs it, and
// registers it with the kubelet stand-in.
func (h *harness) start() {
	h.t.Helper()
	cfg := h.config()
	cp := NewCheckpoint(filepath.Join(h.state, "dra", "checkpoint.json"))
	if err := cp.Load(); err != nil {
		h.t.Fatal(err)
	}
	w := cdi.NewWriter(h.cdiDir, cfg.Owner(), time.Now().UnixNano())
	drv := filepath.Join(h.plugins, testDriver)
	opts := Options{DriverName: testDriver, NodeName: node, Client: h.client, RegistrarDir: h.registrar, PluginDir: drv,
		Writer: w, Checkpoint: cp, PodResources: h.podSock, BootID: h.boot, Log: logrus.NewEntry(logrus.New()), PollInterval: 20 * time.Millisecond}
	opts.Log.Logger.SetOutput(io.MultiWriter(testWriter{h.t}, &h.logs))
	for i := range cfg.Resources {
		rc := &cfg.Resources[i]
		p, err := resource.Build(cfg, i, resource.Options{Writer: w, Socket: filepath.Join(drv, "dra.sock"), Log: opts.Log,
			Holders: func(context.Context) ([]string, error) { return cp.Held(rc.Name), nil }})
		if err != nil {
			h.t.Fatal(err)
		}
		if _, err := p.Prepare(); err != nil {
			h.t.Fatal(err)
		}
		var runner Runner = p.Runner
		if h.wrap != nil {
			runner = h.wrap(runner)
		}
		opts.Resources = append(opts.Resources, Resource{Name: rc.Name, Kind: p.Kind, IDPrefix: rc.IDPrefix, EnvPrefix: rc.EnvPrefix,
			Source: p.Source, Spec: p.Spec, Runner: runner, Replicas: rc.ReplicaCount()})
	}
	if h.options != nil {
		h.options(&opts)
	}
	d, err := New(opts)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.driver, h.cancel, h.done = d, cancel, make(chan error, 1)
	go func() { h.done <- d.Run(ctx) }()
	sock := filepath.Join(h.registrar, testDriver+"-reg.sock")
	h.waitFor("registration", func() bool {
		kl, err := kubeletsim.RegisterDRA(context.Background(), sock)
		if err != nil {
			return false
		}
		h.kl = kl
		return true
	})
	h.waitFor("readiness", func() bool { return d.Ready() == nil })
}

// stop stops the driver and waits for it.
func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("driver: %v", err)
		}
	case <-time.After(deadline):
		h.t.Error("the driver did not stop within 10s of its cancel")
	}
	_ = h.kl.Close()
	h.cancel = nil
}

// nameGenerated makes client's creates name the objects that ask for a
// generated name (metadata.generateName), as the API server does and the
// fake clientset does not: the ResourceSlice controller names its slices
// so, and matches them by the index at the start of the name.
func nameGenerated(client *fake.Clientset) {
	var n atomic.Int64
	client.PrependReactor("create", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if o, ok := a.(clienttesting.CreateAction).GetObject().(metav1.Object); ok && o.GetName() == "" && o.GetGenerateName() != "" {
			o.SetName(fmt.Sprintf("%s%05d", o.GetGenerateName(), n.Add(1)))
		}
		return false, nil, nil
	})
}

type testWriter struct{ t testing.TB }

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			h.t.Fatalf("not within %s: %s", deadline, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// claim makes an allocated claim of the devices (DRA names, of the pool
// simPool) in the API.
func (h *harness) claim(name string, devices ...string) *drav1.Claim {
	h.t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: claimNS, UID: types.UID("uid-" + name)}}
	alloc := &resourceapi.AllocationResult{}
	for _, d := range devices {
		alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{Request: "req", Driver: testDriver, Pool: simPool, Device: d})
	}
	// A device of another driver is not ours to prepare.
	alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{Request: "other", Driver: "gpu.other.com", Pool: node, Device: "gpu-0"})
	c.Status.Allocation = alloc
	if _, err := h.client.ResourceV1().ResourceClaims(claimNS).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	return &drav1.Claim{Namespace: claimNS, Name: name, Uid: string(c.UID)}
}

func (h *harness) prepare(claims ...*drav1.Claim) map[string]*drav1.NodePrepareResourceResponse {
	h.t.Helper()
	resp, err := h.kl.Prepare(context.Background(), claims...)
	if err != nil {
		h.t.Fatal(err)
	}
	if len(resp.Claims) != len(claims) {
		h.t.Fatalf("%d answers for %d claims", len(resp.Claims), len(claims))
	}
	return resp.Claims
}

func (h *harness) unprepare(claims ...*drav1.Claim) map[string]*drav1.NodeUnprepareResourceResponse {
	h.t.Helper()
	resp, err := h.kl.Unprepare(context.Background(), claims...)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.Claims
}

func (h *harness) deviceState(id string) prestart.State {
	h.t.Helper()
	s, err := prestart.LoadState(filepath.Join(h.state, "devices", id))
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

func (h *harness) checkpointed() map[types.UID]PreparedClaim {
	h.t.Helper()
	cp := NewCheckpoint(filepath.Join(h.state, "dra", "checkpoint.json"))
	if err := cp.Load(); err != nil {
		h.t.Fatal(err)
	}
	return cp.Claims()
}

// inject resolves the CDI IDs with a fresh CDI cache and applies them to
// an OCI spec, as containerd does for a container.
func (h *harness) inject(ids []string) *oci.Spec {
	h.t.Helper()
	c, err := cdiapi.NewCache(cdiapi.WithSpecDirs(h.cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		h.t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := c.InjectDevices(spec, ids...); err != nil || len(unresolved) > 0 {
		h.t.Fatalf("inject %v: %v %v", ids, unresolved, err)
	}
	return spec
}

func allIDs(r *drav1.NodePrepareResourceResponse) []string {
	var out []string
	for _, d := range r.Devices {
		out = append(out, d.CdiDeviceIds...)
	}
	return out
}

// TestPrepareUnprepareAcrossRestart (issue 21): a claim's devices are
// prepared with the resource's steps (state.json), its CDI IDs resolve
// with a fresh CDI cache to the device nodes, the per-device variables of
// the resource's spec and the claim's SIM_DEVICES; it is checkpointed; a
// second Prepare, also after a driver restart, answers the same without
// running the steps again; Unprepare after the restart resets the device,
// removes the claim spec and the checkpoint entry; an unknown UID is
// unprepared at once.
func TestPrepareUnprepareAcrossRestart(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	c1 := h.claim("c1", "sim-1", "sim-3")
	got := h.prepare(c1)[c1.Uid]
	if got.Error != "" {
		t.Fatal(got.Error)
	}
	claimID := "k8s." + testDriver + "/claim=" + c1.Uid
	want := [][]string{{"k8s.example.com/sim=sim-n1-1", claimID}, {"k8s.example.com/sim=sim-n1-3"}}
	if len(got.Devices) != 2 {
		t.Fatalf("devices %v", got.Devices)
	}
	for i, d := range got.Devices {
		if !slices.Equal(d.CdiDeviceIds, want[i]) || d.PoolName != simPool || d.DeviceName != []string{"sim-1", "sim-3"}[i] || !slices.Equal(d.RequestNames, []string{"req"}) {
			t.Errorf("device %d: %v, want CDI IDs %v", i, d, want[i])
		}
	}
	spec := h.inject(allIDs(got))
	for _, e := range []string{"SIM_1=/dev/sim-1", "SIM_3=/dev/sim-3", "SIM_DEVICES=sim-n1-1,sim-n1-3"} {
		if !slices.Contains(spec.Process.Env, e) {
			t.Errorf("env %v lacks %s", spec.Process.Env, e)
		}
	}
	if len(spec.Linux.Devices) != 2 || spec.Linux.Devices[0].Path != "/dev/sim-1" {
		t.Errorf("devices %+v", spec.Linux.Devices)
	}
	for _, m := range spec.Mounts {
		if _, err := os.Stat(m.Source); err != nil {
			t.Errorf("mount source %s: %v", m.Source, err)
		}
	}
	if s := h.deviceState("sim-n1-1"); s.Generation != 1 || s.Firmware == nil || s.Status != prestart.StatusReady {
		t.Fatalf("sim-n1-1 state %+v", s)
	}
	if s := h.deviceState("sim-n1-0"); s.Generation != 0 {
		t.Fatalf("an unallocated device was prepared: %+v", s)
	}
	pc, ok := h.checkpointed()[types.UID(c1.Uid)]
	if !ok || pc.Namespace != claimNS || pc.Name != "c1" || pc.ClaimSpec == "" || len(pc.Devices) != 2 {
		t.Fatalf("checkpoint %+v", pc)
	}

	ckpt := filepath.Join(h.state, "dra", "checkpoint.json")
	written, err := os.Stat(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	again := h.prepare(c1)[c1.Uid]
	if again.Error != "" || fmt.Sprint(allIDs(again)) != fmt.Sprint(allIDs(got)) {
		t.Fatalf("second Prepare: %v, want %v", again, got)
	}
	// Nothing new to keep: the checkpoint is not written (and synced)
	// again (a write replaces the file).
	if fi, err := os.Stat(ckpt); err != nil || !os.SameFile(fi, written) {
		t.Fatalf("the checkpoint was written again for a claim prepared already (%v)", err)
	}
	h.stop()
	h.start()
	after := h.prepare(c1)[c1.Uid]
	if after.Error != "" || fmt.Sprint(allIDs(after)) != fmt.Sprint(allIDs(got)) {
		t.Fatalf("Prepare after a restart: %v, want %v", after, got)
	}
	if s := h.deviceState("sim-n1-1"); s.Generation != 1 {
		t.Fatalf("steps ran again for a prepared claim: generation %d", s.Generation)
	}

	before := h.deviceState("sim-n1-3").ResetCount
	unknown := &drav1.Claim{Namespace: claimNS, Name: "never", Uid: "uid-never"}
	res := h.unprepare(c1, unknown)
	if res[c1.Uid].GetError() != "" || res[unknown.Uid].GetError() != "" || len(res) != 2 {
		t.Fatalf("unprepare: %v", res)
	}
	if s := h.deviceState("sim-n1-3"); s.ResetCount != before+1 || s.Generation != 1 {
		t.Fatalf("no reset at unprepare: %+v", s)
	}
	if _, err := os.Stat(pc.ClaimSpec); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("claim spec left: %v", err)
	}
	if _, ok := h.checkpointed()[types.UID(c1.Uid)]; ok {
		t.Fatal("claim still checkpointed after unprepare")
	}
	// Unprepared twice: done already.
	if res := h.unprepare(c1); res[c1.Uid].GetError() != "" {
		t.Fatal(res[c1.Uid].GetError())
	}
}

// TestPrepareRefusesHeldDevices (issue 21): a device another prepared
// claim holds, or that a container holds through the device plugin
// (PodResources), is refused with the reason; when any claim of a call
// fails, every claim of it gets an error and none is checkpointed, also
// when the failure comes from a step after the others' steps ran.
func TestPrepareRefusesHeldDevices(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	a := h.claim("a", "sim-0")
	if r := h.prepare(a)[a.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	b, c := h.claim("b", "sim-1"), h.claim("c", "sim-0")
	res := h.prepare(b, c)
	if !strings.Contains(res[c.Uid].Error, "held by claim default/a") {
		t.Errorf("c: %q, want held by claim default/a", res[c.Uid].Error)
	}
	if !strings.Contains(res[b.Uid].Error, ErrCallFailed.Error()) || !strings.Contains(res[b.Uid].Error, "default/c") {
		t.Errorf("b: %q, want failed with the call, naming c", res[b.Uid].Error)
	}
	if len(res[b.Uid].Devices)+len(res[c.Uid].Devices) != 0 {
		t.Errorf("devices returned with errors: %v", res)
	}
	h.podres.Set(&podresourcesapi.PodResources{Name: "dp-pod", Namespace: "default", Containers: []*podresourcesapi.ContainerResources{{
		Name: "ctr", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: resName, DeviceIds: []string{"sim-n1-2"}}}}}})
	d := h.claim("d", "sim-2")
	if r := h.prepare(d)[d.Uid]; !strings.Contains(r.Error, "held by a container through the device plugin") {
		t.Errorf("d: %q, want held through the device plugin", r.Error)
	}
	cp := h.checkpointed()
	for _, uid := range []string{b.Uid, c.Uid, d.Uid} {
		if _, ok := cp[types.UID(uid)]; ok {
			t.Errorf("%s checkpointed after a failed call", uid)
		}
	}
	h.podres.Set()

	// A step fails on one claim's device: sim-1's state is of another
	// version. The other claim's steps ran, but it is neither
	// checkpointed nor given a claim spec.
	bad := filepath.Join(h.state, "devices", "sim-n1-1", prestart.StateFile)
	if err := os.WriteFile(bad, []byte(`{"version": 99}`), 0o644); err != nil {
		t.Fatal(err)
	}
	e := h.claim("e", "sim-3")
	res = h.prepare(b, e)
	if !strings.Contains(res[b.Uid].Error, "sim-n1-1") || !strings.Contains(res[e.Uid].Error, ErrCallFailed.Error()) {
		t.Fatalf("a failed step: b %q, e %q", res[b.Uid].Error, res[e.Uid].Error)
	}
	if _, ok := h.checkpointed()[types.UID(e.Uid)]; ok {
		t.Fatal("e checkpointed after its call failed")
	}
	if _, err := os.Stat(filepath.Join(h.cdiDir, "k8s."+testDriver+"-claim_"+e.Uid+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("e's claim spec written: %v", err)
	}
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	res = h.prepare(b, e)
	if res[b.Uid].Error != "" || res[e.Uid].Error != "" {
		t.Fatalf("retry: %v", res)
	}
	if cp := h.checkpointed(); len(cp) != 3 {
		t.Fatalf("checkpointed %d claims, want a, b, e", len(cp))
	}
}

// TestPrepareAgainAfterReboot (issue 21): after a reboot a claim is
// prepared again (its steps run, generation +1) when the kubelet asks:
// one the boot ID tells, or one only the emptied CDI dir tells (the e2e
// suite's simulated reboot). Its claim spec is written again at start, so
// that its CDI IDs resolve before that; the spec of a claim not prepared
// is removed.
func TestPrepareAgainAfterReboot(t *testing.T) {
	for _, c := range []struct {
		name string
		boot string
	}{
		{"boot ID changed", "boot-2"},
		{"same boot ID, CDI dir emptied", bootOne},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.start()
			cl := h.claim("c", "sim-2")
			if r := h.prepare(cl)[cl.Uid]; r.Error != "" {
				t.Fatal(r.Error)
			}
			h.stop()
			if err := os.RemoveAll(h.cdiDir); err != nil {
				t.Fatal(err)
			}
			// A claim spec of a claim not prepared (a driver killed between
			// the spec and the checkpoint) is removed at start.
			w := cdi.NewWriter(h.cdiDir, "x", 1)
			if _, _, err := w.WriteClaimSpec(h.driver.specs.kind, cdi.Claim{UID: "uid-stale", Env: []string{"SIM_DEVICES=sim-n1-0"}}); err != nil {
				t.Fatal(err)
			}
			h.boot = c.boot
			h.start()
			if _, err := os.Stat(w.ClaimSpecPath(h.driver.specs.kind, cl.Uid)); err != nil {
				t.Fatalf("claim spec not restored at start: %v", err)
			}
			if _, err := os.Stat(w.ClaimSpecPath(h.driver.specs.kind, "uid-stale")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("claim spec of a claim not prepared left: %v", err)
			}
			r := h.prepare(cl)[cl.Uid]
			if r.Error != "" {
				t.Fatal(r.Error)
			}
			if s := h.deviceState("sim-n1-2"); s.Generation != 2 {
				t.Fatalf("generation %d after a reboot, want 2", s.Generation)
			}
			spec := h.inject(allIDs(r))
			if !slices.Contains(spec.Process.Env, "SIM_DEVICES=sim-n1-2") {
				t.Fatalf("env %v", spec.Process.Env)
			}
			if pc := h.checkpointed()[types.UID(cl.Uid)]; pc.BootID != c.boot || pc.PrepareAgain {
				t.Fatalf("checkpoint after preparing again: %+v", pc)
			}
			// Once prepared again, a further Prepare runs nothing.
			if r := h.prepare(cl)[cl.Uid]; r.Error != "" || h.deviceState("sim-n1-2").Generation != 2 {
				t.Fatalf("prepared a third time: %v, generation %d", r.Error, h.deviceState("sim-n1-2").Generation)
			}
		})
	}
}

// slices lists the driver's ResourceSlices of the node, by device.
func (h *harness) published() map[string]resourceapi.Device {
	h.t.Helper()
	list, err := h.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]resourceapi.Device{}
	for _, s := range list.Items {
		if s.Spec.Driver != testDriver || !strings.HasPrefix(s.Spec.Pool.Name, node+"/") || s.Spec.NodeName == nil || *s.Spec.NodeName != node {
			h.t.Fatalf("slice %s: driver %q pool %q node %v", s.Name, s.Spec.Driver, s.Spec.Pool.Name, s.Spec.NodeName)
		}
		for _, d := range s.Spec.Devices {
			out[d.Name] = d
		}
	}
	return out
}

func hasTaint(d resourceapi.Device, key string) bool {
	return slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool { return t.Key == testDriver+"/"+key })
}

// TestSlicesHealthAndTaints (issue 21): the node's ResourceSlice lists the
// four devices, each id the name the spec on disk gives it; a device
// whose node is removed gets the unhealthy taint and is Unhealthy on the
// kubelet's health stream, and both clear when it is back.
func TestSlicesHealthAndTaints(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.waitFor("4 devices without taints", func() bool {
		p := h.published()
		return len(p) == 4 && !slices.ContainsFunc([]string{"sim-0", "sim-1", "sim-2", "sim-3"}, func(n string) bool { return len(p[n].Taints) > 0 })
	})
	spec, err := cdiapi.ReadSpec(filepath.Join(h.cdiDir, "k8s.example.com-sim.json"), 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range spec.Devices {
		names = append(names, spec.Kind+"="+d.Name)
	}
	for name, d := range h.published() {
		id := d.Attributes[resourceapi.QualifiedName(testDriver+"/"+AttrID)]
		if id.StringValue == nil || !slices.Contains(names, *id.StringValue) {
			t.Errorf("%s: id %v is not a device of the spec (%v)", name, id.StringValue, names)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*deadline)
	defer cancel()
	stream, err := h.kl.Health.NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	health := func(want map[string]drahealthv1.HealthStatus) {
		t.Helper()
		for {
			r, err := stream.Recv()
			if err != nil {
				t.Fatalf("health stream: %v", err)
			}
			got := map[string]drahealthv1.HealthStatus{}
			for _, d := range r.Devices {
				if d.Device.PoolName == PoolName(node, "sim") {
					got[d.Device.DeviceName] = d.Health
				}
			}
			if fmt.Sprint(got) == fmt.Sprint(want) {
				return
			}
		}
	}
	healthy := drahealthv1.HealthStatus_HEALTHY
	health(map[string]drahealthv1.HealthStatus{"sim-0": healthy, "sim-1": healthy, "sim-2": healthy, "sim-3": healthy})

	if err := os.Remove(filepath.Join(h.dev, "sim-2")); err != nil {
		t.Fatal(err)
	}
	h.waitFor("sim-2 tainted unhealthy", func() bool { d := h.published()["sim-2"]; return hasTaint(d, TaintUnhealthy) })
	if hasTaint(h.published()["sim-1"], TaintUnhealthy) {
		t.Fatal("sim-1 tainted too")
	}
	health(map[string]drahealthv1.HealthStatus{"sim-0": healthy, "sim-1": healthy, "sim-2": drahealthv1.HealthStatus_UNHEALTHY, "sim-3": healthy})
	testutil.Mknod(t, filepath.Join(h.dev, "sim-2"), 1, 3)
	h.waitFor("sim-2 healthy again", func() bool { return len(h.published()["sim-2"].Taints) == 0 })
	health(map[string]drahealthv1.HealthStatus{"sim-0": healthy, "sim-1": healthy, "sim-2": healthy, "sim-3": healthy})
}

// TestHandoverGuard (issue 21): while the node reports the resource as
// an extended resource, or a container holds a device of it through the
// device plugin, every device carries the handover taint; once neither
// holds, none does.
func TestHandoverGuard(t *testing.T) {
	h := newHarness(t, nil)
	setNode := func(n int64) {
		t.Helper()
		nd, err := h.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		q := *apiresource.NewQuantity(n, apiresource.DecimalSI)
		nd.Status.Allocatable = corev1.ResourceList{corev1.ResourceName(resName): q}
		nd.Status.Capacity = corev1.ResourceList{corev1.ResourceName(resName): q}
		if _, err := h.client.CoreV1().Nodes().UpdateStatus(context.Background(), nd, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	all := func(taint bool) func() bool {
		return func() bool {
			p := h.published()
			if len(p) != 4 {
				return false
			}
			for _, d := range p {
				if hasTaint(d, TaintHandover) != taint {
					return false
				}
			}
			return true
		}
	}
	setNode(4)
	h.start()
	h.waitFor("handover taint while the node reports the resource", all(true))
	setNode(0)
	h.waitFor("no handover taint once it reports none", all(false))

	h.podres.Set(&podresourcesapi.PodResources{Name: "dp-pod", Namespace: "default", Containers: []*podresourcesapi.ContainerResources{{
		Name: "ctr", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: resName, DeviceIds: []string{"sim-n1-0"}}}}}})
	// The poll runs only while a guard is up: the node reporting the
	// resource again raises it, and PodResources then keeps it up.
	setNode(4)
	h.waitFor("handover taint again", all(true))
	setNode(0)
	time.Sleep(100 * time.Millisecond) // five polls
	if !all(true)() {
		t.Fatal("handover taint gone while a device-plugin container holds a device")
	}
	h.podres.Set()
	h.waitFor("no handover taint once no container holds a device", all(false))
}

// TestStopTaintsDevices (issue 21): a driver that stops leaves its
// devices tainted handover in its slices, which the kubelet wipes only 30
// s after the driver unregistered: meanwhile the scheduler allocates none
// of them, so a node switched back to the device plugin gets no new pod
// served through a driver that is gone. Started again, the driver
// publishes them untainted.
func TestStopTaintsDevices(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	untainted := func() bool {
		p := h.published()
		return len(p) == 4 && !slices.ContainsFunc([]string{"sim-0", "sim-1", "sim-2", "sim-3"}, func(n string) bool { return len(p[n].Taints) > 0 })
	}
	h.waitFor("4 devices without taints", untainted)
	h.stop()
	p := h.published()
	if len(p) != 4 {
		t.Fatalf("%d devices left in the slices after the stop, want 4", len(p))
	}
	for name, d := range p {
		if !hasTaint(d, TaintHandover) || d.Taints[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
			t.Errorf("%s after the stop: taints %+v, want %s/%s:NoSchedule", name, d.Taints, testDriver, TaintHandover)
		}
	}
	h.start()
	h.waitFor("untainted again after the start", untainted)
}
