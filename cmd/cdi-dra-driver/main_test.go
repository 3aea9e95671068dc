package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

type dirs struct{ kubelet, cdi, dev, state, podres string }

func newDirs(t *testing.T) dirs {
	t.Helper()
	short := testutil.ShortDir(t)
	base := t.TempDir()
	d := dirs{kubelet: short, cdi: filepath.Join(base, "cdi"), dev: filepath.Join(base, "dev"), state: filepath.Join(base, "state"),
		podres: filepath.Join(short, "podres.sock")}
	if err := os.Mkdir(d.dev, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d dirs) args(extra ...string) []string {
	return append([]string{"--cdi-dir", d.cdi, "--dev-root", d.dev, "--state-dir", d.state, "--pod-resources-socket", d.podres,
		"--kubelet-registrar-dir", filepath.Join(d.kubelet, "reg"), "--kubelet-plugins-dir", filepath.Join(d.kubelet, "plugins")}, extra...)
}

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// clientsOf makes the driver's clients (kubeclient.DRA) of the one client
// f makes.
func clientsOf(f func(string) (kubernetes.Interface, error)) func(string) (kubeclient.DRA, error) {
	return func(k string) (kubeclient.DRA, error) {
		c, err := f(k)
		if err != nil {
			return kubeclient.DRA{}, err
		}
		return kubeclient.DRA{Client: c, Status: c.ResourceV1(), Cleanup: c.ResourceV1()}, nil
	}
}

func fakeClient(objs ...any) func(string) (kubernetes.Interface, error) {
	return func(string) (kubernetes.Interface, error) {
		c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
		// Creates name the objects that ask for a generated name, as the
		// API server does and the fake does not: with a pool per resource,
		// the slice controller creates several slices by generateName.
		var n atomic.Int64
		c.PrependReactor("create", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
			if o, ok := a.(clienttesting.CreateAction).GetObject().(metav1.Object); ok && o.GetName() == "" && o.GetGenerateName() != "" {
				o.SetName(fmt.Sprintf("%s%05d", o.GetGenerateName(), n.Add(1)))
			}
			return false, nil, nil
		})
		for _, o := range objs {
			if cl, ok := o.(*resourceapi.ResourceClaim); ok {
				if _, err := c.ResourceV1().ResourceClaims(cl.Namespace).Create(context.Background(), cl, metav1.CreateOptions{}); err != nil {
					return nil, err
				}
			}
		}
		return c, nil
	}
}

// TestBadConfigExits2AndWritesNothing: bad configuration, the driver's
// own flags included, exits with status 2 and a message naming the flag
// or field and the value, before anything is written.
func TestBadConfigExits2AndWritesNothing(t *testing.T) {
	noClient := func(string) (kubernetes.Interface, error) { return nil, errors.New("not in a cluster") }
	// Two resources whose long ID prefixes differ only at the end: before
	// idPrefix had a length bound, both published aaaa…a-0.
	long := strings.Repeat("a", 70)
	twoLong := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(twoLong, []byte("resources:\n- name: example.com/x\n  idPrefix: "+long+"x\n- name: example.com/y\n  idPrefix: "+long+"y\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A valid node name (a DNS subdomain of 251 characters) that leaves no
	// room for /<idPrefix> in a pool name (253).
	longNode := strings.Join([]string{strings.Repeat("n", 62), strings.Repeat("n", 62), strings.Repeat("n", 62), strings.Repeat("n", 62)}, ".")
	sameName := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(sameName, []byte("resources:\n- name: example.com/x\n  idPrefix: GPU.x\n- name: example.com/y\n  idPrefix: gpu_x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		args   []string
		env    map[string]string
		client func(string) (kubernetes.Interface, error)
		want   string
	}{
		{"driver name", []string{"--driver-name", "Bad_Name"}, map[string]string{"NODE_NAME": "n1"}, nil, `driver-name="Bad_Name"`},
		{"driver name from env", nil, map[string]string{"NODE_NAME": "n1", "DRIVER_NAME": "x..y"}, nil, `driver-name="x..y"`},
		{"default driver name", nil, map[string]string{"NODE_NAME": "n1", "RESOURCE_NAME": "example.com/Sim_X"}, nil, `driver-name="Sim_X.example.com"`},
		{"no node name", nil, nil, nil, `node-name=""`},
		{"relative registrar dir", []string{"--kubelet-registrar-dir", "reg"}, map[string]string{"NODE_NAME": "n1"}, nil, `kubelet-registrar-dir="reg"`},
		{"socket path too long", []string{"--kubelet-plugins-dir", "/" + strings.Repeat("p", 100)}, map[string]string{"NODE_NAME": "n1"}, nil, "kubelet-plugins-dir="},
		{"no API client", nil, map[string]string{"NODE_NAME": "n1"}, noClient, `kubeconfig="": no API client`},
		{"stale claim grace", []string{"--stale-claim-grace", "soon"}, map[string]string{"NODE_NAME": "n1"}, nil, `stale-claim-grace="soon"`},
		{"stale claim grace from env", nil, map[string]string{"NODE_NAME": "n1", "STALE_CLAIM_GRACE": "-1m"}, nil, `stale-claim-grace="-1m"`},
		{"device metadata", []string{"--device-metadata", "maybe"}, map[string]string{"NODE_NAME": "n1"}, nil, `device-metadata="maybe": must be true or false`},
		{"device metadata from env", nil, map[string]string{"NODE_NAME": "n1", "DEVICE_METADATA": "on"}, nil, `device-metadata="on"`},
		{"device status", []string{"--device-status", "sometimes"}, map[string]string{"NODE_NAME": "n1"}, nil, `device-status="sometimes": must be true or false`},
		{"device status from env", nil, map[string]string{"NODE_NAME": "n1", "DEVICE_STATUS": "off"}, nil, `device-status="off"`},
		{"shared config checks", []string{"--log-level", "loud"}, map[string]string{"NODE_NAME": "n1"}, nil, `log-level="loud"`},
		{"node name too long for the pools", nil, map[string]string{"NODE_NAME": longNode, "DEVICE_ID_PREFIX": "sim"}, nil,
			`node-name="` + longNode + `": too long for the pool of example.com/simple-device: the pool name ` + longNode + `/sim is longer than 253 characters`},
		{"id prefix over the bound", nil, map[string]string{"NODE_NAME": "n1", "DEVICE_ID_PREFIX": strings.Repeat("a", 44)}, nil,
			`DEVICE_ID_PREFIX="` + strings.Repeat("a", 44) + `": must be at most 43 characters`},
		{"long ID prefixes alike but at the end", nil, map[string]string{"NODE_NAME": "n1", "CONFIG_FILE": twoLong}, nil,
			`resources[0].idPrefix="` + long + `x": must be at most 43 characters`},
		{"two resources, one device name", nil, map[string]string{"NODE_NAME": "n1", "CONFIG_FILE": sameName}, nil,
			`resources[1].idPrefix="gpu_x": resources[0] (example.com/x, idPrefix "GPU.x") and resources[1] (example.com/y) would both publish the device name "gpu-x-0"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newDirs(t)
			client := c.client
			if client == nil {
				client = fakeClient()
			}
			var stderr bytes.Buffer
			// The later flags win: the case's own come last.
			code := run(context.Background(), d.args(c.args...), envOf(c.env), &stderr, clientsOf(client))
			if code != 2 || !strings.Contains(stderr.String(), c.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), c.want)
			}
			for _, p := range []string{d.cdi, d.state, filepath.Join(d.kubelet, "reg"), filepath.Join(d.kubelet, "plugins")} {
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s exists after a refused start", p)
				}
			}
			if entries, _ := os.ReadDir(d.dev); len(entries) != 0 {
				t.Errorf("device nodes created: %v", entries)
			}
		})
	}
}

// syncBuffer is a goroutine-safe log sink (testutil.SyncBuffer).
type syncBuffer = testutil.SyncBuffer

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestDriverEndToEnd: the binary's run with the simple plugin's
// variables: it registers as sim.example.com (the default name), the
// kubelet's Prepare of an allocated claim returns the device's CDI name
// from the spec the device plugin would write, the claim is checkpointed
// at <state-dir>/dra/checkpoint.json, /readyz answers ok once registered
// and published, and a cancel shuts it down with status 0.
func TestDriverEndToEnd(t *testing.T) {
	testutil.NeedMknod(t)
	d := newDirs(t)
	testutil.ServePodResources(t, d.podres)
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default", UID: "uid-c"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "r", Driver: "sim.example.com", Pool: "n1/sim", Device: "sim-1"}}}}}}
	addr := freePort(t)
	env := map[string]string{"NODE_NAME": "n1", "RESOURCE_NAME": "example.com/sim", "NUMBER_DEVICES": "2", "DEVICE_ID_PREFIX": "sim", "ENV_PREFIX": "SIM"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, d.args("--metrics-address", addr), envOf(env), &stderr, clientsOf(fakeClient(claim)))
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(stderr.String())
		}
	})
	sock := filepath.Join(d.kubelet, "reg", "sim.example.com-reg.sock")
	var kl *kubeletsim.DRA
	end := time.Now().Add(10 * time.Second)
	for kl == nil {
		var err error
		if kl, err = kubeletsim.RegisterDRA(context.Background(), sock); err != nil && time.Now().After(end) {
			t.Fatalf("registration: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer kl.Close()
	if kl.Info.Name != "sim.example.com" || kl.Info.Endpoint != filepath.Join(d.kubelet, "plugins", "sim.example.com", "dra.sock") {
		t.Fatalf("registered %+v", kl.Info)
	}
	resp, err := kl.Prepare(context.Background(), &drav1.Claim{Namespace: "default", Name: "c", Uid: "uid-c"})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Claims["uid-c"]
	if r.GetError() != "" || len(r.Devices) != 1 || r.Devices[0].CdiDeviceIds[0] != "k8s.example.com/sim=sim-n1-1" {
		t.Fatalf("prepare: %v", r)
	}
	if data, err := os.ReadFile(filepath.Join(d.state, "dra", "checkpoint.json")); err != nil || !strings.Contains(string(data), "uid-c") {
		t.Fatalf("checkpoint: %s %v", data, err)
	}
	for time.Now().Before(end) { // ready once the slices are handed on
		res, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, probe := range []string{"/readyz", "/healthz"} {
		res, err := http.Get("http://" + addr + probe)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", probe, res.StatusCode, body)
		}
	}
	cancel()
	select {
	case code := <-exit:
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit within 10s of the cancel")
	}
	if _, err := os.Stat(filepath.Join(d.cdi, "k8s.example.com-sim.json")); err != nil {
		t.Fatalf("spec not kept on shutdown: %v", err)
	}
}

// TestFlagsDocumented: every flag of the driver's own is in
// docs/configuration.md, with its environment variable.
func TestFlagsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	var f flags
	for _, e := range f.extra() {
		row := "| `--" + e.Name + "` | `" + e.Env + "` |"
		if !strings.Contains(string(doc), row) {
			t.Errorf("docs/configuration.md has no row starting %q", row)
		}
	}
}

// TestPluginLinksNoKubeClient: the device plugin's binary links neither
// client-go nor the DRA libraries nor klog: they are the DRA driver's
// alone (dra/ and this command).
func TestPluginLinksNoKubeClient(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go in PATH: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", "github.com/cdi-device-plugin/cdi-device-plugin/cmd/cdi-device-plugin").CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v: %s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"k8s.io/client-go/", "k8s.io/dynamic-resource-allocation/", "k8s.io/klog/", "github.com/cdi-device-plugin/cdi-device-plugin/dra"} {
			if strings.HasPrefix(dep+"/", banned) {
				t.Errorf("cmd/cdi-device-plugin links %s", dep)
			}
		}
	}
	if !strings.Contains(string(out), "github.com/cdi-device-plugin/cdi-device-plugin/resource") {
		t.Fatal("go list -deps does not list resource: the check looked at nothing")
	}
}

// TestDriverLinksNoPluginServer: the DRA driver's binary links nothing of
// the device plugin's server (plugin/): what both commands share lives in
// resource/, device/ (identities and their variables) and cdi/.
func TestDriverLinksNoPluginServer(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go in PATH: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", "github.com/cdi-device-plugin/cdi-device-plugin/cmd/cdi-dra-driver").CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v: %s", err, out)
	}
	deps := strings.Fields(string(out))
	if slices.Contains(deps, "github.com/cdi-device-plugin/cdi-device-plugin/plugin") {
		t.Error("cmd/cdi-dra-driver links plugin/, the device plugin's server")
	}
	if !slices.Contains(deps, "github.com/cdi-device-plugin/cdi-device-plugin/resource") {
		t.Fatal("go list -deps does not list resource: the check looked at nothing")
	}
}

// TestInternalHoldsLeaves: the packages under internal/ are leaf helpers:
// none imports a package of the project other than config (typed values,
// itself a leaf) and other internal/ helpers. The core both commands share
// is resource/, a floor of its own.
func TestInternalHoldsLeaves(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go in PATH: %v", err)
	}
	const mod = "github.com/cdi-device-plugin/cdi-device-plugin/"
	out, err := exec.Command(goBin, "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, mod+"internal/...").CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v: %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 3 {
		t.Fatalf("go list found %d packages under internal/: the check looked at nothing", len(lines))
	}
	for _, line := range lines {
		f := strings.Fields(line)
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, mod) || strings.HasPrefix(imp, mod+"internal/") || imp == mod+"config" {
				continue
			}
			t.Errorf("%s imports %s: internal/ holds leaf helpers only", f[0], imp)
		}
	}
}

// TestDriverBoolFlags: device metadata (KEP-5304) and the claims' device
// status (status.devices, KEP-4817) are on by default; the flag or its env
// var turns each off.
func TestDriverBoolFlags(t *testing.T) {
	metadata := func(d *driver) bool { return d.opts.DeviceMetadata }
	status := func(d *driver) bool { return !d.opts.NoDeviceStatus }
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
		on   func(*driver) bool
		want bool
	}{
		{"metadata default", nil, nil, metadata, true},
		{"metadata flag", []string{"--device-metadata=false"}, nil, metadata, false},
		{"metadata env", nil, map[string]string{"DEVICE_METADATA": "false"}, metadata, false},
		{"status default", nil, nil, status, true},
		{"status flag", []string{"--device-status=false"}, nil, status, false},
		{"status env", nil, map[string]string{"DEVICE_STATUS": "false"}, status, false},
		{"status env true", nil, map[string]string{"DEVICE_STATUS": "true"}, status, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := map[string]string{"NODE_NAME": "n1"}
			for k, v := range c.env {
				env[k] = v
			}
			var f flags
			cfg, err := config.LoadWith("cdi-dra-driver", newDirs(t).args(c.args...), envOf(env), io.Discard, f.extra()...)
			if err != nil {
				t.Fatal(err)
			}
			d, err := build(cfg, f, clientsOf(fakeClient()), logs.Discard())
			if err != nil {
				t.Fatal(err)
			}
			if got := c.on(d); got != c.want {
				t.Errorf("on: %v, want %v", got, c.want)
			}
		})
	}
}
