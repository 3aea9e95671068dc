package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
	"github.com/cdi-device-plugin/cdi-device-plugin/podresources"
	"github.com/cdi-device-plugin/cdi-device-plugin/resource"
)

// Defaults of Options.
const (
	// DefaultPollInterval is how often the kubelet's PodResources is asked
	// while a handover guard is up.
	DefaultPollInterval = 2 * time.Second
	// DefaultHealthResend is how often the device health is sent to the
	// kubelet when nothing changed: within the kubelet's 30 s, after which
	// it takes the health for unknown.
	DefaultHealthResend = 10 * time.Second
	// DefaultCleanupInterval is how often the checkpointed claims are
	// looked up in the API (see Options.CleanupGrace).
	DefaultCleanupInterval = time.Minute
	// DefaultCleanupGrace is how long a checkpointed claim must be gone
	// from the API before it is dropped and its devices released.
	DefaultCleanupGrace = 5 * time.Minute
)

// Runner prepares and resets devices (prestart.Runner), and recovers
// failed ones in the background (Run).
type Runner interface {
	Prepare(ctx context.Context, devs []device.Device) error
	Reset(ctx context.Context, devs []device.Device) error
	HasReset() bool
	FirmwareSHA256() (string, error)
	Run(ctx context.Context) error
}

// Resource is one configured resource as the driver serves it: the same
// device source, spec and prestart runner as the device plugin's (see
// resource.Build).
type Resource struct {
	// Name is the extended resource name, Kind the CDI kind of its devices.
	Name string
	Kind cdi.Kind
	// IDPrefix names its devices in the slice (DeviceName).
	IDPrefix string
	// EnvPrefix, when set, gives a claim's containers
	// <EnvPrefix>_DEVICES=<the claim's device IDs of the resource>.
	EnvPrefix string
	// Mounts are given to a claim's containers.
	Mounts []cdi.Mount
	Source resource.DeviceSource
	Spec   resource.SpecFile
	Runner Runner

	// Replicas, above 1, makes each device shareable by that many claims
	// at once (Published.Shares; see shares.go).
	Replicas int
}

// Options configure the driver.
type Options struct {
	// DriverName names the driver (CheckDriverName); NodeName the node,
	// which starts the name of every resource's pool (PoolName).
	DriverName, NodeName string
	Client               kubernetes.Interface
	// StatusClient (default Client) writes the claims' status.devices
	// (status.go). Give it a client of its own: a client's requests share
	// one client-side rate limit, and the status writes must not hold up
	// the kubelet plugin helper's reads of the claims it is asked to
	// prepare.
	StatusClient kubernetes.Interface
	// RegistrarDir is the kubelet's plugin registry directory, PluginDir
	// the driver's own directory (dra.sock).
	RegistrarDir, PluginDir string
	// Writer writes the per-claim specs.
	Writer     *cdi.Writer
	Checkpoint *Checkpoint
	// PodResources is the kubelet's PodResources socket.
	PodResources string
	// BootID is the kernel's boot ID: a claim prepared in another boot is
	// prepared again.
	BootID    string
	Resources []Resource
	Log       *logrus.Entry
	// Metrics, when set, counts the spec writes.
	Metrics *metrics.Metrics
	// PollInterval (default DefaultPollInterval), HealthResend (default
	// DefaultHealthResend).
	PollInterval, HealthResend time.Duration
	// PublishInterval (default DefaultPublishInterval) is the least time
	// between two ResourceSlice publishes after the first (coalescer).
	PublishInterval time.Duration
	// CleanupInterval (default DefaultCleanupInterval) is how often the
	// checkpointed claims are looked up in the API; a claim gone (not
	// found, or its name taken by another UID) for CleanupGrace (default
	// DefaultCleanupGrace) is dropped and its devices released, as
	// Unprepare would. Clock (default the real one) times both.
	CleanupInterval, CleanupGrace time.Duration
	Clock                         clock.WithTicker
	// NoDeviceStatus: the claims' status.devices is not written
	// (--device-status=false): one API write less per prepared claim,
	// which a large fleet's API server may want more than the status.
	NoDeviceStatus bool
	// DeviceMetadata: the helper writes each prepared claim's device
	// metadata (KEP-5304) for its containers (metadataOptions).
	DeviceMetadata bool
}

// Driver is the DRA kubelet plugin of the configured resources.
type Driver struct {
	opts      Options
	log       *logrus.Entry
	claimKind cdi.Kind
	res       []*running

	// changed: a resource published a snapshot; nodes: the node's
	// reported resources (latest); polled: a PodResources poll's result.
	changed chan struct{}
	nodes   chan nodeReport
	polled  chan pollResult
	// fatal: an error that ends Run (HandleError).
	fatal chan error
	pings chan chan struct{}

	helper    atomic.Pointer[kubeletplugin.Helper]
	published atomic.Bool
	health    atomic.Pointer[healthView]

	// prepMu serialises Prepare and Unprepare (the helper does too, but
	// the checkpoint must not depend on that).
	prepMu sync.Mutex
	// podres asks the kubelet's PodResources (Prepare, Unprepare and the
	// handover poll), over one connection kept between calls.
	podres *podresources.Client
	// status writes the claims' status.devices (status.go).
	status *statusQueue
}

// running is a Resource running: its follower publishes to it.
type running struct {
	Resource
	d        *Driver
	follower *resource.Follower
	// pool is the pool of its devices (PoolName).
	pool string
	// snap is what the spec describes now (resource.Gate).
	snap     atomic.Pointer[device.Snapshot]
	firmware string
}

// Update takes a snapshot from the follower (resource.Publisher).
func (r *running) Update(s *device.Snapshot) error {
	r.snap.Store(s)
	select {
	case r.d.changed <- struct{}{}:
	default:
	}
	return nil
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
	if err := o.Checkpoint.Adopt(o.DriverName); err != nil {
		return nil, err
	}
	k, err := cdi.ClaimKind(o.DriverName)
	if err != nil {
		return nil, fmt.Errorf("%w: driver name %q gives no CDI kind: %w", ErrOptions, o.DriverName, err)
	}
	if o.Log == nil {
		o.Log = logs.Discard()
	}
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.HealthResend <= 0 {
		o.HealthResend = DefaultHealthResend
	}
	if o.CleanupInterval <= 0 {
		o.CleanupInterval = DefaultCleanupInterval
	}
	if o.CleanupGrace <= 0 {
		o.CleanupGrace = DefaultCleanupGrace
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.PublishInterval <= 0 {
		o.PublishInterval = DefaultPublishInterval
	}
	if o.StatusClient == nil {
		o.StatusClient = o.Client
	}
	d := &Driver{opts: o, log: o.Log.WithField("driver", o.DriverName), claimKind: k,
		changed: make(chan struct{}, 1), nodes: make(chan nodeReport, 1), polled: make(chan pollResult, 1),
		fatal: make(chan error, 1), pings: make(chan chan struct{}), podres: podresources.New(o.PodResources)}
	d.health.Store(&healthView{changed: make(chan struct{})})
	d.status = newStatusQueue(d)
	for _, rc := range o.Resources {
		r := &running{Resource: rc, d: d, pool: PoolName(o.NodeName, rc.IDPrefix)}
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
		d.res = append(d.res, r)
	}
	return d, nil
}

// Run writes the resources' specs, registers with the kubelet and serves
// it, publishes the devices in ResourceSlices and keeps them and their
// health in step until ctx is done, drops the checkpointed claims gone
// from the API (cleanup) and writes the prepared claims' status.devices
// (status.go); every goroutine it started has ended when it returns. Specs, claim specs and the checkpoint are kept.
func (d *Driver) Run(ctx context.Context) error {
	ctx = klog.NewContext(ctx, Logger(d.log))
	// Spec first, then the devices are published.
	for _, r := range d.res {
		if err := r.follower.Start(); err != nil {
			return fmt.Errorf("%s: %w", r.Name, err)
		}
	}
	d.restoreClaimSpecs()
	for _, dir := range []string{d.opts.RegistrarDir, d.opts.PluginDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("kubelet plugin directory: %w", err)
		}
	}
	helper, err := kubeletplugin.Start(ctx, d, append([]kubeletplugin.Option{
		kubeletplugin.DriverName(d.opts.DriverName),
		kubeletplugin.NodeName(d.opts.NodeName),
		kubeletplugin.KubeClient(d.opts.Client),
		kubeletplugin.RegistrarDirectoryPath(d.opts.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(d.opts.PluginDir),
		kubeletplugin.GRPCInterceptor(d.prefetchHeld),
	}, d.metadataOptions()...)...)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	d.helper.Store(helper)
	d.log.WithField("registrar", d.opts.RegistrarDir).WithField("plugin dir", d.opts.PluginDir).Info("serving the kubelet")
	g, gctx := errgroup.WithContext(ctx)
	for _, r := range d.res {
		g.Go(func() error { return r.follower.Run(gctx) })
		g.Go(func() error { return r.Runner.Run(gctx) })
	}
	g.Go(func() error { return d.watchNode(gctx) })
	g.Go(func() error { return d.cleanup(gctx) })
	g.Go(func() error { return d.status.run(gctx) })
	g.Go(func() error { return d.loop(gctx, helper) })
	err = g.Wait()
	helper.Stop() // its slice controller too: nothing publishes after this
	_ = d.podres.Close()
	d.taintOnStop()
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// Stopped while starting (the slice informer not yet synced,
		// say): a shutdown, not a failure.
		return nil
	}
	return err
}

// stopTaintTimeout bounds the slice updates of a driver that stops.
const stopTaintTimeout = 5 * time.Second

// taintOnStop puts the handover taint on every device of the node's
// slices as the driver stops. The kubelet wipes a gone driver's slices
// only 30 s after it unregistered; meanwhile the scheduler would still
// allocate their devices to pods that no driver can prepare (a node
// switched back to the device plugin, whose pods asking for the extended
// resource would go through DRA). A driver that starts again publishes its
// devices as they are. Best effort: a failure is logged.
func (d *Driver) taintOnStop() {
	ctx, cancel := context.WithTimeout(context.Background(), stopTaintTimeout)
	defer cancel()
	taint := resourceapi.DeviceTaint{Key: d.opts.DriverName + "/" + TaintHandover, Effect: resourceapi.DeviceTaintEffectNoSchedule}
	list, err := d.opts.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.driver=" + d.opts.DriverName + ",spec.nodeName=" + d.opts.NodeName})
	if err != nil {
		d.log.WithError(err).Warn("stopping: could not list the ResourceSlices to taint their devices")
		return
	}
	n := 0
	for i := range list.Items {
		s := list.Items[i].DeepCopy()
		// The field selector is the API server's; a fake client ignores it.
		if s.Spec.Driver != d.opts.DriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != d.opts.NodeName {
			continue
		}
		changed := false
		for j := range s.Spec.Devices {
			dv := &s.Spec.Devices[j]
			if !slices.ContainsFunc(dv.Taints, func(t resourceapi.DeviceTaint) bool { return t.Key == taint.Key }) {
				dv.Taints = append(dv.Taints, taint)
				changed = true
				n++
			}
		}
		if !changed {
			continue
		}
		if _, err := d.opts.Client.ResourceV1().ResourceSlices().Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			d.log.WithError(err).WithField("slice", s.Name).Warn("stopping: could not taint the devices of a ResourceSlice")
		}
	}
	d.log.WithField("devices", n).Info("stopping: the devices carry the handover taint until the driver publishes them again")
}

// HandleError is called by the helper for errors in the background
// (publishing slices, gRPC servers): logged, and a fatal one ends Run.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.log.WithError(err).Warn(msg)
		return
	}
	d.log.WithError(err).Error(msg)
	select {
	case d.fatal <- fmt.Errorf("%s: %w", msg, err):
	default:
	}
}

// Alive reports whether the driver's loops (the slice loop, every
// resource's spec loop) answer within ctx.
func (d *Driver) Alive(ctx context.Context) error {
	reply := make(chan struct{})
	select {
	case d.pings <- reply:
	case <-ctx.Done():
		return fmt.Errorf("the slice loop does not answer: %w", ctx.Err())
	}
	select {
	case <-reply:
	case <-ctx.Done():
		return fmt.Errorf("the slice loop does not answer: %w", ctx.Err())
	}
	for _, r := range d.res {
		if err := r.follower.Alive(ctx); err != nil {
			return fmt.Errorf("%s: %w", r.Name, err)
		}
	}
	return nil
}

// Ready reports whether the kubelet registered the driver and its devices
// were handed to the ResourceSlice controller.
func (d *Driver) Ready() error {
	h := d.helper.Load()
	if h == nil {
		return errors.New("not serving the kubelet yet")
	}
	if st := h.RegistrationStatus(); st == nil || !st.PluginRegistered {
		return errors.New("not registered with the kubelet")
	}
	if !d.published.Load() {
		return errors.New("no ResourceSlice published yet")
	}
	return nil
}

// loop owns the handover guards and what was published: it publishes the
// slices and the health again whenever a resource's devices, the node or
// the devices containers hold change, and asks PodResources while a guard
// is up.
func (d *Driver) loop(ctx context.Context, helper *kubeletplugin.Helper) error {
	g := newGuards(d.res, d.log)
	poll := time.NewTimer(0) // the first look at once
	defer poll.Stop()
	armed, polling := true, false
	var wg sync.WaitGroup
	defer wg.Wait()
	var last map[string]resourceslice.Pool
	co := newCoalescer(d.opts.Clock, d.opts.PublishInterval)
	publish := func() error {
		cur := d.current(g)
		pools := Pools(d.opts.DriverName, d.opts.NodeName, cur)
		if (last == nil || !reflect.DeepEqual(pools, last)) && co.ready() {
			if last == nil {
				d.publishAtOnce(ctx, pools) // not a second later (firstpublish.go)
			}
			co.published()
			if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: pools}); err != nil {
				return fmt.Errorf("publish the ResourceSlices: %w", err)
			}
			n, ns := 0, 0
			for _, p := range pools {
				ns += len(p.Slices)
				for _, s := range p.Slices {
					n += len(s.Devices)
				}
			}
			d.log.WithField("devices", n).WithField("slices", ns).WithField("pools", len(pools)).Debug("ResourceSlices published")
			last = pools
			d.published.Store(true)
		}
		d.setHealth(cur)
		return nil
	}
	if err := publish(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-d.fatal:
			return err
		case reply := <-d.pings:
			close(reply)
			continue
		case <-d.changed:
		case <-co.C(): // the trailing publish of a coalesced change
			co.fired()
		case n := <-d.nodes:
			g.node(n)
		case <-poll.C:
			armed, polling = false, true
			wg.Add(1)
			go func() {
				defer wg.Done()
				res := d.pollHolders(ctx)
				select {
				case d.polled <- res:
				case <-ctx.Done():
				}
			}()
			continue
		case res := <-d.polled:
			polling = false
			g.held(res)
		}
		if g.anyUp() && !polling && !armed {
			poll.Reset(d.opts.PollInterval)
			armed = true
		}
		if err := publish(); err != nil {
			return err
		}
	}
}

// current is every resource's devices as they are to be published now.
func (d *Driver) current(g *guards) []Published {
	out := make([]Published, len(d.res))
	for i, r := range d.res {
		out[i] = Published{Resource: r.Name, Kind: r.Kind, IDPrefix: r.IDPrefix, Snapshot: r.snap.Load(), Handover: g.up(i), FirmwareSHA256: r.firmware, Shares: r.Replicas}
	}
	return out
}

// lookup finds the device an allocation names: its pool and its name.
// The pool is its resource's (PoolName); the node's name is taken too,
// the one pool of the driver's versions before a pool per resource, so
// that a claim allocated before an upgrade is still prepared (the device
// names are unique across the resources either way).
func (d *Driver) lookup(pool, name string) (*running, device.Device, bool) {
	for _, r := range d.res {
		if pool != r.pool && pool != d.opts.NodeName {
			continue
		}
		s := r.snap.Load()
		if s == nil {
			continue
		}
		for _, dv := range s.Devices {
			if DeviceName(r.IDPrefix, dv.Index) == name {
				return r, dv, true
			}
		}
	}
	return nil, device.Device{}, false
}

// byName is the resource named name.
func (d *Driver) byName(name string) *running {
	for _, r := range d.res {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// restoreClaimSpecs writes again the claim specs of prepared claims that
// are missing, and marks those claims to be prepared again: the CDI dir
// was emptied (a reboot empties /var/run/cdi; the kubelet may start a
// container of such a claim before it prepares the claim again, and its
// CDI IDs must resolve meanwhile). It removes the specs of claims not
// prepared (a driver killed between writing a claim's spec and its
// checkpoint). A claim whose Unprepare was under way when the driver
// stopped is left as it is: its spec is gone because Unprepare removed
// it, not because of a reboot; the retried Unprepare completes it.
func (d *Driver) restoreClaimSpecs() {
	claims := d.opts.Checkpoint.Claims()
	removed, err := d.opts.Writer.RemoveStaleClaimSpecs(d.claimKind, func(uid string) bool {
		pc, ok := claims[types.UID(uid)]
		return ok && pc.ClaimSpec != ""
	})
	for _, p := range removed {
		d.log.WithField("spec", p).Info("removed the CDI spec of a claim not prepared")
	}
	if err != nil {
		d.log.WithError(err).Warn("removing the CDI specs of claims not prepared")
	}
	lost := false
	for uid, pc := range claims {
		if pc.Unpreparing {
			// Its spec may be gone: Unprepare removed it. No reboot.
			d.log.WithField("claim", pc.Namespace+"/"+pc.Name).Info("an Unprepare of the claim was under way when the driver stopped; " +
				"it completes when the kubelet asks again (its devices reset already are not reset again)")
			continue
		}
		if pc.ClaimSpec == "" {
			continue
		}
		if _, err := os.Stat(pc.ClaimSpec); err == nil {
			continue
		}
		log := d.log.WithField("claim", pc.Namespace+"/"+pc.Name)
		if _, _, err := d.opts.Writer.WriteClaimSpec(d.claimKind, d.claimEdits(uid, pc)); err != nil {
			log.WithError(err).Error("writing the CDI spec of a prepared claim again")
		}
		pc.PrepareAgain, lost = true, true
		claims[uid] = pc
		log.Info("the CDI spec of a prepared claim was gone (a reboot): written again; its devices are prepared again when the kubelet asks")
	}
	if lost {
		if err := d.opts.Checkpoint.Save(claims); err != nil {
			d.log.WithError(err).Error("recording the claims to prepare again")
		}
	}
}
