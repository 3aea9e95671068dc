package dra

import (
	"time"

	"k8s.io/utils/clock"
)

// DefaultPublishInterval is the least time between two ResourceSlice
// publishes of a driver after its first (Options.PublishInterval).
const DefaultPublishInterval = time.Second

// coalescer spaces the driver's ResourceSlice publishes: the first goes
// at once (a starting driver's devices are schedulable as soon as can
// be), and so does a change after a quiet interval (an isolated health
// change is tainted at once); within interval of the last publish a
// change waits for the interval's end, when one trailing publish sends
// the state of then. A storm of health flips thus costs the API server
// at most one write per pool a second, plus the leading one, and its last
// state is published at most interval after its end. The loop that owns
// it calls every method; it is not safe for concurrent use.
type coalescer struct {
	interval time.Duration
	clock    clock.Clock
	last     time.Time   // the last publish; zero: none yet
	timer    clock.Timer // the trailing publish, while pending
}

func newCoalescer(c clock.Clock, interval time.Duration) *coalescer {
	return &coalescer{interval: interval, clock: c}
}

// ready reports whether a publish may go now. When it may not, the
// trailing publish is armed (once): C fires at the interval's end.
func (c *coalescer) ready() bool {
	if c.last.IsZero() {
		return true
	}
	wait := c.interval - c.clock.Since(c.last)
	if wait <= 0 {
		return true
	}
	if c.timer == nil {
		c.timer = c.clock.NewTimer(wait)
	}
	return false
}

// published records a publish made now; a pending trailing one is
// dropped (this one sent the latest state).
func (c *coalescer) published() {
	c.last = c.clock.Now()
	c.fired()
}

// C fires when the trailing publish is due; nil (never) while none is
// pending.
func (c *coalescer) C() <-chan time.Time {
	if c.timer == nil {
		return nil
	}
	return c.timer.C()
}

// fired drops the pending trailing publish (C fired, or a publish went).
func (c *coalescer) fired() {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
}
