// Package fleet is dp-bench -fleet N: it runs every DRA target of
// -targets on a fleet of N nodes, one target after the other, each with a
// fresh private control plane (fleetCluster): etcd, kube-apiserver,
// kube-scheduler and kube-controller-manager. One driver process per
// node, with a kubelet stand-in per node (fleetNode, kubeletsim.Pods): the
// scheduler allocates the claims of real pods from the drivers'
// ResourceSlices, and the stand-in prepares them. It counts the drivers'
// API writes (package audit), their CPU and memory, through scheduling
// rounds, a steady window, a health storm and a rollout, and writes the
// table of docs/fleet.md. The targets run apart, not side by side: at
// N=100 two fleets at once would share two cores and one API server, and
// each figure (the API server's memory above all) would be the sum of
// both.
package fleet

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/audit"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/controlplane"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/stats"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/target"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
)

// Options are the -fleet flags.
type Options struct {
	N, Rounds                    int
	Fill                         float64
	Steady, Storm, Settle        time.Duration
	StormRate                    int
	Scheduler, ControllerManager string
	MD, JSON                     string
}

// AddFlags defines the -fleet flags on fs.
func AddFlags(fs *flag.FlagSet) *Options {
	fo := &Options{}
	fs.IntVar(&fo.N, "fleet", 0, "run the DRA targets on a fleet of this many nodes (0: no fleet; docs/fleet.md)")
	fs.Float64Var(&fo.Fill, "fleet-fill", 0.8, "fleet: the share of the fleet's devices claimed by pods created at once")
	fs.IntVar(&fo.Rounds, "fleet-rounds", 3, "fleet: scheduling rounds (pods created, bound, prepared, then deleted and unprepared but the last); the medians are reported")
	fs.DurationVar(&fo.Steady, "fleet-steady", 5*time.Minute, "fleet: the steady-state window (nothing changes; the drivers' writes are counted)")
	fs.DurationVar(&fo.Storm, "fleet-storm", 30*time.Second, "fleet: the health storm's length (0: none)")
	fs.IntVar(&fo.StormRate, "fleet-storm-rate", 10, "fleet: health storm cycles (Unhealthy and back) per second")
	fs.DurationVar(&fo.Settle, "fleet-settle", 10*time.Second, "fleet: quiet time after a step before the next is counted")
	fs.StringVar(&fo.Scheduler, "kube-scheduler", "", "fleet: the kube-scheduler binary")
	fs.StringVar(&fo.ControllerManager, "kube-controller-manager", "", "fleet: the kube-controller-manager binary")
	fs.StringVar(&fo.MD, "fleet-md", "", "fleet: write the tables into this Markdown file between the fleet markers")
	fs.StringVar(&fo.JSON, "fleet-json", "", "fleet: write the report as JSON to this file")
	return fo
}

// Check validates the fleet flags; errors name the flag and the value.
func (fo *Options) Check() error {
	switch {
	case fo.N < 1:
		return fmt.Errorf("-fleet=%d: must be at least 1", fo.N)
	case fo.Rounds < 1:
		return fmt.Errorf("-fleet-rounds=%d: must be at least 1", fo.Rounds)
	case fo.Fill <= 0 || fo.Fill > 1:
		return fmt.Errorf("-fleet-fill=%g: must be in (0, 1]", fo.Fill)
	case fo.Steady <= 0:
		return fmt.Errorf("-fleet-steady=%s: must be above 0", fo.Steady)
	case fo.Storm < 0:
		return fmt.Errorf("-fleet-storm=%s: must not be negative", fo.Storm)
	case fo.StormRate < 1 || fo.StormRate > 100:
		return fmt.Errorf("-fleet-storm-rate=%d: must be in 1..100", fo.StormRate)
	case fo.Settle <= 0:
		return fmt.Errorf("-fleet-settle=%s: must be above 0", fo.Settle)
	}
	return nil
}

// Config is what a fleet runs: the -fleet flags, and the targets, their
// settings and the control plane's binaries of dp-bench's flags.
type Config struct {
	Options
	// Command is dp-bench's command line, for the report.
	Command      string
	Targets      []target.Target
	Settings     target.Settings
	ControlPlane controlplane.Options
	// MustPass names the targets that must run to the end for exit
	// status 0 (nil: all).
	MustPass map[string]bool
}

// Run runs every DRA target of c on a fleet, writes the report, and
// returns dp-bench's exit status.
func Run(ctx context.Context, c *Config, stdout, stderr io.Writer) int {
	fo := &c.Options
	rep := &Report{Command: c.Command, Machine: report.DescribeMachine(), N: fo.N,
		Steady: fo.Steady.String(), Storm: fmt.Sprintf("%s at %d/s", fo.Storm, fo.StormRate)}
	// Every driver process of ours holds 2 inotify instances; the kernel
	// allows fs.inotify.max_user_instances per user (128 by default), for
	// the whole machine: a larger fleet's drivers fail to start.
	if b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_instances"); err == nil {
		if limit, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && 2*fo.N > limit {
			fmt.Fprintf(stderr, "dp-bench: fleet: warning: -fleet=%d needs about %d inotify instances, fs.inotify.max_user_instances is %d: drivers will fail to start\n", fo.N, 2*fo.N, limit)
		}
	}
	ok := true
	for _, t := range c.Targets {
		if t.DRA == nil {
			continue
		}
		fmt.Fprintf(stderr, "dp-bench: fleet of %d: %s\n", fo.N, t.Label())
		ft, version := runTarget(ctx, t, c, stderr)
		if version != "" {
			rep.APIServer = version
		}
		if ft.Err != "" {
			fmt.Fprintf(stderr, "dp-bench: fleet: %s: %s\n", t.Label(), ft.Err)
			if c.MustPass == nil || c.MustPass[t.Name] {
				ok = false
			}
		}
		rep.Targets = append(rep.Targets, ft)
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "dp-bench: interrupted")
			return 1
		}
	}
	rep.Machine.LoadAfter = report.Loadavg()
	writeMarkdown(stdout, rep)
	if fo.JSON != "" {
		if err := report.WriteJSON(fo.JSON, rep); err != nil {
			fmt.Fprintln(stderr, "dp-bench: -fleet-json:", err)
			return 1
		}
	}
	if fo.MD != "" {
		var gen bytes.Buffer
		writeMarkdown(&gen, rep)
		if err := report.WriteBetween(fo.MD, mdBeginFleet, mdEndFleet, "", gen.Bytes()); err != nil {
			fmt.Fprintln(stderr, "dp-bench: -fleet-md:", err)
			return 1
		}
	}
	if !ok {
		return 1
	}
	return 0
}

// runTarget runs one driver on the fleet.
func runTarget(ctx context.Context, t target.Target, c *Config, stderr io.Writer) (TargetReport, string) {
	ft := TargetReport{Name: t.Label(), Driver: t.DRA.Driver}
	fc, err := startFleetCluster(ctx, c.ControlPlane, &c.Options)
	if err != nil {
		ft.Err = err.Error()
		return ft, ""
	}
	defer fc.stop()
	f := &fleet{t: t, c: c, fc: fc, ft: &ft, log: stderr}
	if err := f.run(ctx); err != nil {
		ft.Err = err.Error()
	}
	return ft, fc.cp.Version
}

// fleet is one driver's fleet in progress.
type fleet struct {
	t        target.Target
	c        *Config
	fc       *fleetCluster
	ft       *TargetReport
	log      io.Writer
	nodes    []*fleetNode
	names    []string
	k        *kubeletsim.Pods
	podWatch *apiclient.Watcher // the stand-in's watch of the pods
	st       *sliceTracker
	tpl      string
	pods     int
}

func (f *fleet) logf(format string, a ...any) {
	fmt.Fprintf(f.log, "dp-bench: fleet: %s: "+format+"\n", append([]any{f.t.Name}, a...)...)
}

func (f *fleet) run(ctx context.Context) error {
	api := f.fc.cp.Client
	var err error
	if f.tpl, err = f.fc.driverObjects(ctx, f.t.DRA.Driver); err != nil {
		return err
	}
	f.ft.Agent = target.BaseName(f.t.Command[0])
	if a, err := t0Expand(f.t); err == nil {
		f.ft.Agent = a
	}
	for i := range f.c.N {
		f.names = append(f.names, fleetNodeName(i))
	}
	var made errgroup.Group
	made.SetLimit(16)
	for _, name := range f.names {
		made.Go(func() error { return f.fc.makeNode(ctx, name) })
	}
	if err := made.Wait(); err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	want := f.t.DRA.Devices
	if f.st, err = trackSlices(wctx, api, f.t.DRA.Driver, want, f.logf); err != nil {
		return err
	}
	defer func() { cancel(); f.st.wait() }()

	// Start: every driver at once.
	start := time.Now()
	f.nodes = make([]*fleetNode, f.c.N)
	var started errgroup.Group
	started.SetLimit(16)
	for i, name := range f.names {
		started.Go(func() error {
			kc, err := f.fc.nodeKubeconfig(name)
			if err != nil {
				return err
			}
			f.nodes[i], err = startFleetNode(f.t, f.c.Settings, kc, name)
			return err
		})
	}
	err = started.Wait()
	defer func() {
		var stopped errgroup.Group
		stopped.SetLimit(16)
		for _, n := range f.nodes {
			if n != nil {
				stopped.Go(func() error { n.stop(); return nil })
			}
		}
		_ = stopped.Wait()
	}()
	if err != nil {
		return err
	}
	if err := f.standIn(wctx); err != nil {
		return err
	}
	defer func() { cancel(); f.k.Wait(); f.podWatch.Wait() }()
	var registered errgroup.Group
	for _, n := range f.nodes {
		registered.Go(func() error { return n.register(ctx, 2*time.Minute) })
	}
	if err := registered.Wait(); err != nil {
		return err
	}
	last, err := f.st.waitClean(ctx, f.names, 2*time.Minute)
	if err != nil {
		return err
	}
	f.ft.StartSlicesS = last.Sub(start).Seconds()
	f.ft.Devices = f.c.N * want
	f.logf("%d nodes registered, %d devices published %.1f s after the start", f.c.N, f.ft.Devices, f.ft.StartSlicesS)

	if err := f.schedule(ctx); err != nil {
		return err
	}
	f.memory()
	if err := f.steady(ctx); err != nil {
		return err
	}
	if err := f.storm(ctx); err != nil {
		return err
	}
	return f.rollout(ctx)
}

// standIn starts the kubelet stand-in of every node: one watch of the
// fleet's pods, dispatched by node (kubeletsim.Pods).
func (f *fleet) standIn(ctx context.Context) error {
	nodes := make(map[string]kubeletsim.NodeDriver, len(f.nodes))
	for _, n := range f.nodes {
		nodes[n.name] = n
	}
	api := f.fc.cp.Client
	f.k = kubeletsim.NewPods(podAPI{api}, fleetNamespace, nodes, f.logf)
	w, err := api.Watch(ctx, apiclient.PathPods(fleetNamespace), url.Values{}, func(ev apiclient.Event) {
		if p, ok := podOf(ev); ok {
			f.k.Observe(p, ev.At)
		}
	}, f.logf)
	if err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}
	f.podWatch = w
	f.k.Run(ctx)
	return nil
}

// t0Expand is the user agent's product of the target: client-go's
// default is the binary's base name.
func t0Expand(t target.Target) (string, error) {
	if len(t.Command) == 0 {
		return "", errors.New("no command")
	}
	v := t.Command[0]
	if strings.Contains(v, "{{") {
		r, err := t.Prepare("", &target.Cluster{})
		if err != nil {
			return "", err
		}
		defer r.Cleanup()
		v = r.Argv[0]
	}
	return target.BaseName(v), nil
}

// createPods creates count pods named prefix-<i> at once (32 at a time)
// and returns their names.
func (f *fleet) createPods(ctx context.Context, prefix string, count int) ([]string, error) {
	names := make([]string, count)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	var g errgroup.Group
	g.SetLimit(32)
	for _, name := range names {
		g.Go(func() error {
			f.k.Created(name, time.Now())
			return f.fc.cp.Client.Do(ctx, http.MethodPost, apiclient.PathPods(fleetNamespace), claimPod(name, f.tpl), nil)
		})
	}
	return names, g.Wait()
}

// schedule: Fill of the devices claimed by pods created at once, Rounds
// times; between two rounds the pods are deleted and their claims
// unprepared and deleted (kubeletsim.Pods.Finish). The last round's pods
// stay (the rollout needs them).
func (f *fleet) schedule(ctx context.Context) error {
	count := int(f.c.Fill * float64(f.ft.Devices))
	for r := range f.c.Rounds {
		cpu0 := f.cpu()
		names, err := f.createPods(ctx, fmt.Sprintf("sched%d", r), count)
		if err != nil {
			return fmt.Errorf("round %d: creating pods: %w", r+1, err)
		}
		f.pods = count
		if err := f.k.WaitPrepared(ctx, names, time.Minute+time.Duration(count)*200*time.Millisecond); err != nil {
			if e := f.fc.alive(); e != nil {
				return e
			}
			return fmt.Errorf("round %d: scheduling: %w; kube-scheduler: %s; kube-controller-manager: %s", r+1, err, f.fc.others[0].LogTail(1500), f.fc.others[1].LogTail(1500))
		}
		var rd schedRound
		rd.DriverCPUPerPodMs, rd.ControlPlaneCPUS, rd.StandInCPUS = roundCPU(f.cpu().sub(cpu0), count)
		ws, err := f.flushedAudit(ctx)
		if err != nil {
			return err
		}
		var missed int
		binds := audit.BindTimes(ws, names)
		rd.BoundPerS, rd.PreparedPerS, missed = f.k.Rates(names, binds)
		b2p, calls := f.k.Latencies(names, binds)
		rd.BindToPreparedP50Ms, rd.BindToPreparedP99Ms = report.Ms(stats.Quantile(b2p, 0.5)), report.Ms(stats.Quantile(b2p, 0.99))
		rd.PrepareCallP50Ms, rd.PrepareCallP99Ms = report.Ms(stats.Quantile(calls, 0.5)), report.Ms(stats.Quantile(calls, 0.99))
		if missed > 0 {
			f.logf("round %d: %d bindings not in the audit log: the watch's times taken for them", r+1, missed)
		}
		f.ft.Rounds = append(f.ft.Rounds, rd)
		f.logf("round %d: %d pods: %.1f/s bound, %.1f/s prepared; per pod, binding to prepared p50 %.0f ms, p99 %.0f ms; NodePrepareResources p50 %.1f ms, p99 %.1f ms; CPU: drivers %.1f ms a pod, control plane %.1f s, stand-in %.1f s",
			r+1, count, rd.BoundPerS, rd.PreparedPerS, rd.BindToPreparedP50Ms, rd.BindToPreparedP99Ms, rd.PrepareCallP50Ms, rd.PrepareCallP99Ms,
			rd.DriverCPUPerPodMs, rd.ControlPlaneCPUS, rd.StandInCPUS)
		if r == f.c.Rounds-1 {
			break
		}
		if err := f.k.Finish(ctx, names); err != nil {
			return fmt.Errorf("round %d: %w", r+1, err)
		}
		if err := f.waitNoClaims(ctx, 2*time.Minute); err != nil {
			return fmt.Errorf("round %d: %w", r+1, err)
		}
		if err := proc.Sleep(ctx, f.c.Settle); err != nil {
			return err
		}
	}
	f.ft.Pods = count
	f.ft.BoundPerS = roundsMedian(f.ft.Rounds, func(r schedRound) float64 { return r.BoundPerS })
	f.ft.PreparedPerS = roundsMedian(f.ft.Rounds, func(r schedRound) float64 { return r.PreparedPerS })
	f.ft.PrepareErrors = f.k.Errors()
	f.logf("%d rounds of %d pods: medians %.1f/s bound, %.1f/s prepared", f.c.Rounds, count, f.ft.BoundPerS, f.ft.PreparedPerS)
	return nil
}

// waitNoClaims waits until the fleet's namespace has no ResourceClaim
// (the stand-in's Finish deleted them; the resourceclaim controller deallocates
// each and lets it go): the devices are free.
func (f *fleet) waitNoClaims(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var list struct {
			Items []apiclient.ResourceClaim `json:"items"`
		}
		if err := f.fc.cp.Client.Do(ctx, http.MethodGet, apiclient.PathClaims(fleetNamespace), nil, &list); err != nil {
			return fmt.Errorf("listing claims: %w", err)
		}
		if len(list.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d claims left %s after their pods were deleted", len(list.Items), timeout)
		}
		if err := proc.Sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// memory: the drivers' resident memory and the API server's.
func (f *fleet) memory() {
	var rss []float64
	for _, n := range f.nodes {
		rss = append(rss, report.MiB(n.rss()))
	}
	f.ft.DriverRSSMiB = stats.Median(rss)
	f.ft.DriverRSSMaxMiB = slices.Max(rss)
	f.ft.APIServerRSSMiB = report.MiB(f.fc.apiserverRSS())
}

// window runs during, waits until d has passed since it began, and
// returns the audit log's writes and the window's bounds [from, to).
func (f *fleet) window(ctx context.Context, d time.Duration, during func(context.Context) error) ([]audit.Write, time.Time, time.Time, error) {
	from := time.Now()
	if during != nil {
		if err := during(ctx); err != nil {
			return nil, from, from, err
		}
	}
	if err := proc.Sleep(ctx, time.Until(from.Add(d))); err != nil {
		return nil, from, from, err
	}
	to := time.Now()
	ws, err := f.flushedAudit(ctx)
	return ws, from, to, err
}

// flushedAudit reads the audit log once what happened until now is in it:
// the API server writes it in batches of at most 200 ms.
func (f *fleet) flushedAudit(ctx context.Context) ([]audit.Write, error) {
	if err := proc.Sleep(ctx, time.Second); err != nil {
		return nil, err
	}
	return f.fc.audit()
}

// steady: nothing changes for Steady; every write of the drivers counts.
func (f *fleet) steady(ctx context.Context) error {
	if err := proc.Sleep(ctx, f.c.Settle); err != nil {
		return err
	}
	before, err := f.fc.metrics(ctx)
	if err != nil {
		return err
	}
	cpu0 := f.cpu()
	ws, from, to, err := f.window(ctx, f.c.Steady, nil)
	if err != nil {
		return err
	}
	f.ft.SteadyCPUMsPerNodeMin = perNodeMinuteMs(f.cpu().sub(cpu0).Drivers, f.c.N, to.Sub(from))
	tally := audit.TallyWrites(ws, f.ft.Agent, "", from, to)
	if after, err := f.fc.metrics(ctx); err == nil {
		f.ft.SteadyAll = audit.RequestWrites(before, after)
	}
	f.ft.Steady = tally
	f.ft.SteadyPerNodeMin = float64(tally.Total) / float64(f.c.N) / to.Sub(from).Minutes()
	f.logf("steady %s: %d driver writes (%.2f per node per minute) %v; driver CPU %.2f ms per node per minute", to.Sub(from).Round(time.Second), tally.Total, f.ft.SteadyPerNodeMin, tally.ByKind, f.ft.SteadyCPUMsPerNodeMin)
	return nil
}

// storm: every device node of every node removed and made again,
// StormRate times a second, for Storm; the slice writes in the storm and
// the second after it, and when the last state (all healthy) was
// published.
func (f *fleet) storm(ctx context.Context) error {
	if f.c.Storm == 0 {
		f.ft.StormNA = "not run (-fleet-storm=0)"
		return nil
	}
	type devNode struct {
		path string
		mode uint32
		dev  uint64
	}
	var devs []devNode
	for _, n := range f.nodes {
		paths, err := n.deviceNodes()
		if err != nil {
			return err
		}
		for _, p := range paths {
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil {
				return err
			}
			devs = append(devs, devNode{p, st.Mode, st.Rdev})
		}
	}
	if len(devs) == 0 {
		f.ft.StormNA = "n/a: the driver makes no device node whose health dp-bench can flip"
		return nil
	}
	events0 := f.st.eventCount()
	flip := func(up bool) {
		for _, d := range devs {
			if up {
				_ = unix.Mknod(d.path, d.mode, int(d.dev))
			} else {
				_ = os.Remove(d.path)
			}
		}
	}
	var end time.Time
	during := func(ctx context.Context) error {
		tick := time.NewTicker(time.Second / time.Duration(2*f.c.StormRate))
		defer tick.Stop()
		stop := time.Now().Add(f.c.Storm)
		up := true
		for time.Now().Before(stop) {
			select {
			case <-ctx.Done():
				flip(true)
				return ctx.Err()
			case <-tick.C:
			}
			up = !up
			flip(up)
			if up {
				f.ft.StormFlips++
			}
		}
		flip(true)
		end = time.Now()
		return nil
	}
	ws, from, to, err := f.window(ctx, f.c.Storm+time.Second, during)
	if err != nil {
		return err
	}
	c := audit.StormRates(ws, f.ft.Agent, f.c.N, from, end, to)
	last, err := f.st.waitClean(ctx, f.names, time.Minute)
	if err != nil {
		return fmt.Errorf("after the storm: %w", err)
	}
	f.ft.StormLastS = max(0, last.Sub(end).Seconds())
	f.ft.Storm, f.ft.StormPerNodeS = c.Window, c.WindowPerNodeS
	f.ft.StormDuring, f.ft.StormDuringPerNodeS = c.During.Total, c.DuringPerNodeS
	f.logf("storm %s: %d flips per device, %d slice events seen; %d slice writes in it (%.2f per node per second), %d with the %s after it (%.2f per node per second, at most %d of a node in a second), last state published %.2f s after its end",
		end.Sub(from).Round(time.Millisecond), f.ft.StormFlips, f.st.eventCount()-events0, c.During.Total, c.DuringPerNodeS,
		c.Window.Total, to.Sub(end).Round(time.Millisecond), c.WindowPerNodeS, c.Window.MaxNodeSecond, f.ft.StormLastS)
	return nil
}

// rollout: every driver restarted at once while its pods' claims are
// prepared; pods created during the rollout on the remaining devices
// must be scheduled and prepared, and no pod may fail.
func (f *fleet) rollout(ctx context.Context) error {
	if err := proc.Sleep(ctx, f.c.Settle); err != nil {
		return err
	}
	extra := max(1, (f.ft.Devices-f.pods)/2)
	var names []string
	var rolled time.Time
	during := func(ctx context.Context) error {
		var restarts errgroup.Group
		for _, n := range f.nodes {
			restarts.Go(func() error { return n.restart(ctx, f.c.Settings.Term, 2*time.Minute) })
		}
		var err error
		names, err = f.createPods(ctx, "rollout", extra)
		if rerr := restarts.Wait(); rerr != nil {
			return rerr
		}
		if err != nil {
			return err
		}
		if _, err := f.st.waitClean(ctx, f.names, 2*time.Minute); err != nil {
			return err
		}
		if err := f.k.WaitPrepared(ctx, names, 5*time.Minute); err != nil {
			return fmt.Errorf("pods created during the rollout: %w", err)
		}
		rolled = time.Now()
		return proc.Sleep(ctx, f.c.Settle)
	}
	ws, from, to, err := f.window(ctx, 0, during)
	if err != nil {
		return fmt.Errorf("rollout: %w", err)
	}
	tally := audit.TallyWrites(ws, f.ft.Agent, "resourceslices", from, to)
	f.ft.Rollout = tally
	f.ft.RolloutS = rolled.Sub(from).Seconds()
	f.ft.RolloutPerNode = float64(tally.Total) / float64(f.c.N)
	f.ft.RolloutPods = extra
	f.ft.RolloutFailed = f.k.Failures()
	f.logf("rollout: done in %.1f s; %d slice writes (%.2f per node, at most %d), %d pods created during it, %d pods failed %v",
		f.ft.RolloutS, tally.Total, f.ft.RolloutPerNode, tally.MaxNode, extra, len(f.ft.RolloutFailed), tally.ByKind)
	if len(f.ft.RolloutFailed) > 0 {
		return fmt.Errorf("rollout: pods failed: %s", strings.Join(f.ft.RolloutFailed, "; "))
	}
	return nil
}
