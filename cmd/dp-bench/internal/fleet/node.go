package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
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
	// sock is the registration socket the current process registered
	// through.
	sock string
	// registered is closed when the current process registered.
	registered chan struct{}
	// healthStop ends the health stream of the current driver.
	healthStop context.CancelFunc
	healthWG   sync.WaitGroup
	health     healthCount
}

// healthCount is what the stand-in read of a node's health streams.
type healthCount struct {
	opened, updates atomic.Int64
	unserved        atomic.Bool  // the driver has no health service
	lastErr         atomic.Value // string: the last stream's end, other than a stop
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
	p, err := n.spawn()
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.p, n.registered = p, make(chan struct{})
	n.mu.Unlock()
	return nil
}

// spawn starts a driver process with a pod UID of its own (POD_UID), as
// the DaemonSets of both drivers pass it from the downward API: with it,
// each instance names its sockets after its pod, and a new one can start
// beside the old (surge).
func (n *fleetNode) spawn() (*proc.Proc, error) {
	uid, err := apiclient.NewUID()
	if err != nil {
		return nil, err
	}
	return proc.Start(n.r.Argv, append(slices.Clone(n.r.Env), "POD_UID="+uid), nil, n.r.Scratch)
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
	d, sock, err := n.await(ctx, p, "", timeout)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.sock = sock
	n.mu.Unlock()
	n.setDriver(d)
	close(done)
	return nil
}

// await registers process p as the kubelet's plugin watcher would,
// polling the registration directory, through any socket but skip.
func (n *fleetNode) await(ctx context.Context, p *proc.Proc, skip string, timeout time.Duration) (*kubeletsim.DRA, string, error) {
	w := kubeletsim.PluginWatcher{Connect: 5 * time.Second, Poll: 50 * time.Millisecond, Exited: p.Done(), Skip: skip}
	d, sock, err := w.Await(ctx, n.r.Host.RegistrarDir, timeout)
	switch {
	case errors.Is(err, kubeletsim.ErrExited):
		return nil, "", fmt.Errorf("node %s: the driver exited: %w: %s", n.name, p.Err(), p.LogTail(600))
	case err != nil:
		return nil, "", fmt.Errorf("node %s: %w: %s", n.name, err, p.LogTail(600))
	}
	return d, sock, nil
}

// surge replaces the driver as a DaemonSet's rolling update with
// maxSurge 1 and maxUnavailable 0 does (the charts of both drivers): the
// new process starts beside the old one, and the old one gets SIGTERM
// once the kubelet registered the new one, which serves the calls from
// then on. The node is never without a registered driver.
func (n *fleetNode) surge(ctx context.Context, term, regTimeout time.Duration) (replacement, error) {
	n.mu.Lock()
	old, oldSock := n.p, n.sock
	n.mu.Unlock()
	p, err := n.spawn()
	if err != nil {
		return replacement{}, err
	}
	d, sock, err := n.await(ctx, p, oldSock, regTimeout)
	if err != nil {
		_, _ = p.Terminate(term)
		return replacement{}, err
	}
	rp := replacement{registered: time.Since(p.Start)}
	n.mu.Lock()
	n.p, n.sock = p, sock
	n.mu.Unlock()
	n.setDriver(d)
	rp.exit(old, term)
	return rp, nil
}

// replacement is how one node's driver was replaced in the rollout.
type replacement struct {
	// registered: the new process's start → its registration.
	registered time.Duration
	// exited: the old process's SIGTERM → its exit, or its kill (killed)
	// when it had not exited within the bound.
	exited time.Duration
	killed bool
	// killedLog is the end of a killed process's log: what it was doing.
	killedLog string
}

// exit stops old (SIGTERM, killed after term) and records how long that
// took.
func (rp *replacement) exit(old *proc.Proc, term time.Duration) {
	t0 := time.Now()
	ok, _ := old.Terminate(term)
	rp.exited, rp.killed = time.Since(t0), !ok
	if rp.killed {
		rp.killedLog = old.LogTail(1500)
	}
}

// setDriver makes d the node's DRA service (nil: none), opens its health
// stream as the kubelet does on a registration, and ends the stream of
// the one before and closes the connection to it.
func (n *fleetNode) setDriver(d *kubeletsim.DRA) {
	n.mu.Lock()
	old, oldStop := n.dra, n.healthStop
	n.dra, n.healthStop = d, nil
	if d != nil {
		ctx, cancel := context.WithCancel(context.Background())
		n.healthStop = cancel
		n.healthWG.Add(1)
		go n.watchHealth(ctx, d)
	}
	n.mu.Unlock()
	if oldStop != nil {
		oldStop()
	}
	if old != nil {
		_ = old.Close()
	}
}

// watchHealth reads d's health stream until ctx ends or the stream does.
func (n *fleetNode) watchHealth(ctx context.Context, d *kubeletsim.DRA) {
	defer n.healthWG.Done()
	n.health.opened.Add(1)
	err := d.WatchHealth(ctx, func(*drahealthv1.NodeWatchResourcesResponse) { n.health.updates.Add(1) })
	switch {
	case errors.Is(err, kubeletsim.ErrNoHealth):
		n.health.unserved.Store(true)
	case err != nil && ctx.Err() == nil:
		n.health.lastErr.Store(err.Error())
	}
}

// restart ends the driver with SIGTERM and starts it again at once, as
// a DaemonSet's rolling update with maxUnavailable 100% (maxSurge 0)
// does; the kubelet's registration follows.
func (n *fleetNode) restart(ctx context.Context, term, regTimeout time.Duration) (replacement, error) {
	n.setDriver(nil)
	var rp replacement
	rp.exit(n.process(), term)
	// The kubelet's plugin watcher sees the socket go; a new one comes
	// with the new process.
	if err := n.start(); err != nil {
		return rp, err
	}
	if err := n.register(ctx, regTimeout); err != nil {
		return rp, err
	}
	rp.registered = time.Since(n.process().Start)
	return rp, nil
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

// Prepare calls NodePrepareResources for the claim of a pod, as the
// kubelet does before it starts the pod's containers; it waits for the
// driver to be registered. The claim must be answered with its 1 device.
func (n *fleetNode) Prepare(ctx context.Context, c *drav1.Claim) error {
	return n.call(ctx, func(ctx context.Context, d *kubeletsim.DRA) error {
		got, err := d.PrepareClaim(ctx, c)
		if err == nil && len(got.GetDevices()) != 1 {
			err = fmt.Errorf("claim %s: %d devices answered, want 1", c.Name, len(got.GetDevices()))
		}
		return err
	})
}

// Unprepare calls NodeUnprepareResources for a claim, as the kubelet does
// once the pod that held it is gone.
func (n *fleetNode) Unprepare(ctx context.Context, c *drav1.Claim) error {
	return n.call(ctx, func(ctx context.Context, d *kubeletsim.DRA) error { return d.UnprepareClaim(ctx, c) })
}

// call calls f with the current driver, once it registered, and the
// kubelet's timeout.
func (n *fleetNode) call(ctx context.Context, f func(context.Context, *kubeletsim.DRA) error) error {
	d, err := n.driver(ctx)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, kubeletCallTimeout)
	defer cancel()
	return f(cctx, d)
}

// kubeletCallTimeout bounds each call to a driver, as the kubelet's does.
const kubeletCallTimeout = 30 * time.Second

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
	n.setDriver(nil)
	n.healthWG.Wait()
	if p := n.process(); p != nil && !p.Exited() {
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

// podOf is what the kubelet stand-in reads of a pod's watch event (false
// for an event that is not a pod's).
func podOf(ev apiclient.Event) (kubeletsim.Pod, bool) {
	var p apiclient.Pod
	if ev.Type == apiclient.Error || json.Unmarshal(ev.Object, &p) != nil {
		return kubeletsim.Pod{}, false
	}
	out := kubeletsim.Pod{Name: p.Metadata.Name, Node: p.Spec.NodeName, Deleted: ev.Type == apiclient.Deleted}
	for _, c := range p.Status.Conditions {
		if c.Type == "DisruptionTarget" && c.Status == "True" {
			out.Failed = "DisruptionTarget (evicted)"
		}
	}
	if p.Status.Phase == "Failed" {
		out.Failed = "phase Failed"
	}
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			out.Claim = *s.ResourceClaimName
		}
	}
	return out, true
}

// podAPI is the stand-in's API server: the fleet's namespace.
type podAPI struct{ api *apiclient.Client }

func (a podAPI) ClaimUID(ctx context.Context, name string) (string, error) {
	var c apiclient.ResourceClaim
	err := a.api.Do(ctx, http.MethodGet, apiclient.PathClaims(fleetNamespace)+"/"+name, nil, &c)
	return c.Metadata.UID, err
}

func (a podAPI) DeletePod(ctx context.Context, name string) error {
	return a.deleted(a.api.Do(ctx, http.MethodDelete, apiclient.PathPods(fleetNamespace)+"/"+name+"?gracePeriodSeconds=0", nil, nil))
}

func (a podAPI) DeleteClaim(ctx context.Context, name string) error {
	return a.deleted(a.api.Do(ctx, http.MethodDelete, apiclient.PathClaims(fleetNamespace)+"/"+name, nil, nil))
}

// deleted is a deletion's error: none when the object was gone already.
func (podAPI) deleted(err error) error {
	if apiclient.IsNotFound(err) {
		return nil
	}
	return err
}
