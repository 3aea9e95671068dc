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
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/cdiresolve"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/stats"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/target"
	"github.com/cdi-device-plugin/cdi-device-plugin/device/sysfs"
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

// items are the parts of an Allocate answer that belong to devices: CDI
// names, device specs and mounts (env and annotations may name the whole
// set, so they are not compared).
func items(r *pluginapi.ContainerAllocateResponse) []string {
	var out []string
	for _, d := range r.CdiDevices {
		out = append(out, "CDI device "+d.Name)
	}
	for _, d := range r.Devices {
		out = append(out, "device "+d.HostPath+" at "+d.ContainerPath)
	}
	for _, m := range r.Mounts {
		out = append(out, "mount "+m.HostPath+" at "+m.ContainerPath)
	}
	names, _, _ := cdiapi.ParseAnnotations(r.Annotations)
	for _, n := range names {
		out = append(out, "CDI device "+n)
	}
	return out
}

func empty(r *pluginapi.ContainerAllocateResponse) bool {
	return len(r.CdiDevices) == 0 && len(r.Devices) == 0 && len(r.Mounts) == 0 && len(r.Envs) == 0 && len(r.Annotations) == 0
}

func allocReq(containers ...[]string) *pluginapi.AllocateRequest {
	req := &pluginapi.AllocateRequest{}
	for _, ids := range containers {
		req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
	}
	return req
}

// allocate checks Allocate: each ID alone gets an answer, and all of them
// together get an answer that holds every single answer's devices; two
// containers get two answers; unknown IDs are refused. Then the CDI names
// are resolved and Allocate is timed against an empty RPC.
func (x *session) allocate(ctx context.Context, ids []string) error {
	var problems []string
	var want []string
	for _, id := range ids {
		resp, err := x.c.Allocate(ctx, allocReq([]string{id}))
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s alone: %v", id, err))
		case len(resp.ContainerResponses) != 1:
			problems = append(problems, fmt.Sprintf("%s alone: %d container answers", id, len(resp.ContainerResponses)))
		case empty(resp.ContainerResponses[0]):
			problems = append(problems, fmt.Sprintf("%s alone: empty answer", id))
		default:
			want = append(want, items(resp.ContainerResponses[0])...)
		}
	}
	all, err := x.c.Allocate(ctx, allocReq(ids))
	var got *pluginapi.ContainerAllocateResponse
	switch {
	case err != nil:
		problems = append(problems, fmt.Sprintf("%d IDs: %v", len(ids), err))
	case len(all.ContainerResponses) != 1:
		problems = append(problems, fmt.Sprintf("%d IDs: %d container answers for 1 container", len(ids), len(all.ContainerResponses)))
	default:
		got = all.ContainerResponses[0]
		have := map[string]bool{}
		for _, it := range items(got) {
			have[it] = true
		}
		for _, w := range want {
			if !have[w] {
				problems = append(problems, fmt.Sprintf("%d IDs together: %s missing (given for its ID alone)", len(ids), w))
				break
			}
		}
	}
	if len(ids) >= 2 {
		two, err := x.c.Allocate(ctx, allocReq(ids[:1], ids[1:2]))
		if err != nil {
			problems = append(problems, fmt.Sprintf("2 containers: %v", err))
		} else if len(two.ContainerResponses) != 2 || empty(two.ContainerResponses[0]) || empty(two.ContainerResponses[1]) {
			problems = append(problems, fmt.Sprintf("2 containers: %d container answers", len(two.ContainerResponses)))
		}
	}
	if len(problems) > 0 {
		x.res.Fail("allocate", "%s", strings.Join(problems, "; "))
	} else {
		x.res.Pass("allocate", "%d IDs alone and together, 2 containers", len(ids))
	}

	const unknown = "dp-bench-no-such-device"
	var accepted []string
	for _, req := range [][]string{{unknown}, {ids[0], unknown}} {
		if _, err := x.c.Allocate(ctx, allocReq(req)); err == nil {
			accepted = append(accepted, strings.Join(req, ","))
		}
	}
	if len(accepted) > 0 {
		x.res.Fail("allocate-unknown", "accepted %s", strings.Join(accepted, " and "))
	} else {
		_, err := x.c.Allocate(ctx, allocReq([]string{unknown}))
		x.res.Pass("allocate-unknown", "refused: %s", status.Code(err))
	}

	if got != nil {
		x.resolve(got)
	} else {
		x.res.Skip("cdi-resolve", "no Allocate answer")
	}

	req := allocReq(ids)
	a, b, err := x.timed(ctx, func() error { _, err := x.c.Allocate(ctx, req); return err })
	if err != nil {
		return fmt.Errorf("the Allocate call: %w", err)
	}
	x.res.Measure("allocate", report.Us(a), report.Us(b))
	return nil
}

// timed calls f and an empty RPC alternately and returns both p50s.
func (x *session) timed(ctx context.Context, f func() error) (time.Duration, time.Duration, error) {
	var ds, bs []time.Duration
	for i := 0; i < x.s.Calls; i++ {
		t := time.Now()
		if _, err := x.c.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
			return 0, 0, err
		}
		bs = append(bs, time.Since(t))
		t = time.Now()
		if err := f(); err != nil {
			return 0, 0, err
		}
		ds = append(ds, time.Since(t))
	}
	return stats.Quantile(ds, 0.5), stats.Quantile(bs, 0.5), nil
}

// resolve injects the answer's CDI names the way containerd does: a fresh
// cache over the CDI directory, InjectDevices into an empty OCI spec.
func (x *session) resolve(r *pluginapi.ContainerAllocateResponse) {
	var names []string
	for _, d := range r.CdiDevices {
		names = append(names, d.Name)
	}
	ann, _, err := cdiapi.ParseAnnotations(r.Annotations)
	if err != nil {
		x.res.Fail("cdi-resolve", "CDI annotations: %v", err)
		return
	}
	names = append(names, ann...)
	if len(names) == 0 {
		x.res.Skip("cdi-resolve", "no CDI names returned")
		return
	}
	n, err := cdiresolve.Inject(x.r.Host.CDIDir, names)
	if err != nil {
		x.res.Fail("cdi-resolve", "%v", err)
		return
	}
	x.res.Pass("cdi-resolve", "%d names, %d device nodes injected", len(names), n)
}

// preferred checks GetPreferredAllocation, when advertised, on all IDs and
// on every other ID, and times it.
func (x *session) preferred(ctx context.Context) error {
	if !x.reg.Options.GetPreferredAllocationAvailable {
		x.res.Skip("preferred-allocation", "not advertised")
		return nil
	}
	if len(x.healthy) < 2 {
		x.res.Skip("preferred-allocation", "fewer than 2 healthy devices")
		return nil
	}
	var alternate []string
	for i := 0; i < len(x.healthy); i += 2 {
		alternate = append(alternate, x.healthy[i])
	}
	cases := []struct {
		name            string
		available, must []string
		size            int
	}{
		// Sizes below the number available, so that "all of them" is wrong.
		{"all IDs, must-include the last", x.healthy, x.healthy[len(x.healthy)-1:], min(4, len(x.healthy)-1)},
		{"every other ID", alternate, nil, max(1, min(2, len(alternate)-1))},
	}
	var problems []string
	for _, c := range cases {
		req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: c.available, MustIncludeDeviceIDs: c.must, AllocationSize: int32(c.size)}}}
		resp, err := x.c.GetPreferredAllocation(ctx, req)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", c.name, err))
			continue
		}
		if len(resp.ContainerResponses) != 1 {
			problems = append(problems, fmt.Sprintf("%s: %d container answers", c.name, len(resp.ContainerResponses)))
			continue
		}
		if p := checkPreferred(resp.ContainerResponses[0].DeviceIDs, c.available, c.must, c.size); p != "" {
			problems = append(problems, c.name+": "+p)
		}
	}
	if len(problems) > 0 {
		x.res.Fail("preferred-allocation", "%s", strings.Join(problems, "; "))
	} else {
		x.res.Pass("preferred-allocation", "%d cases", len(cases))
	}
	req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: x.healthy, AllocationSize: int32(min(4, len(x.healthy)))}}}
	a, b, err := x.timed(ctx, func() error { _, err := x.c.GetPreferredAllocation(ctx, req); return err })
	if err != nil {
		return fmt.Errorf("GetPreferredAllocation: %w", err)
	}
	x.res.Measure("preferred", report.Us(a), report.Us(b))
	return nil
}

// checkPreferred returns what is wrong with a preferred allocation.
func checkPreferred(got, available, must []string, size int) string {
	avail := map[string]bool{}
	for _, id := range available {
		avail[id] = true
	}
	seen := map[string]bool{}
	for _, id := range got {
		if !avail[id] {
			return fmt.Sprintf("returned %q, not available", id)
		}
		if seen[id] {
			return fmt.Sprintf("returned %q twice", id)
		}
		seen[id] = true
	}
	for _, id := range must {
		if !seen[id] {
			return fmt.Sprintf("must-include %q left out", id)
		}
	}
	if len(got) != size {
		return fmt.Sprintf("%d IDs, size %d", len(got), size)
	}
	return ""
}

func (x *session) prestart(ctx context.Context, ids []string) error {
	if !x.reg.Options.PreStartRequired {
		x.res.Skip("prestart", "not advertised")
		return nil
	}
	req := &pluginapi.PreStartContainerRequest{DevicesIds: ids}
	if _, err := x.c.PreStartContainer(ctx, req); err != nil {
		x.res.Fail("prestart", "%d IDs: %v", len(ids), err)
		return nil
	}
	x.res.Pass("prestart", "%d IDs", len(ids))
	a, b, err := x.timed(ctx, func() error { _, err := x.c.PreStartContainer(ctx, req); return err })
	if err != nil {
		return fmt.Errorf("PreStartContainer: %w", err)
	}
	x.res.Measure("prestart", report.Us(a), report.Us(b))
	return nil
}

// catchUp takes the lists that arrived since the last one read: they are
// the current state.
func (x *session) catchUp() error {
	for more := true; more; {
		select {
		case u, ok := <-x.updates:
			if !ok {
				return errors.New("ListAndWatch stream ended")
			}
			x.last = u
		default:
			more = false
		}
	}
	return nil
}

// healthySet is the sorted healthy IDs of u.
func healthySet(u kubeletsim.Update) string {
	var ids []string
	for _, d := range u.Devices {
		if d.Health == pluginapi.Healthy {
			ids = append(ids, d.ID)
		}
	}
	sort.Strings(ids)
	return strings.Join(ids, "\x00")
}

// change removes the device file, waits for a list with fewer healthy IDs,
// puts the file back as it was and waits for the original list.
func (x *session) change() error {
	if x.r.Remove == "" {
		x.res.Skip("listandwatch-change", "no device file to remove given")
		return nil
	}
	if err := x.catchUp(); err != nil {
		return err
	}
	before := healthySet(x.last)
	var st unix.Stat_t
	if err := unix.Lstat(x.r.Remove, &st); err != nil {
		return fmt.Errorf("removeDevice: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(x.r.Remove)); err != nil {
		return err
	}
	t0 := time.Now()
	if err := os.Remove(x.r.Remove); err != nil {
		return err
	}
	raw, err := rawEvent(w, x.r.Remove, t0)
	if err != nil {
		return err
	}
	u, err := kubeletsim.WaitFor(x.updates, x.s.Change, func(u kubeletsim.Update) bool { return healthySet(u) != before })
	if err != nil {
		x.res.Fail("listandwatch-change", "removal of %s not reported within %s", x.r.Remove, x.s.Change)
	} else {
		x.res.Measure("removed-update", report.Ms(u.At.Sub(t0)), report.Ms(raw))
	}
	// Put it back as it was.
	if st.Mode&unix.S_IFMT == unix.S_IFREG {
		err = os.WriteFile(x.r.Remove, nil, os.FileMode(st.Mode&0o7777))
	} else {
		err = unix.Mknod(x.r.Remove, st.Mode, int(st.Rdev))
	}
	if err != nil {
		return fmt.Errorf("restore %s: %w", x.r.Remove, err)
	}
	if x.res.Checks["listandwatch-change"].Status == report.Fail {
		return nil
	}
	if x.last, err = kubeletsim.WaitFor(x.updates, x.s.Change, func(u kubeletsim.Update) bool { return healthySet(u) == before }); err != nil {
		x.res.Fail("listandwatch-change", "return of %s not reported within %s", x.r.Remove, x.s.Change)
		return nil
	}
	x.res.Pass("listandwatch-change", "removal and return reported")
	return nil
}

// uevent changes the device tree (Uevent.Change), makes the kernel send a
// uevent (writes "change" to Uevent.Trigger) and waits for a list that
// differs. The baseline is the uevent as a listener of our own receives it.
func (x *session) uevent(ctx context.Context) error {
	if x.t.Uevent == nil {
		return nil // not checked: the tables say n/a
	}
	if err := x.catchUp(); err != nil {
		return err
	}
	before := healthySet(x.last)
	if out, err := exec.Command("sh", "-c", x.r.Change).CombinedOutput(); err != nil {
		return fmt.Errorf("uevent.change: %w: %s", err, out)
	}
	got := make(chan time.Time, 16)
	l, err := sysfs.Listen(ctx, func(sysfs.Uevent) {
		select {
		case got <- time.Now():
		default:
		}
	})
	if err != nil {
		x.res.Skip("uevent-change", "no uevent socket: %v", err)
		return nil
	}
	defer l.Close()
	t0 := time.Now()
	if err := os.WriteFile(x.t.Uevent.Trigger, []byte("change"), 0); err != nil {
		x.res.Skip("uevent-change", "cannot trigger a uevent through %s: %v", x.t.Uevent.Trigger, err)
		return nil
	}
	var raw time.Duration
	select {
	case at := <-got:
		raw = at.Sub(t0)
	case <-time.After(5 * time.Second):
		x.res.Fail("uevent-change", "no uevent within 5s of writing %s", x.t.Uevent.Trigger)
		return nil
	}
	u, err := kubeletsim.WaitFor(x.updates, x.s.Change, func(u kubeletsim.Update) bool { return healthySet(u) != before })
	if err != nil {
		x.res.Fail("uevent-change", "the change was not reported within %s of the uevent", x.s.Change)
		return nil
	}
	x.last = u
	x.res.Measure("uevent-update", report.Ms(u.At.Sub(t0)), report.Ms(raw))
	x.res.Pass("uevent-change", "a change seen only through a kernel uevent reported")
	return nil
}

// rawEvent waits for an inotify event naming path and returns its delay
// from t.
func rawEvent(w *fsnotify.Watcher, path string, t time.Time) (time.Duration, error) {
	timeout := time.After(5 * time.Second)
	for {
		select {
		case ev := <-w.Events:
			if ev.Name == path {
				return time.Since(t), nil
			}
		case err := <-w.Errors:
			return 0, err
		case <-timeout:
			return 0, errors.New("no inotify event for " + path)
		}
	}
}

// idle measures CPU and wake-ups over the idle window, the ListAndWatch
// stream open and nothing else happening, next to an idle Go process over
// the same window; then resident memory.
func (x *session) idle(ctx context.Context) error {
	base, err := proc.StartIdle()
	if err != nil {
		return err
	}
	defer func() { _, _ = base.Terminate(5 * time.Second) }()
	if x.s.Idle > 0 {
		// Let the plugin and the baseline settle: the start-up of one and
		// the calls just made to the other are not idleness.
		if err := proc.Sleep(ctx, time.Second); err != nil {
			return err
		}
		p0, err := proc.Read(x.p.Pid())
		if err != nil {
			return err
		}
		b0, err := proc.Read(base.Pid())
		if err != nil {
			return err
		}
		t0 := time.Now()
		if err := proc.Sleep(ctx, x.s.Idle); err != nil {
			return err
		}
		p1, err := proc.Read(x.p.Pid())
		if err != nil {
			return err
		}
		b1, err := proc.Read(base.Pid())
		if err != nil {
			return err
		}
		perMin := float64(time.Minute) / float64(time.Since(t0))
		x.res.Measure("idle-cpu", report.Ms(p1.CPU-p0.CPU)*perMin, report.Ms(b1.CPU-b0.CPU)*perMin)
		x.res.Measure("idle-wakeups", float64(p1.Switches-p0.Switches)*perMin, float64(b1.Switches-b0.Switches)*perMin)
	}
	ps, err := proc.Read(x.p.Pid())
	if err != nil {
		return err
	}
	bs, err := proc.Read(base.Pid())
	if err != nil {
		return err
	}
	x.res.Measure("rss", report.MiB(ps.RSS), report.MiB(bs.RSS))
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

// sigterm stops the plugin with SIGTERM and checks its socket is gone.
func (x *session) sigterm() {
	x.closeStream()
	sock := filepath.Join(x.r.Host.SocketDir, x.reg.Request.Endpoint)
	ok, err := x.p.Terminate(x.s.Term)
	x.stopped = true
	if !ok {
		x.res.Fail("sigterm-socket", "still running %s after SIGTERM", x.s.Term)
		return
	}
	if _, serr := os.Lstat(sock); serr == nil {
		x.res.Fail("sigterm-socket", "%s left behind (exit: %v)", x.reg.Request.Endpoint, exitText(err))
		return
	}
	x.res.Pass("sigterm-socket", "removed (exit: %s)", exitText(err))
}

func exitText(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}
