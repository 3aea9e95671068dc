package plugin

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/dranames"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
)

// The claim guard. A node switched back from the DRA driver to the device
// plugin may still run pods whose claims the driver prepared: their
// devices must not be advertised Healthy, or the kubelet hands them to a
// second pod. The guard asks the kubelet's PodResources which devices
// DRA claims hold and reports those of its resource Unhealthy
// (device.CauseHeldByDRA) until no claim holds them.

// DefaultClaimPoll is how often PodResources is asked while a DRA claim
// holds a device of the resource.
const DefaultClaimPoll = 5 * time.Second

// claimListTimeout bounds one PodResources List of the guard: a kubelet
// whose PodResources hangs delays the resource's start by at most this.
const claimListTimeout = 2 * time.Second

// ClaimMatch recognises a resource's devices among those DRA claims hold.
type ClaimMatch struct {
	// Kind is the CDI kind of the resource's devices: a claim device whose
	// CDI names include <kind>=<device name> is that device, whatever the
	// driver's name.
	Kind cdi.Kind
	// IDPrefix, Drivers and Pool recognise a claim device that comes with
	// no CDI names: its driver is one of Drivers (the DRA driver's name),
	// its pool Pool (the node name; empty: never) and its name
	// dranames.DeviceName(IDPrefix, index) of a device of the resource.
	IDPrefix string
	Drivers  []string
	Pool     string
}

// Held returns the devices of snap that claims hold, by device name, each
// with its problem (CauseHeldByDRA, naming the first claim that holds it).
// The CDI names of a claim device decide when there are any; otherwise its
// driver, pool and device name do (never for a resource with replicas,
// which the DRA driver does not publish).
func (m ClaimMatch) Held(snap *device.Snapshot, claims []metrics.ClaimDevice) map[string]device.Problem {
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
		case m.Pool != "" && c.Pool == m.Pool && slices.Contains(m.Drivers, c.Driver) && snap.Replicas <= 1:
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
// tell of, is seen then). While nothing is held nothing runs. Without
// PodResources (no socket, a failed List) it says so once per outage and
// goes on: the plugin starts as it would without the guard, and devices
// already held stay so until PodResources answers. Set the fields, then
// Start and Run.
type ClaimGuard struct {
	Source ClaimSource
	Match  ClaimMatch
	// Socket is the kubelet's PodResources socket.
	Socket string
	// Interval (default DefaultClaimPoll) is how often PodResources is
	// asked while a claim holds a device.
	Interval time.Duration
	Log      *logrus.Entry

	once       sync.Once
	registered chan struct{}

	// Owned by Start, then by Run's goroutine.
	holds map[string]device.Problem
	// unavailable: a failed List was said; started: Start has asked (and
	// said what it found).
	unavailable, started bool
}

func (g *ClaimGuard) init() {
	g.once.Do(func() {
		g.registered = make(chan struct{}, 1)
		if g.Interval <= 0 {
			g.Interval = DefaultClaimPoll
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

// Run asks PodResources again while a claim holds a device, and after
// every registration, until ctx is done.
func (g *ClaimGuard) Run(ctx context.Context) error {
	g.init()
	poll := time.NewTimer(g.Interval)
	defer poll.Stop()
	if len(g.holds) == 0 {
		poll.Stop()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-g.registered:
			g.check(ctx)
		case <-poll.C:
			g.check(ctx)
		}
		if len(g.holds) > 0 {
			poll.Reset(g.Interval)
		} else {
			poll.Stop()
		}
	}
}

// check asks PodResources and sets the holds it finds. A failed List
// keeps the holds as they are.
func (g *ClaimGuard) check(ctx context.Context) {
	claims, err := g.list(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return // stopping: nothing to say
		}
		if !g.unavailable {
			g.unavailable = true
			g.Log.WithError(err).Warn("cannot tell which devices DRA claims hold (PodResources); devices a claim of the DRA driver still holds are not recognised " +
				"(asked again at the next registration with the kubelet)")
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
}

// list asks PodResources which devices DRA claims hold.
func (g *ClaimGuard) list(ctx context.Context) ([]metrics.ClaimDevice, error) {
	ctx, cancel := context.WithTimeout(ctx, claimListTimeout)
	defer cancel()
	return metrics.ClaimDevices(ctx, g.Socket)
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
