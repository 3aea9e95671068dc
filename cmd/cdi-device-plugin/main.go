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
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
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
	cfg, showVersion, err := config.Load(args, env, stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		fmt.Fprintln(stderr, "cdi-device-plugin:", err)
		return 2
	case showVersion:
		fmt.Fprintln(stderr, "cdi-device-plugin", version)
		return 0
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
	lvl, _ := logrus.ParseLevel(cfg.LogLevel) // validated
	l.SetLevel(lvl)
	if cfg.LogFormat == "json" {
		l.SetFormatter(&logrus.JSONFormatter{TimestampFormat: time.RFC3339Nano})
	} else {
		l.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: time.RFC3339Nano})
	}
	return logrus.NewEntry(l).WithField("plugin", cfg.PluginName)
}

// serve prepares every resource (nodes, spec), removes our stale specs and
// runs the resources until ctx is done. Specs and device nodes are kept on
// shutdown: a container restarting while the plugin is being upgraded must
// still resolve its CDI names.
func serve(ctx context.Context, cfg *config.Config, log *logrus.Entry) error {
	if fi, err := os.Stat(cfg.DevRoot); err != nil || !fi.IsDir() {
		return &config.FieldError{Field: "dev-root", Value: cfg.DevRoot, Reason: "must be an existing directory"}
	}
	if err := os.MkdirAll(cfg.DevicePluginDir, 0o750); err != nil {
		return fmt.Errorf("device plugin dir: %w", err)
	}
	start := time.Now().UnixNano()
	writer, err := cdi.NewWriter(cfg.CDIDir, cfg.Owner(), start)
	if err != nil {
		return err
	}
	var (
		resources []*plugin.Resource
		kinds     []cdi.Kind
	)
	for i := range cfg.Resources {
		r, kind, err := prepare(cfg, &cfg.Resources[i], writer, start, log)
		if err != nil {
			return err
		}
		resources = append(resources, r)
		kinds = append(kinds, kind)
	}
	removed, err := writer.RemoveStale(kinds)
	for _, p := range removed {
		log.WithField("spec", p).Info("removed the CDI spec of a resource no longer configured")
	}
	if err != nil {
		log.WithError(err).Warn("removing stale CDI specs")
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(resources))
	for _, r := range resources {
		go func() { errc <- r.Run(ctx) }()
	}
	var first error
	for range resources {
		if err := <-errc; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}

func prepare(cfg *config.Config, rc *config.Resource, writer *cdi.Writer, start int64, log *logrus.Entry) (*plugin.Resource, cdi.Kind, error) {
	log = log.WithField("resource", rc.Name)
	kind, err := cdi.KindForResource(rc.Name)
	if err != nil {
		return nil, kind, err // validated already
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
		opts.Type = device.Char
		if rc.DeviceNode.Type == "block" {
			opts.Type = device.Block
		}
		opts.Major, opts.Minor = *rc.DeviceNode.Major, *rc.DeviceNode.Minor
		opts.NUMANodes = rc.NUMANodes
	} else {
		for _, g := range rc.HostDevices {
			rel, _ := config.HostGlob(g) // validated
			opts.HostGlobs = append(opts.HostGlobs, rel)
		}
		// Host devices keep their IDs and indexes across restarts.
		opts.Registry = filepath.Join(cfg.StateDir, "resources", kind.SpecName()+".json")
	}
	src, err := device.NewSource(opts)
	if err != nil {
		return nil, kind, err
	}
	snap, err := src.Prepare()
	if err != nil {
		return nil, kind, fmt.Errorf("%s: %w", rc.Name, err)
	}
	stateRoot := filepath.Join(cfg.StateDir, "devices")
	runner, err := newRunner(rc, stateRoot, src, log)
	if err != nil {
		return nil, kind, fmt.Errorf("%s: %w", rc.Name, err)
	}
	// Every device has a state directory (mounted into its containers);
	// a failed preparation recorded by an earlier run keeps it unhealthy.
	faults, err := runner.Init(snap)
	if err != nil {
		return nil, kind, fmt.Errorf("%s: %w", rc.Name, err)
	}
	if len(faults) > 0 {
		for name, reason := range faults {
			src.SetFault(name, reason)
		}
		src.Refresh()
	}
	spec := stateSpec{
		Spec:   writer.Spec(cdi.Resource{Name: rc.Name, Kind: kind, EnvPrefix: rc.EnvPrefix, StateRoot: stateRoot}),
		runner: runner,
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
		SocketName:       config.SocketName(cfg.PluginName, rc.Name, start),
		Kind:             kind,
		EnvPrefix:        rc.EnvPrefix,
		AnnotationPrefix: rc.AnnotationPrefix,
		CDICRI:           cfg.Has(config.StrategyCDICRI),
		CDIAnnotations:   cfg.Has(config.StrategyCDIAnnotations),
		DeviceSpecs:      cfg.Has(config.StrategyDeviceSpecs),
		Mounts:           mounts,
		Preparer:         preparer,
		Log:              log,
	}, nil)
	if err != nil {
		return nil, kind, fmt.Errorf("%s: %w", rc.Name, err)
	}
	log.WithField("spec", spec.Path()).WithField("devices", len(snap.Devices)).Info("resource prepared")
	return &plugin.Resource{Source: src, Spec: spec, Plugin: p, Recovery: runner, Log: log}, kind, nil
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

// newRunner builds the prestart runner of a resource from its steps.
func newRunner(rc *config.Resource, stateRoot string, src *device.Source, log *logrus.Entry) (*prestart.Runner, error) {
	opts := prestart.Options{Resource: rc.Name, StateRoot: stateRoot, Health: src, Log: log}
	if p := rc.Prestart; p != nil {
		opts.Budget = p.Budget.Duration
		opts.MarkUnhealthy = p.OnFailure != "ignore"
		opts.Recovery = prestart.Recovery(p.Recovery)
		opts.RecoveryInterval = p.RecoveryInterval.Duration
		for _, s := range p.Steps {
			switch s.Type {
			case config.StepReset:
				opts.Steps = append(opts.Steps, prestart.Reset{Limit: s.Timeout.Duration})
			case config.StepReprogram:
				opts.Steps = append(opts.Steps, &prestart.Reprogram{Image: s.Image, SHA256: s.SHA256, Always: s.Always, Limit: s.Timeout.Duration})
			case config.StepExec:
				e, err := prestart.NewExec(s.Command, s.Env, s.Timeout.Duration)
				if err != nil {
					return nil, err
				}
				opts.Steps = append(opts.Steps, e)
			}
		}
	}
	return prestart.NewRunner(opts), nil
}
