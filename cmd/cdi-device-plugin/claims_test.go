package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// claimPod is pod ns/p-<claim> whose container c holds DRA claim
// ns/<claim> with the device cr.
func claimPod(claim string, cr *podresourcesapi.ClaimResource) *podresourcesapi.PodResources {
	return &podresourcesapi.PodResources{Namespace: "ns", Name: "p-" + claim, Containers: []*podresourcesapi.ContainerResources{{Name: "c",
		DynamicResources: []*podresourcesapi.DynamicResource{{ClaimNamespace: "ns", ClaimName: claim, ClaimResources: []*podresourcesapi.ClaimResource{cr}}}}}}
}

func claimDevice(driver, pool, dev string, cdi ...string) *podresourcesapi.ClaimResource {
	cr := &podresourcesapi.ClaimResource{DriverName: driver, PoolName: pool, DeviceName: dev}
	for _, n := range cdi {
		cr.CdiDevices = append(cr.CdiDevices, &podresourcesapi.CDIDevice{Name: n})
	}
	return cr
}

// TestDRAClaimHeldAtStart: on a node switched back from the DRA driver, a
// device a claim of the driver still holds is Unhealthy in the plugin's
// first ListAndWatch answer, counted under the reason dra_claim and logged
// with its claim. The kubelet names it by its CDI name, or (without CDI
// names) by the driver, the pool (the node name and the ID prefix, as the
// driver names its pools now; or the node name alone, as earlier versions
// named it) and its ResourceSlice name; the driver's name is the DRA
// driver's default, or --driver-name / DRIVER_NAME as the driver is given
// it.
func TestDRAClaimHeldAtStart(t *testing.T) {
	env := map[string]string{"NUMBER_DEVICES": "3", "RESOURCE_NAME": "example.com/sim", "DEVICE_ID_PREFIX": "sim",
		"PRESTART_STEPS": "none", "NODE_NAME": "node1"}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for k, v := range env {
			m[k] = v
		}
		return m
	}
	for _, c := range []struct {
		name string
		dev  *podresourcesapi.ClaimResource
		args []string
		env  map[string]string
		held bool
	}{
		{"by CDI name", claimDevice("any.example.com", "node1/sim", "sim-1", "k8s.example.com/sim=sim-node1-1"), nil, env, true},
		{"by the default driver name", claimDevice("sim.example.com", "node1/sim", "sim-1"), nil, env, true},
		{"by --driver-name", claimDevice("renamed.example.com", "node1/sim", "sim-1"), []string{"--driver-name", "renamed.example.com"}, env, true},
		{"by DRIVER_NAME", claimDevice("renamed.example.com", "node1/sim", "sim-1"), nil, with("DRIVER_NAME", "renamed.example.com"), true},
		{"another driver's", claimDevice("renamed.example.com", "node1/sim", "sim-1"), nil, env, false},
		{"another node's", claimDevice("sim.example.com", "node2/sim", "sim-1"), nil, env, false},
		// Allocated before the driver published a pool per resource: the
		// pool named after the node, as the driver still prepares it.
		{"by the node's pool of earlier versions", claimDevice("sim.example.com", "node1", "sim-1"), nil, env, true},
		{"another node's pool of earlier versions", claimDevice("sim.example.com", "node2", "sim-1"), nil, env, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newDirs(t)
			testutil.NeedMknod(t)
			sock := filepath.Join(d.plugins, "pod-resources.sock")
			testutil.ServePodResources(t, sock, claimPod("c1", c.dev))
			addr := freeAddr(t)
			r := startRun(t, d, append([]string{"--pod-resources-socket", sock, "--metrics-address", addr}, c.args...), c.env)
			var first kubeletsim.Update
			select {
			case first = <-r.updates:
			case <-time.After(5 * time.Second):
				t.Fatalf("no first answer; log:\n%s", r.stderr.String())
			}
			want := pluginapi.Healthy
			if c.held {
				want = pluginapi.Unhealthy
			}
			if first.Health("sim-node1-1") != want || first.Healthy() != 2+btoi(!c.held) {
				t.Fatalf("first answer %+v, want sim-node1-1 %s, the others Healthy; log:\n%s", first.Devices, want, r.stderr.String())
			}
			if !c.held {
				return
			}
			waitHTTP(t, addr, "/metrics", 5*time.Second, hasMetric(
				`cdi_device_plugin_device_health_transitions_total{health="unhealthy",reason="dra_claim",resource="example.com/sim"}`, 1))
			if log := r.stderr.String(); !strings.Contains(log, `msg="devices held by DRA claims at start: reported unhealthy until no claim holds them" `) ||
				!strings.Contains(log, `first="sim-node1-1 (held by DRA claim ns/c1)"`) {
				t.Fatalf("not logged with its claim:\n%s", log)
			}
		})
	}
}

// TestDRAClaimDefaultNameSkipsReplicas: the claim guard takes
// the DRA driver's default name as the driver does (internal/dranames):
// <class>.<domain> of the first resource the driver publishes. The first
// resource has replicas (the driver does not publish it), so a claim of
// sim.example.com holds sim-1, named without CDI names.
func TestDRAClaimDefaultNameSkipsReplicas(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	sock := filepath.Join(d.plugins, "pod-resources.sock")
	testutil.ServePodResources(t, sock, claimPod("c1", claimDevice("sim.example.com", "node1/sim", "sim-1")))
	cfg := writeConfig(t, `
resources:
- name: example.com/shared
  idPrefix: shared
  replicas: 2
- name: example.com/sim
  idPrefix: sim
  count: 3
`)
	r := startRun(t, d, []string{"--config", cfg, "--pod-resources-socket", sock}, map[string]string{"NODE_NAME": "node1"})
	updates := r.updates
	if r.reg.Request.ResourceName != "example.com/sim" {
		reg, err := r.kubelet.WaitRegistration(5 * time.Second)
		if err != nil || reg.Request.ResourceName != "example.com/sim" {
			t.Fatalf("registration %+v, %v; log:\n%s", reg.Request, err, r.stderr.String())
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		_, updates = testutil.Watch(ctx, t, d.plugins, reg.Request.Endpoint)
	}
	var first kubeletsim.Update
	select {
	case first = <-updates:
	case <-time.After(5 * time.Second):
		t.Fatalf("no first answer; log:\n%s", r.stderr.String())
	}
	if first.Health("sim-node1-1") != pluginapi.Unhealthy || first.Healthy() != 2 {
		t.Fatalf("first answer %+v, want sim-node1-1 Unhealthy, the others Healthy; log:\n%s", first.Devices, r.stderr.String())
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestRecoverySparesDRAClaims: a failed device that a DRA claim
// holds is not prepared again in the background (its steps would reset
// what the claim's pod uses); released, it is.
func TestRecoverySparesDRAClaims(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	sock := filepath.Join(d.plugins, "pod-resources.sock")
	pr := testutil.ServePodResources(t, sock)
	mknod(t, d, "ttyR0", 4, 64)
	ok := filepath.Join(t.TempDir(), "ok")
	cfg := writeConfig(t, fmt.Sprintf(`
resources:
- name: example.com/serial
  idPrefix: ser
  hostDevices: ["ttyR*"]
  prestart:
    recoveryInterval: 50ms
    steps:
    - type: exec
      command: ["/bin/sh", "-c", "test -e %s"]
`, ok))
	r := startRun(t, d, []string{"--config", cfg, "--pod-resources-socket", sock}, nil)
	waitResolves(t, r, d, 5*time.Second, "ser-ttyR0")
	// A claim holds it from before its preparation failed: no background
	// attempt ever finds it free.
	pr.Set(claimPod("c1", claimDevice("serial.example.com", "", "ser-0", "k8s.example.com/serial=ser-ttyR0")))
	if _, err := r.c.PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: []string{"ser-ttyR0"}}); err == nil {
		t.Fatal("exec step did not fail")
	}
	if _, err := r.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Health("ser-ttyR0") == pluginapi.Unhealthy }); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ok, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(r.stderr.String(), "failed device held by a container; not prepared in the background") {
		if time.Now().After(deadline) {
			t.Fatalf("the held device was not spared; log:\n%s", r.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(r.stderr.String(), "preparing a failed device again") {
		t.Fatalf("prepared a device a DRA claim holds; log:\n%s", r.stderr.String())
	}
	pr.Set()
	waitResolves(t, r, d, 10*time.Second, "ser-ttyR0")
}
