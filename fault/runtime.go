package fault

import (
	"context"
	"fmt"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// device is the resource's device of that name, if any.
func (in *Injector) device(name string) (device.Device, bool) {
	for _, d := range in.o.Devices() {
		if d.Name == name {
			return d, true
		}
	}
	return device.Device{}, false
}

// Has reports whether the resource has a device of that name.
func (in *Injector) Has(name string) bool {
	_, ok := in.device(name)
	return ok
}

// Inject starts fault f on device name now (a fault of run time: no
// trigger, no devices). A bad fault is a config.FieldError naming the
// field, without a resource's prefix.
func (in *Injector) Inject(name string, f config.Fault) error {
	d, ok := in.device(name)
	if !ok {
		return fmt.Errorf("%w %q in %s", ErrNoDevice, name, in.o.Resource)
	}
	if in.o.Count == 0 {
		return fmt.Errorf("%s: faults apply to simulated devices; a host device fails for real", in.o.Resource)
	}
	f.Devices = nil
	if err := config.ValidateFault(func(s string) string { return s }, &f, in.o.Count, in.o.Steps, false); err != nil {
		return err
	}
	now := in.o.Clock.Now()
	in.mu.Lock()
	st := in.state(d)
	a := &armed{f: f, runtime: true, now: true}
	st.faults = append(st.faults, a)
	in.fire(name, a, now, "control")
	in.applyLocked(name, st, now)
	in.mu.Unlock()
	in.poke()
	return nil
}

// Clear ends every fault of device name: those injected at run time, and
// its configured ones, for good (until the process or configuration
// changes). The device's health then takes the path of a real recovery:
// the source sees its node fine again; a preparation the fault failed is
// healed by the runner's background re-preparation or the next start.
func (in *Injector) Clear(name string) error {
	d, ok := in.device(name)
	if !ok {
		return fmt.Errorf("%w %q in %s", ErrNoDevice, name, in.o.Resource)
	}
	now := in.o.Clock.Now()
	in.mu.Lock()
	st := in.state(d)
	st.cleared = true
	st.faults = nil
	in.applyLocked(name, st, now)
	in.mu.Unlock()
	in.o.Log.WithField("device", name).Warn("faults cleared")
	in.poke()
	return nil
}

// poke asks Run to look at the next change again.
func (in *Injector) poke() {
	select {
	case in.kick <- struct{}{}:
	default:
	}
}

// next is when the next fault starts by time, or a flap turns: the
// earliest such time after now.
func (in *Injector) next(now time.Time) (time.Time, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	var at time.Time
	found := false
	consider := func(t time.Time) {
		if t.After(now) && (!found || t.Before(at)) {
			at, found = t, true
		}
	}
	for _, f := range in.o.Faults {
		if f.Trigger.After != nil {
			consider(in.start.Add(f.Trigger.After.Duration))
		}
	}
	for _, st := range in.devs {
		for _, a := range st.faults {
			if a.on && a.f.Kind == config.FaultFlapping {
				p := a.f.Period.Duration
				consider(a.since.Add((now.Sub(a.since)/p + 1) * p))
			}
		}
	}
	return at, found
}

// Run applies the faults as time passes (their after triggers, the flaps)
// until ctx is done.
func (in *Injector) Run(ctx context.Context) error {
	for {
		in.Tick()
		var due <-chan time.Time
		now := in.o.Clock.Now()
		if at, ok := in.next(now); ok {
			due = in.o.Clock.After(at.Sub(now))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-due:
		case <-in.kick:
		}
	}
}
