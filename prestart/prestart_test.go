package prestart

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
	"github.com/cdi-device-plugin/cdi-device-plugin/podresources"
)

// faults records what the runner reports, like device.Source.
type faults struct {
	mu    sync.Mutex
	calls []string
	cur   map[string]string
}

func (f *faults) SetFault(name string, p device.Problem) {
	reason := p.String()
	if !p.None() && p.Cause != device.CausePrepareFailed {
		reason = "wrong cause " + reason
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cur == nil {
		f.cur = map[string]string{}
	}
	f.calls = append(f.calls, name+"="+reason)
	if reason == "" {
		delete(f.cur, name)
	} else {
		f.cur[name] = reason
	}
}

func (f *faults) reports() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *faults) get(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur[name]
}

func devs(n int) []device.Device {
	var out []device.Device
	for i := 0; i < n; i++ {
		name := "sim-" + string(rune('0'+i))
		out = append(out, device.Device{Name: name, Index: i, HostPath: "/dev/" + name, ContainerPath: "/dev/" + name})
	}
	return out
}

func newRunner(t *testing.T, steps ...Step) (*Runner, *faults, *test.Hook) {
	t.Helper()
	l, hook := test.NewNullLogger()
	l.SetLevel(logrus.DebugLevel)
	f := &faults{}
	r := NewRunner(Options{Resource: "example.com/sim", StateRoot: t.TempDir(), Steps: steps, Budget: 5 * time.Second,
		MarkUnhealthy: true, Recovery: config.RecoverReset, Health: f, Log: logrus.NewEntry(l)})
	// As the plugin does: the spec's writer ensures the state directories,
	// then the faults of an earlier run are restored.
	if err := r.Ensure(&device.Snapshot{Devices: devs(2)}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Init(&device.Snapshot{Devices: devs(2)}); err != nil {
		t.Fatal(err)
	}
	return r, f, hook
}

func state(t *testing.T, r *Runner, name string) State {
	t.Helper()
	s, err := LoadState(r.Dir(name))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func image(t *testing.T, size int) (string, string) {
	t.Helper()
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	p := filepath.Join(t.TempDir(), "bitstream.bin")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return p, hex.EncodeToString(sum[:])
}

func ino(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestEnsureWritesOnlyDirectories: a device's state directory exists
// before the spec mounts it, and nothing else is written at start: a
// device without a state file is new; its state appears with its first
// preparation. A symlink planted where a state directory goes is refused:
// that device is unhealthy.
func TestEnsureWritesOnlyDirectories(t *testing.T) {
	r, f, _ := newRunner(t, Reset{})
	for _, d := range devs(2) {
		entries, err := os.ReadDir(r.Dir(d.Name))
		if err != nil || len(entries) != 0 {
			t.Fatalf("%s: %v %v", d.Name, entries, err)
		}
		if s := state(t, r, d.Name); s.Status != StatusNew || s.Generation != 0 {
			t.Fatalf("%+v", s)
		}
	}
	if err := r.Prepare(context.Background(), devs(1)); err != nil {
		t.Fatal(err)
	}
	if s := state(t, r, "sim-0"); s.Status != StatusReady || s.Device != "sim-0" || s.Resource != "example.com/sim" || s.Generation != 1 {
		t.Fatalf("after the first preparation: %+v", s)
	}
	outside := t.TempDir()
	planted := device.Device{Name: "sim-9"}
	if err := os.Symlink(outside, r.Dir(planted.Name)); err != nil {
		t.Fatal(err)
	}
	if err := r.Ensure(&device.Snapshot{Devices: []device.Device{planted}}); err != nil || f.get("sim-9") == "" || !r.BadState("sim-9") {
		t.Fatalf("a symlinked state directory was accepted: %v", err)
	}
}

func TestReset(t *testing.T) {
	r, _, _ := newRunner(t, Reset{})
	d := devs(1)
	junk := filepath.Join(r.Dir("sim-0"), ScratchDir, "junk")
	if err := os.MkdirAll(filepath.Dir(junk), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(junk, []byte("left by the last workload"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := time.Now().UTC()
	if err := r.Prepare(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(junk); !os.IsNotExist(err) {
		t.Fatalf("scratch not cleared: %v", err)
	}
	s := state(t, r, "sim-0")
	if s.Status != StatusReady || s.ResetCount != 1 || s.Generation != 1 || s.LastReset.Before(before) || s.LastError != "" {
		t.Fatalf("%+v", s)
	}
	left, _ := filepath.Glob(filepath.Join(r.Dir("sim-0"), "*.old-*"))
	tmps, _ := filepath.Glob(filepath.Join(r.Dir("sim-0"), ".*tmp*"))
	if len(left)+len(tmps) != 0 {
		t.Fatalf("left behind: %v %v", left, tmps)
	}
}

func TestReprogramAndIdempotence(t *testing.T) {
	img, sum := image(t, 1<<20)
	r, _, _ := newRunner(t, Reset{}, &Reprogram{Image: img, SHA256: sum})
	d := devs(2)
	if err := r.Prepare(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	fw := filepath.Join(r.Dir("sim-1"), FirmwareFile)
	data, err := os.ReadFile(fw)
	if err != nil {
		t.Fatal(err)
	}
	if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != sum {
		t.Fatal("loaded firmware differs from the image")
	}
	s := state(t, r, "sim-1")
	if s.Firmware == nil || s.Firmware.Name != "bitstream.bin" || s.Firmware.SHA256 != sum || s.Firmware.Size != 1<<20 || s.Generation != 1 {
		t.Fatalf("%+v %+v", s, s.Firmware)
	}
	// A second call: a new generation, another reset, no second copy.
	first := ino(t, fw)
	if err := r.Prepare(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	s = state(t, r, "sim-1")
	if s.Generation != 2 || s.ResetCount != 2 || s.Status != StatusReady {
		t.Fatalf("%+v", s)
	}
	if ino(t, fw) != first {
		t.Fatal("firmware copied again although the device holds that digest")
	}
	// always: copied every time.
	r2, _, _ := newRunner(t, &Reprogram{Image: img, Always: true})
	_ = r2.Prepare(context.Background(), d)
	fw2 := filepath.Join(r2.Dir("sim-0"), FirmwareFile)
	i1 := ino(t, fw2)
	if err := r2.Prepare(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	if ino(t, fw2) == i1 {
		t.Fatal("always did not copy again")
	}
}

func TestBuiltinImage(t *testing.T) {
	r, _, _ := newRunner(t, &Reprogram{})
	if err := r.Prepare(context.Background(), devs(1)); err != nil {
		t.Fatal(err)
	}
	s := state(t, r, "sim-0")
	want := sha256.Sum256(builtinImage())
	if s.Firmware == nil || s.Firmware.Name != BuiltinImageName || s.Firmware.SHA256 != hex.EncodeToString(want[:]) {
		t.Fatalf("%+v", s.Firmware)
	}
}

// TestCorruptImageAndRecovery: a digest mismatch fails the call naming
// device and step, loads nothing, marks the device unhealthy; a later
// successful preparation with a reset makes it healthy again.
func TestCorruptImageAndRecovery(t *testing.T) {
	img, sum := image(t, 64*1024)
	r, f, _ := newRunner(t, Reset{}, &Reprogram{Image: img, SHA256: sum})
	d := devs(1)
	if err := r.Prepare(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	fw := filepath.Join(r.Dir("sim-0"), FirmwareFile)
	good := ino(t, fw)

	if err := os.WriteFile(img, []byte("corrupt"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := r.Prepare(context.Background(), d)
	var se *StepError
	if !errors.As(err, &se) || se.Device != "sim-0" || se.Step != "reprogram" || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("error %v", err)
	}
	if !strings.Contains(err.Error(), "device sim-0: step reprogram:") {
		t.Fatalf("message %q", err)
	}
	if ino(t, fw) != good {
		t.Fatal("firmware replaced by a corrupt image")
	}
	s := state(t, r, "sim-0")
	if s.Status != StatusFailed || !strings.Contains(s.LastError, "reprogram") || s.Generation != 1 {
		t.Fatalf("%+v", s)
	}
	if f.get("sim-0") == "" {
		t.Fatal("device not reported unhealthy")
	}
	// A restarted plugin remembers the fault.
	r2 := NewRunner(Options{Resource: "example.com/sim", StateRoot: filepath.Dir(r.Dir("sim-0")), MarkUnhealthy: true})
	if got, _ := r2.Init(&device.Snapshot{Devices: d}); got["sim-0"].None() {
		t.Fatalf("fault not restored: %v", got)
	}

	// The image is fixed: reset + reprogram succeed, the fault is cleared.
	img2, _ := image(t, 64*1024)
	data, _ := os.ReadFile(img2)
	if err := os.WriteFile(img, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.Prepare(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	if f.get("sim-0") != "" {
		t.Fatal("device still unhealthy after a successful reset")
	}
	if s := state(t, r, "sim-0"); s.Status != StatusReady || s.LastError != "" || s.Generation != 2 {
		t.Fatalf("%+v", s)
	}
}

func TestNoRecoveryWithoutReset(t *testing.T) {
	img, sum := image(t, 1024)
	r, f, _ := newRunner(t, &Reprogram{Image: img, SHA256: sum})
	_ = os.WriteFile(img, []byte("bad"), 0o644)
	if err := r.Prepare(context.Background(), devs(1)); err == nil {
		t.Fatal("no error")
	}
	img2, _ := image(t, 1024)
	data, _ := os.ReadFile(img2)
	_ = os.WriteFile(img, data, 0o644)
	if err := r.Prepare(context.Background(), devs(1)); err != nil {
		t.Fatal(err)
	}
	if f.get("sim-0") == "" {
		t.Fatal("recovered without a reset step")
	}
}

func TestExec(t *testing.T) {
	e, err := NewExec([]string{"/usr/bin/env", "ID={{.ID}}", "HOST={{.HostPath}}", "RES={{.Resource}}", "IDX={{.Index}}", "/usr/bin/env"},
		map[string]string{"FPGA_MODE": "fast"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("LEAK_ME", "secret")
	r, _, hook := newRunner(t, e)
	if err := r.Prepare(context.Background(), devs(2)[1:]); err != nil {
		t.Fatal(err)
	}
	var out string
	for _, en := range hook.AllEntries() {
		if o, ok := en.Data["output"].(string); ok {
			out += o
		}
	}
	// env prints its environment (ID=..., HOST=... are set by the templated
	// arguments), then runs env again in that environment.
	for _, want := range []string{"ID=sim-1", "HOST=/dev/sim-1", "RES=example.com/sim", "IDX=1", "FPGA_MODE=fast", "PATH="} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q: %q", want, out)
		}
	}
	if strings.Contains(out, "LEAK_ME") || strings.Contains(out, "HOME=") {
		t.Errorf("environment not clean: %q", out)
	}
}

func TestExecFails(t *testing.T) {
	e, _ := NewExec([]string{"/bin/false"}, nil, time.Second)
	r, f, _ := newRunner(t, Reset{}, e)
	err := r.Prepare(context.Background(), devs(1))
	var se *StepError
	if !errors.As(err, &se) || se.Step != "exec" || se.Device != "sim-0" || !strings.Contains(err.Error(), "exit status 1") {
		t.Fatalf("error %v", err)
	}
	if f.get("sim-0") == "" {
		t.Fatal("not unhealthy")
	}
	if _, err := NewExec([]string{"/bin/echo", "{{.Nope}}"}, nil, 0); err == nil {
		t.Fatal("unknown template field accepted")
	}
}

func TestExecHangsAndTimesOut(t *testing.T) {
	// The shell's child sleeps on after the shell is killed unless the
	// whole process group goes.
	e, _ := NewExec([]string{"/bin/sh", "-c", "sleep 30 & wait"}, nil, 200*time.Millisecond)
	r, _, _ := newRunner(t, e)
	start := time.Now()
	err := r.Prepare(context.Background(), devs(1))
	if err == nil || !strings.Contains(err.Error(), "timed out after 200ms") {
		t.Fatalf("error %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("hung for %s", took)
	}
}

func TestBudget(t *testing.T) {
	e, _ := NewExec([]string{"/bin/sleep", "30"}, nil, 20*time.Second)
	l, _ := test.NewNullLogger()
	r := NewRunner(Options{Resource: "example.com/sim", StateRoot: t.TempDir(), Steps: []Step{e}, Budget: 300 * time.Millisecond, Log: logrus.NewEntry(l)})
	err := r.Prepare(context.Background(), devs(2))
	if err == nil || !strings.Contains(err.Error(), "budget of 300ms used up") || !strings.Contains(err.Error(), "sim-0") || !strings.Contains(err.Error(), "sim-1") {
		t.Fatalf("error %v", err)
	}
}

// barrier is a step that only completes when n devices are in it at once:
// sequential preparation would time out.
type barrier struct {
	wg *sync.WaitGroup
}

func (barrier) Name() string           { return "barrier" }
func (barrier) Timeout() time.Duration { return 3 * time.Second }
func (b barrier) Run(ctx context.Context, _ *Target) error {
	b.wg.Done()
	done := make(chan struct{})
	go func() { b.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return errors.New("devices were not prepared in parallel")
	}
}

func TestParallel(t *testing.T) {
	var wg sync.WaitGroup
	wg.Add(2)
	r, _, _ := newRunner(t, barrier{&wg})
	if err := r.Prepare(context.Background(), devs(2)); err != nil {
		t.Fatal(err)
	}
}

func TestSameDeviceSerialised(t *testing.T) {
	img, _ := image(t, 256*1024)
	r, _, _ := newRunner(t, Reset{}, &Reprogram{Image: img, Always: true})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- r.Prepare(context.Background(), devs(1)) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if s := state(t, r, "sim-0"); s.Generation != 8 || s.ResetCount != 8 {
		t.Fatalf("lost updates: %+v", s)
	}
}

// TestReprogramLoadMemory: loading an image takes a small buffer; devices
// load in parallel, and what a load takes grows the heap the plugin then
// keeps. With a 256 KiB buffer, a load allocated over 256 KiB.
func TestReprogramLoadMemory(t *testing.T) {
	img, _ := image(t, 1<<20)
	r, _, _ := newRunner(t, &Reprogram{Image: img, Always: true})
	d := devs(1)
	if err := r.Prepare(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := r.Prepare(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 128<<10 {
		t.Fatalf("loading a 1 MiB image allocated %d KiB, want at most 128 KiB", got>>10)
	} else {
		t.Logf("loading a 1 MiB image allocated %d KiB", got>>10)
	}
}

func BenchmarkPrepare2Devices1MiB(b *testing.B) {
	data := make([]byte, 1<<20)
	img := filepath.Join(b.TempDir(), "img.bin")
	_ = os.WriteFile(img, data, 0o644)
	sum := sha256.Sum256(data)
	r := NewRunner(Options{Resource: "example.com/sim", StateRoot: b.TempDir(), Steps: []Step{Reset{}, &Reprogram{Image: img, SHA256: hex.EncodeToString(sum[:])}}})
	d := devs(2)
	if _, err := r.Init(&device.Snapshot{Devices: d}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := r.Prepare(context.Background(), d); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDigestMismatchKeepsFirmware: when the bytes copied
// do not have the digest checked before the copy (the image changed in
// between), the firmware in place and the state stay as they were.
func TestDigestMismatchKeepsFirmware(t *testing.T) {
	img, sum := image(t, 64*1024)
	step := &Reprogram{Image: img, SHA256: sum}
	r, _, _ := newRunner(t, step)
	d := devs(1)
	if err := r.Prepare(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	fw := filepath.Join(r.Dir("sim-0"), FirmwareFile)
	before, err := os.ReadFile(fw)
	if err != nil {
		t.Fatal(err)
	}
	// The image changes after it was hashed: the cached digest (for this
	// very stat) says "new", the bytes on disk are something else.
	newImg, _ := image(t, 32*1024)
	data, _ := os.ReadFile(newImg)
	if err := os.WriteFile(img, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := step.digest(); err != nil {
		t.Fatal(err)
	}
	step.mu.Lock()
	step.cache.sha256 = strings.Repeat("ab", 32)
	step.mu.Unlock()
	step.SHA256 = strings.Repeat("ab", 32)

	err = r.Prepare(context.Background(), d)
	if err == nil || !strings.Contains(err.Error(), "changed while loading") {
		t.Fatalf("error %v", err)
	}
	after, err := os.ReadFile(fw)
	if err != nil {
		t.Fatalf("firmware in place was removed: %v", err)
	}
	if !bytes.Equal(after, before) {
		t.Fatal("firmware in place was replaced")
	}
	if s := state(t, r, "sim-0"); s.Firmware == nil || s.Firmware.SHA256 != sum {
		t.Fatalf("state no longer names the firmware in place: %+v", s.Firmware)
	}
	if entries, _ := filepath.Glob(filepath.Join(r.Dir("sim-0"), "."+FirmwareFile+".tmp-*")); len(entries) != 0 {
		t.Fatalf("temp files left: %v", entries)
	}
}

// TestCorruptStateOneWay: an unreadable state.json is treated the
// same at start and before a container start: logged, kept aside as
// state.json.corrupt, and the device starts afresh.
func TestCorruptStateOneWay(t *testing.T) {
	for _, when := range []string{"init", "prepare"} {
		t.Run(when, func(t *testing.T) {
			r, f, hook := newRunner(t, Reset{})
			dir := r.Dir("sim-0")
			if err := os.WriteFile(filepath.Join(dir, StateFile), []byte("\x00garbage"), 0o644); err != nil {
				t.Fatal(err)
			}
			var err error
			if when == "init" {
				_, err = r.Init(&device.Snapshot{Devices: devs(2)})
			} else {
				err = r.Prepare(context.Background(), devs(1))
			}
			if err != nil {
				t.Fatal(err)
			}
			if kept, err := os.ReadFile(filepath.Join(dir, StateFile+".corrupt")); err != nil || string(kept) != "\x00garbage" {
				t.Fatalf("not kept aside: %q %v", kept, err)
			}
			if _, err := LoadState(dir); err != nil {
				t.Fatalf("state still unreadable: %v", err)
			}
			if f.get("sim-0") != "" {
				t.Fatalf("device faulted: %q", f.get("sim-0"))
			}
			logged := false
			for _, e := range hook.AllEntries() {
				logged = logged || strings.Contains(e.Message, "unreadable device state")
			}
			if !logged {
				t.Fatal("not logged")
			}
		})
	}
}

// noHolders is a PodResources lister that finds no container holding a
// device.
func noHolders(context.Context) ([]string, error) { return nil, nil }

// failing is an exec-like step that fails while its flag file is absent.
type failing struct{ flag string }

func (failing) Name() string           { return "exec" }
func (failing) Timeout() time.Duration { return time.Second }
func (f failing) Run(context.Context, *Target) error {
	if _, err := os.Stat(f.flag); err != nil {
		return fmt.Errorf("device not ready: %w", err)
	}
	return nil
}

// TestBackgroundRecovery: with the default recovery, a
// device without a reset step (a host device with an exec step) whose
// preparation failed is prepared again in the background, with a growing
// backoff, and healed as soon as that works; nobody retries the container.
// With recovery never, it stays unhealthy and nothing runs.
func TestBackgroundRecovery(t *testing.T) {
	for _, mode := range []config.Recovery{config.RecoverAuto, config.RecoverNever} {
		t.Run(string(mode), func(t *testing.T) {
			flag := filepath.Join(t.TempDir(), "ready")
			f := &faults{}
			r := NewRunner(Options{Resource: "example.com/serial", StateRoot: t.TempDir(), Steps: []Step{failing{flag}},
				MarkUnhealthy: true, Recovery: mode, RecoveryInterval: 20 * time.Millisecond, Health: f, Holders: noHolders})
			if _, err := r.Init(&device.Snapshot{Devices: devs(1)}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Error(err)
				}
			}()
			if err := r.Prepare(context.Background(), devs(1)); err == nil {
				t.Fatal("no error")
			}
			if mode == config.RecoverAuto {
				// A background attempt fails (fewer than MaxRecoveryAttempts).
				waitFor(t, "a background attempt", func() bool { return len(f.reports()) >= 2 })
			} else {
				time.Sleep(150 * time.Millisecond) // none would run
			}
			attempts := len(f.reports())
			if f.get("sim-0") == "" {
				t.Fatal("not unhealthy")
			}
			if err := os.WriteFile(flag, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(3 * time.Second)
			for f.get("sim-0") != "" && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			healed := f.get("sim-0") == ""
			if mode == config.RecoverAuto && (!healed || attempts < 2) {
				t.Fatalf("healed %v after %d reports: %v", healed, attempts, f.reports())
			}
			if mode == config.RecoverNever && (healed || len(f.reports()) != 1) {
				t.Fatalf("recovery never: healed %v, reports %v", healed, f.reports())
			}
		})
	}
}

// TestRecoveryAfterRestoredFault: a fault restored from the state at start
// is prepared again in the background too.
func TestRecoveryAfterRestoredFault(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "sim-0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	st := State{Device: "sim-0", Status: StatusFailed, LastError: "step reset: boom"}
	if err := st.Save(dir); err != nil {
		t.Fatal(err)
	}
	f := &faults{}
	r := NewRunner(Options{Resource: "example.com/sim", StateRoot: root, Steps: []Step{Reset{}}, MarkUnhealthy: true,
		RecoveryInterval: 10 * time.Millisecond, Health: f, Holders: noHolders})
	got, err := r.Init(&device.Snapshot{Devices: devs(1)})
	if err != nil || got["sim-0"].None() {
		t.Fatalf("fault not restored: %v %v", got, err)
	}
	f.SetFault("sim-0", got["sim-0"])
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	deadline := time.Now().Add(3 * time.Second)
	for f.get("sim-0") != "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if f.get("sim-0") != "" {
		t.Fatal("restored fault never healed")
	}
	if s := state(t, r, "sim-0"); s.Status != StatusReady || s.ResetCount != 1 {
		t.Fatalf("%+v", s)
	}
}

// TestStateVersion: state.json carries its format version; a file without
// one (an older plugin's) is read, one of an unknown version is refused
// with an error naming it, and left as it is.
func TestStateVersion(t *testing.T) {
	r, _, _ := newRunner(t, Reset{})
	dir := r.Dir("sim-0")
	if err := r.Prepare(context.Background(), devs(1)); err != nil {
		t.Fatal(err)
	}
	if s := state(t, r, "sim-0"); s.Version != StateVersion {
		t.Fatalf("written without its version: %+v", s)
	}
	if err := os.WriteFile(filepath.Join(dir, StateFile), []byte(`{"device":"sim-0","status":"ready","generation":3}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if s := state(t, r, "sim-0"); s.Generation != 3 {
		t.Fatalf("unversioned state: %+v", s)
	}
	newer := []byte(`{"version":2,"device":"sim-0","status":"ready"}`)
	if err := os.WriteFile(filepath.Join(dir, StateFile), newer, 0o644); err != nil {
		t.Fatal(err)
	}
	// Unhealthy, with the cause; not an error of the whole resource.
	got, err := r.Init(&device.Snapshot{Devices: devs(1)})
	if err != nil || !strings.Contains(got["sim-0"].String(), "version 2") {
		t.Fatalf("unknown version: %v %v", got, err)
	}
	if err := r.Prepare(context.Background(), devs(1)); !errors.Is(err, ErrStateVersion) {
		t.Fatalf("prepare with an unknown version: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, StateFile)); !bytes.Equal(got, newer) {
		t.Fatalf("state of an unknown version replaced: %s", got)
	}
}

// TestExecMetacharactersLiteral: shell metacharacters in an exec step's
// arguments, templated ones included, reach the command literally: no
// shell runs, nothing they would do happens.
func TestExecMetacharactersLiteral(t *testing.T) {
	dir := t.TempDir()
	args := []string{
		"a; touch " + dir + "/pwned",
		"$(touch " + dir + "/pwned)",
		"`touch " + dir + "/pwned`",
		"{{.ID}} && touch " + dir + "/pwned | cat > " + dir + "/pwned",
		"$HOME * ~ \\n '\"",
	}
	e, err := NewExec(append([]string{"/bin/echo"}, args...), nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r, _, hook := newRunner(t, e)
	if err := r.Prepare(context.Background(), devs(1)); err != nil {
		t.Fatal(err)
	}
	var out string
	for _, en := range hook.AllEntries() {
		if o, ok := en.Data["output"].(string); ok {
			out += o
		}
	}
	args[3] = strings.Replace(args[3], "{{.ID}}", "sim-0", 1)
	if want := strings.Join(args, " "); strings.TrimSpace(out) != want {
		t.Errorf("echo printed %q, want the arguments as written: %q", out, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "pwned")); err == nil {
		t.Error("a shell ran: pwned exists")
	}
}

// TestCancelledIsNotAFault: a PreStartContainer whose
// caller goes away (the kubelet restarts, the socket is served again, a
// reload) while a real exec step runs is not a device fault: no failed
// state, no Unhealthy, no failed-step metric, no background recovery. The
// device is left unprepared (the step may have half-run), so the next
// start prepares it again; a device that had failed stays failed.
func TestCancelledIsNotAFault(t *testing.T) {
	for _, before := range []string{StatusNew, StatusFailed} {
		t.Run(before, func(t *testing.T) {
			started := filepath.Join(t.TempDir(), "started")
			e, err := NewExec([]string{"/bin/sh", "-c", "touch " + started + "; sleep 30 & wait"}, nil, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			l, hook := test.NewNullLogger()
			m := metrics.New("test")
			f := &faults{}
			root := t.TempDir()
			if before == StatusFailed {
				dir := filepath.Join(root, "sim-0")
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				st := State{Device: "sim-0", Status: StatusFailed, LastError: "step exec: boom"}
				if err := st.Save(dir); err != nil {
					t.Fatal(err)
				}
			}
			r := NewRunner(Options{Resource: "example.com/sim", StateRoot: root, Steps: []Step{Reset{}, e}, Budget: 20 * time.Second,
				MarkUnhealthy: true, Recovery: config.RecoverAuto, Health: f, Log: logrus.NewEntry(l), Metrics: m})
			if _, err := r.Init(&device.Snapshot{Devices: devs(1)}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Prepare(ctx, devs(1)) }()
			deadline := time.Now().Add(10 * time.Second)
			for {
				if _, err := os.Stat(started); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("exec step never started")
				}
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			err = <-done
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("error %v, want context.Canceled", err)
			}
			if got := f.reports(); len(got) != 0 {
				t.Fatalf("health reported: %v", got)
			}
			if n, err := promtest.GatherAndCount(m.Registry(), metrics.Namespace+"_prestart_step_failures_total"); err != nil || n != 0 {
				t.Fatalf("failed steps counted: %d series (%v)", n, err)
			}
			s := state(t, r, "sim-0")
			want := StatusUnprepared
			if before == StatusFailed {
				want = StatusFailed
			}
			if s.Status != want || s.Generation != 0 {
				t.Fatalf("state %+v, want status %s", s, want)
			}
			r.mu.Lock()
			_, recovering := r.failed["sim-0"]
			r.mu.Unlock()
			if recovering != (before == StatusFailed) {
				t.Fatalf("background recovery entry %v, want %v", recovering, before == StatusFailed)
			}
			var logged bool
			for _, en := range hook.AllEntries() {
				if en.Message == "preparation cancelled" {
					logged = true
				}
				if en.Level <= logrus.ErrorLevel {
					t.Errorf("logged at %s: %s", en.Level, en.Message)
				}
			}
			if !logged {
				t.Fatal(`no "preparation cancelled" log`)
			}
		})
	}
}

// TestBadStateDirHoldsBackNoOther: a symlink planted at
// one device's state directory makes that device unhealthy, with a reason
// naming the path, in Ensure and in Init; the other devices get their
// directories and are prepared.
func TestBadStateDirHoldsBackNoOther(t *testing.T) {
	root := t.TempDir()
	bad := filepath.Join(root, "sim-1")
	if err := os.Symlink(t.TempDir(), bad); err != nil {
		t.Fatal(err)
	}
	f := &faults{}
	r := NewRunner(Options{Resource: "example.com/sim", StateRoot: root, Steps: []Step{Reset{}}, MarkUnhealthy: true, Health: f})
	snap := &device.Snapshot{Devices: devs(3)}
	if err := r.Ensure(snap); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	got, err := r.Init(snap)
	if err != nil {
		t.Fatalf("Init: %v", err)
	}
	for name, reason := range map[string]string{"ensure": f.get("sim-1"), "init": got["sim-1"].String()} {
		if !strings.Contains(reason, bad) {
			t.Errorf("%s: reason %q does not name %s", name, reason, bad)
		}
	}
	if !r.BadState("sim-1") || r.BadState("sim-0") {
		t.Error("BadState")
	}
	for _, d := range []string{"sim-0", "sim-2"} {
		if f.get(d) != "" || !got[d].None() {
			t.Errorf("%s unhealthy: %q %q", d, f.get(d), got[d])
		}
		if fi, err := os.Lstat(r.Dir(d)); err != nil || !fi.IsDir() {
			t.Errorf("%s: no state directory: %v", d, err)
		}
	}
	good := []device.Device{snap.Devices[0], snap.Devices[2]}
	if err := r.Prepare(context.Background(), good); err != nil {
		t.Fatal(err)
	}
	// Repaired, the device is healthy again at the next Ensure.
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	if err := r.Ensure(snap); err != nil || f.get("sim-1") != "" || r.BadState("sim-1") {
		t.Fatalf("after repair: %v %q", err, f.get("sim-1"))
	}
}

// podResources is the kubelet's PodResources API on a unix socket,
// answering List with the device IDs of example.com/sim set by hold.
type podResources struct{ *testutil.PodResources }

func (p podResources) hold(ids ...string) {
	p.Set(&podresourcesapi.PodResources{
		Name: "a", Namespace: "default",
		Containers: []*podresourcesapi.ContainerResources{{Name: "c", Devices: []*podresourcesapi.ContainerDevices{
			{ResourceName: "example.com/sim", DeviceIds: slices.Clone(ids)},
			{ResourceName: "vendor.com/other", DeviceIds: []string{"sim-0"}},
		}}},
	})
}

func servePodResources(t *testing.T) (podResources, string) {
	t.Helper()
	sock := filepath.Join(testutil.ShortDir(t), "kubelet.sock")
	p := podResources{testutil.ServePodResources(t, sock)}
	p.hold()
	return p, sock
}

// counting is a step that always fails and counts its runs.
type counting struct{ runs *atomic.Int32 }

func (counting) Name() string           { return "exec" }
func (counting) Timeout() time.Duration { return time.Second }
func (c counting) Run(context.Context, *Target) error {
	c.runs.Add(1)
	return errors.New("wrong sha256")
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func logCount(hook *test.Hook, msg string) int {
	n := 0
	for _, e := range hook.AllEntries() {
		if e.Message == msg {
			n++
		}
	}
	return n
}

// heldSim is what the resource's holders ask (resource.Build): the
// device IDs of example.com/sim that containers hold, from one List on
// sock.
func heldSim(ctx context.Context, sock string) ([]string, error) {
	res, err := podresources.List(ctx, sock)
	if err != nil {
		return nil, err
	}
	return res.Held("example.com/sim"), nil
}

// TestRecoverySparesHeldDevices: a failed device that a
// container holds (a replica of it, per the kubelet's PodResources List on
// a real socket) is not prepared again in the background; once nobody
// holds it, it is, at most MaxRecoveryAttempts times, then given up: one
// log line, the metric, no more attempts, still Unhealthy. Without the
// PodResources API nothing is prepared in the background, logged once.
func TestRecoverySparesHeldDevices(t *testing.T) {
	newRun := func(t *testing.T, holders func(context.Context) ([]string, error)) (*Runner, *faults, *test.Hook, *atomic.Int32, *metrics.Metrics) {
		t.Helper()
		l, hook := test.NewNullLogger()
		l.SetLevel(logrus.DebugLevel)
		f := &faults{}
		m := metrics.New("test")
		runs := &atomic.Int32{}
		r := NewRunner(Options{Resource: "example.com/sim", StateRoot: t.TempDir(), Steps: []Step{counting{runs}},
			MarkUnhealthy: true, Recovery: config.RecoverAuto, RecoveryInterval: time.Millisecond, Health: f,
			Log: logrus.NewEntry(l), Metrics: m, Holders: holders})
		testutil.Go(t, r.Run)
		if err := r.Prepare(context.Background(), devs(1)); err == nil {
			t.Fatal("no error")
		}
		return r, f, hook, runs, m
	}
	t.Run("held, then free, then given up", func(t *testing.T) {
		p, sock := servePodResources(t)
		p.hold("sim-1::0", "sim-0::1") // pod A runs on a replica of sim-0
		var asked atomic.Int32
		r, f, hook, runs, m := newRun(t, func(ctx context.Context) ([]string, error) {
			asked.Add(1)
			return heldSim(ctx, sock)
		})
		waitFor(t, "three background rounds", func() bool { return asked.Load() >= 3 })
		if n := runs.Load(); n != 1 {
			t.Fatalf("a held device was prepared again in the background: %d runs", n)
		}
		p.hold("sim-1::0")
		waitFor(t, "recovery given up", func() bool { return logCount(hook, "background recovery given up") > 0 })
		if n := runs.Load(); n != 1+MaxRecoveryAttempts {
			t.Fatalf("%d runs, want 1 + %d", n, MaxRecoveryAttempts)
		}
		want := `# HELP cdi_device_plugin_recovery_given_up_total Failed devices whose background re-preparation was given up after its last attempt, by resource.
# TYPE cdi_device_plugin_recovery_given_up_total counter
cdi_device_plugin_recovery_given_up_total{resource="example.com/sim"} 1
`
		if err := promtest.GatherAndCompare(m.Registry(), strings.NewReader(want), metrics.Namespace+"_recovery_given_up_total"); err != nil {
			t.Fatal(err)
		}
		if f.get("sim-0") == "" {
			t.Fatal("given up, yet healthy")
		}
		r.mu.Lock()
		_, scheduled := r.failed["sim-0"]
		r.mu.Unlock()
		if scheduled {
			t.Fatal("still scheduled for background recovery")
		}
	})
	t.Run("no PodResources socket", func(t *testing.T) {
		var asked atomic.Int32
		sock := filepath.Join(t.TempDir(), "missing.sock")
		_, _, hook, runs, _ := newRun(t, func(ctx context.Context) ([]string, error) {
			asked.Add(1)
			return heldSim(ctx, sock)
		})
		waitFor(t, "three background rounds", func() bool { return asked.Load() >= 3 })
		if n := runs.Load(); n != 1 {
			t.Fatalf("prepared in the background without PodResources: %d runs", n)
		}
		if n := logCount(hook, "cannot tell which devices containers hold; no background recovery"); n != 1 {
			t.Fatalf("logged %d times", n)
		}
	})
}

// TestHeldBy: the kubelet IDs of a physical device are its name and its
// replica IDs, nothing else.
func TestHeldBy(t *testing.T) {
	for _, c := range []struct {
		name string
		ids  []string
		want bool
	}{
		{"sim-0", nil, false},
		{"sim-0", []string{"sim-0"}, true},
		{"sim-0", []string{"sim-0::3"}, true},
		{"sim-0", []string{"sim-00", "sim-0::", "sim-0::x", "sim-1::0"}, false},
		{"net::1", []string{"net::1::0"}, true}, // a name with an escaped ':'
		{"net", []string{"net::1::0"}, false},
	} {
		t.Run(c.name+"/"+strings.Join(c.ids, ","), func(t *testing.T) {
			if got := heldBy(c.name, c.ids); got != c.want {
				t.Fatalf("got %v", got)
			}
		})
	}
}

// counted is a step that works and counts its runs.
type counted struct{ runs *atomic.Int32 }

func (counted) Name() string           { return "exec" }
func (counted) Timeout() time.Duration { return time.Second }
func (c counted) Run(context.Context, *Target) error {
	c.runs.Add(1)
	return nil
}

// brokenReset is a reset step that fails.
type brokenReset struct{}

func (brokenReset) Name() string                       { return "reset" }
func (brokenReset) Timeout() time.Duration             { return time.Second }
func (brokenReset) Resets() bool                       { return true }
func (brokenReset) Run(context.Context, *Target) error { return errors.New("device wedged") }

// TestResetOnly: Reset runs only the steps that reset the
// device, records the reset in the state but not as a preparation (the
// generation stays), and a failed reset makes the device unhealthy as a
// failed preparation does. Without a reset step it runs nothing.
func TestResetOnly(t *testing.T) {
	img, sum := image(t, 4096)
	var runs atomic.Int32
	r, _, _ := newRunner(t, Reset{}, &Reprogram{Image: img, SHA256: sum}, counted{&runs})
	if !r.HasReset() {
		t.Fatal("HasReset false with a reset step")
	}
	if err := r.Prepare(context.Background(), devs(1)); err != nil {
		t.Fatal(err)
	}
	prepared := state(t, r, "sim-0")
	if err := r.Reset(context.Background(), devs(1)); err != nil {
		t.Fatal(err)
	}
	s := state(t, r, "sim-0")
	if s.ResetCount != prepared.ResetCount+1 || s.Generation != prepared.Generation || !s.PreparedAt.Equal(prepared.PreparedAt) || s.Status != StatusReady {
		t.Fatalf("after a reset: %+v, after the preparation: %+v", s, prepared)
	}
	if runs.Load() != 1 {
		t.Fatalf("the other steps ran %d times, want once (the preparation only)", runs.Load())
	}
	if sha, err := r.FirmwareSHA256(); err != nil || sha != sum {
		t.Fatalf("firmware digest %q (%v), want %q", sha, err, sum)
	}

	noReset, _, _ := newRunner(t, counted{&runs})
	if noReset.HasReset() {
		t.Fatal("HasReset true without a reset step")
	}
	if err := noReset.Reset(context.Background(), devs(1)); err != nil || runs.Load() != 1 {
		t.Fatalf("Reset without a reset step: %v, %d runs", err, runs.Load())
	}
	if sha, err := noReset.FirmwareSHA256(); err != nil || sha != "" {
		t.Fatalf("firmware digest %q (%v) without a reprogram step", sha, err)
	}

	broken, bf, _ := newRunner(t, brokenReset{})
	err := broken.Reset(context.Background(), devs(1))
	var se *StepError
	if !errors.As(err, &se) || se.Device != "sim-0" || se.Step != "reset" {
		t.Fatalf("a failed reset: %v", err)
	}
	if bf.get("sim-0") == "" || state(t, broken, "sim-0").Status != StatusFailed {
		t.Fatalf("a failed reset left the device healthy: fault %q, state %+v", bf.get("sim-0"), state(t, broken, "sim-0"))
	}
}

// TestExecFailureSaysWhy: a failed exec step's error ends with the last
// line its command wrote (bounded), which the device's problem, the
// claim's status and a binding failure condition carry: the user sees why
// the command failed, not only its exit status.
func TestExecFailureSaysWhy(t *testing.T) {
	e, _ := NewExec([]string{"/bin/sh", "-c", "echo checking >&2; echo bitstream CRC mismatch >&2; exit 3"}, nil, time.Second)
	r, _, _ := newRunner(t, e)
	err := r.Prepare(context.Background(), devs(1))
	if err == nil || !strings.HasSuffix(err.Error(), "exit status 3: bitstream CRC mismatch") {
		t.Fatalf("error %v, want it to end with the command's last line", err)
	}
	long, _ := NewExec([]string{"/bin/sh", "-c", "printf '%0500d' 0 >&2; exit 1"}, nil, time.Second)
	r, _, _ = newRunner(t, long)
	if err := r.Prepare(context.Background(), devs(1)); err == nil || len(err.Error()) > 400 {
		t.Fatalf("error of %d bytes, want the output bounded: %v", len(err.Error()), err)
	}
}
