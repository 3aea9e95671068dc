package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/podresources"
	"github.com/cdi-device-plugin/cdi-device-plugin/resource"
)

// Driver is the DRA kubelet plugin of the configured resources. It
// composes its parts and serves the kubelet: the devices (devices.go),
// the preparer of claims (prepare.go, unprepare.go) with the claim
// checkpoint and shares (checkpoint.go, shares.go), the claims' CDI specs
// (claimspecs.go) and device metadata (metadata.go), the status writer
// (status.go), the PodResources view (podresources.go), the slice loop
// (loop.go) with the slice publisher (publisher.go) and the first look
// (firstlook.go), the handover guard (handover.go) and the health stream
// (health.go), and the stale-claim cleaner (cleanup.go). No part calls
// back into the Driver.
type Driver struct {
	opts Options
	log  *logrus.Entry

	devs     *devices
	prep     *preparer
	specs    *claimSpecs
	metadata *metadataFiles
	status   *statusQueue
	guard    *handoverGuard
	slices   *slicePublisher
	health   *healthStream
	loop     *sliceLoop
	// podres is the client of the kubelet's PodResources (Prepare,
	// Unprepare and the handover poll), closed when Run ends.
	podres *podresources.Client
	// helper is the kubeletplugin helper, once Run started it.
	helper atomic.Pointer[kubeletplugin.Helper]
	// registered: the kubelet said it registered the driver (intercept;
	// the helper's RegistrationStatus is not safe to read while the
	// kubelet notifies it).
	registered atomic.Bool
	// firstRegistered is closed the first time registered is set.
	firstRegistered chan struct{}
	regOnce         sync.Once
}

// ErrOptions is returned by New for options it cannot run with.
var ErrOptions = errors.New("DRA driver options")

// New checks the options and returns the driver; it touches nothing on
// disk. The checkpoint, loaded already, is taken over by the driver's name
// (Checkpoint.Adopt): one holding claims prepared under another name is
// refused with ErrOtherDriver.
func New(o Options) (*Driver, error) {
	if err := CheckDriverName("driver-name", o.DriverName); err != nil {
		return nil, err
	}
	if o.NodeName == "" || o.Client == nil || o.Writer == nil || o.Checkpoint == nil {
		return nil, fmt.Errorf("%w: a node name, a client, a CDI writer and a checkpoint are needed", ErrOptions)
	}
	for _, r := range o.Resources {
		if r.PrepareBeforeBind && o.NoDeviceStatus {
			return nil, fmt.Errorf("%w: resource %s prepares before binding (prepareBeforeBind), which writes the claims' status.devices: "+
				"it cannot run with --device-status=false", ErrOptions, r.Name)
		}
	}
	if err := o.Checkpoint.Adopt(o.DriverName); err != nil {
		return nil, err
	}
	k, err := cdi.ClaimKind(o.DriverName)
	if err != nil {
		return nil, fmt.Errorf("%w: driver name %q gives no CDI kind: %w", ErrOptions, o.DriverName, err)
	}
	o.setDefaults()
	d := &Driver{opts: o, log: o.Log.WithField("driver", o.DriverName), podres: podresources.New(o.PodResources),
		firstRegistered: make(chan struct{})}
	d.health = newHealthStream(o.HealthResend)
	m := o.Metrics.DRA()
	d.slices = &slicePublisher{driver: o.DriverName, node: o.NodeName, client: o.Client, log: d.log, co: newCoalescer(o.Clock, o.PublishInterval), metrics: m,
		first: make(chan struct{})}
	d.devs = &devices{node: o.NodeName}
	changed := make(chan struct{}, 1)
	d.status = newStatusQueue(o.DriverName, o.StatusClient, d.devs, o.NoDeviceStatus, d.log)
	d.status.metrics = m
	for _, rc := range o.Resources {
		r := &running{Resource: rc, changed: changed, pool: PoolName(o.NodeName, rc.IDPrefix)}
		if err := checkPoolName(r.pool); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrOptions, rc.Name, err)
		}
		log := d.log.WithField("resource", rc.Name)
		r.follower = &resource.Follower{Resource: rc.Name, Source: rc.Source, Spec: rc.Spec, Publish: r, Log: log, Metrics: o.Metrics}
		if sha, err := rc.Runner.FirmwareSHA256(); err != nil {
			log.WithError(err).Warn("cannot tell the reprogram image's digest; the devices are published without firmwareSHA256")
		} else {
			r.firmware = sha
		}
		d.devs.res = append(d.devs.res, r)
	}
	d.specs = &claimSpecs{writer: o.Writer, kind: k, devs: d.devs, log: d.log}
	d.metadata = &metadataFiles{enabled: o.DeviceMetadata, driver: o.DriverName, pluginDir: o.PluginDir,
		cdiDir: filepath.Dir(o.Writer.Path(k)), devs: d.devs}
	holders := &holdersView{client: d.podres, checkpoint: o.Checkpoint, boot: o.BootID}
	d.prep = &preparer{driver: o.DriverName, boot: o.BootID, devs: d.devs, checkpoint: o.Checkpoint, specs: d.specs, metrics: m,
		serializeLock: rollingLock(o),
		metadata:      d.metadata, status: d.status, holders: holders, log: d.log}
	d.guard = newHandoverGuard(d.devs.names(), o.NodeName, o.Client, holders.heldNow, d.log)
	d.loop = newSliceLoop(o.DriverName, o.NodeName, d.devs, changed, d.guard, d.slices, d.health, o.PollInterval)
	d.loop.metrics = m
	d.loop.firstHold = o.FirstPublishHold
	return d, nil
}

// Run writes the resources' specs, registers with the kubelet and serves
// it, publishes the devices in ResourceSlices and keeps them and their
// health in step until ctx is done, drops the checkpointed claims gone
// from the API (cleanup) and writes the prepared claims' status.devices
// (status.go); every goroutine it started has ended when it returns. Specs, claim specs and the checkpoint are kept.
func (d *Driver) Run(ctx context.Context) error {
	ctx = klog.NewContext(ctx, Logger(d.log))
	// What the first publish needs from the API and PodResources is asked
	// for now, beside the start below (firstlook.go).
	look := startFirstLook(ctx, d.guard, d.opts.Client, d.opts.DriverName, d.opts.NodeName, d.log)
	defer func() {
		look.stop()
		_ = d.podres.Close()
	}()
	if err := checkNotLost(ctx, d.opts.Checkpoint, d.specs, d.metadata, d.podres, d.opts.NodeName, d.log); err != nil {
		return err
	}
	// Spec first, then the devices are published.
	for _, r := range d.devs.res {
		if err := r.follower.Start(); err != nil {
			return fmt.Errorf("%s: %w", r.Name, err)
		}
	}
	d.specs.restore(d.opts.Checkpoint)
	for _, dir := range []string{d.opts.RegistrarDir, d.opts.PluginDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("kubelet plugin directory: %w", err)
		}
	}
	if d.opts.RollingUpdateUID != "" {
		for _, p := range removeDeadSockets(d.opts.RegistrarDir, d.opts.PluginDir, d.opts.DriverName) {
			d.log.WithField("socket", p).Info("removed the socket of an instance of the driver that is gone")
		}
	}
	helper, err := kubeletplugin.Start(ctx, d, append([]kubeletplugin.Option{
		kubeletplugin.DriverName(d.opts.DriverName),
		kubeletplugin.NodeName(d.opts.NodeName),
		kubeletplugin.KubeClient(d.opts.Client),
		kubeletplugin.RegistrarDirectoryPath(d.opts.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(d.opts.PluginDir),
		kubeletplugin.RollingUpdate(d.opts.RollingUpdateUID),
		kubeletplugin.GRPCInterceptor(d.intercept),
	}, d.metadata.options()...)...)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	d.helper.Store(helper)
	d.log.WithField("registrar", d.opts.RegistrarDir).WithField("plugin dir", d.opts.PluginDir).Info("serving the kubelet")
	g, gctx := errgroup.WithContext(ctx)
	for _, r := range d.devs.res {
		g.Go(func() error { return r.follower.Run(gctx) })
		g.Go(func() error { return r.Runner.Run(gctx) })
		if r.Faults != nil {
			g.Go(func() error { return r.Faults.Run(gctx) })
		}
	}
	g.Go(func() error { return d.guard.watchNode(gctx) })
	// The clean-up starts once the driver serves: its first pass reads
	// every checkpointed claim, which must not delay the first publish or
	// the registration.
	ready := make(chan struct{})
	g.Go(func() error { return d.closeWhenReady(gctx, ready) })
	cleaner := &staleCleaner{claims: d.opts.Checkpoint.Claims, api: d.opts.CleanupClient, clock: d.opts.Clock,
		interval: d.opts.CleanupInterval, grace: d.opts.CleanupGrace, log: d.log, drop: d.prep.dropStale, ready: ready,
		firstDelay: spreadDelay(d.opts.CleanupSpread)}
	g.Go(func() error { return cleaner.run(gctx) })
	g.Go(func() error { return d.status.run(gctx) })
	if slices.ContainsFunc(d.opts.Resources, func(r Resource) bool { return r.PrepareBeforeBind }) {
		b := &prebinder{driver: d.opts.DriverName, node: d.opts.NodeName, client: d.opts.Client, prep: d.prep, log: d.log.WithField("part", "prepare before bind")}
		g.Go(func() error { return b.run(gctx) })
	}
	g.Go(func() error { return d.loop.run(gctx, helper, look) })
	err = g.Wait()
	helper.Stop() // its slice controller too: nothing publishes after this
	if d.opts.RollingUpdateUID != "" && otherInstanceServes(d.opts.RegistrarDir, d.opts.DriverName, d.opts.RollingUpdateUID) {
		// A rollout: the new instance serves the devices, and taints
		// them itself when it stops.
		d.log.Info("stopping: another instance of the driver serves the node; its devices are left as they are")
	} else {
		d.slices.taintOnStop()
	}
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// Stopped while starting (the slice informer not yet synced,
		// say): a shutdown, not a failure.
		return nil
	}
	return err
}

// PrepareResourceClaims prepares the devices of the claims of one kubelet
// call, all or none (preparer.prepareClaims).
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	return d.prep.prepareClaims(ctx, claims)
}

// UnprepareResourceClaims undoes Prepare for each claim
// (preparer.unprepareClaims).
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	return d.prep.unprepareClaims(ctx, claims)
}

// WatchHealthStatus streams the devices' health to the kubelet
// (healthStream.watch) until ctx is done.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return d.health.watch(ctx, reports)
}

// HandleError is called by the helper for errors in the background
// (publishing slices, gRPC servers): logged, and a fatal one ends Run.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.log.WithError(err).Warn(msg)
		return
	}
	d.log.WithError(err).Error(msg)
	d.loop.fail(fmt.Errorf("%s: %w", msg, err))
}

// Alive reports whether the driver's loops (the slice loop, every
// resource's spec loop) answer within ctx.
func (d *Driver) Alive(ctx context.Context) error {
	if err := d.loop.alive(ctx); err != nil {
		return err
	}
	for _, r := range d.devs.res {
		if err := r.follower.Alive(ctx); err != nil {
			return fmt.Errorf("%s: %w", r.Name, err)
		}
	}
	return nil
}

// intercept is the helper's gRPC interceptor, on its registration and
// DRA servers alike: it records the kubelet's registration status, and
// hands the DRA calls to the PodResources view's (holdersView.intercept).
func (d *Driver) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if st, ok := req.(*registerapi.RegistrationStatus); ok {
		resp, err := handler(ctx, req)
		ok := err == nil && st.PluginRegistered
		d.registered.Store(ok)
		if ok {
			d.regOnce.Do(func() { close(d.firstRegistered) })
		}
		return resp, err
	}
	return d.prep.holders.intercept(ctx, req, info, handler)
}

// closeWhenReady closes ready once the kubelet first registered the
// driver and its devices were first handed to the ResourceSlice
// controller, or returns when ctx is done. It waits on both, not on a
// timer: a start on a loaded node, a rollout's, takes seconds, and a
// process woken every few milliseconds meanwhile spends CPU the other
// starts need.
func (d *Driver) closeWhenReady(ctx context.Context, ready chan<- struct{}) error {
	for _, c := range []<-chan struct{}{d.firstRegistered, d.slices.first} {
		select {
		case <-ctx.Done():
			return nil
		case <-c:
		}
	}
	close(ready)
	return nil
}

// Ready reports whether the kubelet registered the driver and its devices
// were handed to the ResourceSlice controller.
func (d *Driver) Ready() error {
	h := d.helper.Load()
	if h == nil {
		return errors.New("not serving the kubelet yet")
	}
	if !d.registered.Load() {
		return errors.New("not registered with the kubelet")
	}
	if !d.slices.published() {
		return errors.New("no ResourceSlice published yet")
	}
	return nil
}
