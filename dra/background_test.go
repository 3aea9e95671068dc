package dra

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
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
	h.options = func(o *Options) { o.CleanupClient, o.Clock, o.CleanupInterval = bg.ResourceV1(), fc, time.Minute }
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

// TestCleanupFirstPassSpread: with a spread, the clean-up's first pass
// waits for its delay after the driver serves instead of running at once,
// so that the drivers of a fleet started or rolled at once do not look
// every claim up in the same second, and every interval in step after
// that. Without a spread it runs at once.
func TestCleanupFirstPassSpread(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
	}{
		{"no spread", 0},
		{"a delay", 40 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			gets := make(chan struct{}, 16)
			client.PrependReactor("get", "resourceclaims", func(clienttesting.Action) (bool, runtime.Object, error) {
				gets <- struct{}{}
				return false, nil, nil
			})
			fc := testingclock.NewFakeClock(time.Now())
			ready := make(chan struct{})
			close(ready)
			c := &staleCleaner{
				claims: func() map[types.UID]PreparedClaim {
					return map[types.UID]PreparedClaim{"u1": {Namespace: "default", Name: "c"}}
				},
				api: client.ResourceV1(), clock: fc, interval: time.Minute, grace: 5 * time.Minute,
				log:   logrus.NewEntry(logrus.New()),
				drop:  func(context.Context, types.UID, *logrus.Entry) error { return nil },
				ready: ready, firstDelay: tc.delay,
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = c.run(ctx) }()
			defer func() { cancel(); <-done }()
			// The cleaner waits on the fake clock: for its first delay,
			// or, past its first pass, for the interval's tick.
			deadline := time.Now().Add(10 * time.Second)
			for !fc.HasWaiters() {
				if time.Now().After(deadline) {
					t.Fatal("the clean-up never waited on its clock")
				}
				time.Sleep(time.Millisecond)
			}
			passed := len(gets) > 0
			if want := tc.delay == 0; passed != want {
				t.Fatalf("first pass before the clock moved: %v, want %v", passed, want)
			}
			if tc.delay == 0 {
				return
			}
			fc.Step(tc.delay - time.Second)
			select {
			case <-gets:
				t.Fatal("first pass a second before its delay")
			case <-time.After(50 * time.Millisecond):
			}
			fc.Step(time.Second)
			select {
			case <-gets:
			case <-time.After(10 * time.Second):
				t.Fatal("no first pass once its delay passed")
			}
		})
	}
}

// TestSpreadDelay: the first pass's delay is within (0, spread], and
// none without a spread.
func TestSpreadDelay(t *testing.T) {
	if d := spreadDelay(0); d != 0 {
		t.Errorf("spreadDelay(0) = %v, want 0", d)
	}
	seen := map[time.Duration]bool{}
	for range 200 {
		d := spreadDelay(time.Minute)
		if d <= 0 || d > time.Minute {
			t.Fatalf("spreadDelay(1m) = %v, want within (0, 1m]", d)
		}
		seen[d] = true
	}
	if len(seen) < 100 {
		t.Errorf("spreadDelay(1m): %d distinct delays in 200, want them spread", len(seen))
	}
}
