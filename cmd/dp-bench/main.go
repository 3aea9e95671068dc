// Command dp-bench measures the built plugin binary against the kubelet
// stand-in, in temporary directories, the way the kubelet uses it: time
// from process start to registration, the first device list, Allocate
// answers resolved through a fresh CDI cache into host nodes, the delay
// from a node's removal to the Unhealthy report, and from a kubelet
// restart to re-registration. Every latency is reported as a median over
// the runs next to a baseline measured in the same run, and as the ratio.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
)

type sample struct{ name, baseline string }

var metrics = []sample{
	{"start→registered", "exec --version"},
	{"start→8 healthy listed", "exec --version"},
	{"node removed→Unhealthy", "raw inotify event"},
	{"node restored→Healthy", "raw inotify event"},
	{"kubelet restart→re-registered", "raw inotify event"},
	{"Allocate RPC (8 devices)", "GetDevicePluginOptions RPC"},
	{"PreStart 2 dev, 1st (copy 1MiB)", "GetDevicePluginOptions RPC"},
	{"PreStart 2 dev, repeat", "GetDevicePluginOptions RPC"},
	{"PreStart fail→Unhealthy listed", "raw inotify event"},
}

func main() {
	bin := flag.String("plugin", "bin/cdi-device-plugin", "plugin binary")
	runs := flag.Int("runs", 20, "runs (fresh directories and process each)")
	devices := flag.Int("devices", 8, "simulated devices")
	flag.Parse()
	if err := bench(*bin, *runs, *devices); err != nil {
		fmt.Fprintln(os.Stderr, "dp-bench:", err)
		os.Exit(1)
	}
}

func bench(bin string, runs, n int) error {
	res := map[string][]time.Duration{}
	base := map[string][]time.Duration{}
	for i := 0; i < runs; i++ {
		if err := once(bin, n, res, base); err != nil {
			return fmt.Errorf("run %d: %w", i, err)
		}
	}
	fmt.Printf("dp-bench: %d runs, %d devices, %s\n", runs, n, bin)
	fmt.Printf("%-32s %10s %10s %10s   %-28s %10s %7s\n", "metric", "median", "p90", "max", "baseline", "median", "ratio")
	for _, m := range metrics {
		r, b := res[m.name], base[m.name]
		fmt.Printf("%-32s %10s %10s %10s   %-28s %10s %7.1f\n", m.name, fmtD(pct(r, 50)), fmtD(pct(r, 90)), fmtD(pct(r, 100)),
			m.baseline, fmtD(pct(b, 50)), float64(pct(r, 50))/float64(max(pct(b, 50), 1)))
	}
	return nil
}

func fmtD(d time.Duration) string { return d.Round(time.Microsecond).String() }

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s) - 1) * p / 100
	return s[i]
}

func once(bin string, n int, res, base map[string][]time.Duration) (err error) {
	pluginDir, err := os.MkdirTemp("", "dpb")
	if err != nil {
		return err
	}
	defer os.RemoveAll(pluginDir)
	tmp, err := os.MkdirTemp("", "dp-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	devRoot, cdiDir := filepath.Join(tmp, "dev"), filepath.Join(tmp, "cdi")
	if err := os.Mkdir(devRoot, 0o755); err != nil {
		return err
	}
	k, err := kubeletsim.Start(pluginDir)
	if err != nil {
		return err
	}
	defer k.Stop()

	// Baseline: the cost of starting the binary at all.
	t0 := time.Now()
	if out, err := exec.Command(bin, "--version").CombinedOutput(); err != nil {
		return fmt.Errorf("%s --version: %w: %s", bin, err, out)
	}
	execCost := time.Since(t0)

	cmd := exec.Command(bin, "--device-plugin-dir", pluginDir, "--cdi-dir", cdiDir, "--dev-root", devRoot,
		"--state-dir", filepath.Join(tmp, "state"), "--log-level", "warn")
	// Reset, then reprogram with a 1 MiB image (the env mode's steps).
	img := filepath.Join(tmp, "bitstream.bin")
	good := make([]byte, 1<<20)
	for i := range good {
		good[i] = byte(i)
	}
	if err := os.WriteFile(img, good, 0o644); err != nil {
		return err
	}
	sum := sha256.Sum256(good)
	cmd.Env = []string{fmt.Sprintf("NUMBER_DEVICES=%d", n), "RESOURCE_NAME=example.com/bench", "DEVICE_ID_PREFIX=bench", "NODE_NAME=node-1",
		"PRESTART_STEPS=reset,reprogram", "FIRMWARE_IMAGE=" + img, "FIRMWARE_SHA256=" + hex.EncodeToString(sum[:])}
	var logs strings.Builder
	cmd.Stderr = &logs
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		_ = cmd.Process.Signal(unix.SIGTERM)
		if werr := cmd.Wait(); werr != nil && err == nil {
			err = fmt.Errorf("plugin exit: %w: %s", werr, logs.String())
		}
	}()
	reg, err := k.WaitRegistration(10 * time.Second)
	if err != nil {
		return fmt.Errorf("%w; plugin log: %s", err, logs.String())
	}
	res[metrics[0].name] = append(res[metrics[0].name], reg.At.Sub(start))
	base[metrics[0].name] = append(base[metrics[0].name], execCost)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := kubeletsim.Dial(pluginDir, reg.Request.Endpoint)
	if err != nil {
		return err
	}
	defer c.Close()
	updates, err := c.Watch(ctx)
	if err != nil {
		return err
	}
	u, err := kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == n })
	if err != nil {
		return fmt.Errorf("waiting for %d healthy devices: %w", n, err)
	}
	if len(u.Devices) != n {
		return fmt.Errorf("listed %d devices, want %d", len(u.Devices), n)
	}
	res[metrics[1].name] = append(res[metrics[1].name], u.At.Sub(start))
	base[metrics[1].name] = append(base[metrics[1].name], execCost)

	// Allocate everything; the answer must resolve into existing nodes.
	ids := make([]string, 0, n)
	for _, d := range u.Devices {
		ids = append(ids, d.ID)
	}
	areq := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}
	resp, err := c.Allocate(ctx, areq)
	if err != nil {
		return err
	}
	if err := resolve(cdiDir, devRoot, resp.ContainerResponses[0], n); err != nil {
		return err
	}
	const calls = 200
	for i := 0; i < calls; i++ {
		t := time.Now()
		if _, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
			return err
		}
		base[metrics[5].name] = append(base[metrics[5].name], time.Since(t))
		t = time.Now()
		if _, err := c.Allocate(ctx, areq); err != nil {
			return err
		}
		res[metrics[5].name] = append(res[metrics[5].name], time.Since(t))
	}

	// Removal and return of a node, against a raw inotify watcher.
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(devRoot); err != nil {
		return err
	}

	if err := prestartBench(ctx, c, updates, filepath.Join(tmp, "state", "devices"), img, good, hex.EncodeToString(sum[:]), w, res, base); err != nil {
		return err
	}
	victim := filepath.Join(devRoot, "bench-3")
	victimID := "bench-node-1-3"
	t1 := time.Now()
	if err := os.Remove(victim); err != nil {
		return err
	}
	raw, err := rawEvent(w, victim, t1)
	if err != nil {
		return err
	}
	u, err = kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool { return u.Health(victimID) == pluginapi.Unhealthy })
	if err != nil {
		return fmt.Errorf("removal not reported: %w", err)
	}
	res[metrics[2].name] = append(res[metrics[2].name], u.At.Sub(t1))
	base[metrics[2].name] = append(base[metrics[2].name], raw)

	t1 = time.Now()
	if err := unix.Mknod(victim, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		return err
	}
	raw, err = rawEvent(w, victim, t1)
	if err != nil {
		return err
	}
	u, err = kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == n })
	if err != nil {
		return fmt.Errorf("return not reported: %w", err)
	}
	res[metrics[3].name] = append(res[metrics[3].name], u.At.Sub(t1))
	base[metrics[3].name] = append(base[metrics[3].name], raw)

	// Kubelet restart: directory wiped, kubelet.sock served again.
	if err := w.Add(pluginDir); err != nil {
		return err
	}
	served, err := k.Restart()
	if err != nil {
		return err
	}
	raw, err = rawEvent(w, k.Socket(), served)
	if err != nil {
		return err
	}
	reg, err = k.WaitRegistration(5 * time.Second)
	if err != nil {
		return fmt.Errorf("no re-registration: %w; plugin log: %s", err, logs.String())
	}
	if _, err := os.Stat(filepath.Join(pluginDir, reg.Request.Endpoint)); err != nil {
		return fmt.Errorf("re-registered endpoint not served: %w", err)
	}
	res[metrics[4].name] = append(res[metrics[4].name], reg.At.Sub(served))
	base[metrics[4].name] = append(base[metrics[4].name], raw)
	return nil
}

// rawEvent waits for an event naming path and returns its delay from t.
func rawEvent(w *fsnotify.Watcher, path string, t time.Time) (time.Duration, error) {
	timeout := time.After(5 * time.Second)
	for {
		select {
		case ev := <-w.Events:
			if ev.Name == path {
				return time.Since(t), nil
			}
		case err := <-w.Errors:
			return 0, err
		case <-timeout:
			return 0, errors.New("no inotify event for " + path)
		}
	}
}

// resolve checks an Allocate answer the way containerd uses it: a fresh
// CDI cache resolves the names and injects nodes that exist on the host
// with the numbers the spec gives.
func resolve(cdiDir, devRoot string, r *pluginapi.ContainerAllocateResponse, n int) error {
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return err
	}
	var names []string
	for _, d := range r.CdiDevices {
		names = append(names, d.Name)
	}
	if len(names) != n {
		return fmt.Errorf("allocate gave %d CDI devices, want %d", len(names), n)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, names...); err != nil {
		return fmt.Errorf("inject: %w", err)
	}
	for _, d := range spec.Linux.Devices {
		var st unix.Stat_t
		host := filepath.Join(devRoot, filepath.Base(d.Path))
		if err := unix.Stat(host, &st); err != nil {
			return fmt.Errorf("host node for %s: %w", d.Path, err)
		}
		if int64(unix.Major(uint64(st.Rdev))) != d.Major || int64(unix.Minor(uint64(st.Rdev))) != d.Minor || d.Major != 1 || d.Minor != 3 {
			return fmt.Errorf("host node %s is %d:%d, spec says %d:%d", host, unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)), d.Major, d.Minor)
		}
	}
	if len(spec.Linux.Devices) != n {
		return fmt.Errorf("injected %d devices, want %d", len(spec.Linux.Devices), n)
	}
	return nil
}

// prestartBench times PreStartContainer on 2 devices (reset + 1 MiB
// reprogram), checks the state it leaves, and the failure path: a corrupt
// image fails the call and the device is listed Unhealthy, a fixed one
// heals it.
func prestartBench(ctx context.Context, c *kubeletsim.Client, updates <-chan kubeletsim.Update, stateRoot, img string, good []byte, sum string,
	w *fsnotify.Watcher, res, base map[string][]time.Duration) error {
	ids := []string{"bench-node-1-0", "bench-node-1-1"}
	req := &pluginapi.PreStartContainerRequest{DevicesIds: ids}
	const calls = 50
	for i := 0; i < calls; i++ {
		t := time.Now()
		if _, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
			return err
		}
		b := time.Since(t)
		t = time.Now()
		if _, err := c.PreStartContainer(ctx, req); err != nil {
			return fmt.Errorf("PreStartContainer: %w", err)
		}
		d := time.Since(t)
		m := metrics[7].name
		if i == 0 {
			m = metrics[6].name
		}
		res[m] = append(res[m], d)
		base[m] = append(base[m], b)
	}
	for _, id := range ids {
		s, err := prestart.LoadState(filepath.Join(stateRoot, id))
		if err != nil {
			return err
		}
		if s.Generation != calls || s.ResetCount != calls || s.Firmware == nil || s.Firmware.SHA256 != sum || s.Status != prestart.StatusReady {
			return fmt.Errorf("state of %s after %d calls: %+v", id, calls, s)
		}
	}
	if err := w.Add(filepath.Dir(img)); err != nil {
		return err
	}
	t0 := time.Now()
	if err := os.WriteFile(img, []byte("corrupt"), 0o644); err != nil {
		return err
	}
	raw, err := rawEvent(w, img, t0)
	if err != nil {
		return err
	}
	t0 = time.Now()
	if _, err := c.PreStartContainer(ctx, req); err == nil || !strings.Contains(err.Error(), "step reprogram") {
		return fmt.Errorf("corrupt image not refused at the reprogram step (error: %w)", err)
	}
	u, err := kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool {
		return u.Health(ids[0]) == pluginapi.Unhealthy && u.Health(ids[1]) == pluginapi.Unhealthy
	})
	if err != nil {
		return fmt.Errorf("failed preparation not reported: %w", err)
	}
	res[metrics[8].name] = append(res[metrics[8].name], u.At.Sub(t0))
	base[metrics[8].name] = append(base[metrics[8].name], raw)
	if err := os.WriteFile(img, good, 0o644); err != nil {
		return err
	}
	if _, err := c.PreStartContainer(ctx, req); err != nil {
		return fmt.Errorf("after fixing the image: %w", err)
	}
	if _, err := kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool {
		return u.Health(ids[0]) == pluginapi.Healthy && u.Health(ids[1]) == pluginapi.Healthy
	}); err != nil {
		return fmt.Errorf("recovery not reported: %w", err)
	}
	return nil
}
