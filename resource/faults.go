package resource

import (
	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/fault"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
)

// newInjector is the fault injector of resource rc, whose devices src
// has: its health faults reach them through the source as injected
// problems, apart from the real ones.
func newInjector(rc *config.Resource, src *device.Source, log *logrus.Entry, m *metrics.Metrics) *fault.Injector {
	var steps []config.StepType
	if rc.Prestart != nil {
		for _, s := range rc.Prestart.Steps {
			steps = append(steps, s.Type)
		}
	}
	return fault.New(fault.Options{Resource: rc.Name, Faults: rc.Faults, Seed: rc.FaultSeed, Count: rc.DeviceCount(), Steps: steps,
		Devices: func() []device.Device {
			if snap := src.Snapshot(); snap != nil {
				return snap.Devices
			}
			return nil
		},
		Apply: src.SetInjected, Log: log, Metrics: m})
}
