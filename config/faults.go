package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// FaultKind is how a simulated device fails on purpose.
type FaultKind string

// Fault kinds.
const (
	// FaultLost: the device's node is gone, as if it fell off the bus.
	FaultLost FaultKind = "lost"
	// FaultUnhealthy: the device is Unhealthy for Reason.
	FaultUnhealthy FaultKind = "unhealthy"
	// FaultStepFails: a preparation step fails with Message.
	FaultStepFails FaultKind = "stepFails"
	// FaultSlowStep: a preparation step takes Delay longer.
	FaultSlowStep FaultKind = "slowStep"
	// FaultFlapping: the device is Unhealthy and Healthy in turn, each for
	// Period.
	FaultFlapping FaultKind = "flapping"
)

// FaultKinds are the kinds, in order.
var FaultKinds = []FaultKind{FaultLost, FaultUnhealthy, FaultStepFails, FaultSlowStep, FaultFlapping}

// Steps reports whether the kind acts on preparation steps (else on the
// device's health).
func (k FaultKind) Steps() bool { return k == FaultStepFails || k == FaultSlowStep }

// Fault is a failure of simulated devices, injected on purpose.
type Fault struct {
	Kind FaultKind `json:"kind"`
	// Devices are the indexes of the devices it applies to; none: all.
	Devices []int `json:"devices,omitempty"`
	// Reason (unhealthy) says why the device is Unhealthy.
	Reason string `json:"reason,omitempty"`
	// Message (stepFails) is the step's error.
	Message string `json:"message,omitempty"`
	// Step (stepFails, slowStep) is the type of the step it acts on;
	// empty: every step.
	Step StepType `json:"step,omitempty"`
	// Delay (slowStep) is how much longer the step takes.
	Delay Duration `json:"delay,omitempty"`
	// Period (flapping) is how long each half of a flap lasts.
	Period Duration `json:"period,omitempty"`
	// NoExecute (lost): the DRA driver taints the device NoExecute, so
	// that the pods using it are evicted (NoSchedule otherwise).
	NoExecute bool `json:"noExecute,omitempty"`
	// Trigger says when the fault starts.
	Trigger FaultTrigger `json:"trigger"`
}

// FaultTrigger says when a fault starts; exactly one field is set.
type FaultTrigger struct {
	// AtStart: from the start.
	AtStart bool `json:"atStart,omitempty"`
	// AfterPreparations: once a device was prepared this many times (its
	// next preparation sees the fault).
	AfterPreparations int `json:"afterPreparations,omitempty"`
	// After: this long after the start.
	After *Duration `json:"after,omitempty"`
	// Probability: at each preparation of a device, with this
	// probability (0 to 1) under the resource's faultSeed: a step fault
	// acts on that preparation only, a health fault starts for good.
	Probability float64 `json:"probability,omitempty"`
}

// set names the trigger's fields that are set.
func (t FaultTrigger) set() []string {
	var s []string
	if t.AtStart {
		s = append(s, "atStart")
	}
	if t.AfterPreparations != 0 {
		s = append(s, "afterPreparations")
	}
	if t.After != nil {
		s = append(s, "after")
	}
	if t.Probability != 0 {
		s = append(s, "probability")
	}
	return s
}

// AppliesTo reports whether the fault applies to device index.
func (f *Fault) AppliesTo(index int) bool {
	return len(f.Devices) == 0 || slices.Contains(f.Devices, index)
}

// validateFaults checks the faults of resource r.
func validateFaults(f func(string) string, r *Resource) error {
	if len(r.Faults) == 0 {
		return nil
	}
	if !r.Simulated() {
		return fieldErr(f("faults"), string(r.Faults[0].Kind), "faults apply to simulated devices (count); a host device fails for real")
	}
	var steps []StepType
	if r.Prestart != nil {
		for _, s := range r.Prestart.Steps {
			steps = append(steps, s.Type)
		}
	}
	for j := range r.Faults {
		field := func(name string) string { return f(fmt.Sprintf("faults[%d].%s", j, name)) }
		if err := ValidateFault(field, &r.Faults[j], r.DeviceCount(), steps, true); err != nil {
			return err
		}
	}
	return nil
}

// ValidateFault checks one fault of a resource of count devices whose
// preparation has steps; field names its fields. withTrigger: the fault
// needs a trigger (one of the configuration; one injected at run time
// starts at once and has none).
func ValidateFault(field func(string) string, ft *Fault, count int, steps []StepType, withTrigger bool) error {
	if err := oneOf(field("kind"), ft.Kind, FaultKinds...); err != nil {
		return err
	}
	for k, i := range ft.Devices {
		if i < 0 || i >= count {
			return fieldErr(field(fmt.Sprintf("devices[%d]", k)), strconv.Itoa(i), "must be a device index between 0 and count-1 (%d)", count-1)
		}
	}
	if err := validateFaultKind(field, ft, steps); err != nil {
		return err
	}
	if withTrigger {
		return validateTrigger(field, ft.Trigger)
	}
	if set := ft.Trigger.set(); len(set) > 0 {
		return fieldErr(field("trigger"), strings.Join(set, ","), "a fault injected at run time starts at once: no trigger")
	}
	return nil
}

// validateFaultKind checks that the fault has what its kind needs, and
// nothing another kind needs.
func validateFaultKind(field func(string) string, ft *Fault, steps []StepType) error {
	k := ft.Kind
	switch {
	case k == FaultUnhealthy && ft.Reason == "":
		return fieldErr(field("reason"), "", "an unhealthy fault needs a reason")
	case k != FaultUnhealthy && ft.Reason != "":
		return fieldErr(field("reason"), ft.Reason, "belongs to unhealthy faults")
	case k == FaultStepFails && ft.Message == "":
		return fieldErr(field("message"), "", "a stepFails fault needs a message")
	case k != FaultStepFails && ft.Message != "":
		return fieldErr(field("message"), ft.Message, "belongs to stepFails faults")
	case k == FaultSlowStep && ft.Delay.Duration <= 0:
		return fieldErr(field("delay"), ft.Delay.String(), "a slowStep fault needs a delay above 0")
	case k != FaultSlowStep && ft.Delay.Duration != 0:
		return fieldErr(field("delay"), ft.Delay.String(), "belongs to slowStep faults")
	case k == FaultFlapping && ft.Period.Duration <= 0:
		return fieldErr(field("period"), ft.Period.String(), "a flapping fault needs a period above 0")
	case k != FaultFlapping && ft.Period.Duration != 0:
		return fieldErr(field("period"), ft.Period.String(), "belongs to flapping faults")
	case k != FaultLost && ft.NoExecute:
		return fieldErr(field("noExecute"), "true", "belongs to lost faults")
	case !k.Steps() && ft.Step != "":
		return fieldErr(field("step"), string(ft.Step), "belongs to stepFails and slowStep faults")
	case k.Steps() && len(steps) == 0:
		return fieldErr(field("kind"), string(k), "acts on preparation steps, and the resource has none (prestart.steps)")
	case ft.Step != "" && !slices.Contains(steps, ft.Step):
		return fieldErr(field("step"), string(ft.Step), "the resource has no step of this type (prestart.steps)")
	}
	return nil
}

func validateTrigger(field func(string) string, t FaultTrigger) error {
	set := t.set()
	switch {
	case len(set) == 0:
		return fieldErr(field("trigger"), "", "needs one of atStart, afterPreparations, after, probability")
	case len(set) > 1:
		return fieldErr(field("trigger"), strings.Join(set, ","), "takes one of atStart, afterPreparations, after, probability")
	case t.AfterPreparations < 0:
		return fieldErr(field("trigger.afterPreparations"), strconv.Itoa(t.AfterPreparations), "must be 1 or more")
	case t.After != nil && t.After.Duration <= 0:
		return fieldErr(field("trigger.after"), t.After.String(), "must be above 0 (atStart for at once)")
	case t.Probability < 0 || t.Probability > 1:
		return fieldErr(field("trigger.probability"), strconv.FormatFloat(t.Probability, 'g', -1, 64), "must be between 0 and 1")
	}
	return nil
}
