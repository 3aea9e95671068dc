package plugin

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/dranames"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/latest"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
	"github.com/cdi-device-plugin/cdi-device-plugin/podresources"
)

// The claim guard. A node switched back from the DRA driver to the device
// plugin may still run pods whose claims the driver prepared: their
// devices must not be advertised Healthy, or the kubelet hands them to a
// second pod. The guard asks the kubelet's PodResources which devices
// DRA claims hold and reports those of its resource Unhealthy
// (device.CauseHeldByDRA) until no claim holds them.
//
// It fails closed: until PodResources has answered once, no device of the
// resource is advertised Healthy (each is Unhealthy for dra_claim, "not
// known whether a DRA claim holds it"), and a List that fails is tried
// again with a backoff (DefaultClaimRetryMin doubling up to
// DefaultClaimRetryMax, back to the minimum once it answers) until it
// answers. On a node the kubelet's PodResources always answers, DRA driver
// or not (a List with no claims), so this costs one List at the start; a
// plugin whose PodResources socket is wrong or not mounted advertises no
// device, and says why.

// DefaultClaimPoll is how often PodResources is asked while a DRA claim
// holds a device of the resource, and while a registration settles.
const DefaultClaimPoll = 5 * time.Second

// DefaultClaimSettle is how long after each registration PodResources is
// asked again (every Interval) even when it answered that no claim holds
// a device: a kubelet that restarted serves PodResources before its pod
// manager has its pods back (kubelet v1.36.3 starts the PodResources
// server beside its pod sync loop, and lists the claims of the pods that
// manager has), so its first answers may leave out claims it holds.
const DefaultClaimSettle = time.Minute

// Default bounds of the backoff between failed PodResources Lists.
const (
	DefaultClaimRetryMin = 100 * time.Millisecond
	DefaultClaimRetryMax = 5 * time.Second
)

// claimListTimeout bounds one PodResources List of the guard: a kubelet
// whose PodResources hangs delays the resource's start by at most this.
const claimListTimeout = 2 * time.Second

// claimsUnknown is the problem of every device that would be healthy
// while PodResources has never answered.
var claimsUnknown = device.Problem{Cause: device.CauseHeldByDRA,
	Message: "not known whether a DRA claim holds it: PodResources has not answered yet"}

// ClaimMatch recognises a resource's devices among those DRA claims hold.
type ClaimMatch struct {
	// Kind is the CDI kind of the resource's devices: a claim device whose
	// CDI names include <kind>=<device name> is that device, whatever the
	// driver's name.
	Kind cdi.Kind
	// IDPrefix, Drivers and Pools recognise a claim device that comes
	// with no CDI names: its driver is one of Drivers (the DRA driver's
	// name), its pool one of Pools (the resource's pool on this node,
	// dranames.PoolName, and the node name, the pool of earlier versions
	// that the driver still prepares; none: never) and its name
	// dranames.DeviceName(IDPrefix, index) of a device of the resource.
	IDPrefix string
	Drivers  []string
	Pools    []string
}

// Held returns the devices of snap that claims hold, by device name, each
// with its problem (CauseHeldByDRA, naming the first claim that holds it).
// The CDI names of a claim device decide when there are any; otherwise its
// driver, pool and device name do (also for a resource with replicas: the
// DRA driver publishes each device once, shared by its claims). A device
// held is one name: the plugin advertises every replica ID of it with its
// health, so all of them are Unhealthy.
func (m ClaimMatch) Held(snap *device.Snapshot, claims []podresources.ClaimDevice) map[string]device.Problem {
	if snap == nil || len(claims) == 0 {
		return nil
	}
	prefix := m.Kind.String() + "="
	names := make(map[string]bool, len(snap.Devices))
	for _, d := range snap.Devices {
		names[d.Name] = true
	}
	var byDRAName map[string]string // slice device name -> device name, made when needed
	var out map[string]device.Problem
	hold := func(name, claim string) {
		if out == nil {
			out = map[string]device.Problem{}
		}
		if _, seen := out[name]; !seen {
			out[name] = device.Problemf(device.CauseHeldByDRA, "held by DRA claim %s", claim)
		}
	}
	for _, c := range claims {
		switch {
		case len(c.CDIDevices) > 0:
			// Every CDI name of ours counts: kubelet 1.36.3 lists a
			// claim's later devices with the CDI names of the earlier
			// ones too, so the first of ours may be another device's.
			for _, n := range c.CDIDevices {
				if rest, ok := strings.CutPrefix(n, prefix); ok && names[rest] {
					hold(rest, c.Claim)
				}
			}
		case c.Pool != "" && slices.Contains(m.Pools, c.Pool) && slices.Contains(m.Drivers, c.Driver):
			if byDRAName == nil {
				byDRAName = make(map[string]string, len(snap.Devices))
				for _, d := range snap.Devices {
					byDRAName[dranames.DeviceName(m.IDPrefix, d.Index)] = d.Name
				}
			}
			if name := byDRAName[c.Device]; name != "" {
				hold(name, c.Claim)
			}
		}
	}
	return out
}

// ClaimSource is the device source as the claim guard uses it
// (device.Source).
type ClaimSource interface {
	Snapshot() *device.Snapshot
	// Refresh makes a snapshot with the holds set (before Run).
	Refresh() *device.Snapshot
	SetHolds(holds map[string]device.Problem)
}

// ClaimGuard reports Unhealthy the devices of one resource that DRA
// claims hold, from the kubelet's PodResources API. It asks once at
// Start, before the first advertisement, so that a held device is never
// advertised Healthy; then, only while a claim holds a device, every
// Interval until none does; and once after every registration with the
// kubelet (the first, and those after a kubelet restart: a claim the
// driver prepared while it was going away, or one PodResources could not
// tell of, is seen then). While nothing is held and PodResources answers
// nothing runs. A failed List (no socket, an error, no answer in time) is
// said once per outage and tried again with a backoff (RetryMin doubling
// up to RetryMax) until PodResources answers. Until its first answer the
// guard fails closed: the resource (Resource.Claims) advertises none of
// its devices Healthy. After it, devices already held stay so until
// PodResources answers again. Set the fields, then Start and Run.
type ClaimGuard struct {
	Source ClaimSource
	Match  ClaimMatch
	// PodResources asks the kubelet's PodResources API (the guard does
	// not close it).
	PodResources *podresources.Client
	// Interval (default DefaultClaimPoll) is how often PodResources is
	// asked while a claim holds a device.
	Interval time.Duration
	// RetryMin and RetryMax (defaults DefaultClaimRetryMin,
	// DefaultClaimRetryMax) bound the backoff between failed Lists.
	RetryMin, RetryMax time.Duration
	// Settle (default DefaultClaimSettle) is how long after a
	// registration PodResources is asked every Interval whatever it
	// answers.
	Settle time.Duration
	Log    *logrus.Entry

	once       sync.Once
	registered chan struct{}
	// changed signals the gate that answered or shown changed.
	changed chan struct{}

	// What the gate applies to the published snapshots: whether
	// PodResources ever answered, and the holds it told of.
	mu       sync.Mutex
	answered bool
	shown    map[string]device.Problem

	// Owned by Start, then by Run's goroutine.
	holds map[string]device.Problem
	// unavailable: the last List failed (and that was said); started:
	// Start has asked (and said what it found).
	unavailable, started bool
}

func (g *ClaimGuard) init() {
	g.once.Do(func() {
		g.registered = make(chan struct{}, 1)
		g.changed = make(chan struct{}, 1)
		if g.Interval <= 0 {
			g.Interval = DefaultClaimPoll
		}
		if g.RetryMin <= 0 {
			g.RetryMin = DefaultClaimRetryMin
		}
		if g.Settle <= 0 {
			g.Settle = DefaultClaimSettle
		}
		if g.RetryMax < g.RetryMin {
			g.RetryMax = max(DefaultClaimRetryMax, g.RetryMin)
		}
		if g.Log == nil {
			g.Log = logs.Discard()
		}
	})
}

// Registered tells the guard that the plugin registered with a kubelet
// (Options.Registered); it never blocks.
func (g *ClaimGuard) Registered() {
	g.init()
	select {
	case g.registered <- struct{}{}:
	default:
	}
}

// Start asks PodResources once and has the source's snapshot report the
// devices claims hold: call it before the resource publishes anything.
func (g *ClaimGuard) Start(ctx context.Context) {
	g.init()
	g.check(ctx)
	g.started = true
	if len(g.holds) == 0 {
		return
	}
	g.Source.Refresh()
	const shown = 5
	var some []string
	for _, name := range slices.Sorted(maps.Keys(g.holds)) {
		if len(some) == shown {
			break
		}
		some = append(some, name+" ("+g.holds[name].Message+")")
	}
	g.Log.WithField("held", len(g.holds)).WithField("first", strings.Join(some, ", ")).WithField("recheck", g.Interval).
		Warn("devices held by DRA claims at start: reported unhealthy until no claim holds them")
}

// Run asks PodResources again while a claim holds a device, after every
// registration and every Interval for Settle after it, and, with a
// backoff, after a failed List, until ctx is done.
func (g *ClaimGuard) Run(ctx context.Context) error {
	g.init()
	next := time.NewTimer(time.Hour)
	defer next.Stop()
	backoff := g.RetryMin
	var settling time.Time // until when a registration settles
	for {
		switch {
		case g.unavailable:
			next.Reset(backoff)
			backoff = min(2*backoff, g.RetryMax)
		case len(g.holds) > 0 || time.Now().Before(settling):
			backoff = g.RetryMin
			next.Reset(g.Interval)
		default:
			backoff = g.RetryMin
			next.Stop()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-g.registered:
			settling = time.Now().Add(g.Settle)
			g.check(ctx)
		case <-next.C:
			g.check(ctx)
		}
	}
}

// check asks PodResources and sets the holds it finds. A failed List
// keeps the holds as they are (none are known before the first answer:
// the gate holds every device back then).
func (g *ClaimGuard) check(ctx context.Context) {
	claims, err := g.list(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return // stopping: nothing to say
		}
		if !g.unavailable {
			g.unavailable = true
			log := g.Log.WithError(err).WithField("socket", g.PodResources.Socket())
			if g.known() {
				log.Warn("cannot tell which devices DRA claims hold (PodResources); devices found held stay unhealthy, a claim made since is not recognised " +
					"until it answers (asked again with a backoff)")
			} else {
				log.Warn("cannot tell which devices DRA claims hold (PodResources): no device is advertised healthy until it answers " +
					"(asked again with a backoff; check --pod-resources-socket and that its directory is mounted)")
			}
		}
		return
	}
	if g.unavailable {
		g.unavailable = false
		g.Log.Info("PodResources answers again: devices DRA claims hold are recognised")
	}
	holds := g.Match.Held(g.Source.Snapshot(), claims)
	switch {
	case !g.started:
	case len(g.holds) == 0 && len(holds) > 0:
		g.Log.WithField("held", len(holds)).WithField("recheck", g.Interval).
			Warn("DRA claims hold devices: reported unhealthy until no claim holds them")
	case len(g.holds) > 0 && len(holds) == 0:
		g.Log.Info("no DRA claim holds a device any more")
	}
	g.holds = holds
	g.Source.SetHolds(holds)
	g.show(holds)
}

// known reports whether PodResources ever answered.
func (g *ClaimGuard) known() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.answered
}

// show hands the gate an answer's holds.
func (g *ClaimGuard) show(holds map[string]device.Problem) {
	g.mu.Lock()
	changed := !g.answered || !maps.Equal(g.shown, holds)
	g.answered, g.shown = true, holds
	g.mu.Unlock()
	if changed {
		select {
		case g.changed <- struct{}{}:
		default:
		}
	}
}

// apply returns snap as the gate publishes it: every healthy device
// Unhealthy while PodResources never answered (claimsUnknown), else
// those its last answer found held. The source reports the holds too
// (SetHolds); applying them here as well makes the first answer's holds
// and the end of the fail-closed rule one change, with no snapshot
// between them.
func (g *ClaimGuard) apply(snap *device.Snapshot) *device.Snapshot {
	if snap == nil {
		return nil
	}
	g.mu.Lock()
	answered, shown := g.answered, g.shown
	g.mu.Unlock()
	var out *device.Snapshot
	for i, d := range snap.Devices {
		if !d.Healthy {
			continue
		}
		p := claimsUnknown
		if answered {
			if p = shown[d.Name]; p.None() {
				continue
			}
		}
		if out == nil {
			out = &device.Snapshot{Replicas: snap.Replicas, Devices: slices.Clone(snap.Devices)}
		}
		out.Devices[i].SetProblem(p)
	}
	if out == nil {
		return snap
	}
	return out
}

// gate returns src as the resource publishes it under the guard (apply):
// the follower gets it in place of the source.
func (g *ClaimGuard) gate(src DeviceSource) DeviceSource {
	g.init()
	return &claimGate{src: src, g: g}
}

// claimGate is a device source seen through its claim guard.
type claimGate struct {
	src DeviceSource
	g   *ClaimGuard
}

func (c *claimGate) Snapshot() *device.Snapshot { return c.g.apply(c.src.Snapshot()) }

// Run runs the source and publishes its snapshots through the guard, and
// the latest again whenever what the guard knows changes.
func (c *claimGate) Run(ctx context.Context, out chan *device.Snapshot) error {
	in := make(chan *device.Snapshot, 1)
	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return c.src.Run(ctx, in) })
	eg.Go(func() error {
		var last *device.Snapshot
		for {
			select {
			case <-ctx.Done():
				return nil
			case last = <-in:
			case <-c.g.changed:
				if last == nil {
					last = c.src.Snapshot()
				}
			}
			if snap := c.g.apply(last); snap != nil {
				latest.Send(out, snap)
			}
		}
	})
	return eg.Wait()
}

// list asks PodResources which devices DRA claims hold.
func (g *ClaimGuard) list(ctx context.Context) ([]podresources.ClaimDevice, error) {
	ctx, cancel := context.WithTimeout(ctx, claimListTimeout)
	defer cancel()
	res, err := g.PodResources.List(ctx)
	if err != nil {
		return nil, err
	}
	return res.Claims(), nil
}

// Held returns the names of the resource's devices that DRA claims hold
// now, asked afresh (for background recovery and forgetting, which spare
// devices in use: resource.Options.Holders).
func (g *ClaimGuard) Held(ctx context.Context) ([]string, error) {
	claims, err := g.list(ctx)
	if err != nil {
		return nil, err
	}
	return slices.Sorted(maps.Keys(g.Match.Held(g.Source.Snapshot(), claims))), nil
}
