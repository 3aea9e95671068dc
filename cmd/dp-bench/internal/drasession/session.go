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
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/cdiresolve"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/controlplane"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/stats"
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

// pool is the driver's slices of one pool of the node, as the watch shows
// them.
type pool map[string]*apiclient.ResourceSlice

// complete returns the devices of the pool's newest generation, in slice
// order, and the number of its slices; ok is false while some are
// missing.
func (pl pool) complete() (devices []string, n int, ok bool) {
	var gen int64 = -1
	for _, s := range pl {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	var cur []*apiclient.ResourceSlice
	for _, s := range pl {
		if s.Spec.Pool.Generation == gen {
			cur = append(cur, s)
		}
	}
	if len(cur) == 0 || int64(len(cur)) != cur[0].Spec.Pool.ResourceSliceCount {
		return nil, len(cur), false
	}
	sort.Slice(cur, func(i, j int) bool { return cur[i].Metadata.Name < cur[j].Metadata.Name })
	for _, s := range cur {
		for _, d := range s.Spec.Devices {
			devices = append(devices, d.Name)
		}
	}
	return devices, len(cur), true
}

// nodePools are the driver's pools of the node by name: the pool named
// after the node (dra-example-driver's), or one per resource named
// <node>/<resource> (cdi-dra-driver's).
type nodePools map[string]pool

// ofNode reports whether pool name is one of node's.
func ofNode(name, node string) bool { return name == node || strings.HasPrefix(name, node+"/") }

// complete returns the devices of every pool's newest generation, each
// as <pool>/<device> (benchClaim's form), pools by name, and the number of
// their slices; ok is false while some are missing.
func (ps nodePools) complete() (devices []string, n int, ok bool) {
	if len(ps) == 0 {
		return nil, 0, false
	}
	names := make([]string, 0, len(ps))
	for name := range ps {
		names = append(names, name)
	}
	sort.Strings(names)
	ok = true
	for _, name := range names {
		devs, k, done := ps[name].complete()
		for _, d := range devs {
			devices = append(devices, name+"/"+d)
		}
		n, ok = n+k, ok && done
	}
	return devices, n, ok
}

// names are the pools' names, sorted.
func (ps nodePools) names() string {
	names := make([]string, 0, len(ps))
	for name := range ps {
		names = append(names, name)
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

// slices waits for the driver's ResourceSlices of the node's pools with
// all their devices.
func (x *draSession) slices(ctx context.Context) error {
	pl := nodePools{}
	var others []string // pools of the driver not of the node
	timeout := time.NewTimer(x.s.Register)
	defer timeout.Stop()
	for {
		select {
		case ev := <-x.events:
			s := &apiclient.ResourceSlice{}
			if ev.Type == apiclient.Error || json.Unmarshal(ev.Object, s) != nil || s.Spec.Driver != x.t.DRA.Driver {
				continue
			}
			if !ofNode(s.Spec.Pool.Name, x.node) {
				others = append(others, s.Spec.Pool.Name)
				continue
			}
			if pl[s.Spec.Pool.Name] == nil {
				pl[s.Spec.Pool.Name] = pool{}
			}
			if ev.Type == apiclient.Deleted {
				delete(pl[s.Spec.Pool.Name], s.Metadata.Name)
			} else {
				pl[s.Spec.Pool.Name][s.Metadata.Name] = s
			}
			devs, n, ok := pl.complete()
			if !ok || (x.t.DRA.Devices > 0 && len(devs) < x.t.DRA.Devices) {
				continue
			}
			x.res.Measure("start-sliced", report.Ms(ev.At.Sub(x.p.Start)), report.Ms(x.apiBase))
			x.res.Count("dra-devices", float64(len(devs)))
			x.devices = devs
			if x.t.DRA.Devices > 0 && len(devs) != x.t.DRA.Devices {
				x.res.Fail("dra-slices", "%d devices, want %d", len(devs), x.t.DRA.Devices)
			} else {
				x.res.Pass("dra-slices", "%d devices in %d slice(s) of pool(s) %s", len(devs), n, pl.names())
			}
			if len(devs) == 0 {
				return errors.New("no device published")
			}
			return nil
		case <-x.p.Done():
			x.res.Fail("dra-slices", "exited: %v", x.p.Err())
			return fmt.Errorf("the driver exited: %w", x.p.Err())
		case <-timeout.C:
			devs, n, _ := pl.complete()
			x.res.Fail("dra-slices", "within %s: %d devices in %d slices of pool(s) %s of node %s (other pools: %v)", x.s.Register, len(devs), n, pl.names(), x.node, others)
			return errors.New("its devices were not published")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// createClaim makes a claim allocated to devs, as the scheduler leaves
// it: created, then its status written.
func (x *draSession) createClaim(ctx context.Context, devs []string) (*apiclient.ResourceClaim, error) {
	want := benchClaim(benchNamespace, fmt.Sprintf("claim-%d", x.cl.claims.Add(1)), x.t.DRA.Driver, x.node, devs)
	path := apiclient.PathClaims(benchNamespace)
	c := &apiclient.ResourceClaim{}
	if err := x.api.Do(ctx, http.MethodPost, path, &apiclient.ResourceClaim{TypeMeta: want.TypeMeta, Metadata: want.Metadata, Spec: want.Spec}, c); err != nil {
		return nil, fmt.Errorf("creating claim %s: %w", want.Metadata.Name, err)
	}
	c.Status = want.Status
	if err := x.api.Do(ctx, http.MethodPut, path+"/"+c.Metadata.Name+"/status", c, c); err != nil {
		return nil, fmt.Errorf("allocating claim %s: %w", want.Metadata.Name, err)
	}
	if c.Metadata.UID == "" || c.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s: the API server's answer has no UID or allocation", want.Metadata.Name)
	}
	return c, nil
}

func (x *draSession) deleteClaim(ctx context.Context, c *apiclient.ResourceClaim) {
	_ = x.api.Do(ctx, http.MethodDelete, apiclient.PathClaims(c.Metadata.Namespace)+"/"+c.Metadata.Name, nil, nil)
}

// pace waits until the API interval has passed since the last call that
// made the driver read a claim: the driver's client-side limiter (5
// requests a second in client-go's default) must not be what is timed.
func (x *draSession) pace(ctx context.Context) error {
	if d := time.Until(x.lastGET.Add(x.s.APIInterval)); d > 0 {
		return proc.Sleep(ctx, d)
	}
	return nil
}

// timed times call right after an empty RPC, timed too (as the device
// plugins' calls alternate with one): each call finds the driver as warm
// as its baseline did. A call that makes the driver read a claim (get)
// is paced (pace) and sets lastGET.
func (x *draSession) timed(ctx context.Context, st *sizeTimes, get bool, call func(context.Context) error) (time.Duration, error) {
	if get {
		if err := x.pace(ctx); err != nil {
			return 0, err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, x.s.Register)
	defer cancel()
	t0 := time.Now()
	if _, err := x.dra.Unprepare(cctx); err != nil {
		return 0, fmt.Errorf("the empty NodeUnprepareResources: %w", err)
	}
	st.empty = append(st.empty, time.Since(t0))
	t0 = time.Now()
	err := call(cctx)
	d := time.Since(t0)
	if get {
		x.lastGET = time.Now()
	}
	return d, err
}

// prepare calls NodePrepareResources for c (the driver reads c from the
// API server), timed after an empty RPC.
func (x *draSession) prepare(ctx context.Context, st *sizeTimes, c *apiclient.ResourceClaim) (*drav1.NodePrepareResourcesResponse, time.Duration, error) {
	var resp *drav1.NodePrepareResourcesResponse
	d, err := x.timed(ctx, st, true, func(ctx context.Context) (err error) {
		resp, err = x.dra.Prepare(ctx, kubeletClaim(c))
		return err
	})
	return resp, d, err
}

// unprepare calls NodeUnprepareResources for claims, timed after an
// empty RPC.
func (x *draSession) unprepare(ctx context.Context, st *sizeTimes, claims ...*drav1.Claim) (*drav1.NodeUnprepareResourcesResponse, time.Duration, error) {
	var resp *drav1.NodeUnprepareResourcesResponse
	d, err := x.timed(ctx, st, false, func(ctx context.Context) (err error) {
		resp, err = x.dra.Unprepare(ctx, claims...)
		return err
	})
	return resp, d, err
}

// unprepareErr is the error of an unprepare call for claim uid, if any.
func unprepareErr(resp *drav1.NodeUnprepareResourcesResponse, err error, uid string) error {
	if err != nil {
		return err
	}
	r, ok := resp.GetClaims()[uid]
	switch {
	case !ok:
		return errors.New("claim not answered")
	case r.GetError() != "":
		return errors.New(r.GetError())
	}
	return nil
}

// sizeTimes are one claim size's timed calls: the empty RPCs before
// each call, the calls, and dp-bench's own GETs of the claims.
type sizeTimes struct{ empty, prepare, again, unprepare, get []time.Duration }

// calls times prepare, prepare again and unprepare of fresh claims of 1
// and 8 devices (as many as published, up to 8), each call next to an
// empty RPC, and checks the answers.
func (x *draSession) calls(ctx context.Context) error {
	var sizes []int
	for _, n := range draSizes {
		if n <= len(x.devices) {
			sizes = append(sizes, n)
		}
	}
	var gets []time.Duration
	failed := map[string]bool{}
	fail := func(id, format string, args ...any) {
		failed[id] = true
		x.res.Fail(id, format, args...)
	}
	for _, n := range sizes {
		var st sizeTimes
		for i := 0; i < x.s.DRACalls && !failed["dra-prepare"]; i++ {
			if err := x.cycle(ctx, n, i == 0, &st, fail); err != nil {
				return err
			}
		}
		base := report.Us(stats.Quantile(st.empty, 0.5))
		for id, ds := range map[string][]time.Duration{"prepare": st.prepare, "prepare-again": st.again, "unprepare": st.unprepare} {
			if len(ds) > 0 {
				x.res.Measure(fmt.Sprintf("%s-%d", id, n), report.Us(stats.Quantile(ds, 0.5)), base)
			}
		}
		gets = append(gets, st.get...)
	}
	if len(gets) > 0 {
		x.res.Metrics["claim-get"] = report.Sample{Value: report.Us(stats.Quantile(gets, 0.5))}
	}
	desc := fmt.Sprintf("claims of %v devices, %d each", sizes, x.s.DRACalls)
	for _, id := range []string{"dra-prepare", "dra-idempotent", "dra-unprepare"} {
		if !failed[id] {
			x.res.Pass(id, "%s", desc)
		}
	}
	return nil
}

// cycle is one claim of n devices: allocated, prepared, prepared again,
// unprepared twice, deleted. The first cycle of a size also resolves the
// CDI IDs and looks at the steps' files.
func (x *draSession) cycle(ctx context.Context, n int, first bool, st *sizeTimes, fail func(id, format string, args ...any)) error {
	c, err := x.createClaim(ctx, x.devices[:n])
	if err != nil {
		return err
	}
	defer x.deleteClaim(ctx, c)
	uid := c.Metadata.UID
	var ev0 map[string]string
	if first && x.r.Evidence != "" {
		if ev0, err = evidence(x.r.Evidence); err != nil {
			return err
		}
	}
	resp, d, err := x.prepare(ctx, st, c)
	if err != nil {
		fail("dra-prepare", "%d devices: %v", n, err)
		return nil
	}
	if p := checkPrepared(c, x.t.DRA.Driver, resp); len(p) > 0 {
		fail("dra-prepare", "%d devices: %s", n, strings.Join(p, "; "))
		_, _, _ = x.unprepare(ctx, st, kubeletClaim(c))
		return nil
	}
	st.prepare = append(st.prepare, d)
	answer := resp.GetClaims()[uid]
	var ev1 map[string]string
	if first {
		x.resolve(cdiIDs(answer))
		if x.r.Evidence != "" {
			if ev1, err = evidence(x.r.Evidence); err != nil {
				return err
			}
		}
	}
	again, d, err := x.prepare(ctx, st, c)
	switch {
	case err != nil:
		fail("dra-idempotent", "%d devices: %v", n, err)
	case diffAnswers(answer, again.GetClaims()[uid]) != "":
		fail("dra-idempotent", "%d devices: %s", n, diffAnswers(answer, again.GetClaims()[uid]))
	default:
		st.again = append(st.again, d)
	}
	if first {
		if err := x.stepsOnce(n, ev0, ev1); err != nil {
			return err
		}
	}
	ur, d, err := x.unprepare(ctx, st, kubeletClaim(c))
	if err := unprepareErr(ur, err, uid); err != nil {
		fail("dra-unprepare", "%d devices: %v", n, err)
		return nil
	}
	st.unprepare = append(st.unprepare, d)
	ur, err = x.dra.Unprepare(ctx, kubeletClaim(c))
	if err := unprepareErr(ur, err, uid); err != nil {
		fail("dra-unprepare", "%d devices, unprepared already: %v", n, err)
	}
	// What every NodePrepareResources costs before the driver's own
	// work: the helper reads the claim from the API server.
	t0 := time.Now()
	if err := x.api.Do(ctx, http.MethodGet, apiclient.PathClaims(c.Metadata.Namespace)+"/"+c.Metadata.Name, nil, &apiclient.ResourceClaim{}); err != nil {
		return fmt.Errorf("reading claim %s: %w", c.Metadata.Name, err)
	}
	st.get = append(st.get, time.Since(t0))
	return nil
}

// stepsOnce checks that the second prepare left the steps' files as the
// first one did (ev1), when the first one changed them (from ev0).
func (x *draSession) stepsOnce(n int, ev0, ev1 map[string]string) error {
	if x.r.Evidence == "" {
		x.res.Skip("dra-steps-once", "no steps' files given")
		return nil
	}
	if len(changedFiles(ev0, ev1)) == 0 {
		if _, ok := x.res.Checks["dra-steps-once"]; !ok {
			x.res.Skip("dra-steps-once", "the first preparation changed none of %s", x.t.DRA.StepsEvidence)
		}
		return nil
	}
	ev2, err := evidence(x.r.Evidence)
	if err != nil {
		return err
	}
	if ch := changedFiles(ev1, ev2); len(ch) > 0 {
		x.res.Fail("dra-steps-once", "%d devices: %d file(s) written again: %s", n, len(ch), strings.Join(ch, ", "))
		return nil
	}
	x.res.Pass("dra-steps-once", "%d file(s) written by the first preparation, none by the second", len(changedFiles(ev0, ev1)))
	return nil
}

// resolve injects the CDI IDs as containerd does.
func (x *draSession) resolve(ids []string) {
	if _, ok := x.res.Checks["dra-cdi-resolve"]; ok && x.res.Checks["dra-cdi-resolve"].Status == report.Fail {
		return
	}
	nodes, err := cdiresolve.Inject(x.r.Host.CDIDir, ids)
	if err != nil {
		x.res.Fail("dra-cdi-resolve", "%v", err)
		return
	}
	x.res.Pass("dra-cdi-resolve", "%d IDs, %d device nodes injected", len(ids), nodes)
}

// unknown checks that an unknown claim is unprepared without an error and
// that a claim allocated to a device the driver does not publish is
// refused.
func (x *draSession) unknown(ctx context.Context) error {
	uid, err := randomUID()
	if err != nil {
		return err
	}
	ur, err := x.dra.Unprepare(ctx, &drav1.Claim{Namespace: benchNamespace, Name: "dp-bench-never-prepared", Uid: uid})
	if err := unprepareErr(ur, err, uid); err != nil {
		x.res.Fail("dra-unprepare-unknown", "%v", err)
	} else {
		x.res.Pass("dra-unprepare-unknown", "answered without an error")
	}
	c, err := x.createClaim(ctx, []string{"dp-bench-no-such-device"})
	if err != nil {
		return err
	}
	defer x.deleteClaim(ctx, c)
	resp, _, err := x.prepare(ctx, &sizeTimes{}, c)
	var got *drav1.NodePrepareResourceResponse
	if err == nil {
		got = resp.GetClaims()[c.Metadata.UID]
	}
	switch {
	case err != nil:
		x.res.Pass("dra-refuse-unknown", "call failed: %v", err)
	case got == nil:
		x.res.Fail("dra-refuse-unknown", "claim not answered")
	case got.GetError() != "":
		x.res.Pass("dra-refuse-unknown", "%s", got.GetError())
	default:
		x.res.Fail("dra-refuse-unknown", "prepared: %s", answerKey(got))
	}
	_, _ = x.dra.Unprepare(ctx, kubeletClaim(c))
	return nil
}

// randomUID is a random UUID (version 4), as the API server makes.
func randomUID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:]), nil
}
