package dra

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
)

// TestFirstPublishAtOnce: the driver's slices are in
// the API before the ResourceSlice controller's informer starts its
// watch, so before that informer can have synced: the helper's controller
// looks at its sync once a second, and every slice it writes itself comes
// after it synced. The order of the fake clientset's calls tells it, not
// a timing.
func TestFirstPublishAtOnce(t *testing.T) {
	h := newHarness(t, nil)
	var mu sync.Mutex
	var calls []string
	record := func(verb string) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, verb)
	}
	h.client.PrependReactor("create", "resourceslices", func(clienttesting.Action) (bool, runtime.Object, error) {
		record("create")
		return false, nil, nil
	})
	h.client.PrependWatchReactor("resourceslices", func(clienttesting.Action) (bool, watch.Interface, error) {
		record("watch")
		return false, nil, nil
	})
	h.start()
	h.waitFor("4 devices published", func() bool { return len(h.published()) == 4 })
	mu.Lock()
	defer mu.Unlock()
	c, w := slices.Index(calls, "create"), slices.Index(calls, "watch")
	if c < 0 || w < 0 || c > w {
		t.Fatalf("ResourceSlice calls %v: the first slice was not created before the ResourceSlice controller's informer watched "+
			"(the controller writes only after its informer synced, which it checks once a second)", calls)
	}
}

// doneQueue is the controller's work queue, telling which pools it
// finished a sync of.
type doneQueue struct {
	workqueue.TypedRateLimitingInterface[string]
	done chan string
}

func (q *doneQueue) Done(item string) {
	q.TypedRateLimitingInterface.Done(item)
	select {
	case q.done <- item:
	default:
	}
}

// TestFirstPublishAdopted: the slices publishAtOnce
// creates are those the ResourceSlice controller (the real one, v0.37.2,
// on the fake clientset) creates for the same pools (name prefix, owner,
// pool, spec), and a controller started after them adopts them: its first
// sync of every pool makes no create, update or delete. A pool of 70
// devices has two slices.
func TestFirstPublishAdopted(t *testing.T) {
	pools := Pools(testDriver, node, []Published{
		{Resource: resName, Kind: kindOf(t, "example.com", "sim"), IDPrefix: "sim", Snapshot: simDevices(4, node)},
		{Resource: "example.com/big", Kind: kindOf(t, "example.com", "big"), IDPrefix: "big", Snapshot: simDevices(70, node)},
	})
	if n := len(pools[PoolName(node, "big")].Slices); n != 2 {
		t.Fatalf("the big pool has %d slices, want 2", n)
	}
	run := func(t *testing.T, atOnce bool) (created []*resourceapi.ResourceSlice, stats resourceslice.Stats, controllerWrites []string) {
		t.Helper()
		client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})
		nameGenerated(client)
		var mu sync.Mutex
		started := false
		client.PrependReactor("*", "resourceslices", func(a clienttesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			switch a.GetVerb() {
			case "create":
				created = append(created, a.(clienttesting.CreateAction).GetObject().(*resourceapi.ResourceSlice).DeepCopy())
				fallthrough
			case "update", "delete", "patch":
				if started {
					controllerWrites = append(controllerWrites, a.GetVerb())
				}
			}
			return false, nil, nil
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if atOnce {
			if n := publishAtOnce(ctx, client, testDriver, node, "", nil, logs.Discard(), pools); n != 3 {
				t.Fatalf("publishAtOnce created %d slices, want 3", n)
			}
		}
		mu.Lock()
		started = true
		mu.Unlock()
		q := &doneQueue{TypedRateLimitingInterface: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
			done: make(chan string, 16)}
		c, err := resourceslice.StartController(ctx, resourceslice.Options{DriverName: testDriver, KubeClient: client,
			Owner: &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: node}, Resources: &resourceslice.DriverResources{Pools: pools}, Queue: q})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Stop()
		synced := map[string]bool{}
		timeout := time.After(deadline)
		for len(synced) < len(pools) {
			select {
			case p := <-q.done:
				synced[p] = true
			case <-timeout:
				t.Fatalf("the controller synced only %v within %s", synced, deadline)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		return created, c.GetStats(), controllerWrites
	}
	want, st, _ := run(t, false)
	if st.NumCreates != 3 {
		t.Fatalf("the controller alone created %d slices, want 3", st.NumCreates)
	}
	got, st, writes := run(t, true)
	if st != (resourceslice.Stats{}) || len(writes) > 0 {
		t.Errorf("the controller wrote slices created at once: %+v, calls %v", st, writes)
	}
	key := func(s *resourceapi.ResourceSlice) string { return s.GenerateName }
	slices.SortFunc(want, func(a, b *resourceapi.ResourceSlice) int {
		return strings.Compare(key(a)+a.Spec.Pool.Name, key(b)+b.Spec.Pool.Name)
	})
	slices.SortFunc(got, func(a, b *resourceapi.ResourceSlice) int {
		return strings.Compare(key(a)+a.Spec.Pool.Name, key(b)+b.Spec.Pool.Name)
	})
	if len(got) != len(want) {
		t.Fatalf("created %d slices, the controller %d", len(got), len(want))
	}
	for i := range want {
		w, g := want[i], got[i]
		// The created objects as the clientset saw them, named by the
		// reactor after the call: compare what the caller sent.
		if w.GenerateName != g.GenerateName || !apiequality.Semantic.DeepEqual(w.OwnerReferences, g.OwnerReferences) ||
			!apiequality.Semantic.DeepEqual(w.Spec, g.Spec) {
			t.Errorf("slice %d:\n created %s owners %+v pool %+v\n controller %s owners %+v pool %+v", i,
				g.GenerateName, g.OwnerReferences, g.Spec.Pool, w.GenerateName, w.OwnerReferences, w.Spec.Pool)
		}
	}
}
