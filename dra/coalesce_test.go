package dra

import (
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestCoalescer: the first publish goes at once; a burst of changes
// right after it costs at most one publish per interval, the last one
// (trailing) at most an interval after the burst's end; after a quiet
// interval a change goes at once again.
func TestCoalescer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		burst time.Duration // changes every 50 ms for this long
	}{
		{"half a second", 500 * time.Millisecond},
		{"three seconds", 3 * time.Second},
		{"ten seconds", 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			c := newCoalescer(clk, time.Second)
			if !c.ready() {
				t.Fatal("the first publish waits")
			}
			c.published()
			state, sent, publishes := 0, -1, 0
			publish := func() { sent = state; publishes++; c.published() }
			step := 50 * time.Millisecond
			for at := time.Duration(0); at < tc.burst; at += step {
				clk.Step(step)
				state++ // a health flip
				select {
				case <-c.C():
					c.fired()
					publish()
					continue
				default:
				}
				if c.ready() {
					publish()
				}
			}
			end := clk.Now()
			for c.C() != nil {
				clk.Step(step)
				select {
				case <-c.C():
					c.fired()
					publish()
				default:
				}
			}
			if lim := int(math.Ceil(tc.burst.Seconds())); publishes > lim {
				t.Errorf("%d changes in %s: %d publishes, want at most %d", state, tc.burst, publishes, lim)
			}
			if sent != state {
				t.Errorf("the last state (%d) not published: the last publish sent %d", state, sent)
			}
			if late := clk.Since(end); late > time.Second {
				t.Errorf("the last state published %s after the burst's end, want at most 1s", late)
			}
			clk.Step(2 * time.Second)
			if !c.ready() {
				t.Error("after a quiet interval a change waits")
			}
		})
	}
}

// TestHealthStormCoalesced: a device's health flipping 20
// times a second for 2 s costs at most one ResourceSlice write a second
// (plus the leading one: ceil(storm seconds)+1), and the last state (healthy) is published
// within a second of the storm's end.
func TestHealthStormCoalesced(t *testing.T) {
	h := newHarness(t, nil)
	var updates atomic.Int64
	h.client.PrependReactor("update", "resourceslices", func(clienttesting.Action) (bool, runtime.Object, error) {
		updates.Add(1)
		return false, nil, nil
	})
	h.start()
	h.waitFor("4 devices without taints", func() bool {
		p := h.published()
		return len(p) == 4 && len(p["sim-2"].Taints) == 0
	})
	// A quiet interval after the start's publishes.
	time.Sleep(1100 * time.Millisecond)
	before := updates.Load()
	dev := filepath.Join(h.dev, "sim-2")
	const burst = 2 * time.Second
	start := time.Now()
	flips := 0
	for time.Since(start) < burst {
		if err := os.Remove(dev); err != nil {
			t.Fatal(err)
		}
		time.Sleep(25 * time.Millisecond)
		testutil.Mknod(t, dev, 1, 3)
		time.Sleep(25 * time.Millisecond)
		flips++
	}
	end := time.Now()
	h.waitFor("sim-2 healthy after the storm", func() bool {
		return len(h.published()["sim-2"].Taints) == 0 && updates.Load() > before
	})
	if late := time.Since(end); late > 1500*time.Millisecond {
		t.Errorf("the last state published %s after the storm's end, want about 1s at most", late)
	}
	// Anything pending has gone: a trailing publish comes within 1 s.
	time.Sleep(1100 * time.Millisecond)
	got := updates.Load() - before
	// One a second, plus the leading one.
	if lim := int64(math.Ceil(end.Sub(start).Seconds())) + 1; got > lim {
		t.Errorf("%d health flips in %s: %d ResourceSlice updates, want at most %d", flips, end.Sub(start), got, lim)
	}
	if len(h.published()["sim-2"].Taints) != 0 {
		t.Error("sim-2 tainted after the storm: the last state was not published")
	}
}
