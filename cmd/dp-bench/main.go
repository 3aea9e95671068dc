// Command dp-bench plays the kubelet against any device plugin binary: it
// starts the plugin in fresh directories against a kubelet stand-in on
// real unix sockets (internal/kubeletsim), checks the kubelet's contract
// (serving before registering, the registration, ListAndWatch, Allocate,
// GetPreferredAllocation, PreStartContainer, kubelet restarts, SIGTERM, CDI
// names resolved as containerd resolves them) and measures start-up,
// memory, RPC latency against an empty RPC, reaction times and idle CPU,
// each next to a baseline taken in the same run. It prints a pass/fail
// table and the medians, and writes JSON and Markdown.
//
//	dp-bench [flags] -- PLUGIN [ARG...]    one plugin
//	dp-bench [flags] -targets FILE         several, side by side
//
// PLUGIN, its arguments, -env and -remove-device are templates over the
// run's directories: {{.SocketDir}} (kubelet.sock), {{.CDIDir}},
// {{.DevDir}} (device files dp-bench creates), {{.WorkDir}} and
// {{.PodResources}} (the kubelet's PodResources, listing no pods).
//
// A targets file of DRA drivers (targets with "dra" set) runs them
// against a private etcd and kube-apiserver (-etcd, -kube-apiserver), as
// the kubelet drives a DRA driver: registration, ResourceSlices,
// NodePrepareResources and NodeUnprepareResources; their templates also
// have {{.RegistrarDir}}, {{.PluginsDir}}, {{.Kubeconfig}} and
// {{.NodeName}}. With -fleet N, each DRA target runs on a fleet of N
// nodes instead (docs/fleet.md).
//
// This package holds the flags and the dispatch; the rest is in
// internal/: the device-plugin session (dpsession), the DRA session
// (drasession), the fleet, and what they share: the targets and settings
// (target), process control (proc), the API client (apiclient), the
// control plane (controlplane), the audit log's counts (audit), the
// statistics (stats), CDI names resolved as containerd does (cdiresolve)
// and the report (report).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/controlplane"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/dpsession"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/drasession"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/fleet"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/target"
)

func main() {
	if spec, ok := os.LookupEnv(proc.HelperEnv); ok {
		os.Exit(proc.RunHelper(spec))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the parsed command line.
type options struct {
	targets  []target.Target
	settings target.Settings
	cp       controlplane.Options
	runs     int
	jsonOut  string
	mdOut    string
	goBench  string
	compare  string
	render   string
	mustPass map[string]bool // target names whose checks must pass; nil: all
	fleet    *fleet.Options  // -fleet; N 0: no fleet
}

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// parseFlags parses args; errors name the flag and the value.
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("dp-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: dp-bench [flags] -- PLUGIN [ARG...]\n       dp-bench [flags] -targets FILE\n\nflags:\n")
		fs.PrintDefaults()
	}
	def := target.DefaultSettings()
	var (
		o       = &options{settings: def}
		t       target.Target
		env     stringList
		targets = fs.String("targets", "", "YAML or JSON file with several targets to run side by side (instead of -- PLUGIN ...)")
		must    = fs.String("must-pass", "", "comma-separated target names whose checks must all pass for exit status 0 (default: every target)")
	)
	fs.StringVar(&t.Name, "name", "", "the plugin's name in the tables (default: the binary's base name)")
	fs.StringVar(&t.Scenario, "scenario", "", "what the run is, e.g. \"8 devices\"")
	fs.StringVar(&t.SocketDir, "socket-dir", "", "the plugin's socket directory as it sees it; empty: a fresh directory per run, given as {{.SocketDir}}; a fixed path: bind-mounted from a fresh directory in a private mount namespace (root)")
	fs.StringVar(&t.CDIDir, "cdi-dir", "", "the plugin's CDI spec directory, like -socket-dir ({{.CDIDir}})")
	fs.StringVar(&t.RemoveDevice, "remove-device", "", "a device file to remove and put back, to check that ListAndWatch reports it (template)")
	fs.IntVar(&t.DeviceFiles, "device-files", 0, "create this many char device nodes 1:3 as {{.DevDir}}/dev-<i> before each start")
	fs.IntVar(&t.IDs, "ids", 0, "the number of device IDs the plugin must list (0: any)")
	fs.StringVar(&t.Resource, "resource", "", "the resource name the plugin must register (empty: any extended resource name)")
	fs.Var(&env, "env", "KEY=VALUE for the plugin's environment, repeatable (template); the plugin gets these and PATH only")
	fs.IntVar(&o.runs, "runs", 5, "runs per target; medians are taken over them")
	fs.IntVar(&o.settings.Calls, "calls", def.Calls, "timed calls per RPC in a run")
	fs.DurationVar(&o.settings.Idle, "idle", def.Idle, "window for CPU and wake-ups while idle (0: not measured)")
	fs.DurationVar(&o.settings.Prompt, "prompt", def.Prompt, "what \"at once\" allows: the first ListAndWatch list after the stream opens")
	fs.DurationVar(&o.settings.Register, "register-timeout", def.Register, "wait for the first registration")
	fs.DurationVar(&o.settings.Restart, "restart-timeout", def.Restart, "wait for the registration after a kubelet restart")
	fs.DurationVar(&o.settings.Change, "change-timeout", def.Change, "wait for ListAndWatch to report a removed device file")
	fs.DurationVar(&o.settings.Settle, "settle", def.Settle, "after a kubelet restart, how long no second registration may follow the first")
	fs.DurationVar(&o.settings.Connect, "connect-timeout", def.Connect, "the kubelet's call to the plugin's endpoint during Register")
	fs.DurationVar(&o.settings.Term, "term-timeout", def.Term, "wait for the exit after SIGTERM")
	fs.StringVar(&o.settings.TmpfsDir, "tmpfs-dir", def.TmpfsDir, "where {{.DevDir}} and {{.CDIDir}} are made, a tmpfs as /dev and /run are on a node (empty: TMPDIR, like the other directories)")
	fs.IntVar(&o.settings.DRACalls, "dra-calls", def.DRACalls, "DRA drivers: claims per size prepared in a run (p50 over them)")
	fs.DurationVar(&o.settings.APIInterval, "api-interval", def.APIInterval, "DRA drivers: least time between two calls that make the driver read a claim (client-go's default limiter allows 5 a second)")
	fs.StringVar(&o.cp.APIServer, "kube-apiserver", "", "DRA drivers: the kube-apiserver binary")
	fs.StringVar(&o.cp.Etcd, "etcd", "", "DRA drivers: the etcd binary")
	fs.StringVar(&o.cp.FeatureGates, "feature-gates", "", "DRA drivers: kube-apiserver's --feature-gates")
	fs.DurationVar(&o.cp.Ready, "api-ready-timeout", time.Minute, "DRA drivers: wait for the API server to be ready")
	fs.StringVar(&o.jsonOut, "json", "", "write the full report as JSON to this file")
	fs.StringVar(&o.render, "render", "", "run nothing: print (and with -md write) the tables of a report written by -json")
	fs.StringVar(&o.compare, "compare", "", "a target name: add its per-round ratios to every other target of the same group (a target's group, else its scenario)")
	fs.StringVar(&o.goBench, "gobench", "", "add the medians of this `go test -bench` output to the report")
	fs.StringVar(&o.mdOut, "md", "", "write the tables into this Markdown file, between dp-bench's markers (the rest of the file is kept)")
	o.fleet = fleet.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.fleet.N != 0 {
		if err := o.fleet.Check(); err != nil {
			return nil, err
		}
	}
	if o.runs < 1 {
		return nil, fmt.Errorf("-runs=%d: must be at least 1", o.runs)
	}
	if o.settings.Calls < 1 {
		return nil, fmt.Errorf("-calls=%d: must be at least 1", o.settings.Calls)
	}
	if o.settings.DRACalls < 1 {
		return nil, fmt.Errorf("-dra-calls=%d: must be at least 1", o.settings.DRACalls)
	}
	if o.settings.Idle < 0 {
		return nil, fmt.Errorf("-idle=%s: must not be negative", o.settings.Idle)
	}
	for name, d := range map[string]time.Duration{"prompt": o.settings.Prompt, "register-timeout": o.settings.Register,
		"restart-timeout": o.settings.Restart, "change-timeout": o.settings.Change, "settle": o.settings.Settle,
		"connect-timeout": o.settings.Connect, "term-timeout": o.settings.Term, "api-interval": o.settings.APIInterval,
		"api-ready-timeout": o.cp.Ready} {
		if d <= 0 {
			return nil, fmt.Errorf("-%s=%s: must be above 0", name, d)
		}
	}
	if *must != "" {
		o.mustPass = map[string]bool{}
		for _, n := range strings.Split(*must, ",") {
			o.mustPass[strings.TrimSpace(n)] = true
		}
	}
	switch {
	case o.render != "":
		if *targets != "" || fs.NArg() > 0 {
			return nil, fmt.Errorf("-render=%q: runs nothing, give no targets", o.render)
		}
		return o, nil
	case *targets != "" && fs.NArg() > 0:
		return nil, fmt.Errorf("-targets=%q and a plugin command %q: give one of them", *targets, fs.Arg(0))
	case *targets != "":
		ts, err := target.Load(*targets)
		if err != nil {
			return nil, fmt.Errorf("-targets=%q: %w", *targets, err)
		}
		o.targets = ts
	case fs.NArg() == 0:
		fs.Usage()
		return nil, errors.New("no plugin: give -- PLUGIN [ARG...] or -targets FILE")
	default:
		t.Command = fs.Args()
		t.Env = env
		if t.Name == "" {
			t.Name = target.BaseName(t.Command[0])
		}
		if err := t.Validate(); err != nil {
			return nil, fmt.Errorf("%w", flagErr(err))
		}
		o.targets = []target.Target{t}
	}
	if o.compare != "" && !slices.ContainsFunc(o.targets, func(t target.Target) bool { return t.Name == o.compare }) {
		return nil, fmt.Errorf("-compare=%q: no target of that name", o.compare)
	}
	for n := range o.mustPass {
		found := false
		for i := range o.targets {
			found = found || o.targets[i].Name == n
		}
		if !found {
			return nil, fmt.Errorf("-must-pass=%q: no target named %q", *must, n)
		}
	}
	return o, nil
}

// flagErr names the flag behind a target field in err.
func flagErr(err error) error {
	r := strings.NewReplacer("socketDir=", "-socket-dir=", "cdiDir=", "-cdi-dir=", "deviceFiles=", "-device-files=", "ids=", "-ids=")
	return errors.New(r.Replace(err.Error()))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "dp-bench:", err)
		return 2
	}
	if o.render != "" {
		return render(o, stdout, stderr)
	}
	if o.fleet.N > 0 {
		return fleet.Run(ctx, &fleet.Config{Options: *o.fleet, Command: "dp-bench " + strings.Join(args, " "), Targets: o.targets,
			Settings: o.settings, ControlPlane: o.cp, MustPass: o.mustPass}, stdout, stderr)
	}
	rep := &report.Report{Command: "dp-bench " + strings.Join(args, " "), Machine: report.DescribeMachine(), Runs: o.runs, Settings: o.settings, Compare: o.compare,
		DRA: target.IsDRA(o.targets)}
	if o.goBench != "" {
		if rep.GoBench, err = report.ParseGoBench(o.goBench); err != nil {
			fmt.Fprintf(stderr, "dp-bench: -gobench=%q: %v\n", o.goBench, err)
			return 2
		}
	}
	results := make([][]*report.RunResult, len(o.targets))
	setupErr := make([]error, len(o.targets))
	var cl *drasession.Cluster
	if rep.DRA {
		fmt.Fprintln(stderr, "dp-bench: starting etcd and kube-apiserver")
		if cl, err = drasession.StartCluster(ctx, o.cp); err != nil {
			for j := range o.targets {
				setupErr[j] = fmt.Errorf("%w: %w", drasession.ErrNoControlPlane, err)
			}
			fmt.Fprintf(stderr, "dp-bench: DRA drivers not run: %v\n", setupErr[0])
		} else {
			defer cl.Stop()
			rep.APIServer = cl.Version()
		}
	}
	for i := 0; i < o.runs && ctx.Err() == nil; i++ {
		for j := range o.targets {
			t := &o.targets[j]
			if setupErr[j] != nil || ctx.Err() != nil {
				continue
			}
			var res *report.RunResult
			if t.DRA != nil {
				res, err = drasession.Run(ctx, *t, o.settings, cl, func(format string, a ...any) {
					fmt.Fprintf(stderr, "dp-bench: %s: "+format+"\n", append([]any{t.Label()}, a...)...)
				})
			} else {
				res, err = dpsession.Run(ctx, *t, o.settings)
			}
			if err != nil {
				setupErr[j] = err
				fmt.Fprintf(stderr, "dp-bench: %s: not run: %v\n", t.Label(), err)
				continue
			}
			results[j] = append(results[j], res)
			fmt.Fprintf(stderr, "dp-bench: run %d/%d %s: %s\n", i+1, o.runs, t.Label(), progress(res))
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "dp-bench: interrupted")
		return 1
	}
	rep.Machine.LoadAfter = report.Loadavg()
	ok := true
	for j := range o.targets {
		t := &o.targets[j]
		tr := report.Summarize(*t, results[j])
		if setupErr[j] != nil {
			tr.Err = setupErr[j].Error()
		}
		rep.Targets = append(rep.Targets, tr)
		if o.mustPass == nil || o.mustPass[t.Name] {
			ok = ok && tr.Err == "" && !anyFailed(tr)
		}
	}
	report.WriteMarkdown(stdout, rep)
	if o.jsonOut != "" {
		if err := report.WriteJSON(o.jsonOut, rep); err != nil {
			fmt.Fprintln(stderr, "dp-bench: -json:", err)
			return 1
		}
	}
	if o.mdOut != "" {
		if err := report.WriteInto(o.mdOut, rep); err != nil {
			fmt.Fprintln(stderr, "dp-bench: -md:", err)
			return 1
		}
	}
	if !ok {
		fmt.Fprintln(stderr, "dp-bench: contract checks failed")
		return 1
	}
	return 0
}

// render prints the tables of a JSON report and writes them to -md.
func render(o *options, stdout, stderr io.Writer) int {
	b, err := os.ReadFile(o.render)
	var rep report.Report
	if err == nil {
		err = json.Unmarshal(b, &rep)
	}
	if err != nil {
		fmt.Fprintf(stderr, "dp-bench: -render=%q: %v\n", o.render, err)
		return 2
	}
	report.WriteMarkdown(stdout, &rep)
	if o.mdOut != "" {
		if err := report.WriteInto(o.mdOut, &rep); err != nil {
			fmt.Fprintln(stderr, "dp-bench: -md:", err)
			return 1
		}
	}
	return 0
}

func anyFailed(tr report.TargetReport) bool {
	for _, c := range tr.Checks {
		if c.Status == report.Fail {
			return true
		}
	}
	return false
}

func progress(r *report.RunResult) string {
	var parts []string
	if s, ok := r.Metrics["start-registered"]; ok {
		parts = append(parts, fmt.Sprintf("registered %.1f ms after start", s.Value))
	}
	if f := r.Failed(); len(f) > 0 {
		parts = append(parts, "failed: "+strings.Join(f, ", "))
	}
	if r.Err != "" {
		parts = append(parts, "stopped: "+r.Err)
	}
	if len(parts) == 0 {
		return "ok"
	}
	return strings.Join(parts, "; ")
}
