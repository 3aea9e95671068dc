package config

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// TestFaultErrors: a bad fault names its field and value.
func TestFaultErrors(t *testing.T) {
	const head = "resources:\n- name: example.com/a\n  count: 4\n  prestart: {steps: [{type: reset}]}\n  faults:\n"
	cases := []struct{ name, faults, field, value string }{
		{"kind", "  - {kind: melted, trigger: {atStart: true}}\n", "resources[0].faults[0].kind", "melted"},
		{"no trigger", "  - {kind: lost}\n", "resources[0].faults[0].trigger", ""},
		{"two triggers", "  - {kind: lost, trigger: {atStart: true, afterPreparations: 2}}\n", "resources[0].faults[0].trigger", "atStart,afterPreparations"},
		{"probability above 1", "  - {kind: stepFails, message: x, trigger: {probability: 1.5}}\n", "resources[0].faults[0].trigger.probability", "1.5"},
		{"negative preparations", "  - {kind: lost, trigger: {afterPreparations: -1}}\n", "resources[0].faults[0].trigger.afterPreparations", "-1"},
		{"negative after", "  - {kind: lost, trigger: {after: -1s}}\n", "resources[0].faults[0].trigger.after", "-1s"},
		{"device out of range", "  - {kind: lost, devices: [4], trigger: {atStart: true}}\n", "resources[0].faults[0].devices[0]", "4"},
		{"unhealthy without reason", "  - {kind: unhealthy, trigger: {atStart: true}}\n", "resources[0].faults[0].reason", ""},
		{"stepFails without message", "  - {kind: stepFails, trigger: {atStart: true}}\n", "resources[0].faults[0].message", ""},
		{"slowStep without delay", "  - {kind: slowStep, trigger: {atStart: true}}\n", "resources[0].faults[0].delay", "0s"},
		{"flapping without period", "  - {kind: flapping, trigger: {atStart: true}}\n", "resources[0].faults[0].period", "0s"},
		{"step not configured", "  - {kind: stepFails, message: x, step: reprogram, trigger: {atStart: true}}\n", "resources[0].faults[0].step", "reprogram"},
		{"noExecute on unhealthy", "  - {kind: unhealthy, reason: x, noExecute: true, trigger: {atStart: true}}\n", "resources[0].faults[0].noExecute", "true"},
		{"delay on lost", "  - {kind: lost, delay: 1s, trigger: {atStart: true}}\n", "resources[0].faults[0].delay", "1s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := envOf(map[string]string{"CONFIG_FILE": writeFile(t, head+c.faults)})
			_, err := Load(nil, env, io.Discard)
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("not a FieldError: %v", err)
			}
			if fe.Field != c.field || fe.Value != c.value {
				t.Errorf("field %q value %q, want %q %q (%v)", fe.Field, fe.Value, c.field, c.value, err)
			}
			if !strings.Contains(err.Error(), c.field) {
				t.Errorf("message %q does not name the field", err)
			}
		})
	}
}

// TestFaultsOnHostDevices: faults simulate failures of simulated devices
// only; a host device fails for real.
func TestFaultsOnHostDevices(t *testing.T) {
	env := envOf(map[string]string{"CONFIG_FILE": writeFile(t, "resources:\n- name: example.com/a\n  hostDevices: [fuse]\n  faults: [{kind: lost, trigger: {atStart: true}}]\n")})
	_, err := Load(nil, env, io.Discard)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "resources[0].faults" {
		t.Fatalf("got %v, want an error of resources[0].faults", err)
	}
}

// TestFaultsParsed: every kind and trigger reads as written.
func TestFaultsParsed(t *testing.T) {
	env := envOf(map[string]string{"CONFIG_FILE": writeFile(t, `resources:
- name: example.com/a
  count: 4
  faultSeed: 7
  prestart: {steps: [{type: reset}, {type: reprogram}]}
  faults:
  - {kind: lost, devices: [1], noExecute: true, trigger: {atStart: true}}
  - {kind: unhealthy, reason: ECC error, trigger: {afterPreparations: 3}}
  - {kind: stepFails, message: bus error, step: reprogram, trigger: {probability: 0.01}}
  - {kind: slowStep, delay: 20s, trigger: {after: 1m}}
  - {kind: flapping, period: 30s, devices: [0, 2], trigger: {atStart: true}}
`)})
	cfg, err := Load(nil, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Resources[0]
	if r.FaultSeed != 7 || len(r.Faults) != 5 {
		t.Fatalf("seed %d, %d faults", r.FaultSeed, len(r.Faults))
	}
	f := r.Faults
	if f[0].Kind != FaultLost || !f[0].NoExecute || !f[0].Trigger.AtStart || len(f[0].Devices) != 1 {
		t.Errorf("lost: %+v", f[0])
	}
	if f[1].Reason != "ECC error" || f[1].Trigger.AfterPreparations != 3 {
		t.Errorf("unhealthy: %+v", f[1])
	}
	if f[2].Step != StepReprogram || f[2].Trigger.Probability != 0.01 {
		t.Errorf("stepFails: %+v", f[2])
	}
	if f[3].Delay.Duration != 20*time.Second || f[3].Trigger.After == nil || f[3].Trigger.After.Duration != time.Minute {
		t.Errorf("slowStep: %+v", f[3])
	}
	if f[4].Period.Duration != 30*time.Second || !f[4].AppliesTo(2) || f[4].AppliesTo(1) || !f[1].AppliesTo(3) {
		t.Errorf("flapping: %+v", f[4])
	}
}

// TestFaultControlFlag: the fault control is off unless --fault-control
// or FAULT_CONTROL enables it, in both binaries; a bad value names the flag.
func TestFaultControlFlag(t *testing.T) {
	for _, cmd := range []Command{DevicePlugin, DRADriver} {
		env := map[string]string{"NODE_NAME": "n1"}
		cfg, err := LoadWith(cmd, nil, envOf(env), io.Discard)
		if err != nil || cfg.FaultControl {
			t.Fatalf("%s by default: %v, on %v", cmd, err, cfg != nil && cfg.FaultControl)
		}
		cfg, err = LoadWith(cmd, []string{"--fault-control=true"}, envOf(env), io.Discard)
		if err != nil || !cfg.FaultControl {
			t.Fatalf("%s --fault-control=true: %v", cmd, err)
		}
		env["FAULT_CONTROL"] = "true"
		if cfg, err = LoadWith(cmd, nil, envOf(env), io.Discard); err != nil || !cfg.FaultControl {
			t.Fatalf("%s FAULT_CONTROL=true: %v", cmd, err)
		}
		env["FAULT_CONTROL"] = "sometimes"
		_, err = LoadWith(cmd, nil, envOf(env), io.Discard)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "fault-control" || fe.Value != "sometimes" {
			t.Fatalf("%s FAULT_CONTROL=sometimes: %v", cmd, err)
		}
	}
}
