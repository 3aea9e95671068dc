package plugin

import (
	"context"
	"runtime/metrics"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestCallsOnKeptGoroutines: with the kubelet watching, one call after the
// other runs on goroutines the server keeps, not on a new goroutine each
// (whose stack grew, by copying, on every call).
func TestCallsOnKeptGoroutines(t *testing.T) {
	dir := testutil.ShortDir(t)
	k := startKubelet(t, dir)
	p := newPlugin(t, dir, snapshot(8, 0, 1), nil)
	runPlugin(t, p)
	reg, err := k.WaitRegistration(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c, updates := testutil.Watch(context.Background(), t, dir, reg.Request.Endpoint)
	u, err := kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 8 })
	if err != nil {
		t.Fatal(err)
	}
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{u.Devices[0].ID, u.Devices[1].ID}}}}
	call := func() {
		if _, err := c.Allocate(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		if _, err := c.GetDevicePluginOptions(context.Background(), &pluginapi.Empty{}); err != nil {
			t.Fatal(err)
		}
	}
	call()
	const calls = 200
	before := goroutinesCreated()
	for range calls / 2 {
		call()
	}
	created := goroutinesCreated() - before
	t.Logf("%d calls created %d goroutines", calls, created)
	if created >= calls/4 {
		t.Fatalf("%d calls, one after the other, created %d goroutines, want fewer than %d", calls, created, calls/4)
	}
}
