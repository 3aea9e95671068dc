package main

// Tests of what operators use: the metrics and probes endpoint, the pod to
// device assignment read from the kubelet's PodResources API, one log line
// per call, and the live reload of the configuration file. In-process,
// with real sockets and files.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// freeAddr returns a loopback address with a port that was free a moment
// ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// get returns the status and body of http://addr/path.
func get(addr, path string) (int, string, error) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// waitHTTP polls addr/path until cond holds on the status and body.
func waitHTTP(t *testing.T, addr, path string, timeout time.Duration, cond func(int, string) bool) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var (
		code int
		body string
		err  error
	)
	for time.Now().Before(deadline) {
		if code, body, err = get(addr, path); err == nil && cond(code, body) {
			return body
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: last status %d, error %v, body:\n%s", path, code, err, body)
	return ""
}

// metric returns the value of the series name{labels} in a scrape, or -1.
func metric(body, series string) float64 {
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

func hasMetric(series string, want float64) func(int, string) bool {
	return func(code int, body string) bool { return code == 200 && metric(body, series) == want }
}

// TestMetricsAndProbes follows the metrics and probes through a plugin's
// life: not ready without a kubelet, ready once registered with a
// ListAndWatch stream open; Allocate and PreStartContainer counted by
// result, a kubelet restart, a removed node, a failed step.
func TestMetricsAndProbes(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	addr := freeAddr(t)
	img := filepath.Join(t.TempDir(), "fw.bin")
	if err := os.WriteFile(img, []byte("firmware"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"NUMBER_DEVICES": "2", "RESOURCE_NAME": "example.com/sim", "DEVICE_ID_PREFIX": "sim",
		"METRICS_ADDRESS": addr, "FIRMWARE_IMAGE": img}
	var stderr syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- run(ctx, d.args(), envOf(env), &stderr) }()
	t.Cleanup(func() { cancel(); <-done })

	waitHTTP(t, addr, "/healthz", 5*time.Second, func(c int, b string) bool { return c == 200 && strings.TrimSpace(b) == "ok" })
	body := waitHTTP(t, addr, "/readyz", time.Second, func(c int, _ string) bool { return c == 503 })
	if !strings.Contains(body, "example.com/sim: not registered") {
		t.Fatalf("readyz without a kubelet: %q", body)
	}

	k, err := kubeletsim.Start(d.plugins)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	reg, err := k.WaitRegistration(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitHTTP(t, addr, "/readyz", 5*time.Second, func(c int, b string) bool {
		return c == 503 && strings.Contains(b, "example.com/sim: registered, but the kubelet has no ListAndWatch stream open")
	})
	c, _ := testutil.Watch(ctx, t, d.plugins, reg.Request.Endpoint)
	waitHTTP(t, addr, "/readyz", 5*time.Second, func(c int, b string) bool { return c == 200 && strings.TrimSpace(b) == "ok" })

	res := `resource="example.com/sim"`
	waitHTTP(t, addr, "/metrics", 5*time.Second, hasMetric(`cdi_device_plugin_devices{health="healthy",`+res+`}`, 2))
	for _, ids := range [][]string{{"sim-0"}, {"sim-1"}, {"sim-7"}} {
		_, _ = c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	}
	if _, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"sim-0"}}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(img); err != nil { // the reprogram step fails now
		t.Fatal(err)
	}
	if _, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"sim-1"}}); err == nil {
		t.Fatal("prestart with a missing image succeeded")
	}
	if err := os.Remove(filepath.Join(d.dev, "sim-0")); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := k.WaitRegistration(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	for series, want := range map[string]float64{
		`cdi_device_plugin_rpc_duration_seconds_count{` + res + `,result="ok",rpc="Allocate"}`:                2,
		`cdi_device_plugin_rpc_duration_seconds_count{` + res + `,result="error",rpc="Allocate"}`:             1,
		`cdi_device_plugin_rpc_duration_seconds_count{` + res + `,result="ok",rpc="PreStartContainer"}`:       1,
		`cdi_device_plugin_rpc_duration_seconds_count{` + res + `,result="error",rpc="PreStartContainer"}`:    1,
		`cdi_device_plugin_prestart_step_failures_total{` + res + `,step="reprogram"}`:                        1,
		`cdi_device_plugin_registrations_total{` + res + `,result="ok"}`:                                      2,
		`cdi_device_plugin_kubelet_restarts_total{` + res + `}`:                                               1,
		`cdi_device_plugin_cdi_spec_writes_total{` + res + `,result="ok"}`:                                    1,
		`cdi_device_plugin_device_health_transitions_total{health="unhealthy",reason="missing",` + res + `}`:  1,
		`cdi_device_plugin_device_health_transitions_total{health="unhealthy",reason="prestart",` + res + `}`: 1,
		`cdi_device_plugin_devices{health="unhealthy",` + res + `}`:                                           2,
	} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, body, err := get(addr, "/metrics")
			got := metric(body, series)
			if err == nil && got == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s = %v, want %v (%v)", series, got, want, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// One info line per call, naming the devices; details at debug only.
	log := stderr.String()
	for _, want := range []string{`msg=allocate devices=sim-0 .*took=`, `msg=prestart devices=sim-0 .*steps="reset,reprogram" took=`,
		`msg="prestart failed" devices=sim-1 .*error=`} {
		if !regexp.MustCompile(want).MatchString(log) {
			t.Errorf("log has no line like %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "allocate answer") {
		t.Error("allocate details logged at info")
	}
}

// podResourcesServer is the kubelet's PodResources API, answering List with
// pods.
// TestPodDeviceAssignmentMetric: the assignment of our devices to
// containers, as the kubelet's PodResources API reports it, is a metric;
// other resources' devices are not.
func TestPodDeviceAssignmentMetric(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	sock := filepath.Join(d.plugins, "pod-resources.sock")
	testutil.ServePodResources(t, sock, &podresourcesapi.PodResources{
		Name: "p2", Namespace: "team-a",
		Containers: []*podresourcesapi.ContainerResources{{Name: "c", Devices: []*podresourcesapi.ContainerDevices{
			{ResourceName: "example.com/sim", DeviceIds: []string{"sim-1"}},
			{ResourceName: "vendor.com/gpu", DeviceIds: []string{"gpu-0"}},
		}}},
	})
	addr := freeAddr(t)
	startRun(t, d, []string{"--pod-resources-socket", sock, "--metrics-address", addr},
		map[string]string{"RESOURCE_NAME": "example.com/sim", "DEVICE_ID_PREFIX": "sim", "PRESTART_STEPS": "none"})
	body := waitHTTP(t, addr, "/metrics", 5*time.Second, hasMetric(
		`cdi_device_plugin_pod_device_assignment{container="c",device="sim-1",namespace="team-a",pod="p2",resource="example.com/sim"}`, 1))
	if strings.Contains(body, "gpu-0") {
		t.Fatalf("another resource's device reported:\n%s", body)
	}
}

// configMapDir holds a configuration file the way a mounted ConfigMap
// does: <dir>/config.yaml -> ..data/config.yaml, ..data -> a timestamped
// directory, replaced by renaming a new symlink over ..data.
type configMapDir struct {
	t   *testing.T
	dir string
	gen int
}

func newConfigMapDir(t *testing.T, body string) *configMapDir {
	c := &configMapDir{t: t, dir: t.TempDir()}
	c.update(body)
	if err := os.Symlink("..data/config.yaml", filepath.Join(c.dir, "config.yaml")); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *configMapDir) path() string { return filepath.Join(c.dir, "config.yaml") }

// update swaps in a new content as the kubelet does.
func (c *configMapDir) update(body string) {
	c.t.Helper()
	c.gen++
	gen := fmt.Sprintf("..gen_%d", c.gen)
	if err := os.Mkdir(filepath.Join(c.dir, gen), 0o755); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, gen, "config.yaml"), []byte(body), 0o644); err != nil {
		c.t.Fatal(err)
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(gen, tmp); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		c.t.Fatal(err)
	}
	if c.gen > 1 {
		_ = os.RemoveAll(filepath.Join(c.dir, fmt.Sprintf("..gen_%d", c.gen-1)))
	}
}

const resourceA = `
resources:
- name: example.com/a
  count: 2
  idPrefix: a
`

// TestConfigReload: a ConfigMap update that adds a resource starts only it;
// the running resource keeps its socket, stream and allocations. A bad
// configuration is refused with a log line and a metric, and nothing
// changes. A changed resource is restarted alone; a removed one stops and
// its spec goes.
func TestConfigReload(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	cm := newConfigMapDir(t, resourceA)
	addr := freeAddr(t)
	r := startRun(t, d, []string{"--config", cm.path(), "--metrics-address", addr}, nil)
	if r.reg.Request.ResourceName != "example.com/a" {
		t.Fatalf("registration %+v", r.reg.Request)
	}
	aSocket := r.reg.Request.Endpoint
	waitResolves(t, r, d, 5*time.Second, "a-0", "a-1")

	// Add a resource: only it registers; a's stream stays open.
	cm.update(resourceA + `
- name: example.com/b
  count: 1
  idPrefix: b
`)
	kubelet := r.kubelet
	reg, err := kubelet.WaitRegistration(5 * time.Second)
	if err != nil || reg.Request.ResourceName != "example.com/b" {
		t.Fatalf("registration after adding b: %+v %v\n%s", reg.Request, err, r.stderr.String())
	}
	waitHTTP(t, addr, "/metrics", 5*time.Second, hasMetric(`cdi_device_plugin_config_reloads_total{result="applied"}`, 1))
	if _, err := os.Stat(filepath.Join(d.plugins, aSocket)); err != nil {
		t.Fatalf("a's socket changed: %v", err)
	}
	waitResolves(t, r, d, time.Second, "a-0", "a-1")
	if _, err := os.Stat(filepath.Join(d.cdi, "k8s.example.com-b.json")); err != nil {
		t.Fatal(err)
	}
	waitHTTP(t, addr, "/readyz", 5*time.Second, func(c int, b string) bool {
		return c == 503 && strings.Contains(b, "example.com/b: registered, but the kubelet has no ListAndWatch stream open")
	})

	// A bad configuration changes nothing.
	cm.update(resourceA + "\n- name: example.com/b\n  count: 1\n  idPrefix: ../evil\n")
	waitHTTP(t, addr, "/metrics", 5*time.Second, hasMetric(`cdi_device_plugin_config_reloads_total{result="refused"}`, 1))
	if !regexp.MustCompile(`configuration reload refused.*idPrefix=\\?"\.\./evil`).MatchString(r.stderr.String()) {
		t.Fatalf("no log line naming the bad field:\n%s", r.stderr.String())
	}
	select {
	case reg := <-kubelet.Regs:
		t.Fatalf("registration after a refused reload: %+v", reg.Request)
	case <-time.After(300 * time.Millisecond):
	}

	// Change a, remove b: a registers again with 3 devices, b's spec goes.
	cm.update(strings.Replace(resourceA, "count: 2", "count: 3", 1))
	reg, err = kubelet.WaitRegistration(5 * time.Second)
	if err != nil || reg.Request.ResourceName != "example.com/a" || reg.Request.Endpoint == aSocket {
		t.Fatalf("registration after changing a: %+v %v", reg.Request, err)
	}
	waitHTTP(t, addr, "/metrics", 5*time.Second, hasMetric(`cdi_device_plugin_config_reloads_total{result="applied"}`, 2))
	if _, err := os.Stat(filepath.Join(d.cdi, "k8s.example.com-b.json")); !os.IsNotExist(err) {
		t.Fatalf("b's spec stays: %v", err)
	}
	c, err := kubeletsim.Dial(d.plugins, reg.Request.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := resolve(context.Background(), d, c, "a-2"); err != nil {
		t.Fatal(err)
	}
}

// TestReloadStopsBeforePreparing: a reload that changes
// a resource prepares the replacement only once the old part has stopped
// (its handlers ended), so that two parts never prepare one device or save
// one registry at once. A replacement that fails to prepare refuses the
// reload, and the resource runs again with its running configuration.
func TestReloadStopsBeforePreparing(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	cm := newConfigMapDir(t, resourceA)
	addr := freeAddr(t)
	r := startRun(t, d, []string{"--config", cm.path(), "--metrics-address", addr}, nil)
	waitResolves(t, r, d, 5*time.Second, "a-0", "a-1")

	cm.update(strings.Replace(resourceA, "count: 2", "count: 3", 1))
	reg, err := r.kubelet.WaitRegistration(5 * time.Second)
	if err != nil || reg.Request.ResourceName != "example.com/a" {
		t.Fatalf("registration after changing a: %+v %v", reg.Request, err)
	}
	waitHTTP(t, addr, "/metrics", 5*time.Second, hasMetric(`cdi_device_plugin_config_reloads_total{result="applied"}`, 1))
	log := r.stderr.String()
	stopped := strings.Index(log, `msg="resource stopped"`)
	prepared := strings.LastIndex(log, `msg="resource prepared"`)
	if stopped < 0 || prepared < stopped {
		t.Fatalf("the replacement was prepared (at %d) before the old part stopped (at %d):\n%s", prepared, stopped, log)
	}

	// A replacement that cannot prepare (its node's path is taken by a
	// directory): refused, and a runs again as it was (3 devices).
	if err := os.Mkdir(filepath.Join(d.dev, "b-0"), 0o755); err != nil {
		t.Fatal(err)
	}
	cm.update(strings.Replace(strings.Replace(resourceA, "count: 2", "count: 3", 1), "idPrefix: a", "idPrefix: a\n  deviceFilePrefix: b", 1))
	waitHTTP(t, addr, "/metrics", 5*time.Second, hasMetric(`cdi_device_plugin_config_reloads_total{result="refused"}`, 1))
	reg, err = r.kubelet.WaitRegistration(5 * time.Second)
	if err != nil || reg.Request.ResourceName != "example.com/a" {
		t.Fatalf("no registration of a restored: %+v %v\n%s", reg.Request, err, r.stderr.String())
	}
	_, updates := testutil.Watch(t.Context(), t, d.plugins, reg.Request.Endpoint)
	if _, err := kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 3 }); err != nil {
		t.Fatalf("a restored: %v\n%s", err, r.stderr.String())
	}
	waitHTTP(t, addr, "/healthz", 5*time.Second, func(c int, _ string) bool { return c == 200 })
}
