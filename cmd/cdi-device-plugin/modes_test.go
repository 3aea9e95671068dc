package main

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestFileModes: everything the plugin creates has the narrowest mode that
// works (docs/reliability.md, "Files and modes"), whatever the umask, and nothing is
// created outside the configured roots.
func TestFileModes(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	// The narrowest umask: modes that must be wider are set, not left to
	// it. (No test of this package runs in parallel.)
	defer unix.Umask(unix.Umask(0o077))
	// A host-device resource (with its ID registry) and a simulated one
	// with prestart steps (state, firmware, scratch).
	mknod(t, d, "ttyR0", 1, 3)
	cfg := writeConfig(t, serialConfig+`
- name: example.com/sim
  idPrefix: sim
  count: 1
  prestart:
    steps: [{type: reset}, {type: reprogram}]
`)
	r := startRun(t, d, []string{"--config", cfg}, nil)
	c := r.c
	if r.reg.Request.ResourceName != "example.com/sim" {
		reg, err := r.kubelet.WaitRegistration(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if c, err = kubeletsim.Dial(d.plugins, reg.Request.Endpoint); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
	}
	if _, err := c.PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: []string{"sim-0"}}); err != nil {
		t.Fatalf("%v\n%s", err, r.stderr.String())
	}
	want := map[string]fs.FileMode{
		// The kubelet (root) connects; nobody else needs to.
		filepath.Join(d.plugins, "*.sock"): fs.ModeSocket | 0o600,
		// containerd reads specs; they name paths, nothing secret, and
		// other CDI consumers (podman) read them as any user.
		d.cdi:                          fs.ModeDir | 0o755,
		filepath.Join(d.cdi, "*.json"): 0o644,
		// Nodes: the device cgroup decides who may open them; the CDI
		// library copies the host mode into the container.
		filepath.Join(d.dev, "sim-0"): fs.ModeDevice | fs.ModeCharDevice | 0o666,
		// The state root is the plugin's alone; a device's directory is
		// bind-mounted read-only into its containers, whose users may
		// not be root.
		d.state:                                           fs.ModeDir | 0o700,
		filepath.Join(d.state, "devices"):                 fs.ModeDir | 0o700,
		filepath.Join(d.state, "resources"):               fs.ModeDir | 0o700,
		filepath.Join(d.state, "resources", "*.json"):     0o600,
		filepath.Join(d.state, "devices", "*"):            fs.ModeDir | 0o755,
		filepath.Join(d.state, "devices", "*", "*.json"):  0o644,
		filepath.Join(d.state, "devices", "*", "*.bin"):   0o644,
		filepath.Join(d.state, "devices", "*", "scratch"): fs.ModeDir | 0o755,
		// A lock file per device, held while steps run on it (two
		// processes never prepare one device at once): the plugin's
		// alone, beside the directories containers see.
		filepath.Join(d.state, "locks"):           fs.ModeDir | 0o700,
		filepath.Join(d.state, "locks", "*.lock"): 0o600,
	}
	seen := map[string]bool{}
	for pattern, mode := range want {
		matches, _ := filepath.Glob(pattern)
		if len(matches) == 0 {
			t.Errorf("nothing matches %s", pattern)
		}
		for _, p := range matches {
			if filepath.Base(p) == "kubelet.sock" {
				continue
			}
			seen[p] = true
			fi, err := os.Lstat(p)
			if err != nil || fi.Mode() != mode {
				t.Errorf("%s: mode %v, want %v (%v)", p, fi.Mode(), mode, err)
			}
		}
	}
	// Nothing else was created in the roots.
	for _, root := range []string{d.plugins, d.cdi, d.dev, d.state} {
		_ = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err == nil && p != root && !seen[p] && e.Name() != "kubelet.sock" && e.Name() != "ttyR0" && p != filepath.Join(d.state, "devices", "sim-0", "scratch") {
				t.Errorf("unexpected %s", p)
			}
			return nil
		})
	}
}
