package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/target"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
)

// fleetNode is one node of the fleet: its driver process and the
// kubelet's part for it (the registration, the PodResources socket, the
// NodePrepareResources calls of the pods bound to it).
type fleetNode struct {
	name string
	t    target.Target
	r    *target.Run
	pr   *kubeletsim.PodResources

	mu  sync.Mutex
	p   *proc.Proc
	dra *kubeletsim.DRA
	// registered is closed when the current process registered.
	registered chan struct{}
}

// startFleetNode makes the node's directories and starts its driver.
func startFleetNode(t target.Target, s target.Settings, kubeconfig, name string) (*fleetNode, error) {
	r, err := t.Prepare(s.TmpfsDir, &target.Cluster{Kubeconfig: kubeconfig, NodeName: name})
	if err != nil {
		return nil, err
	}
	n := &fleetNode{name: name, t: t, r: r}
	if n.pr, err = kubeletsim.ServePodResources(r.Host.PodResources); err != nil {
		r.Cleanup()
		return nil, err
	}
	if err := n.start(); err != nil {
		n.stop()
		return nil, err
	}
	return n, nil
}

// start starts a driver process; the previous one has ended.
func (n *fleetNode) start() error {
	p, err := proc.Start(n.r.Argv, n.r.Env, nil, n.r.Scratch)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.p, n.registered = p, make(chan struct{})
	n.mu.Unlock()
	return nil
}

// process is the current driver process.
func (n *fleetNode) process() *proc.Proc {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.p
}

// register registers the current process as the kubelet's plugin
// watcher would, polling the registration directory.
func (n *fleetNode) register(ctx context.Context, timeout time.Duration) error {
	n.mu.Lock()
	p, done := n.p, n.registered
	n.mu.Unlock()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		for _, sock := range sockets(n.r.Host.RegistrarDir) {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			d, err := kubeletsim.RegisterDRA(cctx, sock)
			cancel()
			if err == nil {
				n.mu.Lock()
				old := n.dra
				n.dra = d
				n.mu.Unlock()
				if old != nil {
					_ = old.Close()
				}
				close(done)
				return nil
			}
			last = err
		}
		switch {
		case p.Exited():
			return fmt.Errorf("node %s: the driver exited: %w: %s", n.name, p.Err(), p.LogTail(600))
		case time.Now().After(deadline):
			return fmt.Errorf("node %s: not registered within %s (last: %w): %s", n.name, timeout, last, p.LogTail(600))
		}
		if err := proc.Sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// restart ends the driver with SIGTERM and starts it again at once, as
// a DaemonSet's rolling update with maxUnavailable 100% (maxSurge 0)
// does; the kubelet's registration follows.
func (n *fleetNode) restart(ctx context.Context, term, regTimeout time.Duration) error {
	n.mu.Lock()
	old := n.dra
	n.dra = nil
	n.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	_, _ = n.process().Terminate(term)
	// The kubelet's plugin watcher sees the socket go; a new one comes
	// with the new process.
	if err := n.start(); err != nil {
		return err
	}
	return n.register(ctx, regTimeout)
}

// driver is the current process's DRA service, once it registered.
func (n *fleetNode) driver(ctx context.Context) (*kubeletsim.DRA, error) {
	n.mu.Lock()
	d, reg := n.dra, n.registered
	n.mu.Unlock()
	if d != nil {
		return d, nil
	}
	select {
	case <-reg:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	n.mu.Lock()
	d = n.dra
	n.mu.Unlock()
	if d == nil {
		return nil, errors.New("not registered")
	}
	return d, nil
}

// prepare calls NodePrepareResources for the claim of a pod, as the
// kubelet does before it starts the pod's containers; it waits for the
// driver to be registered.
func (n *fleetNode) prepare(ctx context.Context, c *drav1.Claim) error {
	d, err := n.driver(ctx)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, kubeletCallTimeout)
	defer cancel()
	resp, err := d.Prepare(cctx, c)
	if err != nil {
		return err
	}
	got, ok := resp.GetClaims()[c.Uid]
	if err := claimAnswer(c, ok, got.GetError()); err != nil {
		return err
	}
	if len(got.GetDevices()) != 1 {
		return fmt.Errorf("claim %s: %d devices answered, want 1", c.Name, len(got.GetDevices()))
	}
	return nil
}

// kubeletCallTimeout bounds each call to a driver, as the kubelet's does.
const kubeletCallTimeout = 30 * time.Second

// claimAnswer is the error of a driver's answer for claim c: none, not
// answered (ok false), or the driver's error message.
func claimAnswer(c *drav1.Claim, ok bool, msg string) error {
	switch {
	case !ok:
		return fmt.Errorf("claim %s not answered", c.Name)
	case msg != "":
		return fmt.Errorf("claim %s: %s", c.Name, msg)
	}
	return nil
}

// unprepare calls NodeUnprepareResources for a claim, as the kubelet does
// once the pod that held it is gone.
func (n *fleetNode) unprepare(ctx context.Context, c *drav1.Claim) error {
	d, err := n.driver(ctx)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, kubeletCallTimeout)
	defer cancel()
	resp, err := d.Unprepare(cctx, c)
	if err != nil {
		return err
	}
	got, ok := resp.GetClaims()[c.Uid]
	return claimAnswer(c, ok, got.GetError())
}

// rss is the driver's resident memory, bytes (0 when gone).
func (n *fleetNode) rss() int64 {
	s, err := proc.Read(n.process().Pid())
	if err != nil {
		return 0
	}
	return s.RSS
}

// deviceNodes are the char device nodes in the node's DevDir: those a
// driver of simulated devices made (none for a driver that makes none).
func (n *fleetNode) deviceNodes() ([]string, error) {
	ents, err := os.ReadDir(n.r.Host.DevDir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.Type()&os.ModeCharDevice != 0 {
			out = append(out, filepath.Join(n.r.Host.DevDir, e.Name()))
		}
	}
	return out, nil
}

func (n *fleetNode) stop() {
	n.mu.Lock()
	d, p := n.dra, n.p
	n.dra = nil
	n.mu.Unlock()
	if d != nil {
		_ = d.Close()
	}
	if p != nil && !p.Exited() {
		_, _ = p.Terminate(10 * time.Second)
	}
	if n.pr != nil {
		n.pr.Stop()
	}
	n.r.Cleanup()
}

// claimPod is a pod of 1 device claimed from the template tpl, with a
// container that never runs (nothing runs containers here).
func claimPod(name, tpl string) map[string]any {
	return map[string]any{"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": fleetNamespace},
		"spec": map[string]any{
			"automountServiceAccountToken":  false,
			"terminationGracePeriodSeconds": 0,
			"resourceClaims":                []any{map[string]any{"name": "dev", "resourceClaimTemplateName": tpl}},
			"containers": []any{map[string]any{"name": "c", "image": "registry.k8s.io/pause:3.10",
				"resources": map[string]any{"claims": []any{map[string]any{"name": "dev"}}}}},
		}}
}

// podTimes are when a pod was created (POST answered), bound (the watch
// showed its node) and prepared (NodePrepareResources answered).
type podTimes struct {
	created, bound, prepared time.Time
	node                     string
	failed                   string        // why the pod failed: evicted, deleted
	claim                    *drav1.Claim  // the claim prepared, once it is
	released                 bool          // ended by finish: its deletion is no failure
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

// kubelet is the kubelet stand-in of every node: one watch of the fleet's
// pods (one per node would cost the API server N watches for the same
// events), dispatched by node; each node prepares its pods' claims one at
// a time, retrying a failed call every 200 ms as the kubelet retries a
// pod's sync.
type kubelet struct {
	api   *apiclient.Client
	logf  func(string, ...any)
	nodes map[string]*fleetNode

	mu      sync.Mutex
	pods    map[string]*podTimes
	queued  map[string]bool
	errors  atomic.Int64 // failed NodePrepareResources calls
	changed chan struct{}

	work map[string]chan prepareWork
	wg   sync.WaitGroup
	w    *apiclient.Watcher
}

type prepareWork struct {
	pod string
}

func newKubelet(api *apiclient.Client, nodes []*fleetNode, logf func(string, ...any)) *kubelet {
	k := &kubelet{api: api, logf: logf, nodes: map[string]*fleetNode{}, pods: map[string]*podTimes{}, queued: map[string]bool{},
		changed: make(chan struct{}, 1), work: map[string]chan prepareWork{}}
	for _, n := range nodes {
		k.nodes[n.name] = n
		k.work[n.name] = make(chan prepareWork, 1024)
	}
	return k
}

// run watches the pods and prepares them until ctx is done.
func (k *kubelet) run(ctx context.Context) error {
	w, err := k.api.Watch(ctx, apiclient.PathPods(fleetNamespace), url.Values{}, k.event, k.logf)
	if err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}
	k.w = w
	for name, ch := range k.work {
		n := k.nodes[name]
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			k.worker(ctx, n, ch)
		}()
	}
	return nil
}

// wait joins the goroutines and the watch (after ctx is done).
func (k *kubelet) wait() {
	k.wg.Wait()
	if k.w != nil {
		k.w.Wait()
	}
}

// created records a pod's creation.
func (k *kubelet) created(name string, at time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pods[name] == nil {
		k.pods[name] = &podTimes{}
	}
	k.pods[name].created = at
}

func (k *kubelet) event(ev apiclient.Event) {
	var p apiclient.Pod
	if ev.Type == apiclient.Error || json.Unmarshal(ev.Object, &p) != nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	t := k.pods[p.Metadata.Name]
	if t == nil {
		t = &podTimes{}
		k.pods[p.Metadata.Name] = t
	}
	defer k.notify()
	if ev.Type == apiclient.Deleted {
		if !t.released {
			t.failed = "deleted"
		}
		return
	}
	for _, c := range p.Status.Conditions {
		if c.Type == "DisruptionTarget" && c.Status == "True" {
			t.failed = "DisruptionTarget (evicted)"
		}
	}
	if p.Status.Phase == "Failed" {
		t.failed = "phase Failed"
	}
	if p.Spec.NodeName == "" {
		return
	}
	if t.bound.IsZero() {
		t.bound, t.node = ev.At, p.Spec.NodeName
	}
	var claim string
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			claim = *s.ResourceClaimName
		}
	}
	if claim == "" {
		return
	}
	if last := t.lastClaim(); last != claim {
		if last != "" {
			k.logf("pod %s on %s: its status names claim %s now, after %s", p.Metadata.Name, p.Spec.NodeName, claim, last)
		}
		t.claims = append(t.claims, claim)
	}
	ch := k.work[p.Spec.NodeName]
	if k.queued[p.Metadata.Name] || ch == nil {
		return
	}
	k.queued[p.Metadata.Name] = true
	ch <- prepareWork{pod: p.Metadata.Name}
}

func (k *kubelet) notify() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

// worker prepares the node's pods in turn.
func (k *kubelet) worker(ctx context.Context, n *fleetNode, ch <-chan prepareWork) {
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
			var c apiclient.ResourceClaim
			err := k.api.Do(ctx, http.MethodGet, apiclient.PathClaims(fleetNamespace)+"/"+name, nil, &c)
			if err == nil {
				claim = &drav1.Claim{Namespace: fleetNamespace, Name: name, Uid: c.Metadata.UID}
				start := time.Now()
				err = n.prepare(ctx, claim)
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
				k.logf("node %s, pod %s: preparing claim %s (try %d): %v", n.name, w.pod, name, tries, err)
			}
			if proc.Sleep(ctx, 200*time.Millisecond) != nil {
				return
			}
		}
		k.mu.Lock()
		t := k.pods[w.pod]
		t.prepared, t.claim, t.call = time.Now(), claim, call
		k.mu.Unlock()
		k.notify()
	}
}

// finish ends the pods named as their kubelets and the garbage
// collector would once the pods are deleted: each pod is deleted, its
// claim unprepared (the kubelet), then deleted (the garbage collector,
// which the fleet does not run, deletes a claim whose owning pod is gone;
// the resourceclaim controller leaves that to it). The resourceclaim
// controller then deallocates the claims and lets them go. A pod ended
// as Succeeded instead is no good: the controller deletes the claim of a
// pod that is done, and creates it again for the pod, over and over.
func (k *kubelet) finish(ctx context.Context, names []string) error {
	k.mu.Lock()
	for _, name := range names {
		if t := k.pods[name]; t != nil {
			t.released = true
		}
	}
	k.mu.Unlock()
	return parallel(len(names), 16, func(i int) error {
		if err := k.api.Do(ctx, http.MethodDelete, apiclient.PathNamespaces+"/"+fleetNamespace+"/pods/"+names[i]+"?gracePeriodSeconds=0", nil, nil); err != nil && !apiclient.IsNotFound(err) {
			return fmt.Errorf("deleting pod %s: %w", names[i], err)
		}
		k.mu.Lock()
		t := k.pods[names[i]]
		var c *drav1.Claim
		var n *fleetNode
		if t != nil {
			c, n = t.claim, k.nodes[t.node]
		}
		k.mu.Unlock()
		if c == nil || n == nil {
			return nil
		}
		if err := n.unprepare(ctx, c); err != nil {
			return fmt.Errorf("pod %s: unpreparing %w", names[i], err)
		}
		if err := k.api.Do(ctx, http.MethodDelete, apiclient.PathClaims(fleetNamespace)+"/"+c.Name, nil, nil); err != nil && !apiclient.IsNotFound(err) {
			return fmt.Errorf("pod %s: deleting claim %s: %w", names[i], c.Name, err)
		}
		return nil
	})
}

// count returns how many of the pods named are bound and prepared, and
// how many failed.
func (k *kubelet) count(names []string) (bound, prepared, failed int) {
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

// waitPods waits until every pod named is prepared (or one failed).
func (k *kubelet) waitPods(ctx context.Context, names []string, timeout time.Duration) error {
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
func (k *kubelet) pending(names []string, most int) string {
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

// rates are pods per second from the first creation to the last
// binding, taken from binds (the audit log's) where it has the pod and
// from the pod watch where not (missed counts those), and to the last
// preparation.
func (k *kubelet) rates(names []string, binds map[string]time.Time) (bound, prepared float64, missed int) {
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

// latencies are, for each of the pods named that was prepared, the time
// from its binding (from binds, the audit log's, else the watch's) to its
// preparation, and how long its NodePrepareResources call took.
func (k *kubelet) latencies(names []string, binds map[string]time.Time) (bindToPrepared, calls []time.Duration) {
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

// failures lists the pods that failed.
func (k *kubelet) failures() []string {
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
