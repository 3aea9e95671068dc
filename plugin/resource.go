package plugin

import (
	"context"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// DeviceSource publishes snapshots of a resource's devices on out until
// ctx is done (device.Source).
type DeviceSource interface {
	Run(ctx context.Context, out chan *device.Snapshot) error
}

// SpecWriter writes the CDI spec for a device set (cdi.Writer).
type SpecWriter interface {
	Write(snap *device.Snapshot) error
}

// SpecWriterFunc adapts a function to SpecWriter.
type SpecWriterFunc func(*device.Snapshot) error

// Write calls f.
func (f SpecWriterFunc) Write(s *device.Snapshot) error { return f(s) }

// Resource runs one resource: the device source, the CDI spec kept in step
// with the device set, and the plugin server.
type Resource struct {
	Source DeviceSource
	Spec   SpecWriter
	Plugin *Plugin
	// Written is the snapshot whose device set the spec on disk describes.
	Written *device.Snapshot
	Log     *logrus.Entry
}

// Run runs until ctx is done or a part fails; every part is stopped before
// it returns.
func (r *Resource) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	updates := make(chan *device.Snapshot, 1)
	errc := make(chan error, 3)
	go func() { errc <- r.Source.Run(ctx, updates) }()
	go func() { errc <- r.Plugin.Run(ctx) }()
	go func() { errc <- r.follow(ctx, updates) }()
	var first error
	for i := 0; i < 3; i++ {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
		cancel()
	}
	return first
}

// follow applies snapshots: the spec is rewritten only when the device set
// changed (before the kubelet hears of the new devices), health changes go
// straight to the plugin.
func (r *Resource) follow(ctx context.Context, updates <-chan *device.Snapshot) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case snap := <-updates:
			if !device.SameDevices(r.Written, snap) {
				if err := r.Spec.Write(snap); err != nil {
					r.Log.WithError(err).Error("writing the CDI spec failed; the previous spec stays")
				} else {
					r.Written = snap
					r.Log.WithField("devices", len(snap.Devices)).Info("CDI spec updated")
				}
			}
			if err := r.Plugin.Update(snap); err != nil {
				return err
			}
		}
	}
}
