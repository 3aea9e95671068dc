package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestBootBeforeTheKubelet is the host mode's start after a reboot
// (deploy/systemd orders the plugin before the kubelet): no kubelet.sock,
// no device plugin directory yet, no PodResources socket, a metrics
// address. The plugin writes its nodes and spec and serves its socket
// without the kubelet, keeps running while there is none, and registers
// as soon as kubelet.sock appears; its devices are healthy as soon as the
// kubelet's PodResources answers (asked at the registration), not before
// (the claim guard fails closed).
func TestBootBeforeTheKubelet(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	d.plugins = filepath.Join(d.plugins, "device-plugins") // made by the kubelet, later
	env := map[string]string{"NUMBER_DEVICES": "4", "RESOURCE_NAME": "example.com/boot", "DEVICE_ID_PREFIX": "boot",
		"METRICS_ADDRESS": "127.0.0.1:0", "POD_RESOURCES_SOCKET": filepath.Join(d.plugins, "..", "pod-resources", "kubelet.sock")}
	ctx, cancel := context.WithCancel(context.Background())
	stderr := &syncBuffer{}
	done := make(chan int, 1)
	go func() { done <- run(ctx, d.args(), envOf(env), stderr) }()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("exit status %d; log:\n%s", code, stderr.String())
		}
	}()

	// Everything the kubelet and containerd will need, before the kubelet.
	spec := filepath.Join(d.cdi, "k8s.example.com-boot.json")
	ready := func() string {
		b, err := os.ReadFile(spec)
		if err != nil {
			return "no spec: " + err.Error()
		}
		for i := range 4 {
			name := "boot-" + strconv.Itoa(i)
			if !strings.Contains(string(b), `"name":"`+name+`"`) && !strings.Contains(string(b), `"name": "`+name+`"`) {
				return "spec lacks " + name
			}
			if _, err := os.Stat(filepath.Join(d.dev, name)); err != nil {
				return "no node: " + err.Error()
			}
		}
		if socks, _ := filepath.Glob(filepath.Join(d.plugins, "*.sock")); len(socks) != 1 {
			return "plugin sockets: " + strings.Join(socks, " ")
		}
		return ""
	}
	deadline := time.Now().Add(5 * time.Second)
	for why := ready(); why != ""; why = ready() {
		select {
		case code := <-done:
			done <- code
			t.Fatalf("exited (%d) with no kubelet; log:\n%s", code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready without a kubelet: %s; log:\n%s", why, stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Still up a while later, with no kubelet.
	select {
	case code := <-done:
		done <- code
		t.Fatalf("exited (%d) with no kubelet; log:\n%s", code, stderr.String())
	case <-time.After(500 * time.Millisecond):
	}

	start := time.Now()
	// The kubelet serves PodResources and kubelet.sock as it starts.
	if err := os.MkdirAll(filepath.Dir(env["POD_RESOURCES_SOCKET"]), 0o755); err != nil {
		t.Fatal(err)
	}
	testutil.ServePodResources(t, env["POD_RESOURCES_SOCKET"])
	k, err := kubeletsim.Start(d.plugins)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	reg, err := k.WaitRegistration(5 * time.Second)
	if err != nil {
		t.Fatalf("%v; log:\n%s", err, stderr.String())
	}
	took := time.Since(start)
	t.Logf("registered %v after kubelet.sock appeared", took.Round(time.Microsecond))
	// inotify, not a retry timer: well under the kubelet's own start-up.
	if took > time.Second {
		t.Errorf("registered %v after kubelet.sock appeared", took)
	}
	_, updates := testutil.Watch(ctx, t, d.plugins, reg.Request.Endpoint)
	if _, err := kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 4 }); err != nil {
		t.Fatalf("devices not healthy: %v; log:\n%s", err, stderr.String())
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("devices healthy %v after the kubelet came up", took)
	}
}
