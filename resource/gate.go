package resource

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/ping"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
)

// DeviceSource publishes snapshots of a resource's devices (device.Source).
type DeviceSource interface {
	// Snapshot is the current snapshot (the source is prepared).
	Snapshot() *device.Snapshot
	// Run publishes snapshots on out until ctx is done.
	Run(ctx context.Context, out chan *device.Snapshot) error
}

// SpecFile is the CDI spec of a resource on disk (cdi.Spec).
type SpecFile interface {
	// Write writes the spec of snap; every path it names exists after.
	Write(snap *device.Snapshot) error
	// Check compares the file on disk with what was last written.
	Check() (cdi.Status, string)
	// Watch signals changed when the file may have changed.
	Watch(ctx context.Context, changed chan<- struct{}) error
}

// Publisher receives the snapshots the spec describes: every healthy
// device in them is described by the spec on disk (plugin.Plugin, the DRA
// driver). Update is called from one goroutine at a time, in order, and
// only when the snapshot changed.
type Publisher interface {
	Update(snap *device.Snapshot) error
}

// Default bounds of the backoff between failed spec writes.
const (
	DefaultRetryMin = 100 * time.Millisecond
	DefaultRetryMax = 30 * time.Second
	// DefaultYieldRecheck is how often a resource that yielded its spec to
	// a newer process checks whether that process is still there.
	DefaultYieldRecheck = 5 * time.Second
)

// Follower keeps the spec of one resource in step with its device source
// and publishes what the spec describes. Set the fields, then Start and
// Run; the fields are not changed after.
type Follower struct {
	// Resource names the resource in metrics.
	Resource string
	Source   DeviceSource
	Spec     SpecFile
	Publish  Publisher
	Log      *logrus.Entry
	// Metrics, when set, counts the spec writes.
	Metrics *metrics.Metrics
	// RetryMin and RetryMax bound the backoff between failed spec writes
	// (defaults DefaultRetryMin, DefaultRetryMax).
	RetryMin, RetryMax time.Duration
	// YieldRecheck (default DefaultYieldRecheck) is how often the spec is
	// checked while a newer process owns it: once nobody has served that
	// process's socket for this long, the spec is taken back.
	YieldRecheck time.Duration

	once  sync.Once
	pings chan chan struct{} // answered by the loop
	st    *state
}

func (fl *Follower) init() {
	fl.once.Do(func() {
		fl.pings = make(chan chan struct{})
		if fl.Log == nil {
			fl.Log = logs.Discard()
		}
	})
}

// Alive reports whether the loop that keeps the spec in step answers
// within ctx.
func (fl *Follower) Alive(ctx context.Context) error {
	fl.init()
	return ping.Ask(ctx, fl.pings, "the spec loop")
}

// Start writes the spec of the current devices and publishes them: the
// spec first, then the publisher hears of the devices. Call it once,
// before Run.
func (fl *Follower) Start() error {
	fl.init()
	f := &state{fl: fl, retryMin: fl.RetryMin, retryMax: fl.RetryMax, retry: time.NewTimer(0),
		recheck: time.NewTimer(0), recheckEvery: fl.YieldRecheck}
	f.retry.Stop()
	f.recheck.Stop()
	if f.recheckEvery <= 0 {
		f.recheckEvery = DefaultYieldRecheck
	}
	if f.retryMin <= 0 {
		f.retryMin = DefaultRetryMin
	}
	if f.retryMax < f.retryMin {
		f.retryMax = max(DefaultRetryMax, f.retryMin)
	}
	f.backoff = f.retryMin
	fl.st = f
	f.pending = fl.Source.Snapshot()
	f.write()
	return f.publish()
}

// Run runs the device source, the spec's watch and the loop that keeps
// them in step until ctx is done or one fails; all have returned when Run
// returns. Start must have returned without an error.
func (fl *Follower) Run(ctx context.Context) error {
	f := fl.st
	defer f.retry.Stop()
	defer f.recheck.Stop()
	updates := make(chan *device.Snapshot, 1)
	changed := make(chan struct{}, 1)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return fl.Source.Run(ctx, updates) })
	g.Go(func() error { return fl.Spec.Watch(ctx, changed) })
	g.Go(func() error { return f.loop(ctx, updates, changed) })
	return g.Wait()
}

// state is the follower's state, owned by the goroutine running loop
// (Start's, before).
type state struct {
	fl *Follower
	// pending is the latest snapshot, written what the spec on disk
	// describes (nil: nothing known), published what the publisher has.
	pending, written, published *device.Snapshot
	// why pending is not written: the last write's error, or the spec
	// yielded to another process.
	why device.Problem
	// yielded: a newer process owns the spec file; do not write it.
	yielded bool
	// orphanedSince: when the newer process was first found gone (zero:
	// it was not); the spec is taken back once it has stayed gone for
	// recheckEvery. recheck looks again while yielded.
	orphanedSince time.Time
	recheck       *time.Timer
	recheckEvery  time.Duration

	retry              *time.Timer
	backoff            time.Duration
	retryMin, retryMax time.Duration
}

func (f *state) loop(ctx context.Context, updates <-chan *device.Snapshot, changed <-chan struct{}) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case snap := <-updates:
			f.pending = snap
			if !device.SameDevices(f.written, snap) {
				f.write()
			}
		case <-changed:
			f.check()
		case <-f.recheck.C:
			f.check()
		case <-f.retry.C:
			f.write()
		case reply := <-f.fl.pings:
			close(reply)
			continue
		}
		if err := f.publish(); err != nil {
			return err
		}
	}
}

// check looks at the spec on disk after a change there, and while a newer
// process owns it: ours is left alone, a missing or changed one is written
// again at once, a newer process's one is left to it (and our devices are
// held back) for as long as that process serves its socket. Once nobody
// has served it for recheckEvery (two looks, so that a process just
// starting, or serving its socket again after a kubelet restart, is not
// taken for gone), the spec is taken back.
func (f *state) check() {
	st, why := f.fl.Spec.Check()
	log := f.fl.Log.WithField("reason", why)
	if st != cdi.Orphaned {
		f.orphanedSince = time.Time{}
	}
	switch st {
	case cdi.Intact:
		return
	case cdi.Orphaned:
		if f.orphanedSince.IsZero() {
			f.orphanedSince = time.Now()
		}
		if !f.yielded || time.Since(f.orphanedSince) < f.recheckEvery {
			break // look again before taking it back
		}
		log.Warn("the process that took our CDI spec over is gone; taking it back")
		f.orphanedSince = time.Time{}
		f.recheck.Stop()
		f.yielded, f.written = false, nil
		f.write()
		return
	case cdi.Superseded:
	default:
		log.WithField("status", st.String()).Warn("our CDI spec was changed by someone else; writing it again")
		f.recheck.Stop()
		f.yielded, f.written = false, nil
		f.write()
		return
	}
	if !f.yielded {
		log.Error("another process owns our CDI spec now; its devices are reported unhealthy here")
	}
	f.yielded, f.written = true, nil
	f.why = device.Problem{Cause: device.CauseYielded, Message: "the CDI spec was taken over: " + why}
	f.retry.Stop()
	f.recheck.Reset(f.recheckEvery)
}

// write writes the spec of pending; on failure it retries later, with a
// backoff.
func (f *state) write() {
	if f.yielded {
		return
	}
	err := f.fl.Spec.Write(f.pending)
	f.fl.Metrics.SpecWritten(f.fl.Resource, err)
	if err != nil {
		f.fl.Log.WithError(err).WithField("retry in", f.backoff).
			Error("writing the CDI spec failed; the devices it does not describe are reported unhealthy until it works")
		f.why = device.Problem{Cause: device.CauseNotInSpec, Message: "writing the CDI spec failed: " + err.Error()}
		f.retry.Reset(f.backoff)
		f.backoff = min(2*f.backoff, f.retryMax)
		return
	}
	if !f.why.None() {
		f.fl.Log.Info("CDI spec written after failures")
	}
	f.fl.Log.WithField("devices", len(f.pending.Devices)).Debug("CDI spec written")
	f.written, f.why = f.pending, device.Problem{}
	f.backoff = f.retryMin
	f.retry.Stop()
}

// publish hands the publisher what the spec describes, when that changed.
func (f *state) publish() error {
	g := Gate(f.pending, f.written, f.why)
	if f.published != nil && device.Equal(g, f.published) {
		return nil
	}
	f.published = g
	return f.fl.Publish.Update(g)
}

// Gate returns snap with every healthy device that written does not
// describe (as it is in snap) reported unhealthy, for the reason why (none:
// the spec is not written yet).
func Gate(snap, written *device.Snapshot, why device.Problem) *device.Snapshot {
	if snap == written || (written != nil && device.SameDevices(snap, written)) {
		// Every device is described as it is (health aside).
		return snap
	}
	described := map[string]device.Device{}
	if written != nil {
		for _, d := range written.Devices {
			described[d.Name] = d
		}
	}
	var out *device.Snapshot
	for i, d := range snap.Devices {
		if w, ok := described[d.Name]; !d.Healthy || (ok && device.SameDevice(w, d)) {
			continue
		}
		if out == nil {
			out = &device.Snapshot{Replicas: snap.Replicas, Devices: slices.Clone(snap.Devices)}
		}
		p := why
		if p.None() {
			p = device.Problem{Cause: device.CauseNotInSpec, Message: "not in the CDI spec yet"}
		}
		out.Devices[i].SetProblem(p)
	}
	if out == nil {
		return snap
	}
	return out
}
