package main

// Crash safety: the built binary is killed with SIGKILL at random points
// while it writes specs, nodes and device state, and the disk it leaves is
// checked after every kill.

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
)

// crashConfig: 500 simulated devices with reset and reprogram steps (a
// spec, 500 nodes, state on every PreStartContainer) and a host-device
// resource whose device set the test changes while the plugin runs.
const crashConfig = `
resources:
- name: example.com/sim
  idPrefix: sim
  envPrefix: SIM
  count: 500
  prestart:
    steps: [{type: reset}, {type: reprogram}]
- name: example.com/serial
  idPrefix: ser
  envPrefix: SER
  hostDevices: ["ttyR*"]
`

// buildBinary builds the plugin once per test binary run.
var buildBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "cdp-bin")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "cdi-device-plugin")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build: %w\n%s", err, out)
	}
	return bin, nil
})

// diskChecker checks the disk after each kill (checkDisk).
type diskChecker struct {
	// valid holds the digests of CDI dirs and state files found valid.
	valid map[[sha256.Size]byte]bool
}

// checkDisk is what must hold after any kill: every spec in the CDI dir
// loads without error, every state file parses, no state was set aside as
// corrupt. It returns the temp files it found (a crash mid-write leaves
// them; a restarted plugin must remove them).
//
// What it found valid it does not parse again: a CDI dir, or a state file,
// with the very bytes of one that loaded loads again. Most kills change
// little, and parsing 500 states and a 500-device spec under -race after
// each of 200 kills was two thirds of the test's time (144 s of 220 s at a
// load of 20 on 2 cores, against go test's 10 minutes for the package).
func (c *diskChecker) checkDisk(t *testing.T, d dirs) (temps []string) {
	t.Helper()
	if c.valid == nil {
		c.valid = map[[sha256.Size]byte]bool{}
	}
	specs := sha256.New()
	_ = filepath.WalkDir(d.cdi, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			data, _ := os.ReadFile(p)
			fmt.Fprintf(specs, "%s\x00%d\x00", p, len(data))
			specs.Write(data)
		}
		return nil
	})
	if key := [sha256.Size]byte(specs.Sum(nil)); !c.valid[key] {
		cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(d.cdi), cdiapi.WithAutoRefresh(false))
		if err != nil {
			t.Fatal(err)
		}
		for path, errs := range cache.GetErrors() {
			t.Fatalf("CDI spec %s does not load: %v", path, errs)
		}
		c.valid[key] = true
	}
	for _, root := range []string{d.cdi, d.dev, d.state} {
		_ = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			switch name := e.Name(); {
			case strings.Contains(name, ".tmp-") || strings.HasPrefix(name, prestart.ScratchDir+".old-"):
				temps = append(temps, p)
			case strings.HasSuffix(name, prestart.CorruptSuffix):
				t.Fatalf("state set aside as corrupt after a kill: %s", p)
			case name == prestart.StateFile:
				data, err := os.ReadFile(p)
				key := sha256.Sum256(data)
				var s prestart.State
				if err != nil || !c.valid[key] && json.Unmarshal(data, &s) != nil {
					t.Fatalf("state %s unreadable after a kill: %v %q", p, err, data)
				}
				c.valid[key] = true
			}
			return nil
		})
	}
	return temps
}

// TestCrashSafety kills the binary 200 times at random points of start-up
// (500 nodes, the spec, state), device-set changes and PreStartContainer.
// After every kill the disk is consistent; every 20th run and the last are
// left to converge: registered, every device healthy and resolving, no
// temp file left.
func TestCrashSafety(t *testing.T) {
	if testing.Short() {
		t.Skip("200 runs of the built binary")
	}
	d := newDirs(t)
	testutil.NeedMknod(t)
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, crashConfig)
	k, err := kubeletsim.Start(d.plugins)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()

	// Churn the host devices for the whole test: the serial resource's
	// device set changes every few ms, so spec rewrites are in flight.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			p := filepath.Join(d.dev, fmt.Sprintf("ttyR%d", i%6))
			if i%12 < 6 {
				mknod(t, d, filepath.Base(p), 1, 3)
			} else {
				_ = os.Remove(p)
			}
			time.Sleep(3 * time.Millisecond)
		}
	}()
	defer func() { cancel(); wg.Wait() }()

	const runs = 200
	rng := rand.New(rand.NewPCG(1, 2))
	var killedRegistered, killedPrestart int
	var disk diskChecker
	startup := 60 * time.Millisecond // how long the last start-up took, when it was waited for
	for run := 1; run <= runs; run++ {
		for len(k.Regs) > 0 {
			<-k.Regs
		}
		started := time.Now()
		cmd := exec.Command(bin, d.args("--config", cfg, "--node-name", "crash", "--pod-resources-socket", podResources)...)
		var stderr syncBuffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		killed := false
		kill := func() {
			if !killed {
				killed = true
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		}
		t.Cleanup(kill)
		runCtx, stopCalls := context.WithCancel(ctx)
		// This run's registrations: the sim endpoint, and serial's once it
		// registered (it serves, and has removed the sockets of killed
		// runs, by then). A Register call of a killed run that the
		// stand-in answered after the drain above arrived before started:
		// its endpoint is dead.
		simEndpoint, serialRegistered := make(chan string, 1), make(chan struct{})
		simUp := make(chan time.Duration, 1) // from start to the sim registration
		regsDone := make(chan struct{})
		go func() {
			defer close(regsDone)
			sim, serial := false, false
			for !sim || !serial {
				select {
				case r := <-k.Regs:
					switch {
					case r.At.Before(started):
					case r.Request.ResourceName == "example.com/sim" && !sim:
						sim = true
						simUp <- r.At.Sub(started)
						simEndpoint <- r.Request.Endpoint
					case r.Request.ResourceName == "example.com/serial" && !serial:
						serial = true
						close(serialRegistered)
					}
				case <-runCtx.Done():
					return
				}
			}
		}()
		// No later run's registration goes to this run's reader.
		endRun := func() { stopCalls(); <-regsDone }
		if run%20 == 0 {
			waitConverged(t, d, &disk, simEndpoint, serialRegistered, cmd.Process.Pid, &stderr)
			endRun()
			kill()
			// A kill after convergence leaves at most what one write in
			// flight leaves; the next start removes it.
			disk.checkDisk(t, d)
			continue
		}
		// Once registered, PreStartContainer on random devices until the
		// process dies.
		calls := make(chan int, 1)
		go func() {
			n := 0
			defer func() { calls <- n }()
			var endpoint string
			select {
			case endpoint = <-simEndpoint:
			case <-runCtx.Done():
				return
			}
			c, err := kubeletsim.Dial(d.plugins, endpoint)
			if err != nil {
				return
			}
			defer func() { _ = c.Close() }()
			for runCtx.Err() == nil {
				ids := []string{fmt.Sprintf("sim-crash-%d", rand.IntN(500)), fmt.Sprintf("sim-crash-%d", rand.IntN(500))}
				if ids[0] == ids[1] {
					continue
				}
				if _, err := c.PreStartContainer(runCtx, &pluginapi.PreStartContainerRequest{DevicesIds: ids}); err != nil {
					return
				}
				n++
			}
		}()
		// Half the kills within start-up (nodes, spec, state, register):
		// anywhere up to as long as the last start-up took. Half up to
		// 300 ms after the registration: in service, PreStartContainer
		// calls and device-set changes. Windows from the start alone put
		// every kill in start-up once start-up takes longer than they are
		// (a loaded machine: 26 kills of 190 after registration at a load
		// of 20 on 2 cores, with windows of 60 and 400 ms).
		if run%2 == 0 {
			time.Sleep(time.Duration(rng.Int64N(int64(startup))))
		} else {
			select {
			case up := <-simUp:
				startup = max(up, time.Millisecond)
			case <-time.After(20 * time.Second):
				t.Fatalf("run %d: no registration within 20s; log:\n%s", run, stderr.String())
			}
			time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		}
		kill()
		endRun()
		if n := <-calls; n > 0 {
			killedPrestart++
		}
		if strings.Contains(stderr.String(), "registered") {
			killedRegistered++
		}
		disk.checkDisk(t, d)
	}
	t.Logf("%d kills: %d after registration, %d during PreStartContainer calls; %d convergence checks",
		runs, killedRegistered, killedPrestart, runs/20)
	if killedRegistered == 0 || killedRegistered == runs-runs/20 {
		t.Errorf("kills did not spread over start-up and service: %d of %d after registration", killedRegistered, runs)
	}
}

// waitConverged waits until the running binary (pid) lists all 500
// simulated devices healthy and hands out names that resolve, and its
// serial resource registered; by then no temp file of another process
// may be left.
func waitConverged(t *testing.T, d dirs, disk *diskChecker, endpoint <-chan string, serialRegistered <-chan struct{}, pid int, stderr *syncBuffer) {
	t.Helper()
	var sim string
	select {
	case sim = <-endpoint:
	case <-time.After(20 * time.Second):
		t.Fatalf("no registration within 20s; log:\n%s", stderr.String())
	}
	c, err := kubeletsim.Dial(d.plugins, sim)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	updates, err := c.Watch(ctx)
	if err == nil {
		_, err = kubeletsim.WaitFor(updates, 20*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 500 })
	}
	if err == nil {
		_, err = resolve(ctx, d, c, "sim-crash-0", "sim-crash-499")
	}
	if err != nil {
		t.Fatalf("not converged: %v; log:\n%s", err, stderr.String())
	}
	select {
	case <-serialRegistered:
	case <-ctx.Done():
		t.Fatalf("example.com/serial not registered within 20s; log:\n%s", stderr.String())
	}
	// Sockets of killed runs are gone: the kubelet's directory holds
	// kubelet.sock and this run's two sockets.
	if ents, _ := os.ReadDir(d.plugins); len(ents) != 3 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("plugin dir after convergence: %d entries %v", len(ents), names)
	}
	// A write in flight right now is not a leftover: its temp names carry
	// this process's tag (atomicfile.Tag: pid, then its start time). Time
	// stamps cannot tell (the kernel's file clock lags, a renamed-away
	// scratch directory keeps the time of its last change).
	ours := []string{fmt.Sprintf(".tmp-%d.", pid), fmt.Sprintf(".old-%d.", pid)}
	for _, p := range disk.checkDisk(t, d) {
		if !slices.ContainsFunc(ours, func(s string) bool { return strings.Contains(filepath.Base(p), s) }) {
			t.Fatalf("temp file of a killed run left after the plugin converged: %s; log:\n%s", p, stderr.String())
		}
	}
}
