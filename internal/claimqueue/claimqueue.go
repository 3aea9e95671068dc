// Package claimqueue watches ResourceClaims and hands them, one at a
// time, to a sync function: a claim that changed (added, updated,
// deleted) is queued by its namespace and name, and sync gets it as the
// watch has it now (nil when gone); an error queues it again, rate
// limited. The bind marker (all claims) and each node's DRA driver (the
// claims labelled for its node) both work so.
package claimqueue

import (
	"context"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Sync brings claim key in step; c is the claim as the watch has it now,
// nil when it is gone. An error queues the key again, rate limited.
type Sync func(ctx context.Context, key types.NamespacedName, c *resourceapi.ResourceClaim) error

// Queue is one watch of claims and its worker.
type Queue struct {
	Client kubernetes.Interface
	// Name names the queue (its metrics, logs).
	Name string
	// LabelSelector, when set, watches only the claims it selects (a
	// selector the API server applies).
	LabelSelector string
	// Resync (default none) lists the claims again at this interval.
	Resync time.Duration
	// Want, when set, queues only the claims it wants (deleted ones
	// always); nil: every claim.
	Want func(c *resourceapi.ResourceClaim) bool
	Sync Sync
	// Started, when set, is called once the watch has synced, before the
	// first key is worked on, with a func that queues more keys (claims
	// known from elsewhere, to look at again).
	Started func(add func(types.NamespacedName))
	// Failed, when set, is told of each failed sync.
	Failed func(key types.NamespacedName, err error)
}

// Run watches and works until ctx is done; every goroutine it started has
// ended when it returns.
func (q *Queue) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(q.Client, q.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = q.LabelSelector }))
	inf := factory.Resource().V1().ResourceClaims().Informer()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName](),
		workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: q.Name})
	add := func(obj any, deleted bool) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if c, ok := obj.(*resourceapi.ResourceClaim); ok && (deleted || q.Want == nil || q.Want(c)) {
			queue.Add(types.NamespacedName{Namespace: c.Namespace, Name: c.Name})
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { add(obj, false) },
		UpdateFunc: func(_, obj any) { add(obj, false) },
		DeleteFunc: func(obj any) { add(obj, true) },
	}); err != nil {
		return fmt.Errorf("%s: claim informer: %w", q.Name, err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		queue.ShutDown()
		return nil
	}
	if q.Started != nil {
		q.Started(func(k types.NamespacedName) { queue.Add(k) })
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for q.next(ctx, queue, inf.GetStore()) {
		}
	}()
	<-ctx.Done()
	queue.ShutDown()
	<-done
	return nil
}

// next works on the next key of queue; false once it shut down.
func (q *Queue) next(ctx context.Context, queue workqueue.TypedRateLimitingInterface[types.NamespacedName], store cache.Store) bool {
	key, shutdown := queue.Get()
	if shutdown {
		return false
	}
	defer queue.Done(key)
	var c *resourceapi.ResourceClaim
	if obj, exists, err := store.GetByKey(key.String()); err == nil && exists {
		c = obj.(*resourceapi.ResourceClaim)
	}
	if err := q.Sync(ctx, key, c); err != nil {
		if ctx.Err() == nil {
			if q.Failed != nil {
				q.Failed(key, err)
			}
			queue.AddRateLimited(key)
		}
		return true
	}
	queue.Forget(key)
	return true
}
