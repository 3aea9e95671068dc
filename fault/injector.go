// Package fault makes simulated devices fail on purpose, the same way
// every run: the faults of the configuration (a kind and a trigger) and
// those injected at run time (Control). A health fault reaches the
// device's health through the source (device.Source.SetInjected), so both
// APIs see it as a real failure; a step fault acts in the preparation
// runner (prestart.Options.Faults), so it fails or slows a step as a real
// one would.
package fault

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
)

// ErrNoDevice is returned when the injector's resource has no device of that name.
var ErrNoDevice = errors.New("no such device")

// Options configure the injector of one resource.
type Options struct {
	Resource string
	// Faults are the configured faults, Seed the seed of their draws.
	Faults []config.Fault
	Seed   int64
	// Count is the number of devices, Steps the types of the resource's
	// preparation steps: what a fault injected at run time is checked
	// against.
	Count int
	Steps []config.StepType
	// Clock is the time (default RealClock).
	Clock Clock
	// Devices are the resource's devices now (the source's snapshot).
	Devices func() []device.Device
	// Apply sets a device's injected problem (device.Source.SetInjected).
	Apply   func(name string, p device.Problem)
	Log     *logrus.Entry
	Metrics *metrics.Metrics
}

// Injector holds the faults of one resource's devices and applies them.
type Injector struct {
	o     Options
	start time.Time
	kick  chan struct{}

	mu      sync.Mutex
	devs    map[string]*devState
	applied map[string]device.Problem
}

// devState is one device's faults and what draws them.
type devState struct {
	rng   *rand.Rand
	preps int
	// cleared: Clear ended the configured faults of the device for good.
	cleared bool
	faults  []*armed
}

// armed is a fault of a device: on once its trigger fired.
type armed struct {
	f       config.Fault
	runtime bool
	on      bool
	since   time.Time
	// now: a step fault acts on the device's current preparation.
	now bool
}

// New returns the injector of a resource; nothing happens before Tick,
// Run or a preparation.
func New(o Options) *Injector {
	if o.Clock == nil {
		o.Clock = RealClock{}
	}
	if o.Log == nil {
		o.Log = logs.Discard()
	}
	return &Injector{o: o, start: o.Clock.Now(), kick: make(chan struct{}, 1), devs: map[string]*devState{}, applied: map[string]device.Problem{}}
}

// Resource is the resource the injector's devices belong to.
func (in *Injector) Resource() string { return in.o.Resource }

// state is d's state, made at first sight with the configured faults
// that apply to it. Its draws come from a generator of its own, seeded by
// the seed and its index, so that they do not depend on the order in
// which devices are prepared. The caller holds in.mu.
func (in *Injector) state(d device.Device) *devState {
	st := in.devs[d.Name]
	if st != nil {
		return st
	}
	st = &devState{rng: rand.New(rand.NewPCG(uint64(in.o.Seed), uint64(d.Index)))}
	for _, f := range in.o.Faults {
		if f.AppliesTo(d.Index) {
			st.faults = append(st.faults, &armed{f: f})
		}
	}
	in.devs[d.Name] = st
	return st
}

// fire starts a fault on device name (logged and counted). The caller
// holds in.mu.
func (in *Injector) fire(name string, a *armed, now time.Time, why string) {
	a.on, a.since = true, now
	in.o.Metrics.FaultInjected(in.o.Resource, string(a.f.Kind))
	in.o.Log.WithField("device", name).WithField("kind", a.f.Kind).WithField("trigger", why).Warn("fault injected")
}

// Tick starts the faults whose time came and applies every device's
// health as it is now; it reports whether a device's changed.
func (in *Injector) Tick() bool {
	now := in.o.Clock.Now()
	in.mu.Lock()
	defer in.mu.Unlock()
	changed := false
	for _, d := range in.o.Devices() {
		st := in.state(d)
		for _, a := range st.faults {
			t := a.f.Trigger
			switch {
			case a.on || a.runtime || st.cleared:
			case t.AtStart:
				in.fire(d.Name, a, in.start, "atStart")
			case t.After != nil && !now.Before(in.start.Add(t.After.Duration)):
				in.fire(d.Name, a, in.start.Add(t.After.Duration), "after "+t.After.String())
			}
		}
		changed = in.applyLocked(d.Name, st, now) || changed
	}
	return changed
}

// Preparing counts a preparation of d and draws its faults' triggers:
// those after N preparations, and those with a probability (a step fault
// acts on this preparation alone, a health fault starts for good).
func (in *Injector) Preparing(d device.Device) {
	now := in.o.Clock.Now()
	in.mu.Lock()
	defer in.mu.Unlock()
	st := in.state(d)
	st.preps++
	for _, a := range st.faults {
		t := a.f.Trigger
		if !a.on && !st.cleared && !a.runtime {
			switch {
			case t.AfterPreparations > 0 && st.preps > t.AfterPreparations:
				in.fire(d.Name, a, now, fmt.Sprintf("afterPreparations %d", t.AfterPreparations))
			case t.Probability > 0 && !a.f.Kind.Steps() && st.rng.Float64() < t.Probability:
				in.fire(d.Name, a, now, fmt.Sprintf("probability %g", t.Probability))
			}
		}
		a.now = a.on
		if t.Probability > 0 && a.f.Kind.Steps() && !st.cleared && !a.runtime {
			a.now = st.rng.Float64() < t.Probability
		}
	}
	in.applyLocked(d.Name, st, now)
	in.poke()
}

// Step is what the faults of device name do to its step (a step type):
// a slow one waits its delay (or until ctx is done), a failing one
// returns its message; each is counted.
func (in *Injector) Step(ctx context.Context, name, step string) error {
	delay, fail := in.stepFaults(name, step)
	if delay > 0 {
		select {
		case <-in.o.Clock.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if fail != "" {
		return errors.New(fail)
	}
	return nil
}

// stepFaults is the delay and the failure the faults acting on the
// device's current preparation give step.
func (in *Injector) stepFaults(name, step string) (time.Duration, string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	st := in.devs[name]
	if st == nil {
		return 0, ""
	}
	var delay time.Duration
	fail := ""
	for _, a := range st.faults {
		if !a.now || (a.f.Step != "" && string(a.f.Step) != step) {
			continue
		}
		switch {
		case a.f.Kind == config.FaultSlowStep:
			delay += a.f.Delay.Duration
		case a.f.Kind == config.FaultStepFails && fail == "":
			fail = a.f.Message
		default:
			continue
		}
		in.o.Metrics.FaultInjected(in.o.Resource, string(a.f.Kind))
		in.o.Log.WithField("device", name).WithField("kind", a.f.Kind).WithField("step", step).Info("step fault injected")
	}
	return delay, fail
}

// problem is the health the device's faults give it at now: lost before
// unhealthy before flapping.
func (st *devState) problem(now time.Time) device.Problem {
	var p device.Problem
	rank := 0
	for _, a := range st.faults {
		if !a.on {
			continue
		}
		switch a.f.Kind {
		case config.FaultLost:
			return device.Problem{Cause: device.CauseMissing, Message: "injected fault: lost", Evict: a.f.NoExecute}
		case config.FaultUnhealthy:
			if rank < 2 {
				p, rank = device.Problem{Cause: device.CauseInjected, Message: a.f.Reason}, 2
			}
		case config.FaultFlapping:
			if rank < 1 && flappedDown(a, now) {
				p, rank = device.Problem{Cause: device.CauseInjected, Message: "flapping every " + a.f.Period.String()}, 1
			}
		}
	}
	return p
}

// flappedDown: a flapping fault is unhealthy in its even periods.
func flappedDown(a *armed, now time.Time) bool {
	return (now.Sub(a.since)/a.f.Period.Duration)%2 == 0
}

// applyLocked hands the device's health to the source when it changed,
// and reports whether it did. The caller holds in.mu.
func (in *Injector) applyLocked(name string, st *devState, now time.Time) bool {
	p := st.problem(now)
	if in.applied[name] == p {
		return false
	}
	in.applied[name] = p
	in.o.Apply(name, p)
	return true
}

// Active is a fault that acts on a device now (List).
type Active struct {
	Device  string       `json:"device"`
	Fault   config.Fault `json:"fault"`
	Since   time.Time    `json:"since"`
	Runtime bool         `json:"runtime"`
}

// List is the faults on now, by device name.
func (in *Injector) List() []Active {
	in.mu.Lock()
	defer in.mu.Unlock()
	var out []Active
	for name, st := range in.devs {
		for _, a := range st.faults {
			if a.on {
				out = append(out, Active{Device: name, Fault: a.f, Since: a.since, Runtime: a.runtime})
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Device < out[j].Device })
	return out
}
