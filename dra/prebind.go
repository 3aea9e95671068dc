package dra

import (
	"context"
	"slices"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/cdi-device-plugin/cdi-device-plugin/bindmarker"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/claimqueue"
)

// prebinder hears of the claims to prepare before binding: it watches the
// ResourceClaims labelled for this node (bindmarker.NodeLabel: the
// bindmarker.Marker, running once in the cluster, labels each claim
// allocated with the driver's binding conditions with the node of its
// devices; the API server hands each node's driver its own alone), and,
// one claim at a time, prepares a claim allocated devices of this node
// with the driver's binding condition, or releases one it prepared that
// lost its allocation before its pod was bound here.
type prebinder struct {
	driver, node string
	client       kubernetes.Interface
	prep         *preparer
	log          *logrus.Entry
}

// ours reports whether claim c is allocated devices of this node with the
// driver's binding condition.
func (b *prebinder) ours(c *resourceapi.ResourceClaim) bool {
	if c == nil || c.Status.Allocation == nil || c.DeletionTimestamp != nil {
		return false
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == b.driver && bindmarker.NodeOfPool(r.Pool) == b.node && slices.Contains(r.BindingConditions, b.driver+"/"+ConditionPrepared) {
			return true
		}
	}
	return false
}

// run watches and works until ctx is done; every goroutine it started has
// ended when it returns.
func (b *prebinder) run(ctx context.Context) error {
	sel := metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: map[string]string{
		bindmarker.NodeLabel(b.driver): bindmarker.NodeValue(b.node)}})
	q := claimqueue.Queue{
		Client: b.client, Name: "prepare-before-bind", LabelSelector: sel, Sync: b.sync,
		Started: func(add func(types.NamespacedName)) {
			// The claims prepared, or under way, before a restart: their
			// allocation is looked at again (released, completed or
			// reported).
			for _, pc := range b.prep.checkpoint.Claims() {
				if pc.PreBind {
					add(types.NamespacedName{Namespace: pc.Namespace, Name: pc.Name})
				}
			}
			b.log.WithField("selector", sel).Info("watching the claims to prepare before binding")
		},
		Failed: func(key types.NamespacedName, err error) {
			b.log.WithError(err).WithField("claim", key.String()).Warn("preparing or releasing a claim before binding; tried again")
		},
	}
	return q.Run(ctx)
}

// sync brings the claim key (c: as the API has it now, nil when gone) in
// step: an entry prepared before binding for it that lost its allocation
// (the claim gone, of another UID, no longer allocated here, or allocated
// other devices) is released; a claim allocated here with the binding
// condition is prepared.
func (b *prebinder) sync(ctx context.Context, key types.NamespacedName, c *resourceapi.ResourceClaim) error {
	for uid, pc := range b.prep.checkpoint.Claims() {
		if !pc.PreBind || pc.Namespace != key.Namespace || pc.Name != key.Name {
			continue
		}
		if c != nil && c.UID == uid && b.ours(c) && b.prep.sameAllocation(c, pc) == nil {
			continue
		}
		if err := b.prep.prebindRelease(ctx, uid); err != nil {
			return err
		}
	}
	if !b.ours(c) {
		return nil
	}
	if b.failedReported(c) {
		// Its outcome is final until the scheduler deallocates it (which
		// clears its status.devices): a second try would find the device
		// Unhealthy from the first and replace the step's reason.
		b.log.WithFields(logrus.Fields{"claim": key.String(), "resourceVersion": c.ResourceVersion}).
			Info("claim not prepared again: its failure to prepare before binding is reported, the scheduler deallocates it")
		return nil
	}
	return b.prep.prebindPrepare(ctx, c)
}

// failedReported reports whether claim c's status has the driver's failure
// condition True on a device of this node. The API server keeps only
// entries of allocated devices in status.devices, so such an entry is of
// c's current allocation.
func (b *prebinder) failedReported(c *resourceapi.ResourceClaim) bool {
	for _, d := range c.Status.Devices {
		if d.Driver == b.driver && bindmarker.NodeOfPool(d.Pool) == b.node &&
			apimeta.IsStatusConditionTrue(d.Conditions, b.driver+"/"+ConditionPrepareFailed) {
			return true
		}
	}
	return false
}
