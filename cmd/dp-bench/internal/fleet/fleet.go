// Package fleet is dp-bench -fleet N: it runs every DRA target of
// -targets on a fleet of N nodes, each with a fresh private control plane
// (fleetCluster): etcd, kube-apiserver,
// kube-scheduler and kube-controller-manager. One driver process per
// node, with a kubelet stand-in per node (fleetNode, kubeletsim.Pods): the
// scheduler allocates the claims of real pods from the drivers'
// ResourceSlices, and the stand-in prepares them. It counts the drivers'
// API writes (package audit), their CPU and memory, through scheduling
// rounds, a steady window, a health storm and a rollout, and writes the
// table of docs/fleet.md. The fleets are up together but work in turns,
// never two at once (Run): two fleets working at once would share two
// cores, and each figure would carry the other's load; one after the
// other, the one that always ran first met the machine as it warmed up.
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

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/audit"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/controlplane"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
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
	MD, MDSection, JSON          string
	Rollout                      RolloutMode
}

// RolloutMode is how the rollout replaces every node's driver.
type RolloutMode string

// The rollout modes.
const (
	// RolloutSurge starts the new driver beside the old one and stops
	// the old one once the new one registered: the DaemonSets' rolling
	// update with maxSurge 1, maxUnavailable 0, as both drivers' charts
	// deploy them.
	RolloutSurge RolloutMode = "surge"
	// RolloutRestart stops the driver (SIGTERM) and starts a new one:
	// maxSurge 0, or a driver that crashed and came back.
	RolloutRestart RolloutMode = "restart"
)

// String is the mode for the flag.
func (m *RolloutMode) String() string { return string(*m) }

// Set takes the flag's value: surge or restart.
func (m *RolloutMode) Set(v string) error {
	switch RolloutMode(v) {
	case RolloutSurge, RolloutRestart:
		*m = RolloutMode(v)
		return nil
	}
	return fmt.Errorf("%q: want %s or %s", v, RolloutSurge, RolloutRestart)
}

// what is what the mode does to every node's driver, for the report.
func (m RolloutMode) what() string {
	if m == RolloutRestart {
		return "every driver stopped, then started again, at once: maxSurge 0"
	}
	return "every driver replaced at once, the new beside the old: maxSurge 1, as deployed"
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
	fs.StringVar(&fo.MDSection, "fleet-md-section", "fleet", "fleet: the markers of -fleet-md to write between (<!-- dp-bench-<section>:begin ... -->)")
	fs.StringVar(&fo.JSON, "fleet-json", "", "fleet: write the report as JSON to this file")
	fo.Rollout = RolloutSurge
	fs.Var(&fo.Rollout, "fleet-rollout", "fleet: how the rollout replaces each driver: surge (the new beside the old, as both drivers' DaemonSets roll) or restart (stopped, then started)")
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
// returns dp-bench's exit status. The fleets are all started first, one
// after the other, and take turns: round r of each, in an order that
// rotates from round to round (turn), then the steady window, the storm
// and the rollout of each, in the next turn's order. No two fleets work
// at the same time; the others are idle meanwhile.
func Run(ctx context.Context, c *Config, stdout, stderr io.Writer) int {
	fo := &c.Options
	rep := &Report{Command: c.Command, Machine: report.DescribeMachine(), N: fo.N,
		Steady: fo.Steady.String(), Storm: fmt.Sprintf("%s at %d/s", fo.Storm, fo.StormRate), Rollout: fo.Rollout}
	var targets []target.Target
	for _, t := range c.Targets {
		if t.DRA != nil {
			targets = append(targets, t)
		}
	}
	// Every driver process of ours holds 2 inotify instances; the kernel
	// allows fs.inotify.max_user_instances per user (128 by default), for
	// the whole machine, and every fleet is up at once: a larger fleet's
	// drivers fail to start.
	if b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_instances"); err == nil {
		if limit, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && 2*fo.N*len(targets) > limit {
			fmt.Fprintf(stderr, "dp-bench: fleet: warning: -fleet=%d with %d fleets needs about %d inotify instances, fs.inotify.max_user_instances is %d: drivers will fail to start\n", fo.N, len(targets), 2*fo.N*len(targets), limit)
		}
	}
	reports := make([]*TargetReport, len(targets))
	var live []*fleet
	defer func() {
		for _, f := range live {
			f.close()
		}
	}()
	fail := func(f *fleet, err error) {
		f.ft.Err = err.Error()
		fmt.Fprintf(stderr, "dp-bench: fleet: %s: %s\n", f.t.Label(), err)
		f.close()
		live = slices.DeleteFunc(live, func(g *fleet) bool { return g == f })
	}
	for i, t := range targets {
		reports[i] = &TargetReport{Name: t.Label(), Driver: t.DRA.Driver}
		fmt.Fprintf(stderr, "dp-bench: fleet of %d: %s\n", fo.N, t.Label())
		fc, err := startFleetCluster(ctx, c.ControlPlane, &c.Options)
		if err != nil {
			reports[i].Err = err.Error()
			fmt.Fprintf(stderr, "dp-bench: fleet: %s: %s\n", t.Label(), err)
			continue
		}
		rep.APIServer = fc.cp.Version
		f := &fleet{t: t, c: c, fc: fc, ft: reports[i], log: stderr}
		f.onClose(fc.stop)
		live = append(live, f)
		if err := f.setup(ctx); err != nil {
			fail(f, err)
		}
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "dp-bench: interrupted")
			return 1
		}
	}
	for r := range fo.Rounds {
		for _, f := range turn(live, r) {
			if err := f.round(ctx, r); err != nil {
				fail(f, err)
			}
			if ctx.Err() != nil {
				fmt.Fprintln(stderr, "dp-bench: interrupted")
				return 1
			}
		}
	}
	for _, f := range turn(live, fo.Rounds) {
		f.scheduled()
		if err := f.rest(ctx); err != nil {
			fail(f, err)
		} else {
			f.close()
			live = slices.DeleteFunc(live, func(g *fleet) bool { return g == f })
		}
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "dp-bench: interrupted")
			return 1
		}
	}
	ok := true
	for i, ft := range reports {
		if ft.Err != "" && (c.MustPass == nil || c.MustPass[targets[i].Name]) {
			ok = false
		}
		rep.Targets = append(rep.Targets, *ft)
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
		begin, end := mdMarkers(fo.MDSection)
		if err := report.WriteBetween(fo.MD, begin, end, "", gen.Bytes()); err != nil {
			fmt.Fprintln(stderr, "dp-bench: -fleet-md:", err)
			return 1
		}
	}
	if !ok {
		return 1
	}
	return 0
}

// turn is the order in which the fleets take round r: rotated by r, so
// that each goes first in turn.
func turn[T any](fleets []T, r int) []T {
	out := make([]T, 0, len(fleets))
	for i := range fleets {
		out = append(out, fleets[(i+r)%len(fleets)])
	}
	return out
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
	// labelled counts the events of the nodes' labelled claim watches
	// (nil: the target has no controller, its drivers open none).
	labelled *labelCount
	// closers undo the setup, last first (close).
	closers []func()
}

func (f *fleet) logf(format string, a ...any) {
	fmt.Fprintf(f.log, "dp-bench: fleet: %s: "+format+"\n", append([]any{f.t.Name}, a...)...)
}

// onClose adds what close does first.
func (f *fleet) onClose(fn func()) { f.closers = append(f.closers, fn) }

// close stops the fleet: its watches, its stand-in, its drivers, its
// control plane; once.
func (f *fleet) close() {
	for i := len(f.closers) - 1; i >= 0; i-- {
		f.closers[i]()
	}
	f.closers = nil
}

// setup starts the fleet's drivers and its stand-in, and measures the
// start: every driver at once until all devices are published.
func (f *fleet) setup(ctx context.Context) error {
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
	// The watches live as long as the fleet, not as ctx's call.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.onClose(cancel)
	want := f.t.DRA.Devices
	if f.st, err = trackSlices(wctx, api, f.t.DRA.Driver, want, f.logf); err != nil {
		return err
	}
	f.onClose(func() { cancel(); f.st.wait() })

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
	f.onClose(func() {
		var stopped errgroup.Group
		stopped.SetLimit(16)
		for _, n := range f.nodes {
			if n != nil {
				stopped.Go(func() error { n.stop(); return nil })
			}
		}
		_ = stopped.Wait()
	})
	if err != nil {
		return err
	}
	if err := f.standIn(wctx); err != nil {
		return err
	}
	f.onClose(func() { cancel(); f.k.Wait(); f.podWatch.Wait() })
	if len(f.t.DRA.Controller) > 0 {
		if err := f.watchLabelled(wctx); err != nil {
			return err
		}
		f.onClose(cancel)
		if err := f.startController(); err != nil {
			return err
		}
	}
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
	// Every process began with the start: what it spent so far is the
	// start's.
	c := f.cpu()
	f.ft.StartDriverCPUMs = float64(c.Drivers) / float64(time.Millisecond) / float64(f.c.N)
	f.ft.StartControlPlaneS = c.ControlPlane.Seconds()
	f.ft.Devices = f.c.N * want
	// Every figure of writes counts a node's by its user: a driver whose
	// first publish is not its node's would read as no write at all.
	ws, err := f.flushedAudit(ctx)
	if err != nil {
		return err
	}
	if err := audit.NodesCreated(ws, "resourceslices", f.names); err != nil {
		return err
	}
	f.logf("%d nodes registered, %d devices published %.1f s after the start; CPU by then: %.0f ms a driver, %.1f s the control plane",
		f.c.N, f.ft.Devices, f.ft.StartSlicesS, f.ft.StartDriverCPUMs, f.ft.StartControlPlaneS)
	return nil
}

// rest runs what follows the scheduling rounds: the memory, the steady
// window, the health storm and the rollout.
func (f *fleet) rest(ctx context.Context) error {
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
