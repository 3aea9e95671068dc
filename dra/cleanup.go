package dra

import (
	"context"
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
// claims up in the API at start and every interval until ctx is done; a
// claim that stays gone (not found, or its namespace and name taken by a
// claim of another UID) for grace is handed to drop, which releases its
// devices as Unprepare releases them (no device a device-plugin container
// holds is reset). The kubelet unprepares a claim whose pods are gone,
// but not always: a claim deleted while the driver was down, or under
// another driver name, would hold its devices forever. The grace leaves
// the kubelet its turn first. An API that cannot answer drops nothing.
type staleCleaner struct {
	// claims are the checkpointed claims (Checkpoint.Claims), api where
	// they are looked up.
	claims          func() map[types.UID]PreparedClaim
	api             resourcev1.ResourceClaimsGetter
	clock           clock.WithTicker
	interval, grace time.Duration
	log             *logrus.Entry
	// drop releases a claim gone for longer than grace, unless the
	// kubelet unprepared it meanwhile.
	drop func(ctx context.Context, uid types.UID, log *logrus.Entry)
}

// run looks at the claims at once, then every interval, until ctx is
// done.
func (c *staleCleaner) run(ctx context.Context) error {
	t := c.clock.NewTicker(c.interval)
	defer t.Stop()
	gone := map[types.UID]time.Time{}
	for {
		c.pass(ctx, gone)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
	}
}

// pass is one look at the checkpointed claims; gone holds when each
// claim was first seen gone.
func (c *staleCleaner) pass(ctx context.Context, gone map[types.UID]time.Time) {
	now := c.clock.Now()
	claims := c.claims()
	for uid := range gone {
		if _, ok := claims[uid]; !ok {
			delete(gone, uid)
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
		c.drop(ctx, uid, log.WithField("grace", c.grace))
		delete(gone, uid)
	}
}
