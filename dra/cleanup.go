package dra

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// staleNotice is logged once for a checkpointed claim found gone from the
// API.
const staleNotice = "the prepared claim is gone from the API (deleted, or its name taken by another claim): " +
	"its devices are released after the grace period unless the kubelet unprepares it first"

// cleanup looks the checkpointed claims up in the API at start and every
// Options.CleanupInterval until ctx is done: a claim that stays gone (not
// found, or its namespace and name taken by a claim of another UID) for
// Options.CleanupGrace is dropped and its devices released as Unprepare
// releases them (unprepare: no device a device-plugin container holds is
// reset). The kubelet unprepares a claim whose pods are gone, but not
// always: a claim deleted while the driver was down, or under another
// driver name, would hold its devices forever. The grace leaves the
// kubelet its turn first. An API that cannot answer drops nothing.
func (d *Driver) cleanup(ctx context.Context) error {
	t := d.opts.Clock.NewTicker(d.opts.CleanupInterval)
	defer t.Stop()
	gone := map[types.UID]time.Time{}
	for {
		d.cleanupPass(ctx, gone)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
	}
}

// cleanupPass is one look at the checkpointed claims; gone holds when
// each claim was first seen gone.
func (d *Driver) cleanupPass(ctx context.Context, gone map[types.UID]time.Time) {
	now := d.opts.Clock.Now()
	claims := d.opts.Checkpoint.Claims()
	for uid := range gone {
		if _, ok := claims[uid]; !ok {
			delete(gone, uid)
		}
	}
	for uid, pc := range claims {
		if ctx.Err() != nil {
			return
		}
		log := d.log.WithField("claim", pc.Namespace+"/"+pc.Name)
		obj, err := d.opts.Client.ResourceV1().ResourceClaims(pc.Namespace).Get(ctx, pc.Name, metav1.GetOptions{})
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
			log.WithField("grace", d.opts.CleanupGrace).Info(staleNotice)
			continue
		}
		if now.Sub(since) < d.opts.CleanupGrace {
			continue
		}
		d.dropStale(ctx, uid, log)
		delete(gone, uid)
	}
}

// dropStale unprepares the claim uid, gone from the API for longer than
// the grace, unless the kubelet did meanwhile.
func (d *Driver) dropStale(ctx context.Context, uid types.UID, log *logrus.Entry) {
	d.prepMu.Lock()
	defer d.prepMu.Unlock()
	pc, ok := d.opts.Checkpoint.Claims()[uid]
	if !ok {
		return
	}
	log.WithField("grace", d.opts.CleanupGrace).Warn("dropping a prepared claim gone from the API for longer than the grace period; its devices are released as Unprepare releases them")
	// Its queued status and its device metadata go first, while the
	// checkpoint still holds the claim: a driver stopped in between finds
	// the claim again at its next start and drops it then, so nothing is
	// left behind for good (the other way round, metadata left after the
	// checkpoint let go of the claim would never be removed).
	d.status.forget(uid)
	if err := d.removeMetadata(pc.Namespace, pc.Name, uid); err != nil {
		log.WithError(err).Warn("removing the device metadata of a dropped claim")
	}
	if err := d.unprepare(ctx, uid); err != nil {
		log.WithError(err).Error("dropping a prepared claim gone from the API")
	}
}
