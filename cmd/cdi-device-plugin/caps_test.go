package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestCapabilities runs the built binary as root under setpriv with every
// capability dropped from its bounding set but the ones named, as the
// DaemonSet's securityContext (capabilities: drop ALL, add MKNOD) runs it.
// With CAP_MKNOD alone it creates its device nodes, writes its spec and
// state, registers with the kubelet, and answers ListAndWatch, Allocate and
// PreStartContainer (which writes the device state). With no capability at
// all it cannot create a device node and exits. The directories are root's
// own, as on a node (/dev, /var/run/cdi, /var/lib/kubelet/device-plugins,
// the state dir): CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER and the others
// are not needed.
func TestCapabilities(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) not found")
	}
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	run := func(ctx context.Context, bounding string) (*exec.Cmd, *syncBuffer) {
		cmd := exec.CommandContext(ctx, setpriv, append([]string{"--bounding-set", bounding, "--inh-caps", "-all", "--", bin}, d.args("--pod-resources-socket", podResources)...)...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "RESOURCE_NAME=example.com/sim", "NUMBER_DEVICES=2",
			"DEVICE_ID_PREFIX=sim", "DEVICE_FILE_PREFIX=sim", "NODE_NAME=n1"}
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
		return cmd, out
	}

	t.Run("none", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmd, out := run(ctx, "-all")
		err := cmd.Run()
		if err == nil || !strings.Contains(out.String(), "mknod") || !strings.Contains(out.String(), "operation not permitted") {
			t.Fatalf("without CAP_MKNOD: %v, want a mknod failure (operation not permitted); log:\n%s", err, out.String())
		}
	})

	t.Run("mknod", func(t *testing.T) {
		k, err := kubeletsim.Start(d.plugins)
		if err != nil {
			t.Fatal(err)
		}
		defer k.Stop()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cmd, out := run(ctx, "-all,+mknod")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); _ = cmd.Wait() }()
		reg, err := k.WaitRegistration(10 * time.Second)
		if err != nil {
			t.Fatalf("%v; log:\n%s", err, out.String())
		}
		c, updates := testutil.Watch(ctx, t, d.plugins, reg.Request.Endpoint)
		if _, err := kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 2 }); err != nil {
			t.Fatalf("ListAndWatch: %v; log:\n%s", err, out.String())
		}
		ids := []string{"sim-n1-0"}
		if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}); err != nil {
			t.Fatalf("Allocate: %v; log:\n%s", err, out.String())
		}
		if _, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids}); err != nil {
			t.Fatalf("PreStartContainer: %v; log:\n%s", err, out.String())
		}
		for _, p := range []string{filepath.Join(d.dev, "sim-0"), filepath.Join(d.dev, "sim-1"),
			filepath.Join(d.cdi, "k8s.example.com-sim.json"), filepath.Join(d.state, "devices", ids[0], "state.json")} {
			if _, err := os.Stat(p); err != nil {
				t.Errorf("with CAP_MKNOD alone: %v", err)
			}
		}
		if strings.Contains(out.String(), "level=error") {
			t.Errorf("errors logged with CAP_MKNOD alone:\n%s", out.String())
		}
	})
}
