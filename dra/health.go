package dra

import (
	"context"
	"reflect"
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

// setHealth publishes the health of the devices in cur (those the slices
// list) to the health streams, when it changed.
func (d *Driver) setHealth(cur []Published) {
	var devs []kubeletplugin.DeviceHealth
	for _, p := range cur {
		if p.Snapshot == nil {
			continue
		}
		for _, dv := range p.Snapshot.Devices {
			if dv.Problem.Cause == device.CauseNotInSpec {
				continue // not in the slice
			}
			h := kubeletplugin.DeviceHealth{PoolName: PoolName(d.opts.NodeName, p.IDPrefix), DeviceName: DeviceName(p.IDPrefix, dv.Index), Health: kubeletplugin.HealthStatusHealthy}
			if !dv.Healthy {
				h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, dv.Problem.String()
			}
			devs = append(devs, h)
		}
	}
	old := d.health.Load()
	if reflect.DeepEqual(old.devices, devs) {
		return
	}
	d.health.Store(&healthView{devices: devs, changed: make(chan struct{})})
	close(old.changed)
}

// WatchHealthStatus streams the devices' health to the kubelet: all of
// them at once, then again whenever one changes, and every HealthResend
// when nothing does (the kubelet takes a health not refreshed within 30 s
// for unknown), until ctx is done.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	resend := time.NewTimer(d.opts.HealthResend)
	defer resend.Stop()
	for {
		v := d.health.Load()
		now := time.Now()
		devs := make([]kubeletplugin.DeviceHealth, len(v.devices))
		for i, h := range v.devices {
			h.LastUpdated = now
			devs[i] = h
		}
		select {
		case <-ctx.Done():
			return nil
		case reports <- kubeletplugin.DeviceHealthReport{Devices: devs}:
		}
		resend.Reset(d.opts.HealthResend)
		select {
		case <-ctx.Done():
			return nil
		case <-v.changed:
		case <-resend.C:
		}
	}
}
