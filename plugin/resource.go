package plugin

import (
	"context"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"

	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
	"github.com/cdi-device-plugin/cdi-device-plugin/resource"
)

// DeviceSource publishes snapshots of a resource's devices (device.Source).
type DeviceSource = resource.DeviceSource

// SpecFile is the CDI spec of a resource on disk (cdi.Spec).
type SpecFile = resource.SpecFile

// Background is a part that runs beside the resource until ctx is done
// (prestart.Runner's recovery).
type Background interface {
	Run(ctx context.Context) error
}

// Default bounds of the backoff between failed spec writes, and of the
// recheck of a spec a newer process took over (see resource.Follower).
const (
	DefaultRetryMin     = resource.DefaultRetryMin
	DefaultRetryMax     = resource.DefaultRetryMax
	DefaultYieldRecheck = resource.DefaultYieldRecheck
)

// Resource runs one resource: the device source, the CDI spec kept in step
// with the device set, and the plugin server. It enforces the invariant
// the kubelet relies on: a device is advertised Healthy only when the spec
// on disk describes it, so every CDI name Allocate hands out resolves.
type Resource struct {
	Source DeviceSource
	Spec   SpecFile
	Plugin *Plugin
	// Recovery, optional, runs beside the others.
	Recovery Background
	// Faults, optional, injects faults as time passes (fault.Injector),
	// beside the others.
	Faults Background
	// Claims, optional, reports Unhealthy the devices DRA claims hold: it
	// asks before the first publication, then runs beside the others;
	// until PodResources has answered once, no device is advertised
	// Healthy (ClaimGuard).
	Claims *ClaimGuard
	Log    *logrus.Entry
	// Metrics, when set, counts the spec writes.
	Metrics *metrics.Metrics
	// RetryMin and RetryMax bound the backoff between failed spec writes
	// (defaults DefaultRetryMin, DefaultRetryMax).
	RetryMin, RetryMax time.Duration
	// YieldRecheck (default DefaultYieldRecheck) is how often the spec is
	// checked while a newer process owns it: once nobody has served that
	// process's socket for this long, the spec is taken back.
	YieldRecheck time.Duration

	once     sync.Once
	follower *resource.Follower
}

// init makes the follower that keeps the spec in step and publishes to
// the plugin (resource.Follower).
func (r *Resource) init() {
	r.once.Do(func() {
		src := r.Source
		if r.Claims != nil {
			// What the plugin advertises goes through the guard.
			src = r.Claims.gate(src)
		}
		r.follower = &resource.Follower{Resource: r.Plugin.opts.ResourceName, Source: src, Spec: r.Spec, Publish: r.Plugin,
			Log: r.Log, Metrics: r.Metrics, RetryMin: r.RetryMin, RetryMax: r.RetryMax, YieldRecheck: r.YieldRecheck}
	})
}

// Alive reports whether the resource's loops (the one that keeps the spec
// in step, the plugin's registration loop) answer within ctx.
func (r *Resource) Alive(ctx context.Context) error {
	r.init()
	if err := r.follower.Alive(ctx); err != nil {
		return err
	}
	return r.Plugin.Alive(ctx)
}

// Ready reports whether the kubelet uses the resource's plugin.
func (r *Resource) Ready() error { return r.Plugin.Ready() }

// Run writes the spec of the current devices and publishes them, then runs
// every part until ctx is done or one fails; every part has returned when
// Run returns.
func (r *Resource) Run(ctx context.Context) error {
	r.init()
	// The devices DRA claims hold are known before anything is published.
	if r.Claims != nil {
		r.Claims.Start(ctx)
	}
	// Spec first, then the kubelet hears of the devices.
	if err := r.follower.Start(); err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.follower.Run(ctx) })
	g.Go(func() error { return r.Plugin.Run(ctx) })
	if r.Recovery != nil {
		g.Go(func() error { return r.Recovery.Run(ctx) })
	}
	if r.Faults != nil {
		g.Go(func() error { return r.Faults.Run(ctx) })
	}
	if r.Claims != nil {
		g.Go(func() error { return r.Claims.Run(ctx) })
	}
	return g.Wait()
}
