package kubeletsim

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

// TestPodLatencies: binding → prepared per pod takes the audit log's
// binding where it has the pod, else the watch's; a pod not prepared is
// left out.
func TestPodLatencies(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	k := NewPods(nil, "fleet", nil, func(string, ...any) {})
	k.pods = map[string]*podTimes{
		"a": {bound: ms(100), prepared: ms(150), call: 5 * time.Millisecond},  // audit: bound at 90
		"b": {bound: ms(200), prepared: ms(400), call: 40 * time.Millisecond}, // the watch's time
		"c": {bound: ms(300)},                                                 // not prepared
	}
	b2p, calls := k.Latencies([]string{"a", "b", "c"}, map[string]time.Time{"a": ms(90)})
	if !slices.Equal(b2p, []time.Duration{60 * time.Millisecond, 200 * time.Millisecond}) {
		t.Errorf("binding to prepared %v, want [60ms 200ms]", b2p)
	}
	if !slices.Equal(calls, []time.Duration{5 * time.Millisecond, 40 * time.Millisecond}) {
		t.Errorf("calls %v, want [5ms 40ms]", calls)
	}
	// The watch's delay, part of binding → prepared: only for a pod that
	// the audit log and the watch both saw bound.
	if d := k.WatchDelays([]string{"a", "b", "c"}, map[string]time.Time{"a": ms(90), "c": ms(280)}); !slices.Equal(d, []time.Duration{10 * time.Millisecond, 20 * time.Millisecond}) {
		t.Errorf("watch delays %v, want [10ms 20ms]", d)
	}
}

// TestLastPrepared: the latest preparation of the pods named, and only
// once every one of them was prepared.
func TestLastPrepared(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	k := NewPods(nil, "fleet", nil, func(string, ...any) {})
	k.pods = map[string]*podTimes{
		"a": {bound: ms(100), prepared: ms(900)},
		"b": {bound: ms(200), prepared: ms(400)},
		"c": {bound: ms(300)}, // not prepared
		"d": {bound: ms(50), prepared: ms(5000)},
	}
	for _, tc := range []struct {
		names []string
		want  time.Time
		ok    bool
	}{
		{[]string{"a", "b"}, ms(900), true},
		{[]string{"b"}, ms(400), true},
		{[]string{"a", "b", "c"}, time.Time{}, false},
		{[]string{"a", "x"}, time.Time{}, false}, // never seen
		{nil, time.Time{}, false},
	} {
		t.Run(strings.Join(tc.names, ","), func(t *testing.T) {
			got, ok := k.LastPrepared(tc.names)
			if !got.Equal(tc.want) || ok != tc.ok {
				t.Errorf("LastPrepared(%v) = %v, %v; want %v, %v", tc.names, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestStandInFollowsClaim: the kubelet stand-in queues a bound pod once,
// and prepares the claim its status names at each try, as the kubelet
// takes it from the pod it syncs: when the status names another claim
// after the binding, the new one is tried, and the pod's diagnostics list
// both.
func TestStandInFollowsClaim(t *testing.T) {
	var logged []string
	k := NewPods(nil, "fleet", nil, func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) })
	work := make(chan prepareWork, 4)
	k.work["n1"] = work
	pod := func(node, claim string) Pod { return Pod{Name: "p", Node: node, Claim: claim} }
	k.Observe(pod("", "c1"), time.Now())   // not bound yet
	k.Observe(pod("n1", ""), time.Now())   // bound, no claim yet
	k.Observe(pod("n1", "c1"), time.Now()) // bound with its claim: queued
	k.Observe(pod("n1", "c1"), time.Now()) // the same again: nothing
	k.Observe(pod("n1", "c2"), time.Now()) // another claim named
	if len(work) != 1 {
		t.Fatalf("%d work items queued, want 1", len(work))
	}
	if w := <-work; w.pod != "p" {
		t.Errorf("work for pod %q, want p", w.pod)
	}
	if got := k.pods["p"].lastClaim(); got != "c2" {
		t.Errorf("the claim to prepare: %q, want c2 (the one the status names now)", got)
	}
	if got := k.pods["p"].claims; !slices.Equal(got, []string{"c1", "c2"}) {
		t.Errorf("claims seen %v, want [c1 c2]", got)
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "names claim c2 now, after c1") {
		t.Errorf("logged %q, want one line saying the claim changed", logged)
	}
	if got := k.pending([]string{"p"}, 5); !strings.Contains(got, "claims in its status c1 then c2") {
		t.Errorf("pending: %s", got)
	}
}

// fakePodAPI answers a claim's UID (after failing the first ask, when
// failFirst) and records deletions.
type fakePodAPI struct {
	mu                     sync.Mutex
	failFirst              bool
	asked                  int
	deletedPods, deletedCs []string
}

func (a *fakePodAPI) ClaimUID(_ context.Context, name string) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked++
	if a.failFirst && a.asked == 1 {
		return "", context.DeadlineExceeded
	}
	return "uid-" + name, nil
}

func (a *fakePodAPI) DeletePod(_ context.Context, name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.deletedPods = append(a.deletedPods, name)
	return nil
}

func (a *fakePodAPI) DeleteClaim(_ context.Context, name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.deletedCs = append(a.deletedCs, name)
	return nil
}

// fakeDriver records the claims it prepared and unprepared.
type fakeDriver struct {
	mu                   sync.Mutex
	prepared, unprepared []string
}

func (d *fakeDriver) Prepare(_ context.Context, c *drav1.Claim) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.prepared = append(d.prepared, c.Namespace+"/"+c.Name+"/"+c.Uid)
	return nil
}

func (d *fakeDriver) Unprepare(_ context.Context, c *drav1.Claim) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.unprepared = append(d.unprepared, c.Name)
	return nil
}

// TestPodsPrepareAndFinish: a pod bound with a claim is prepared on its
// node's driver, with the claim's UID, after a failed try is retried;
// Finish deletes it, unprepares and deletes its claim, and its deletion
// is no failure; a pod deleted otherwise, or evicted, is one.
func TestPodsPrepareAndFinish(t *testing.T) {
	api, drv := &fakePodAPI{failFirst: true}, &fakeDriver{}
	k := NewPods(api, "fleet", map[string]NodeDriver{"n1": drv}, func(string, ...any) {})
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); k.Wait() }()
	k.Run(ctx)
	t0 := time.Now()
	k.Created("p", t0)
	k.Observe(Pod{Name: "p", Node: "n1", Claim: "p-dev"}, t0.Add(time.Millisecond))
	if err := k.WaitPrepared(ctx, []string{"p"}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	drv.mu.Lock()
	if !slices.Equal(drv.prepared, []string{"fleet/p-dev/uid-p-dev"}) {
		t.Errorf("prepared %v, want the claim p-dev with its UID, once", drv.prepared)
	}
	drv.mu.Unlock()
	if n := k.Errors(); n != 1 {
		t.Errorf("%d failed calls, want 1 (the first claim GET)", n)
	}
	if b, p, missed := k.Rates([]string{"p"}, nil); b <= 0 || p <= 0 || missed != 1 {
		t.Errorf("rates %g bound/s, %g prepared/s, %d bindings missed; want both above 0, 1 missed", b, p, missed)
	}
	if err := k.Finish(ctx, []string{"p"}); err != nil {
		t.Fatal(err)
	}
	k.Observe(Pod{Name: "p", Deleted: true}, time.Now())
	api.mu.Lock()
	if !slices.Equal(api.deletedPods, []string{"p"}) || !slices.Equal(api.deletedCs, []string{"p-dev"}) {
		t.Errorf("deleted pods %v, claims %v; want [p], [p-dev]", api.deletedPods, api.deletedCs)
	}
	api.mu.Unlock()
	if !slices.Equal(drv.unprepared, []string{"p-dev"}) {
		t.Errorf("unprepared %v, want [p-dev]", drv.unprepared)
	}
	k.Observe(Pod{Name: "q", Deleted: true}, time.Now())
	k.Observe(Pod{Name: "r", Failed: "DisruptionTarget (evicted)"}, time.Now())
	got := k.Failures()
	slices.Sort(got)
	if !slices.Equal(got, []string{"q: deleted", "r: DisruptionTarget (evicted)"}) {
		t.Errorf("failures %q", got)
	}
	if err := k.WaitPrepared(ctx, []string{"p", "r"}, time.Second); err == nil || !strings.Contains(err.Error(), "1 of 2 pods failed") {
		t.Errorf("waiting with a pod failed: %v", err)
	}
}
