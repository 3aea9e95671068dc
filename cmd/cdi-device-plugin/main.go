// Command cdi-device-plugin is a kubelet device plugin that creates
// simulated device nodes (or exposes host ones), describes them in CDI
// specs and hands them to containers by CDI name.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/plugin"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
)

var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.LookupEnv, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the plugin until ctx is done and returns the exit status: 0 on
// a clean shutdown, 2 for bad configuration, 1 for any other failure.
func run(ctx context.Context, args []string, env config.Env, stderr io.Writer) int {
	cfg, err := config.Load(args, env, stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, config.ErrVersion):
		fmt.Fprintln(stderr, "cdi-device-plugin", version)
		return 0
	case err != nil:
		fmt.Fprintln(stderr, "cdi-device-plugin:", err)
		return 2
	}
	log := newLogger(cfg, stderr)
	if err := serve(ctx, cfg, log); err != nil {
		log.WithError(err).Error("exiting")
		if errors.Is(err, config.ErrInvalid) {
			return 2
		}
		return 1
	}
	log.Info("shut down cleanly")
	return 0
}

func newLogger(cfg *config.Config, out io.Writer) *logrus.Entry {
	l := logrus.New()
	l.SetOutput(out)
	l.SetLevel(cfg.Level)
	if cfg.LogFormat == config.LogJSON {
		l.SetFormatter(&logrus.JSONFormatter{TimestampFormat: time.RFC3339Nano})
	} else {
		l.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: time.RFC3339Nano})
	}
	return logrus.NewEntry(l).WithField("plugin", cfg.PluginName)
}

// serve builds every resource first (the constructors check what the
// configuration alone could not, before anything is written), then
// prepares them (nodes, device state), removes our stale specs and runs
// the resources until ctx is done. Specs and device nodes are kept on
// shutdown: a container restarting while the plugin is being upgraded
// must still resolve its CDI names.
func serve(ctx context.Context, cfg *config.Config, log *logrus.Entry) error {
	if fi, err := os.Stat(cfg.DevRoot); err != nil || !fi.IsDir() {
		return &config.FieldError{Field: "dev-root", Value: cfg.DevRoot, Reason: "must be an existing directory"}
	}
	start := time.Now().UnixNano()
	writer := cdi.NewWriter(cfg.CDIDir, cfg.Owner(), start)
	parts := make([]*part, len(cfg.Resources))
	kinds := make([]cdi.Kind, len(cfg.Resources))
	for i := range cfg.Resources {
		p, err := build(cfg, i, writer, start, log)
		if err != nil {
			return err
		}
		parts[i], kinds[i] = p, p.kind
	}

	if err := os.MkdirAll(cfg.DevicePluginDir, 0o750); err != nil {
		return fmt.Errorf("device plugin dir: %w", err)
	}
	for _, p := range parts {
		if err := p.prepare(); err != nil {
			return err
		}
	}
	removed, err := writer.RemoveStale(kinds)
	for _, p := range removed {
		log.WithField("spec", p).Info("removed the CDI spec of a resource no longer configured")
	}
	if err != nil {
		log.WithError(err).Warn("removing stale CDI specs")
	}

	g, ctx := errgroup.WithContext(ctx)
	for _, p := range parts {
		g.Go(func() error { return p.resource.Run(ctx) })
	}
	return g.Wait()
}

// part is one configured resource, built.
type part struct {
	name   string
	kind   cdi.Kind
	src    *device.Source
	runner *prestart.Runner
	spec   stateSpec
	// resource runs it all once prepared.
	resource *plugin.Resource
	log      *logrus.Entry
}

// build constructs the parts of resource i without touching the disk.
// Errors of the constructors are errors of the configuration, named by the
// field the user wrote.
func build(cfg *config.Config, i int, writer *cdi.Writer, start int64, log *logrus.Entry) (*part, error) {
	rc := &cfg.Resources[i]
	field := func(name string) string { return cfg.ResourceField(i, name) }
	log = log.WithField("resource", rc.Name)
	kind, err := cdi.KindFor(rc.Domain, rc.Class)
	if err != nil {
		return nil, &config.FieldError{Field: field("name"), Value: rc.Name, Reason: "does not give a valid CDI kind: " + err.Error()}
	}
	opts := device.Options{
		DevRoot:  cfg.DevRoot,
		IDPrefix: rc.IDPrefix, NodeName: cfg.NodeName,
		Replicas: rc.ReplicaCount(),
		Log:      log,
	}
	if rc.Simulated() {
		opts.Count = rc.DeviceCount()
		opts.FilePrefix = rc.DeviceFilePrefix
		opts.Type = device.NodeType(rc.DeviceNode.Type.CDI())
		opts.Major, opts.Minor = *rc.DeviceNode.Major, *rc.DeviceNode.Minor
		opts.NUMANodes = rc.NUMANodes
	} else {
		opts.HostGlobs = rc.HostGlobs
		// Host devices keep their IDs and indexes across restarts.
		opts.Registry = filepath.Join(cfg.StateDir, "resources", kind.SpecName()+".json")
	}
	src, err := device.NewSource(opts)
	if errors.Is(err, device.ErrDeviceName) {
		return nil, &config.FieldError{Field: field("idPrefix"), Value: rc.IDPrefix, Reason: err.Error()}
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", rc.Name, err)
	}
	stateRoot := filepath.Join(cfg.StateDir, "devices")
	runner, err := newRunner(cfg, i, stateRoot, src, log)
	if err != nil {
		return nil, err
	}
	var preparer plugin.Preparer // a nil interface, not a nil *Runner
	if runner.HasSteps() {
		preparer = runner
	}
	var mounts []*pluginapi.Mount
	for _, m := range rc.Mounts {
		mounts = append(mounts, &pluginapi.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, ReadOnly: m.ReadOnly})
	}
	p, err := plugin.New(plugin.Options{
		ResourceName:     rc.Name,
		PluginName:       cfg.PluginName,
		Dir:              cfg.DevicePluginDir,
		SocketName:       plugin.SocketName(cfg.PluginName, rc.Name, start),
		Kind:             kind,
		EnvPrefix:        rc.EnvPrefix,
		AnnotationPrefix: rc.AnnotationPrefix,
		Strategies:       cfg.DeviceListStrategy,
		Mounts:           mounts,
		Preparer:         preparer,
		Log:              log,
	}, nil)
	switch {
	case errors.Is(err, plugin.ErrSocketPath):
		return nil, &config.FieldError{Field: "device-plugin-dir", Value: cfg.DevicePluginDir, Reason: err.Error()}
	case errors.Is(err, plugin.ErrAnnotationKey):
		return nil, &config.FieldError{Field: field("name"), Value: rc.Name, Reason: err.Error()}
	case err != nil:
		return nil, fmt.Errorf("%s: %w", rc.Name, err)
	}
	spec := stateSpec{
		Spec:   writer.Spec(cdi.Resource{Name: rc.Name, Kind: kind, EnvPrefix: rc.EnvPrefix, StateRoot: stateRoot}),
		runner: runner,
	}
	return &part{
		name: rc.Name, kind: kind, src: src, runner: runner, spec: spec, log: log,
		resource: &plugin.Resource{Source: src, Spec: spec, Plugin: p, Recovery: runner, Log: log},
	}, nil
}

// prepare creates the simulated nodes (or finds the host devices), gives
// every device its state and restores the faults an earlier run recorded.
// The spec is written by the resource, before it registers.
func (p *part) prepare() error {
	snap, err := p.src.Prepare()
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	// Every device has a state directory (mounted into its containers);
	// a failed preparation recorded by an earlier run keeps it unhealthy.
	faults, err := p.runner.Init(snap)
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	if len(faults) > 0 {
		for name, reason := range faults {
			p.src.SetFault(name, reason)
		}
		p.src.Refresh()
	}
	p.log.WithField("spec", p.spec.Path()).WithField("devices", len(snap.Devices)).Info("resource prepared")
	return nil
}

// stateSpec is a resource's CDI spec whose writes first give every device
// its state directory, which the spec mounts: the spec never names a
// directory that does not exist (hot-plugged devices included).
type stateSpec struct {
	*cdi.Spec
	runner *prestart.Runner
}

func (s stateSpec) Write(snap *device.Snapshot) error {
	if err := s.runner.Ensure(snap); err != nil {
		return err
	}
	return s.Spec.Write(snap)
}

// newRunner builds the prestart runner of resource i from its steps; a
// command that does not parse is an error of its field.
func newRunner(cfg *config.Config, i int, stateRoot string, src *device.Source, log *logrus.Entry) (*prestart.Runner, error) {
	rc := &cfg.Resources[i]
	opts := prestart.Options{Resource: rc.Name, StateRoot: stateRoot, Health: src, Log: log}
	if p := rc.Prestart; p != nil {
		opts.Budget = p.Budget.Duration
		opts.MarkUnhealthy = p.OnFailure.MarksUnhealthy()
		opts.Recovery = p.Recovery
		opts.RecoveryInterval = p.RecoveryInterval.Duration
		for j, s := range p.Steps {
			switch s.Type {
			case config.StepReset:
				opts.Steps = append(opts.Steps, prestart.Reset{Limit: s.Timeout.Duration})
			case config.StepReprogram:
				opts.Steps = append(opts.Steps, &prestart.Reprogram{Image: s.Image, SHA256: s.SHA256, Always: s.Always, Limit: s.Timeout.Duration})
			case config.StepExec:
				e, err := prestart.NewExec(s.Command, s.Env, s.Timeout.Duration)
				if err != nil {
					return nil, &config.FieldError{
						Field: cfg.ResourceField(i, fmt.Sprintf("prestart.steps[%d].command", j)), Value: strings.Join(s.Command, " "), Reason: err.Error(),
					}
				}
				opts.Steps = append(opts.Steps, e)
			}
		}
	}
	return prestart.NewRunner(opts), nil
}
