package kubeletsim

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

// Pods is the kubelet's part for pods that claim DRA devices, for many
// nodes at once: it follows the pods of one namespace (Observe, fed by one
// watch of them all: one per node would cost the API server a watch per
// node for the same events), and each node prepares its bound pods'
// claims one at a time, retrying a failed call every 200 ms as the
// kubelet retries a pod's sync. It records when each pod was created,
// bound and prepared, and how long its NodePrepareResources call took.
type Pods struct {
	api       PodAPI
	namespace string
	logf      func(string, ...any)
	nodes     map[string]NodeDriver

	mu      sync.Mutex
	pods    map[string]*podTimes
	queued  map[string]bool
	errors  atomic.Int64 // failed NodePrepareResources calls
	changed chan struct{}

	work map[string]chan prepareWork
	wg   sync.WaitGroup
}

// PodAPI is what Pods asks the API server, in its namespace.
type PodAPI interface {
	// ClaimUID reads the ResourceClaim name: its UID.
	ClaimUID(ctx context.Context, name string) (string, error)
	// DeletePod and DeleteClaim delete a pod at once and a claim; one gone
	// already is no error.
	DeletePod(ctx context.Context, name string) error
	DeleteClaim(ctx context.Context, name string) error
}

// NodeDriver is a node's DRA driver as Pods calls it: Prepare and
// Unprepare return an error unless the driver answered the claim without
// one.
type NodeDriver interface {
	Prepare(ctx context.Context, c *drav1.Claim) error
	Unprepare(ctx context.Context, c *drav1.Claim) error
}

// Pod is what Pods reads of a pod in one watch event.
type Pod struct {
	Name string
	// Node is the node it is bound to ("" while it is not).
	Node string
	// Claim is the claim its status names now ("" while none).
	Claim string
	// Failed says why it failed ("" while it has not): evicted, its phase
	// Failed.
	Failed string
	// Deleted is true when the event is its deletion.
	Deleted bool
}

// podTimes are when a pod was created (POST answered), bound (the watch
// showed its node) and prepared (NodePrepareResources answered).
type podTimes struct {
	created, bound, prepared time.Time
	node                     string
	failed                   string        // why the pod failed: evicted, deleted
	claim                    *drav1.Claim  // the claim prepared, once it is
	released                 bool          // ended by Finish: its deletion is no failure
	call                     time.Duration // the NodePrepareResources call that succeeded
	tries                    int           // failed NodePrepareResources (or claim GET) calls
	lastErr                  string        // the last one's error
	// claims are the claim names the pod's status gave, in turn: more
	// than one when the resourceclaim controller named another claim
	// after the pod was bound. The latest is prepared, as the kubelet
	// takes it from the pod it syncs.
	claims []string
}

// lastClaim is the claim the pod's status names now ("" for none yet).
func (t *podTimes) lastClaim() string {
	if len(t.claims) == 0 {
		return ""
	}
	return t.claims[len(t.claims)-1]
}

type prepareWork struct {
	pod string
}

// NewPods is the stand-in of nodes (by name) for the pods of namespace;
// logf takes what it notices (a failed call, a claim renamed).
func NewPods(api PodAPI, namespace string, nodes map[string]NodeDriver, logf func(string, ...any)) *Pods {
	k := &Pods{api: api, namespace: namespace, logf: logf, nodes: nodes, pods: map[string]*podTimes{}, queued: map[string]bool{},
		changed: make(chan struct{}, 1), work: map[string]chan prepareWork{}}
	for name := range nodes {
		k.work[name] = make(chan prepareWork, 1024)
	}
	return k
}

// Run prepares the pods' claims, a goroutine per node, until ctx is done;
// Wait joins them.
func (k *Pods) Run(ctx context.Context) {
	for name, ch := range k.work {
		n := k.nodes[name]
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			k.worker(ctx, name, n, ch)
		}()
	}
}

// Wait joins Run's goroutines (after its ctx is done).
func (k *Pods) Wait() { k.wg.Wait() }

// Created records a pod's creation.
func (k *Pods) Created(name string, at time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pods[name] == nil {
		k.pods[name] = &podTimes{}
	}
	k.pods[name].created = at
}

// Errors is the number of failed NodePrepareResources (or claim GET)
// calls so far.
func (k *Pods) Errors() int64 { return k.errors.Load() }

// Observe takes a pod as a watch event showed it at the time at: a pod
// bound with a claim is queued on its node, once.
func (k *Pods) Observe(p Pod, at time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	t := k.pods[p.Name]
	if t == nil {
		t = &podTimes{}
		k.pods[p.Name] = t
	}
	defer k.notify()
	if p.Deleted {
		if !t.released {
			t.failed = "deleted"
		}
		return
	}
	if p.Failed != "" {
		t.failed = p.Failed
	}
	if p.Node == "" {
		return
	}
	if t.bound.IsZero() {
		t.bound, t.node = at, p.Node
	}
	if p.Claim == "" {
		return
	}
	if last := t.lastClaim(); last != p.Claim {
		if last != "" {
			k.logf("pod %s on %s: its status names claim %s now, after %s", p.Name, p.Node, p.Claim, last)
		}
		t.claims = append(t.claims, p.Claim)
	}
	ch := k.work[p.Node]
	if k.queued[p.Name] || ch == nil {
		return
	}
	k.queued[p.Name] = true
	ch <- prepareWork{pod: p.Name}
}

func (k *Pods) notify() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

// worker prepares the node's pods in turn.
func (k *Pods) worker(ctx context.Context, node string, n NodeDriver, ch <-chan prepareWork) {
	for {
		var w prepareWork
		select {
		case <-ctx.Done():
			return
		case w = <-ch:
		}
		var claim *drav1.Claim
		var call time.Duration
		for {
			// The claim the pod's status names at this try.
			k.mu.Lock()
			name := k.pods[w.pod].lastClaim()
			k.mu.Unlock()
			uid, err := k.api.ClaimUID(ctx, name)
			if err == nil {
				claim = &drav1.Claim{Namespace: k.namespace, Name: name, Uid: uid}
				start := time.Now()
				err = n.Prepare(ctx, claim)
				call = time.Since(start)
			}
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			k.errors.Add(1)
			k.mu.Lock()
			t := k.pods[w.pod]
			t.tries++
			t.lastErr = err.Error()
			tries := t.tries
			k.mu.Unlock()
			if tries == 1 || tries%50 == 0 {
				k.logf("node %s, pod %s: preparing claim %s (try %d): %v", node, w.pod, name, tries, err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
		k.mu.Lock()
		t := k.pods[w.pod]
		t.prepared, t.claim, t.call = time.Now(), claim, call
		k.mu.Unlock()
		k.notify()
	}
}

// Finish ends the pods named as their kubelets and the garbage collector
// would once the pods are deleted: each pod is deleted, its claim
// unprepared (the kubelet), then deleted (the garbage collector deletes a
// claim whose owning pod is gone; the resourceclaim controller leaves
// that to it). The resourceclaim controller then deallocates the claims
// and lets them go. A pod ended as Succeeded instead is no good: the
// controller deletes the claim of a pod that is done, and creates it again
// for the pod, over and over.
func (k *Pods) Finish(ctx context.Context, names []string) error {
	k.mu.Lock()
	for _, name := range names {
		if t := k.pods[name]; t != nil {
			t.released = true
		}
	}
	k.mu.Unlock()
	var g errgroup.Group
	g.SetLimit(16)
	for _, name := range names {
		g.Go(func() error {
			if err := k.api.DeletePod(ctx, name); err != nil {
				return fmt.Errorf("deleting pod %s: %w", name, err)
			}
			k.mu.Lock()
			t := k.pods[name]
			var c *drav1.Claim
			var n NodeDriver
			if t != nil {
				c, n = t.claim, k.nodes[t.node]
			}
			k.mu.Unlock()
			if c == nil || n == nil {
				return nil
			}
			if err := n.Unprepare(ctx, c); err != nil {
				return fmt.Errorf("pod %s: unpreparing %w", name, err)
			}
			if err := k.api.DeleteClaim(ctx, c.Name); err != nil {
				return fmt.Errorf("pod %s: deleting claim %s: %w", name, c.Name, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// count returns how many of the pods named are bound and prepared, and
// how many failed.
func (k *Pods) count(names []string) (bound, prepared, failed int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, name := range names {
		t := k.pods[name]
		if t == nil {
			continue
		}
		if !t.bound.IsZero() {
			bound++
		}
		if !t.prepared.IsZero() {
			prepared++
		}
		if t.failed != "" {
			failed++
		}
	}
	return bound, prepared, failed
}

// LastPrepared is when the last of the pods named was prepared; ok is
// false unless every one of them was (and for none).
func (k *Pods) LastPrepared(names []string) (last time.Time, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, name := range names {
		t := k.pods[name]
		if t == nil || t.prepared.IsZero() {
			return time.Time{}, false
		}
		if t.prepared.After(last) {
			last = t.prepared
		}
	}
	return last, len(names) > 0
}

// WaitPrepared waits until every pod named is prepared (or one failed).
func (k *Pods) WaitPrepared(ctx context.Context, names []string, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		b, p, f := k.count(names)
		switch {
		case f > 0:
			return fmt.Errorf("%d of %d pods failed", f, len(names))
		case p == len(names):
			return nil
		}
		select {
		case <-k.changed:
		case <-deadline.C:
			return fmt.Errorf("%d of %d pods bound, %d prepared within %s; not prepared: %s", b, len(names), p, timeout, k.pending(names, 5))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// pending describes at most most of the pods named that are not
// prepared: bound to which node, queued, and the last error.
func (k *Pods) pending(names []string, most int) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	left := 0
	for _, name := range names {
		t := k.pods[name]
		if t != nil && !t.prepared.IsZero() {
			continue
		}
		left++
		if len(out) == most {
			continue
		}
		switch {
		case t == nil || t.bound.IsZero():
			out = append(out, name+" (not seen bound)")
		default:
			out = append(out, fmt.Sprintf("%s (node %s, queued %v, claims in its status %s, %d failed tries, last: %s)", name, t.node, k.queued[name], strings.Join(t.claims, " then "), t.tries, t.lastErr))
		}
	}
	return fmt.Sprintf("%d: %s", left, strings.Join(out, "; "))
}

// Rates are pods per second from the first creation to the last binding,
// taken from binds (the API server's audit log) where it has the pod and
// from the pod watch where not (missed counts those), and to the last
// preparation.
func (k *Pods) Rates(names []string, binds map[string]time.Time) (bound, prepared float64, missed int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var first, lastB, lastP time.Time
	for _, name := range names {
		t := k.pods[name]
		if t == nil {
			continue
		}
		if first.IsZero() || t.created.Before(first) {
			first = t.created
		}
		b, ok := boundAt(name, t, binds)
		if !ok {
			missed++
		}
		if b.After(lastB) {
			lastB = b
		}
		if t.prepared.After(lastP) {
			lastP = t.prepared
		}
	}
	rate := func(last time.Time) float64 {
		if d := last.Sub(first); d > 0 {
			return float64(len(names)) / d.Seconds()
		}
		return 0
	}
	return rate(lastB), rate(lastP), missed
}

// boundAt is when pod name was bound: the audit log's binding (ok) where
// binds has it, else when the pod watch showed it bound.
func boundAt(name string, t *podTimes, binds map[string]time.Time) (at time.Time, ok bool) {
	if at, ok = binds[name]; ok {
		return at, true
	}
	return t.bound, false
}

// Latencies are, for each of the pods named that was prepared, the time
// from its binding (from binds, the audit log's, else the watch's) to its
// preparation, and how long its NodePrepareResources call took.
func (k *Pods) Latencies(names []string, binds map[string]time.Time) (bindToPrepared, calls []time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, name := range names {
		t := k.pods[name]
		if t == nil || t.prepared.IsZero() {
			continue
		}
		if b, _ := boundAt(name, t, binds); !b.IsZero() {
			bindToPrepared = append(bindToPrepared, t.prepared.Sub(b))
		}
		calls = append(calls, t.call)
	}
	return bindToPrepared, calls
}

// WatchDelays are, for each of the pods named that the audit log (binds)
// and the stand-in's pod watch both saw bound, how much later the watch
// showed the binding: the part of binding → prepared that is the
// stand-in's (a kubelet's own watch has one too, of its own length).
func (k *Pods) WatchDelays(names []string, binds map[string]time.Time) []time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []time.Duration
	for _, name := range names {
		t, b := k.pods[name], binds[name]
		if t == nil || t.bound.IsZero() || b.IsZero() {
			continue
		}
		out = append(out, t.bound.Sub(b))
	}
	return out
}

// Failures lists the pods that failed, with why.
func (k *Pods) Failures() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for name, t := range k.pods {
		if t.failed != "" {
			out = append(out, name+": "+t.failed)
		}
	}
	return out
}
