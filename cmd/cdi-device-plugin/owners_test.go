package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestNodeInTwoResourcesRefused: two resources of one
// process whose globs both match /dev/ttyR0 advertise neither device
// Healthy (shared_node) on ListAndWatch, and the log names both devices
// and the node; their other devices stay Healthy. When the node goes and
// comes back as the second resource's alone (the first glob narrowed by
// a reload), the first resource's device is gone and the second's
// Healthy.
func TestNodeInTwoResourcesRefused(t *testing.T) {
	testutil.NeedMknod(t)
	d := newDirs(t)
	mknod(t, d, "ttyR0", 4, 64)
	mknod(t, d, "ttyR1", 4, 65)
	mknod(t, d, "ttyS0", 4, 66)
	body := func(globA string) string {
		return "resources:\n- name: example.com/serial\n  idPrefix: ser\n  hostDevices: [\"" + globA + "\"]\n" +
			"- name: example.com/console\n  idPrefix: con\n  hostDevices: [\"ttyR0\", \"ttyS*\"]\n"
	}
	cfgPath := writeConfig(t, body("ttyR*"))
	k, err := kubeletsim.Start(d.plugins)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	ctx, cancel := context.WithCancel(context.Background())
	stderr := &syncBuffer{}
	done := make(chan int, 1)
	go func() { done <- run(ctx, d.args("--config", cfgPath), envOf(nil), stderr) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	updates := map[string]<-chan kubeletsim.Update{}
	for range 2 {
		reg, err := k.WaitRegistration(5 * time.Second)
		if err != nil {
			t.Fatalf("%v; log:\n%s", err, stderr.String())
		}
		_, u := testutil.Watch(ctx, t, d.plugins, reg.Request.Endpoint)
		updates[reg.Request.ResourceName] = u
	}
	health := func(u kubeletsim.Update) map[string]string {
		out := map[string]string{}
		for _, dv := range u.Devices {
			out[dv.ID] = dv.Health
		}
		return out
	}
	want := func(resource string, w map[string]string) {
		t.Helper()
		if _, err := kubeletsim.WaitFor(updates[resource], 5*time.Second, func(u kubeletsim.Update) bool {
			h := health(u)
			for id, v := range w {
				if h[id] != v {
					return false
				}
			}
			return true
		}); err != nil {
			t.Fatalf("%s: %v; log:\n%s", resource, err, stderr.String())
		}
	}
	want("example.com/serial", map[string]string{"ser-ttyR0": pluginapi.Unhealthy, "ser-ttyR1": pluginapi.Healthy})
	want("example.com/console", map[string]string{"con-ttyR0": pluginapi.Unhealthy, "con-ttyS0": pluginapi.Healthy})
	node := filepath.Join(d.dev, "ttyR0")
	ok := false
	for _, l := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(l, "ser-ttyR0") && strings.Contains(l, "con-ttyR0") && strings.Contains(l, node) {
			ok = true
		}
	}
	if !ok || !strings.Contains(stderr.String(), "cause=shared_node") {
		t.Errorf("no log line names both devices and the node, or no cause=shared_node:\n%s", stderr.String())
	}

	// The serial resource no longer takes ttyR0 (a reload narrows its
	// glob): its old device stays known, gone; the console's is Healthy.
	if err := os.WriteFile(cfgPath, []byte(body("ttyR[1-9]")), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := k.WaitRegistration(10 * time.Second)
	if err != nil {
		t.Fatalf("%v; log:\n%s", err, stderr.String())
	}
	_, updates[reg.Request.ResourceName] = testutil.Watch(ctx, t, d.plugins, reg.Request.Endpoint)
	want("example.com/console", map[string]string{"con-ttyR0": pluginapi.Healthy, "con-ttyS0": pluginapi.Healthy})
	want("example.com/serial", map[string]string{"ser-ttyR1": pluginapi.Healthy})
}
