package dra

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/sirupsen/logrus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	resourcev1 "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/utils/clock"
)

// staleNotice is logged once for a checkpointed claim found gone from the
// API.
const staleNotice = "the prepared claim is gone from the API (deleted, or its name taken by another claim): " +
	"its devices are released after the grace period unless the kubelet unprepares it first"

// staleCleaner is the stale-claim clean-up: it looks the checkpointed
// claims up in the API once the driver serves (after firstDelay), then
// every interval until ctx is done; a claim that stays gone (not found, or
// its namespace and name taken by a claim of another UID) for grace is
// handed to drop, which releases its devices as Unprepare releases them
// (no device a device-plugin container holds is reset). The kubelet
// unprepares a claim whose pods are gone, but not always: a claim deleted
// while the driver was down, or under another driver name, would hold its
// devices forever. The grace leaves the kubelet its turn first. An API
// that cannot answer drops nothing.
type staleCleaner struct {
	// claims are the checkpointed claims (Checkpoint.Claims), api where
	// they are looked up.
	claims          func() map[types.UID]PreparedClaim
	api             resourcev1.ResourceClaimsGetter
	clock           clock.WithTicker
	interval, grace time.Duration
	log             *logrus.Entry
	// drop releases a claim gone for longer than grace, unless the
	// kubelet unprepared it meanwhile; an error says why it was kept
	// (ErrStillHeld, ErrCannotTell), and the claim is asked about again at
	// the next pass.
	drop func(ctx context.Context, uid types.UID, log *logrus.Entry) error
	// ready, when set, is closed once the first pass may run, and the
	// first pass waits firstDelay more (spreadDelay).
	ready      <-chan struct{}
	firstDelay time.Duration
}

// spreadDelay is a random delay within (0, spread] for the first pass (0
// for no spread). The drivers of a fleet start together, in a rollout or
// after a control-plane outage: with no delay each would look up every
// claim it holds in the same second, and go on doing so every interval in
// step. The grace is minutes, so a later first pass only releases a claim
// deleted while the driver was down up to spread later.
func spreadDelay(spread time.Duration) time.Duration {
	if spread <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(spread))) + 1
}

// run looks at the claims once ready is closed and firstDelay passed,
// then every interval, until ctx is done.
func (c *staleCleaner) run(ctx context.Context) error {
	if c.ready != nil {
		select {
		case <-ctx.Done():
			return nil
		case <-c.ready:
		}
	}
	if c.firstDelay > 0 {
		c.log.WithField("in", c.firstDelay.Round(time.Millisecond)).Debug("the stale-claim clean-up's first pass")
		first := c.clock.NewTimer(c.firstDelay)
		select {
		case <-ctx.Done():
			first.Stop()
			return nil
		case <-first.C():
		}
	}
	t := c.clock.NewTicker(c.interval)
	defer t.Stop()
	gone := map[types.UID]time.Time{}
	kept := map[types.UID]string{}
	for {
		c.pass(ctx, gone, kept)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
	}
}

// pass is one look at the checkpointed claims; gone holds when each
// claim was first seen gone, kept why a claim past the grace was kept (the
// reason is logged when it changes).
func (c *staleCleaner) pass(ctx context.Context, gone map[types.UID]time.Time, kept map[types.UID]string) {
	now := c.clock.Now()
	claims := c.claims()
	for uid := range gone {
		if _, ok := claims[uid]; !ok {
			delete(gone, uid)
			delete(kept, uid)
		}
	}
	for uid, pc := range claims {
		if ctx.Err() != nil {
			return
		}
		log := c.log.WithField("claim", pc.Namespace+"/"+pc.Name)
		obj, err := c.api.ResourceClaims(pc.Namespace).Get(ctx, pc.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			if ctx.Err() == nil {
				log.WithError(err).Warn("cannot look the prepared claim up in the API; kept")
			}
			continue
		case obj.UID == uid:
			if _, was := gone[uid]; was {
				log.Info("the prepared claim is back in the API; kept")
				delete(gone, uid)
				delete(kept, uid)
			}
			continue
		}
		since, seen := gone[uid]
		if !seen {
			gone[uid] = now
			log.WithField("grace", c.grace).Info(staleNotice)
			continue
		}
		if now.Sub(since) < c.grace {
			continue
		}
		if err := c.drop(ctx, uid, log.WithField("grace", c.grace)); err != nil {
			if ctx.Err() == nil && kept[uid] != err.Error() {
				kept[uid] = err.Error()
				log.WithError(err).Warn("the prepared claim is gone from the API past the grace period, but is kept: " + keptBecause(err))
			}
			continue
		}
		delete(gone, uid)
		delete(kept, uid)
	}
}

// keptBecause says why a claim past the grace was kept, from drop's error.
func keptBecause(err error) string {
	if errors.Is(err, ErrStillHeld) {
		return "a container still holds the claim (it is released once PodResources lists it on no container)"
	}
	return "PodResources cannot tell whether a container still holds the claim (it is asked again at the next pass)"
}
