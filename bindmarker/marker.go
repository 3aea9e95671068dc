package bindmarker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
)

// Marker labels every ResourceClaim allocated devices of Driver that carry
// binding conditions with the node of those devices (NodeLabel =
// NodeValue): the one watch of every claim in the cluster, so that each
// node's driver watches only the claims of its node. A claim allocated
// again elsewhere is labelled again; a label is never removed (a claim
// deallocated keeps it, and its node's driver sees the deallocation).
type Marker struct {
	Client kubernetes.Interface
	// Driver is the DRA driver's name.
	Driver string
	Log    *logrus.Entry
	// Resync (default none) lists the claims again at this interval.
	Resync time.Duration
}

// nodeFor is the node claim c is to be labelled with, "" for none: the
// node of its devices of the driver that carry binding conditions (one
// node: the driver's devices are node-local).
func (m *Marker) nodeFor(c *resourceapi.ResourceClaim) string {
	if c.Status.Allocation == nil {
		return ""
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == m.Driver && len(r.BindingConditions) > 0 {
			return NodeOfPool(r.Pool)
		}
	}
	return ""
}

// Run marks claims until ctx is done; every goroutine it started has
// ended when it returns.
func (m *Marker) Run(ctx context.Context) error {
	log := m.Log
	if log == nil {
		log = logs.Discard()
	}
	factory := informers.NewSharedInformerFactory(m.Client, m.Resync)
	inf := factory.Resource().V1().ResourceClaims().Informer()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName](),
		workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "bind-marker"})
	enqueue := func(obj any) {
		if c, ok := obj.(*resourceapi.ResourceClaim); ok && m.nodeFor(c) != "" {
			queue.Add(types.NamespacedName{Namespace: c.Namespace, Name: c.Name})
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return fmt.Errorf("claim informer: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		queue.ShutDown()
		return nil
	}
	log.WithField("driver", m.Driver).Info("marking the claims allocated with the driver's binding conditions for their node")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m.next(ctx, queue, inf.GetStore(), log) {
		}
	}()
	<-ctx.Done()
	queue.ShutDown()
	<-done
	return nil
}

// next marks the next claim of queue; false once the queue shut down.
func (m *Marker) next(ctx context.Context, queue workqueue.TypedRateLimitingInterface[types.NamespacedName], store cache.Store, log *logrus.Entry) bool {
	key, shutdown := queue.Get()
	if shutdown {
		return false
	}
	defer queue.Done(key)
	obj, exists, err := store.GetByKey(key.String())
	if err != nil || !exists {
		queue.Forget(key)
		return true
	}
	c := obj.(*resourceapi.ResourceClaim)
	node := m.nodeFor(c)
	label, value := NodeLabel(m.Driver), NodeValue(node)
	if node == "" || c.Labels[label] == value {
		queue.Forget(key)
		return true
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{label: value}}})
	if _, err := m.Client.ResourceV1().ResourceClaims(c.Namespace).Patch(ctx, c.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		if ctx.Err() == nil {
			log.WithError(err).WithField("claim", key.String()).Warn("labelling a claim for its node's driver; tried again")
			queue.AddRateLimited(key)
		}
		return true
	}
	queue.Forget(key)
	log.WithField("claim", key.String()).WithField("node", node).Debug("claim labelled for its node's driver")
	return true
}
