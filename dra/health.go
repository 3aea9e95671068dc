package dra

import (
	"context"
	"reflect"
	"sync/atomic"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// healthView is the devices' health as last published, with a channel
// closed when a newer view replaces it.
type healthView struct {
	devices []kubeletplugin.DeviceHealth
	changed chan struct{}
}

// healthStream is the devices' health as the kubelet's health streams
// send it: the slice loop sets it, every stream (WatchHealthStatus) reads
// it and wakes when it changes.
type healthStream struct {
	// resend is how often a stream sends the health again when nothing
	// changed (Options.HealthResend).
	resend time.Duration
	view   atomic.Pointer[healthView]
}

func newHealthStream(resend time.Duration) *healthStream {
	h := &healthStream{resend: resend}
	h.view.Store(&healthView{changed: make(chan struct{})})
	return h
}

// deviceHealth is the health of the devices in cur (those the slices
// list) of the node.
func deviceHealth(node string, cur []Published) []kubeletplugin.DeviceHealth {
	var devs []kubeletplugin.DeviceHealth
	for _, p := range cur {
		if p.Snapshot == nil {
			continue
		}
		for _, dv := range p.Snapshot.Devices {
			if dv.Problem.Cause == device.CauseNotInSpec {
				continue // not in the slice
			}
			h := kubeletplugin.DeviceHealth{PoolName: PoolName(node, p.IDPrefix), DeviceName: DeviceName(p.IDPrefix, dv.Index), Health: kubeletplugin.HealthStatusHealthy}
			if !dv.Healthy {
				h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, dv.Problem.String()
			}
			devs = append(devs, h)
		}
	}
	return devs
}

// set publishes devs to the streams, when they changed.
func (h *healthStream) set(devs []kubeletplugin.DeviceHealth) {
	old := h.view.Load()
	if reflect.DeepEqual(old.devices, devs) {
		return
	}
	h.view.Store(&healthView{devices: devs, changed: make(chan struct{})})
	close(old.changed)
}

// watch sends the devices' health to reports: all of them at once, then
// again whenever one changes, and every resend when nothing does (the
// kubelet takes a health not refreshed within 30 s for unknown), until
// ctx is done.
func (h *healthStream) watch(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	resend := time.NewTimer(h.resend)
	defer resend.Stop()
	for {
		v := h.view.Load()
		now := time.Now()
		devs := make([]kubeletplugin.DeviceHealth, len(v.devices))
		for i, dh := range v.devices {
			dh.LastUpdated = now
			devs[i] = dh
		}
		select {
		case <-ctx.Done():
			return nil
		case reports <- kubeletplugin.DeviceHealthReport{Devices: devs}:
		}
		resend.Reset(h.resend)
		select {
		case <-ctx.Done():
			return nil
		case <-v.changed:
		case <-resend.C:
		}
	}
}
