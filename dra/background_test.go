package dra

import (
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"
)

// TestCleanupOwnClient: the stale-claim clean-up reads the checkpointed
// claims through a client of its own (Options.CleanupClient), never
// through the client the kubelet plugin helper reads the claims of each
// NodePrepareResources with: a client's requests share one client-side
// rate limit (client-go's 5 a second, 10 in a burst), and a pass over 60
// claims made the hot path's claim GET wait 300-400 ms. And no pass runs
// before the driver's first publish and its registration.
func TestCleanupOwnClient(t *testing.T) {
	h := newHarness(t, nil)
	bg := &fake.Clientset{}
	bg.AddReactor("*", "*", clienttesting.ObjectReaction(h.client.Tracker()))
	var mu sync.Mutex
	var order []string
	note := func(what string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, what)
	}
	h.client.PrependReactor("create", "resourceslices", func(clienttesting.Action) (bool, runtime.Object, error) {
		note("slice created")
		return false, nil, nil
	})
	bg.PrependReactor("get", "resourceclaims", func(clienttesting.Action) (bool, runtime.Object, error) {
		note("clean-up GET")
		return false, nil, nil
	})
	fc := testingclock.NewFakeClock(time.Now())
	h.options = func(o *Options) { o.CleanupClient, o.Clock, o.CleanupInterval = bg, fc, time.Minute }
	// A claim prepared by an earlier run: the clean-up has it to look up.
	h.start()
	c := h.claim("c", "sim-0")
	if r := h.prepare(c)[c.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	h.stop()
	mu.Lock()
	order = nil
	mu.Unlock()
	h.client.ClearActions()
	// Its slices gone, so that the next start creates them.
	h.deleteSlices()
	h.start()
	h.waitFor("the clean-up's first pass", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, o := range order {
			if o == "clean-up GET" {
				return true
			}
		}
		return false
	})
	mu.Lock()
	if len(order) == 0 || order[0] != "slice created" {
		t.Errorf("the clean-up ran before the first publish: %v", order)
	}
	mu.Unlock()
	for _, a := range h.client.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "resourceclaims" {
			t.Errorf("the clean-up read a claim through the helper's client: %v", a)
		}
	}
}
