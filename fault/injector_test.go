package fault

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// applied records what the injector applies to the source, by device.
type applied struct {
	mu   sync.Mutex
	p    map[string]device.Problem
	seen chan string
}

func (a *applied) apply(name string, p device.Problem) {
	a.mu.Lock()
	a.p[name] = p
	a.mu.Unlock()
	select {
	case a.seen <- name:
	default:
	}
}

func (a *applied) get(name string) device.Problem {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.p[name]
}

func devs(n int) []device.Device {
	out := make([]device.Device, n)
	for i := range out {
		out[i] = device.Device{Name: "sim-" + strconv.Itoa(i), Index: i, Healthy: true}
	}
	return out
}

func newInjector(t *testing.T, seed int64, faults ...config.Fault) (*Injector, *FakeClock, *applied) {
	t.Helper()
	clock := NewFakeClock(t0)
	a := &applied{p: map[string]device.Problem{}, seen: make(chan string, 64)}
	inj := New(Options{Resource: "example.com/sim", Faults: faults, Seed: seed, Count: 4, Steps: []config.StepType{config.StepReset, config.StepReprogram},
		Clock: clock, Devices: func() []device.Device { return devs(4) }, Apply: a.apply})
	return inj, clock, a
}

func after(d time.Duration) *config.Duration { return &config.Duration{Duration: d} }

var (
	lostProblem = device.Problem{Cause: device.CauseMissing, Message: "injected fault: lost", Evict: true}
	eccProblem  = device.Problem{Cause: device.CauseInjected, Message: "ECC error"}
)

// TestAtStartLost: a lost fault at start makes its devices missing, with
// eviction when it says noExecute; the others stay healthy.
func TestAtStartLost(t *testing.T) {
	inj, _, a := newInjector(t, 0, config.Fault{Kind: config.FaultLost, Devices: []int{1, 3}, NoExecute: true, Trigger: config.FaultTrigger{AtStart: true}})
	inj.Tick()
	for i, want := range []device.Problem{{}, lostProblem, {}, lostProblem} {
		if got := a.get("sim-" + strconv.Itoa(i)); got != want {
			t.Errorf("device %d: %+v, want %+v", i, got, want)
		}
	}
}

// TestAfterPreparations: the first N preparations of a device see no
// fault, the next one does; each device counts its own.
func TestAfterPreparations(t *testing.T) {
	inj, _, a := newInjector(t, 0, config.Fault{Kind: config.FaultUnhealthy, Reason: "ECC error", Trigger: config.FaultTrigger{AfterPreparations: 2}})
	d := devs(4)
	for i := 0; i < 2; i++ {
		inj.Preparing(d[0])
		if got := a.get("sim-0"); !got.None() {
			t.Fatalf("after %d preparations: %+v", i+1, got)
		}
	}
	inj.Preparing(d[0])
	if got := a.get("sim-0"); got != eccProblem {
		t.Fatalf("third preparation: %+v, want %+v", got, eccProblem)
	}
	if got := a.get("sim-1"); !got.None() {
		t.Fatalf("sim-1, never prepared: %+v", got)
	}
}

// TestAfterDuration: the fault starts once the clock is past start+after.
func TestAfterDuration(t *testing.T) {
	inj, clock, a := newInjector(t, 0, config.Fault{Kind: config.FaultLost, Trigger: config.FaultTrigger{After: after(time.Minute)}})
	clock.Advance(time.Minute - time.Second)
	inj.Tick()
	if got := a.get("sim-2"); !got.None() {
		t.Fatalf("before: %+v", got)
	}
	if next, ok := inj.next(clock.Now()); !ok || !next.Equal(t0.Add(time.Minute)) {
		t.Fatalf("next change %v %v, want %v", next, ok, t0.Add(time.Minute))
	}
	clock.Advance(time.Second)
	inj.Tick()
	if got := a.get("sim-2"); got.Cause != device.CauseMissing || got.Evict {
		t.Fatalf("after: %+v", got)
	}
}

// TestFlapping: unhealthy for a period, healthy for the next, and so on.
func TestFlapping(t *testing.T) {
	inj, clock, a := newInjector(t, 0, config.Fault{Kind: config.FaultFlapping, Devices: []int{0}, Period: config.Duration{Duration: 10 * time.Second}, Trigger: config.FaultTrigger{AtStart: true}})
	for i, want := range []bool{false, true, false, true} {
		inj.Tick()
		got := a.get("sim-0")
		if got.None() != want || (!want && got.Cause != device.CauseInjected) {
			t.Fatalf("period %d: %+v, want healthy %v", i, got, want)
		}
		if next, _ := inj.next(clock.Now()); !next.Equal(clock.Now().Add(10 * time.Second)) {
			t.Fatalf("period %d: next change at %v", i, next)
		}
		clock.Advance(10 * time.Second)
	}
}

// TestStepFails: a stepFails fault fails the step it names with its
// message, and no other step; a device it does not apply to is untouched.
func TestStepFails(t *testing.T) {
	inj, _, _ := newInjector(t, 0, config.Fault{Kind: config.FaultStepFails, Devices: []int{0}, Message: "bus error", Step: config.StepReprogram, Trigger: config.FaultTrigger{AtStart: true}})
	inj.Tick()
	ctx := context.Background()
	for _, d := range devs(2) {
		inj.Preparing(d)
	}
	if err := inj.Step(ctx, "sim-0", "reset"); err != nil {
		t.Fatalf("reset: %v", err)
	}
	if err := inj.Step(ctx, "sim-0", "reprogram"); err == nil || err.Error() != "bus error" {
		t.Fatalf("reprogram: %v, want bus error", err)
	}
	if err := inj.Step(ctx, "sim-1", "reprogram"); err != nil {
		t.Fatalf("sim-1: %v", err)
	}
}

// TestSlowStep: a slow step waits its delay on the clock, or until the
// step's context is done.
func TestSlowStep(t *testing.T) {
	inj, clock, _ := newInjector(t, 0, config.Fault{Kind: config.FaultSlowStep, Delay: config.Duration{Duration: 20 * time.Second}, Trigger: config.FaultTrigger{AtStart: true}})
	inj.Tick()
	inj.Preparing(devs(1)[0])
	done := make(chan error, 1)
	go func() { done <- inj.Step(context.Background(), "sim-0", "reset") }()
	eventually(t, 10*time.Second, "the step waits on the clock", func() bool { return clock.Waiters() == 1 })
	select {
	case err := <-done:
		t.Fatalf("returned before the delay: %v", err)
	default:
	}
	clock.Advance(20 * time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := inj.Step(ctx, "sim-0", "reset"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// probabilitySeq is which of n preparations of device 0 a 30% stepFails
// fault fails, under seed.
func probabilitySeq(t *testing.T, seed int64, n int) []bool {
	inj, _, _ := newInjector(t, seed, config.Fault{Kind: config.FaultStepFails, Message: "flaky", Trigger: config.FaultTrigger{Probability: 0.3}})
	out := make([]bool, n)
	for i := range out {
		inj.Preparing(devs(1)[0])
		out[i] = inj.Step(context.Background(), "sim-0", "reset") != nil
	}
	return out
}

// TestProbabilitySeed: the same seed fails the same preparations every
// run, another seed others; about the probability of them fail.
func TestProbabilitySeed(t *testing.T) {
	const n = 1000
	a, b, c := probabilitySeq(t, 42, n), probabilitySeq(t, 42, n), probabilitySeq(t, 43, n)
	failed, same := 0, true
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 42, preparation %d: %v then %v", i, a[i], b[i])
		}
		if a[i] {
			failed++
		}
		same = same && a[i] == c[i]
	}
	if same {
		t.Error("seeds 42 and 43 fail the same preparations")
	}
	if failed < 200 || failed > 400 {
		t.Errorf("%d of %d failed at 30%%", failed, n)
	}
}

// TestProbabilityHealth: a health fault with a probability starts for
// good at the first preparation the draw picks.
func TestProbabilityHealth(t *testing.T) {
	inj, _, a := newInjector(t, 1, config.Fault{Kind: config.FaultUnhealthy, Reason: "ECC error", Trigger: config.FaultTrigger{Probability: 0.5}})
	for i := 0; i < 64 && a.get("sim-0").None(); i++ {
		inj.Preparing(devs(1)[0])
	}
	if got := a.get("sim-0"); got != eccProblem {
		t.Fatalf("after 64 draws at 50%%: %+v", got)
	}
}

// TestInjectAndClear: a fault injected at run time starts at once; clearing
// a device ends its run-time and its configured faults for good.
func TestInjectAndClear(t *testing.T) {
	inj, _, a := newInjector(t, 0, config.Fault{Kind: config.FaultLost, Devices: []int{1}, Trigger: config.FaultTrigger{AtStart: true}})
	inj.Tick()
	if err := inj.Inject("sim-0", config.Fault{Kind: config.FaultUnhealthy, Reason: "ECC error"}); err != nil {
		t.Fatal(err)
	}
	if got := a.get("sim-0"); got != eccProblem {
		t.Fatalf("injected: %+v", got)
	}
	if err := inj.Inject("sim-9", config.Fault{Kind: config.FaultLost}); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("unknown device: %v", err)
	}
	var fe *config.FieldError
	if err := inj.Inject("sim-0", config.Fault{Kind: config.FaultSlowStep}); !errors.As(err, &fe) || fe.Field != "delay" {
		t.Fatalf("slowStep without delay: %v", err)
	}
	for _, name := range []string{"sim-0", "sim-1"} {
		if err := inj.Clear(name); err != nil {
			t.Fatal(err)
		}
	}
	inj.Tick()
	if got0, got1 := a.get("sim-0"), a.get("sim-1"); !got0.None() || !got1.None() {
		t.Fatalf("cleared: %+v %+v", got0, got1)
	}
	if got := inj.List(); len(got) != 0 {
		t.Fatalf("listed after clearing: %+v", got)
	}
}

// TestRun: Run applies a fault due after a duration when the clock gets
// there, and a flap at each period.
func TestRun(t *testing.T) {
	inj, clock, a := newInjector(t, 0,
		config.Fault{Kind: config.FaultLost, Devices: []int{0}, Trigger: config.FaultTrigger{After: after(time.Minute)}},
		config.Fault{Kind: config.FaultFlapping, Devices: []int{1}, Period: config.Duration{Duration: 90 * time.Second}, Trigger: config.FaultTrigger{After: after(time.Minute)}})
	goRun(t, inj.Run)
	eventually(t, 10*time.Second, "Run waits for the minute", func() bool { return clock.Waiters() == 1 })
	clock.Advance(time.Minute)
	eventually(t, 10*time.Second, "lost and flapping after a minute", func() bool {
		return a.get("sim-0").Cause == device.CauseMissing && a.get("sim-1").Cause == device.CauseInjected
	})
	eventually(t, 10*time.Second, "Run waits for the flap", func() bool { return clock.Waiters() == 1 })
	clock.Advance(90 * time.Second)
	eventually(t, 10*time.Second, "flapped back to healthy", func() bool { return a.get("sim-1").None() })
}

// eventually polls cond until it holds, failing after d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s", what, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// goRun runs f until the test ends, and checks it returned nil.
func goRun(t *testing.T, f func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}
