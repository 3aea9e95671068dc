package prestart

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/fault"
)

// injectorFor is an injector of faults for the runner's two devices.
func injectorFor(clock fault.Clock, faults ...config.Fault) *fault.Injector {
	inj := fault.New(fault.Options{Resource: "example.com/sim", Faults: faults, Count: 2, Steps: []config.StepType{config.StepReset},
		Clock: clock, Devices: func() []device.Device { return devs(2) }, Apply: func(string, device.Problem) {}})
	inj.Tick()
	return inj
}

// TestInjectedStepFails: an injected step failure fails the preparation
// as a real one does: the error names the step and the message, the
// state file records it, the device is Unhealthy for prestart; once the
// fault is cleared, the next preparation heals the device.
func TestInjectedStepFails(t *testing.T) {
	r, f, _ := newRunner(t, Reset{})
	inj := injectorFor(fault.RealClock{}, config.Fault{Kind: config.FaultStepFails, Message: "bus error", Devices: []int{0}, Trigger: config.FaultTrigger{AtStart: true}})
	r.opts.Faults = inj
	err := r.Prepare(context.Background(), devs(2))
	if err == nil || !strings.Contains(err.Error(), "device sim-0: step reset: bus error") || strings.Contains(err.Error(), "sim-1") {
		t.Fatalf("got %v", err)
	}
	if s := state(t, r, "sim-0"); s.Status != StatusFailed || s.LastError != "step reset: bus error" {
		t.Fatalf("state %+v", s)
	}
	if got := f.get("sim-0"); got != "prestart: step reset: bus error" {
		t.Fatalf("health %q", got)
	}
	if err := inj.Clear("sim-0"); err != nil {
		t.Fatal(err)
	}
	if err := r.Prepare(context.Background(), devs(1)); err != nil {
		t.Fatal(err)
	}
	if got := f.get("sim-0"); got != "" {
		t.Fatalf("health after clearing and preparing: %q", got)
	}
}

// TestInjectedSlowStep: a slow step delays the step on the injector's
// clock; past the step's limit, the step times out as a real slow one.
func TestInjectedSlowStep(t *testing.T) {
	r, _, _ := newRunner(t, Reset{Limit: time.Hour})
	clock := fault.NewFakeClock(time.Now())
	r.opts.Faults = injectorFor(clock, config.Fault{Kind: config.FaultSlowStep, Delay: config.Duration{Duration: time.Minute}, Trigger: config.FaultTrigger{AtStart: true}})
	done := make(chan error, 1)
	go func() { done <- r.Prepare(context.Background(), devs(1)) }()
	deadline := time.Now().Add(10 * time.Second)
	for clock.Waiters() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the step never waited on the clock")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("prepared before the delay: %v", err)
	default:
	}
	clock.Advance(time.Minute)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := state(t, r, "sim-0"); s.Status != StatusReady || s.ResetCount != 1 {
		t.Fatalf("state %+v", s)
	}
}
