package dra

import (
	"context"
	"fmt"
	"slices"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/cdi-device-plugin/cdi-device-plugin/bindmarker"
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
	factory := informers.NewSharedInformerFactoryWithOptions(b.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	inf := factory.Resource().V1().ResourceClaims().Informer()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName](),
		workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "prepare-before-bind"})
	enqueue := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if c, ok := obj.(*resourceapi.ResourceClaim); ok {
			queue.Add(types.NamespacedName{Namespace: c.Namespace, Name: c.Name})
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue,
	}); err != nil {
		return fmt.Errorf("claim informer: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		queue.ShutDown()
		return nil
	}
	// The claims prepared, or under way, before a restart: their
	// allocation is looked at again (released, completed or reported).
	for _, pc := range b.prep.checkpoint.Claims() {
		if pc.PreBind {
			queue.Add(types.NamespacedName{Namespace: pc.Namespace, Name: pc.Name})
		}
	}
	b.log.WithField("selector", sel).Info("watching the claims to prepare before binding")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for b.next(ctx, queue, inf.GetStore()) {
		}
	}()
	<-ctx.Done()
	queue.ShutDown()
	<-done
	return nil
}

// next works on the next claim of queue; false once it shut down.
func (b *prebinder) next(ctx context.Context, queue workqueue.TypedRateLimitingInterface[types.NamespacedName], store cache.Store) bool {
	key, shutdown := queue.Get()
	if shutdown {
		return false
	}
	defer queue.Done(key)
	var c *resourceapi.ResourceClaim
	if obj, exists, err := store.GetByKey(key.String()); err == nil && exists {
		c = obj.(*resourceapi.ResourceClaim)
	}
	if err := b.sync(ctx, key, c); err != nil {
		if ctx.Err() == nil {
			b.log.WithError(err).WithField("claim", key.String()).Warn("preparing or releasing a claim before binding; tried again")
			queue.AddRateLimited(key)
		}
		return true
	}
	queue.Forget(key)
	return true
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
	return b.prep.prebindPrepare(ctx, c)
}
