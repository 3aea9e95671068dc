package dra

import (
	"context"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
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
	// podUID, when set, is the pod UID of the next start's instance
	// (Options.RollingUpdateUID: a rolling update).
	podUID types.UID
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

// start builds the driver (build), runs it, and registers it with the
// kubelet stand-in.
func (h *harness) start() {
	h.t.Helper()
	d := h.build()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	h.driver, h.cancel, h.done = d, cancel, done
	go func() { done <- d.Run(ctx) }()
	sock := filepath.Join(h.registrar, RegistrarSocketFile(h.registrar, testDriver, h.podUID))
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

// build builds the driver as cmd/cdi-dra-driver does.
func (h *harness) build() *Driver {
	h.t.Helper()
	cfg := h.config()
	cp := NewCheckpoint(filepath.Join(h.state, "dra", "checkpoint.json"))
	if err := cp.Load(); err != nil {
		h.t.Fatal(err)
	}
	w := cdi.NewWriter(h.cdiDir, cfg.Owner(), time.Now().UnixNano())
	drv := filepath.Join(h.plugins, testDriver)
	opts := Options{DriverName: testDriver, NodeName: node, Client: h.client, RegistrarDir: h.registrar, PluginDir: drv,
		Writer: w, Checkpoint: cp, PodResources: h.podSock, BootID: h.boot, Log: logrus.NewEntry(logrus.New()), PollInterval: 20 * time.Millisecond,
		RollingUpdateUID: h.podUID}
	opts.Log.Logger.SetOutput(io.MultiWriter(testWriter{h.t}, &h.logs))
	for i := range cfg.Resources {
		rc := &cfg.Resources[i]
		p, err := resource.Build(cfg, i, resource.Options{Writer: w, Socket: filepath.Join(drv, SocketFile(h.podUID)), Siblings: h.podUID != "", PrepareBeforeBind: true, Log: opts.Log,
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
			Source: p.Source, Spec: p.Spec, Runner: runner, Replicas: rc.ReplicaCount(), PrepareBeforeBind: rc.PrepareBeforeBind})
	}
	if h.options != nil {
		h.options(&opts)
	}
	d, err := New(opts)
	if err != nil {
		h.t.Fatal(err)
	}
	return d
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
	if h.kl != nil { // nil: the start failed before the registration
		_ = h.kl.Close()
	}
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

// syncBuffer is a goroutine-safe log sink (testutil.SyncBuffer).
type syncBuffer = testutil.SyncBuffer

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
	return h.claimUID(name, types.UID("uid-"+name), devices...)
}

// claimUID is claim with the UID uid.
func (h *harness) claimUID(name string, uid types.UID, devices ...string) *drav1.Claim {
	h.t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: claimNS, UID: uid}}
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

// deleteSlices deletes every ResourceSlice in the API, as if none had
// been published yet.
func (h *harness) deleteSlices() {
	h.t.Helper()
	list, err := h.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	for _, sl := range list.Items {
		if err := h.client.ResourceV1().ResourceSlices().Delete(context.Background(), sl.Name, metav1.DeleteOptions{}); err != nil {
			h.t.Fatal(err)
		}
	}
}

func hasTaint(d resourceapi.Device, key string) bool {
	return slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool { return t.Key == testDriver+"/"+key })
}

// crashPoint is the claim checkpoint as it was when a resource's runner
// first returned from op (Prepare or Reset): the files of a driver that
// would crash right then, to put back once the driver stopped.
type crashPoint struct {
	h    *harness
	mu   sync.Mutex
	data []byte
}

// runnerOp is the runner call a crashPoint copies the checkpoint after.
type runnerOp int

const (
	afterPrepare runnerOp = iota
	afterReset
)

// crashAfter wraps each runner of the next start so that the checkpoint
// is copied when op first returns.
func (h *harness) crashAfter(op runnerOp) *crashPoint {
	cp := &crashPoint{h: h}
	h.wrap = func(r Runner) Runner { return &copyingRunner{Runner: r, op: op, after: cp.copy} }
	return cp
}

func (cp *crashPoint) path() string { return filepath.Join(cp.h.state, "dra", "checkpoint.json") }

func (cp *crashPoint) copy() {
	b, err := os.ReadFile(cp.path())
	if err != nil {
		cp.h.t.Error(err)
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.data == nil {
		cp.data = b
	}
}

// restore puts the copy in place of the checkpoint (the driver stopped).
func (cp *crashPoint) restore() {
	cp.h.t.Helper()
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.data == nil {
		cp.h.t.Fatal("the runner call to crash after did not run")
	}
	if err := os.WriteFile(cp.path(), cp.data, 0o600); err != nil {
		cp.h.t.Fatal(err)
	}
}

// copyingRunner calls after once its op returned.
type copyingRunner struct {
	Runner
	op    runnerOp
	after func()
}

func (c *copyingRunner) Prepare(ctx context.Context, devs []device.Device) error {
	err := c.Runner.Prepare(ctx, devs)
	if c.op == afterPrepare {
		c.after()
	}
	return err
}

func (c *copyingRunner) Reset(ctx context.Context, devs []device.Device) error {
	err := c.Runner.Reset(ctx, devs)
	if c.op == afterReset {
		c.after()
	}
	return err
}
