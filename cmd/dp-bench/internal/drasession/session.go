// Package drasession drives a DRA driver for one run (Run) as the kubelet
// drives one: it watches the plugin registration directory and registers
// the driver through its socket (GetInfo, NotifyRegistrationStatus), waits
// for its devices in ResourceSlices of the node's pools, then, as the
// scheduler and the kubelet would, writes the allocation of fresh
// ResourceClaims and calls NodePrepareResources and NodeUnprepareResources
// on the driver's endpoint (kubeletsim). It checks the contract
// (report.DRAChecks) and times the calls next to an empty RPC
// (report.DRAMetrics). The API server is a private one (Cluster) shared
// by all runs; every run has a Node object of its own and a PodResources
// stand-in on its socket.
package drasession

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/controlplane"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/target"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
)

// draSizes are the claim sizes the calls are timed at.
var draSizes = []int{1, 8}

// ErrNoControlPlane marks targets that need the API server when it could
// not be started.
var ErrNoControlPlane = errors.New("no API server")

// benchNamespace holds the claims dp-bench makes.
const benchNamespace = "dp-bench"

// Cluster is the API server all DRA runs share.
type Cluster struct {
	cp     *controlplane.ControlPlane
	nodes  atomic.Int64
	claims atomic.Int64
}

// StartCluster starts the control plane and makes the claims' namespace.
func StartCluster(ctx context.Context, o controlplane.Options) (*Cluster, error) {
	cp, err := controlplane.Start(ctx, o)
	if err != nil {
		return nil, err
	}
	cl := &Cluster{cp: cp}
	ns := &apiclient.Namespace{TypeMeta: apiclient.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, Metadata: apiclient.ObjectMeta{Name: benchNamespace}}
	if err := cp.Client.Do(ctx, http.MethodPost, apiclient.PathNamespaces, ns, nil); err != nil && !apiclient.IsAlreadyExists(err) {
		cp.Stop()
		return nil, fmt.Errorf("namespace %s: %w", benchNamespace, err)
	}
	return cl, nil
}

// Stop stops the control plane.
func (cl *Cluster) Stop() { cl.cp.Stop() }

// Version is the API server's version ("" when unknown).
func (cl *Cluster) Version() string { return cl.cp.Version }

// Run runs the DRA driver t once against a fresh Node object, a
// PodResources stand-in and the shared API server. Only setup errors are
// returned; failures of the driver are results; logf takes what happens
// to the run's watch.
func Run(ctx context.Context, t target.Target, s target.Settings, cl *Cluster, logf func(string, ...any)) (*report.RunResult, error) {
	nodeName := fmt.Sprintf("dp-bench-node-%d", cl.nodes.Add(1))
	r, err := t.Prepare(s.TmpfsDir, &target.Cluster{Kubeconfig: cl.cp.Kubeconfig, NodeName: nodeName})
	if err != nil {
		return nil, err
	}
	defer r.Cleanup()
	api := cl.cp.Client
	n := &apiclient.Node{TypeMeta: apiclient.TypeMeta{APIVersion: "v1", Kind: "Node"},
		Metadata: apiclient.ObjectMeta{Name: nodeName, Labels: map[string]string{"kubernetes.io/hostname": nodeName}}}
	if err := api.Do(ctx, http.MethodPost, apiclient.PathNodes, n, nil); err != nil {
		return nil, fmt.Errorf("node %s: %w", nodeName, err)
	}
	defer cleanupNode(api, nodeName)
	pr, err := kubeletsim.ServePodResources(r.Host.PodResources)
	if err != nil {
		return nil, err
	}
	defer pr.Stop()
	wctx, cancel := context.WithCancel(ctx)
	events := make(chan apiclient.Event, 1024)
	w, err := api.Watch(wctx, apiclient.PathResourceSlices, url.Values{"fieldSelector": {"spec.nodeName=" + nodeName}}, func(ev apiclient.Event) {
		select {
		case events <- ev:
		case <-wctx.Done():
		}
	}, logf)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watching ResourceSlices: %w", err)
	}
	defer func() { cancel(); w.Wait() }()
	execBase, err := proc.ExitBaseline()
	if err != nil {
		return nil, err
	}
	apiBase, err := sliceBaseline(ctx, api, nodeName, events)
	if err != nil {
		return nil, err
	}
	idle, err := proc.StartIdle()
	if err != nil {
		return nil, err
	}
	defer func() { _, _ = idle.Terminate(5 * time.Second) }()
	p, err := proc.Start(r.Argv, r.Env, nil, r.Scratch)
	if err != nil {
		return nil, err
	}
	res := report.NewRunResult()
	x := &draSession{t: t, s: s, r: r, p: p, res: res, api: api, cl: cl, node: nodeName, events: events,
		execBase: execBase, apiBase: apiBase, idle: idle}
	err = x.run(ctx)
	x.stop()
	res.End(err, p.Log())
	return res, nil
}

// cleanupNode deletes the node's slices and the node.
func cleanupNode(api *apiclient.Client, node string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = api.Do(ctx, http.MethodDelete, apiclient.PathResourceSlices+"?"+url.Values{"fieldSelector": {"spec.nodeName=" + node}}.Encode(), nil, nil)
	_ = api.Do(ctx, http.MethodDelete, apiclient.PathNodes+"/"+node, nil, nil)
}

// sliceBaseline is the time from dp-bench's own ResourceSlice create to
// its watch event: the API server's share of a published slice.
func sliceBaseline(ctx context.Context, api *apiclient.Client, node string, events <-chan apiclient.Event) (time.Duration, error) {
	name := node + "-baseline"
	sl := &apiclient.ResourceSlice{TypeMeta: apiclient.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceSlice"}, Metadata: apiclient.ObjectMeta{Name: name},
		Spec: apiclient.ResourceSliceSpec{Driver: "baseline.dp-bench.example.com", Pool: apiclient.ResourcePool{Name: node, ResourceSliceCount: 1},
			NodeName: &node, Devices: []apiclient.SliceDevice{{Name: "baseline-0"}}}}
	t0 := time.Now()
	if err := api.Do(ctx, http.MethodPost, apiclient.PathResourceSlices, sl, nil); err != nil {
		return 0, fmt.Errorf("baseline ResourceSlice: %w", err)
	}
	defer func() { _ = api.Do(ctx, http.MethodDelete, apiclient.PathResourceSlices+"/"+name, nil, nil) }()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-events:
			var s apiclient.ResourceSlice
			if ev.Type == apiclient.Added && json.Unmarshal(ev.Object, &s) == nil && s.Metadata.Name == name {
				return ev.At.Sub(t0), nil
			}
		case <-timeout:
			return 0, errors.New("baseline ResourceSlice: no watch event within 10s")
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// draSession is one run of a DRA driver in progress.
type draSession struct {
	t      target.Target
	s      target.Settings
	r      *target.Run
	p      *proc.Proc
	res    *report.RunResult
	api    *apiclient.Client
	cl     *Cluster
	node   string
	events <-chan apiclient.Event
	idle   *proc.Proc

	execBase, apiBase time.Duration

	dra     *kubeletsim.DRA
	devices []string  // published devices, in slice order
	lastGET time.Time // the last call that made the driver read a claim
}

func (x *draSession) stop() {
	if x.dra != nil {
		_ = x.dra.Close()
	}
	if !x.p.Exited() {
		_, _ = x.p.Terminate(x.s.Term)
	}
}

func (x *draSession) run(ctx context.Context) error {
	skipRest := func(err error) { x.res.SkipRest(report.DRAChecks, err) }
	if err := x.register(ctx); err != nil {
		x.res.Err = err.Error()
		skipRest(err)
		return nil
	}
	if err := x.slices(ctx); err != nil {
		x.res.Err = err.Error()
		skipRest(err)
		return nil
	}
	// The driver's start-up requests (lists, watches, slice writes) took
	// tokens of its API client's limiter: let it fill again.
	if err := proc.Sleep(ctx, 10*x.s.APIInterval); err != nil {
		return err
	}
	if err := x.calls(ctx); err != nil {
		return err
	}
	if err := x.unknown(ctx); err != nil {
		return err
	}
	ps, err := proc.Read(x.p.Pid())
	if err != nil {
		return err
	}
	bs, err := proc.Read(x.idle.Pid())
	if err != nil {
		return err
	}
	x.res.Measure("dra-rss", report.MiB(ps.RSS), report.MiB(bs.RSS))
	return nil
}

// register waits for a socket in the registration directory and
// registers the driver through it, as the kubelet's plugin watcher does
// (trying again at once when the directory changes, and every 2 ms, where
// the kubelet tries again within a second, so that the time is the
// driver's).
func (x *draSession) register(ctx context.Context) error {
	w := kubeletsim.PluginWatcher{Connect: x.s.Connect, Poll: 2 * time.Millisecond, Inotify: true, Exited: x.p.Done()}
	d, sock, err := w.Await(ctx, x.r.Host.RegistrarDir, x.s.Register)
	at := time.Now()
	switch {
	case err == nil:
		x.dra = d
		x.res.Measure("start-registered", report.Ms(at.Sub(x.p.Start)), report.Ms(x.execBase))
		if d.Info.Name != x.t.DRA.Driver {
			x.res.Fail("dra-register", "registered as %q, want %q", d.Info.Name, x.t.DRA.Driver)
		} else {
			x.res.Pass("dra-register", "%s, services %v, socket %s", d.Info.Name, d.Info.SupportedVersions, filepath.Base(sock))
		}
		return nil
	case errors.Is(err, kubeletsim.ErrExited):
		x.res.Fail("dra-register", "exited before it registered: %v", x.p.Err())
		return fmt.Errorf("%w: %w", kubeletsim.ErrExited, x.p.Err())
	case errors.Is(err, kubeletsim.ErrNotRegistered):
		x.res.Fail("dra-register", "%v", err)
		return kubeletsim.ErrNotRegistered
	case errors.Is(err, kubeletsim.ErrRefused):
		x.res.Fail("dra-register", "%v", err)
	}
	return err
}
