package dra

import (
	"context"
	"sync"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/ping"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
)

// sliceLoop owns the handover guards and what was published: it
// publishes the slices and the health again whenever a resource's
// devices, the node or the devices containers hold change, and asks
// PodResources while a guard is up.
type sliceLoop struct {
	driver, node string
	devs         *devices
	guard        *handoverGuard
	slices       *slicePublisher
	health       *healthStream
	// metrics tells the guards' state (nil: nothing).
	metrics *metrics.DRA
	// pollInterval is how often PodResources is asked while a guard is
	// up (Options.PollInterval).
	pollInterval time.Duration
	// firstHold bounds the wait of the first publish for guards the first
	// look did not resolve (Options.FirstPublishHold).
	firstHold time.Duration
	// changed: a resource has a new snapshot (running.changed).
	changed chan struct{}
	// fatal: an error that ends the loop (Driver.HandleError); pings: a
	// liveness probe's reply, closed by the loop (alive).
	fatal chan error
	pings chan chan struct{}
}

// newSliceLoop is the loop of the devices devs, whose resources tell
// changed of their snapshots.
func newSliceLoop(driver, node string, devs *devices, changed chan struct{}, guard *handoverGuard, slices *slicePublisher,
	health *healthStream, poll time.Duration) *sliceLoop {
	return &sliceLoop{driver: driver, node: node, devs: devs, guard: guard, slices: slices, health: health, pollInterval: poll,
		changed: changed, fatal: make(chan error, 1), pings: make(chan chan struct{})}
}

// fail ends the loop with err, unless an error is pending already.
func (l *sliceLoop) fail(err error) {
	select {
	case l.fatal <- err:
	default:
	}
}

// alive reports whether the loop answers within ctx.
func (l *sliceLoop) alive(ctx context.Context) error {
	return ping.Ask(ctx, l.pings, "the slice loop")
}

// run runs the loop until ctx is done or an error is fatal, publishing
// through helper; look is the first look (firstlook.go), asked as the
// driver started.
func (l *sliceLoop) run(ctx context.Context, helper resourcePublisher, look *firstLook) error {
	g := l.guard
	// The guards resolved before the first publish: its slices are then
	// the final ones, schedulable at once where no guard is up.
	answers, ok := look.guards(ctx)
	if !ok {
		return nil
	}
	l.slices.nodeUID = g.apply(answers)
	poll := time.NewTimer(0) // while a guard is up, the next look at once
	defer poll.Stop()
	armed, polling := true, false
	if !g.anyUp() {
		poll.Stop()
		armed = false
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	publish := func() error {
		cur := l.devs.published(g.up)
		if err := l.slices.publish(ctx, helper, Pools(l.driver, l.node, cur)); err != nil {
			return err
		}
		l.health.set(deviceHealth(l.node, cur))
		for i, r := range l.devs.res {
			l.metrics.HandoverGuard(r.Name, g.up(i))
		}
		return nil
	}
	// A guard the first look could not resolve (the node or PodResources
	// did not answer within primeTimeout: a loaded node, such as every
	// node of a fleet rolled at once) holds the first publish back until
	// it is resolved, for at most firstHold. Published at once, the devices
	// would carry the handover taint for want of an answer, not for a
	// reason: on a node where the instance this one replaces serves them
	// untainted (a rolling update), that taint makes them unschedulable
	// and takes a second write to lift. Past firstHold they go out with
	// it, the reason in the log, as they did at once before.
	// hold is non-nil while the first publish is held back.
	var hold <-chan time.Time
	if g.anyUnknown() {
		t := time.NewTimer(l.firstHold)
		defer t.Stop()
		hold = t.C
		g.log.WithField("at most", l.firstHold).Info("the node or PodResources gave the first look no answer: the first publish waits for one")
	} else {
		// Published now, the first look's List of the node's slices is
		// fresh enough to create those of the pools it found none of; a
		// held publish lists them again.
		l.slices.existing = look.pools(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err := publish(); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-l.fatal:
			return err
		case reply := <-l.pings:
			close(reply)
			continue
		case <-l.changed:
		case <-l.slices.due(): // the trailing publish of a coalesced change
			l.slices.fired()
		case n := <-g.nodes:
			g.node(n)
		case <-poll.C:
			armed, polling = false, true
			wg.Add(1)
			go func() {
				defer wg.Done()
				res := g.poll(ctx)
				select {
				case g.polled <- res:
				case <-ctx.Done():
				}
			}()
			continue
		case res := <-g.polled:
			polling = false
			g.held(res)
		case <-hold:
			hold = nil
		}
		if hold != nil && !g.anyUnknown() {
			hold = nil
		}
		if g.anyUp() && !polling && !armed {
			poll.Reset(l.pollInterval)
			armed = true
		}
		if hold != nil {
			continue
		}
		if err := publish(); err != nil {
			return err
		}
	}
}
