// Package dpsession plays the kubelet against a device plugin for one
// run (Run): it starts the plugin in fresh directories against a kubelet
// stand-in on real unix sockets (internal/kubeletsim), checks the
// kubelet's contract (report.PluginChecks: serving before registering,
// the registration, ListAndWatch, Allocate, GetPreferredAllocation,
// PreStartContainer, a device file removed and a kernel uevent, a kubelet
// restart, SIGTERM, CDI names resolved as containerd resolves them) and
// measures start-up, memory, RPC latency against an empty RPC, reaction
// times and idle CPU (report.PluginMetrics), each next to a baseline taken
// in the same run.
package dpsession

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/target"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
)

// Run runs t once: starts it against a fresh kubelet stand-in, checks
// the contract, measures, and stops it. Only setup errors are returned;
// failures of the plugin are results.
func Run(ctx context.Context, t target.Target, s target.Settings) (*report.RunResult, error) {
	r, err := t.Prepare(s.TmpfsDir, nil)
	if err != nil {
		return nil, err
	}
	defer r.Cleanup()
	pr, err := kubeletsim.ServePodResources(r.Host.PodResources)
	if err != nil {
		return nil, err
	}
	defer pr.Stop()
	k, err := kubeletsim.StartWith(r.Host.SocketDir, kubeletsim.Options{ConnectTimeout: s.Connect})
	if err != nil {
		return nil, err
	}
	defer k.Stop()
	execBase, err := proc.ExitBaseline()
	if err != nil {
		return nil, err
	}
	p, err := proc.Start(r.Argv, r.Env, r.Binds, r.Scratch)
	if err != nil {
		return nil, err
	}
	res := report.NewRunResult()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sess := &session{t: t, s: s, r: r, k: k, p: p, res: res, execBase: execBase}
	err = sess.run(ctx)
	sess.stop()
	res.End(err, p.Log())
	return res, nil
}

// session is one run in progress.
type session struct {
	t        target.Target
	s        target.Settings
	r        *target.Run
	k        *kubeletsim.Kubelet
	p        *proc.Proc
	res      *report.RunResult
	execBase time.Duration

	reg     kubeletsim.Registration // the accepted registration in use
	c       *kubeletsim.Client
	cancelW context.CancelFunc
	updates <-chan kubeletsim.Update
	last    kubeletsim.Update // the latest list seen
	healthy []string          // healthy IDs of the first list, in list order
	stopped bool
}

// stop ends the stream and the plugin, whatever state the run is in.
func (x *session) stop() {
	x.closeStream()
	if !x.stopped {
		x.p.Kill()
	}
}

func (x *session) closeStream() {
	if x.cancelW != nil {
		x.cancelW()
		_ = kubeletsim.WaitEnded(x.updates, 5*time.Second)
		x.cancelW = nil
	}
	if x.c != nil {
		_ = x.c.Close()
		x.c = nil
	}
}

func (x *session) run(ctx context.Context) error {
	if err := x.register(ctx); err != nil {
		x.res.Err = err.Error()
		// What cannot be checked without a registration is skipped.
		x.res.SkipRest(report.PluginChecks, err)
		return nil
	}
	if err := x.watch(ctx); err != nil {
		return err
	}
	if err := x.listInitial(); err != nil {
		return err
	}
	ids := x.healthy[:min(8, len(x.healthy))]
	if err := x.allocate(ctx, ids); err != nil {
		return err
	}
	if err := x.preferred(ctx); err != nil {
		return err
	}
	if err := x.prestart(ctx, ids); err != nil {
		return err
	}
	if err := x.change(); err != nil {
		return err
	}
	if err := x.uevent(ctx); err != nil {
		return err
	}
	if err := x.idle(ctx); err != nil {
		return err
	}
	if err := x.restart(ctx); err != nil {
		return err
	}
	x.sigterm()
	return nil
}

// register waits for the first Register call and the first accepted one.
func (x *session) register(ctx context.Context) error {
	var first kubeletsim.Registration
	select {
	case first = <-x.k.Calls:
	case <-x.p.Done():
		return fmt.Errorf("the plugin exited before it registered: %w", x.p.Err())
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(x.s.Register):
		return fmt.Errorf("no Register call within %s", x.s.Register)
	}
	x.res.Measure("start-registered", report.Ms(first.At.Sub(x.p.Start)), report.Ms(x.execBase))
	req := first.Request
	if slices.Contains(pluginapi.SupportedVersions[:], req.Version) {
		x.res.Pass("register-version", "%s", req.Version)
	} else {
		x.res.Fail("register-version", "version %q, supported %v", req.Version, pluginapi.SupportedVersions)
	}
	switch {
	case !kubeletsim.IsExtendedResourceName(req.ResourceName):
		x.res.Fail("register-resource", "%q is not an extended resource name", req.ResourceName)
	case x.t.Resource != "" && req.ResourceName != x.t.Resource:
		x.res.Fail("register-resource", "%q, want %q", req.ResourceName, x.t.Resource)
	default:
		x.res.Pass("register-resource", "%s", req.ResourceName)
	}
	if first.Err != nil && strings.Contains(first.Err.Error(), "not served") {
		x.res.Fail("serves-before-register", "%v", first.Err)
	} else if first.Err == nil {
		x.res.Pass("serves-before-register", "answered GetDevicePluginOptions during Register")
	}
	x.reg = first
	if first.Err != nil {
		// A refused plugin may try again.
		select {
		case x.reg = <-x.k.Regs:
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(x.s.Register):
			return kubeletsim.ErrNotRegistered
		}
	} else {
		<-x.k.Regs // the same call
	}
	if _, ok := x.res.Checks["serves-before-register"]; !ok {
		x.res.Pass("serves-before-register", "answered GetDevicePluginOptions during Register")
	}
	drain(x.k.Calls)
	got, want := optionsOf(x.reg.Request.Options), optionsOf(x.reg.Options)
	if got == want {
		x.res.Pass("register-options", "%s", got)
	} else {
		x.res.Fail("register-options", "Register says %s, GetDevicePluginOptions says %s (the kubelet acts on the latter)", got, want)
	}
	return nil
}

func optionsOf(o *pluginapi.DevicePluginOptions) string {
	if o == nil {
		o = &pluginapi.DevicePluginOptions{}
	}
	return fmt.Sprintf("PreStartRequired=%t GetPreferredAllocationAvailable=%t", o.PreStartRequired, o.GetPreferredAllocationAvailable)
}

func drain(ch chan kubeletsim.Registration) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// watch opens ListAndWatch on the registered endpoint, as the kubelet does
// right after Register.
func (x *session) watch(ctx context.Context) error {
	x.closeStream()
	c, err := kubeletsim.Dial(x.r.Host.SocketDir, x.reg.Request.Endpoint)
	if err != nil {
		return err
	}
	x.c = c
	wctx, cancel := context.WithCancel(ctx)
	updates, err := c.Watch(wctx)
	if err != nil {
		cancel()
		return fmt.Errorf("ListAndWatch: %w", err)
	}
	x.cancelW, x.updates = cancel, updates
	return nil
}

func (x *session) listInitial() error {
	opened := time.Now()
	u, err := kubeletsim.WaitFor(x.updates, x.s.Prompt, func(kubeletsim.Update) bool { return true })
	if err != nil {
		x.res.Fail("listandwatch-initial", "no list within %s of opening the stream", x.s.Prompt)
		// Keep going with a late list, if any, to check the rest.
		if u, err = kubeletsim.WaitFor(x.updates, x.s.Register, func(kubeletsim.Update) bool { return true }); err != nil {
			return fmt.Errorf("ListAndWatch sent nothing: %w", err)
		}
	}
	x.last = u
	x.res.Measure("start-listed", report.Ms(u.At.Sub(x.p.Start)), report.Ms(x.execBase))
	x.res.Count("ids", float64(len(u.Devices)))
	seen := map[string]bool{}
	for _, d := range u.Devices {
		if seen[d.ID] {
			x.res.Fail("listandwatch-initial", "device ID %q listed twice", d.ID)
		}
		seen[d.ID] = true
		if d.Health == pluginapi.Healthy {
			x.healthy = append(x.healthy, d.ID)
		}
	}
	switch {
	case len(u.Devices) == 0:
		x.res.Fail("listandwatch-initial", "empty list")
	case x.t.IDs > 0 && len(u.Devices) != x.t.IDs:
		x.res.Fail("listandwatch-initial", "%d device IDs, want %d", len(u.Devices), x.t.IDs)
	default:
		x.res.Pass("listandwatch-initial", "%d IDs (%d healthy) %s after the stream opened", len(u.Devices), len(x.healthy), u.At.Sub(opened).Round(time.Microsecond))
	}
	if len(x.healthy) == 0 {
		return errors.New("no healthy device listed")
	}
	return nil
}

// restart does what a kubelet restart does and expects exactly one
// registration, on a served endpoint with a working ListAndWatch.
func (x *session) restart(ctx context.Context) error {
	x.closeStream()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(x.r.Host.SocketDir); err != nil {
		return err
	}
	drain(x.k.Calls)
	drain(x.k.Regs)
	served, err := x.k.Restart()
	if err != nil {
		return err
	}
	raw, err := rawEvent(w, x.k.Socket(), served)
	if err != nil {
		return err
	}
	var first kubeletsim.Registration
	select {
	case first = <-x.k.Calls:
	case <-x.p.Done():
		x.res.Fail("kubelet-restart", "the plugin exited: %v", x.p.Err())
		x.stopped = true
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(x.s.Restart):
		x.res.Fail("kubelet-restart", "no registration within %s", x.s.Restart)
		return nil
	}
	if first.Err != nil {
		x.res.Fail("kubelet-restart", "registration refused: %v", first.Err)
		return nil
	}
	x.res.Measure("restart-registered", report.Ms(first.At.Sub(served)), report.Ms(raw))
	x.reg = first
	select {
	case extra := <-x.k.Calls:
		x.res.Fail("kubelet-restart", "registered again %s later (endpoint %s)", extra.At.Sub(first.At).Round(time.Microsecond), extra.Request.Endpoint)
		return nil
	case <-time.After(x.s.Settle):
	}
	if err := x.watch(ctx); err != nil {
		x.res.Fail("kubelet-restart", "new endpoint: %v", err)
		return nil
	}
	if _, err := kubeletsim.WaitFor(x.updates, x.s.Prompt, func(kubeletsim.Update) bool { return true }); err != nil {
		x.res.Fail("kubelet-restart", "no list on the new endpoint within %s", x.s.Prompt)
		return nil
	}
	x.res.Pass("kubelet-restart", "one registration, listed on %s", first.Request.Endpoint)
	return nil
}
