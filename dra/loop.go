package dra

import (
	"context"
	"sync"
	"time"
)

// loop owns the handover guards and what was published: it publishes the
// slices and the health again whenever a resource's devices, the node or
// the devices containers hold change, and asks PodResources while a guard
// is up.
func (d *Driver) loop(ctx context.Context, helper resourcePublisher) error {
	g := d.guard
	poll := time.NewTimer(0) // the first look at once
	defer poll.Stop()
	armed, polling := true, false
	var wg sync.WaitGroup
	defer wg.Wait()
	publish := func() error {
		cur := d.devs.published(g.up)
		if err := d.slices.publish(ctx, helper, Pools(d.opts.DriverName, d.opts.NodeName, cur)); err != nil {
			return err
		}
		d.health.set(deviceHealth(d.opts.NodeName, cur))
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
		case <-d.slices.due(): // the trailing publish of a coalesced change
			d.slices.fired()
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
