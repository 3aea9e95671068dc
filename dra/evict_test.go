package dra

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// TestUnhealthyTaintEffect: an unhealthy device is tainted NoSchedule,
// NoExecute when its problem asks for eviction (an injected lost fault
// with noExecute), so that the eviction controller evicts its pods; the
// value is the cause either way.
func TestUnhealthyTaintEffect(t *testing.T) {
	k := kindOf(t, "example.com", "sim")
	for _, c := range []struct {
		p    device.Problem
		want resourceapi.DeviceTaintEffect
	}{
		{device.Problem{Cause: device.CauseMissing}, resourceapi.DeviceTaintEffectNoSchedule},
		{device.Problem{Cause: device.CauseMissing, Message: "injected fault: lost", Evict: true}, resourceapi.DeviceTaintEffectNoExecute},
		{device.Problem{Cause: device.CauseInjected, Message: "ECC error"}, resourceapi.DeviceTaintEffectNoSchedule},
	} {
		d := simDevices(1, "n1").Devices[0]
		d.SetProblem(c.p)
		got := Device(testDriver, Published{Resource: "example.com/sim", Kind: k, IDPrefix: "sim"}, d)
		if len(got.Taints) != 1 || got.Taints[0].Effect != c.want || got.Taints[0].Value != c.p.Cause.String() || got.Taints[0].Key != testDriver+"/"+TaintUnhealthy {
			t.Errorf("%+v: taints %+v, want one %s", c.p, got.Taints, c.want)
		}
	}
}
