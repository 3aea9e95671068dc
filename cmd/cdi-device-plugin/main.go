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
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/device/sysfs"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
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
	logger := logrus.New()
	logger.SetOutput(stderr)
	logger.SetLevel(logLevel(cfg.Level))
	logger.SetFormatter(formatter(cfg.LogFormat))
	log := logrus.NewEntry(logger).WithField("plugin", cfg.PluginName)
	// A reload reads the same flags and environment, and the file again.
	load := func() (*config.Config, error) { return config.Load(args, env, io.Discard) }
	if err := serve(ctx, cfg, load, logger, log); err != nil {
		log.WithError(err).Error("exiting")
		if errors.Is(err, config.ErrInvalid) {
			return 2
		}
		return 1
	}
	log.Info("shut down cleanly")
	return 0
}

func formatter(f config.LogFormat) logrus.Formatter {
	if f == config.LogJSON {
		return &logrus.JSONFormatter{TimestampFormat: time.RFC3339Nano}
	}
	return &logrus.TextFormatter{FullTimestamp: true, TimestampFormat: time.RFC3339Nano}
}

// logLevel maps config's level onto logrus's; Load accepts no other.
func logLevel(l config.Level) logrus.Level {
	switch l {
	case config.LevelTrace:
		return logrus.TraceLevel
	case config.LevelDebug:
		return logrus.DebugLevel
	case config.LevelWarn:
		return logrus.WarnLevel
	case config.LevelError:
		return logrus.ErrorLevel
	case config.LevelFatal:
		return logrus.FatalLevel
	case config.LevelPanic:
		return logrus.PanicLevel
	default:
		return logrus.InfoLevel
	}
}

// serve builds every resource first (the constructors check what the
// configuration alone could not, before anything is written), then
// prepares them (nodes, device state), removes our stale specs and runs
// the resources until ctx is done; with a metrics address, it serves the
// metrics and probes; with a config file, it applies the file's changes.
// Specs and device nodes are kept on shutdown: a container restarting
// while the plugin is being upgraded must still resolve its CDI names.
func serve(ctx context.Context, cfg *config.Config, load func() (*config.Config, error), logger *logrus.Logger, log *logrus.Entry) error {
	if fi, err := os.Stat(cfg.DevRoot); err != nil || !fi.IsDir() {
		return &config.FieldError{Field: "dev-root", Value: cfg.DevRoot, Reason: "must be an existing directory"}
	}
	var (
		m      *metrics.Metrics
		server *metrics.Server
	)
	if cfg.MetricsAddress != "" {
		m = metrics.New(version)
		server = metrics.NewServer(m)
	}
	start := time.Now().UnixNano()
	s := newSupervisor(logger, log, m, server, cdi.NewWriter(cfg.CDIDir, cfg.Owner(), start), start)
	if err := os.MkdirAll(cfg.DevicePluginDir, 0o750); err != nil {
		return fmt.Errorf("device plugin dir: %w", err)
	}
	g, ctx := errgroup.WithContext(ctx)
	if _, err := s.apply(ctx, cfg); err != nil {
		s.stopAll()
		return err
	}
	if server != nil {
		m.WatchPodResources(cfg.PodResourcesSocket, s.servedResources)
		ln, err := net.Listen("tcp", cfg.MetricsAddress)
		if err != nil {
			s.stopAll()
			return fmt.Errorf("metrics address: %w", err)
		}
		log.WithField("address", ln.Addr().String()).Info("serving /metrics, /healthz and /readyz")
		g.Go(func() error { return server.Serve(ctx, ln) })
	}
	temps := []string{
		filepath.Join(cfg.StateDir, "devices", "*", ".*.tmp-*"),
		filepath.Join(cfg.StateDir, "devices", "*", prestart.ScratchDir+".old-*"), // a reset's
	}
	for _, in := range s.running {
		temps = append(temps, in.part.spec.TempPattern())
		if p := in.part.src.TempPattern(); p != "" {
			temps = append(temps, p)
		}
	}
	g.Go(func() error {
		sweepTemps(temps, log)
		return nil
	})
	reloads := make(chan struct{}, 1)
	if cfg.ConfigFile != "" {
		g.Go(func() error { return watchConfig(ctx, cfg.ConfigFile, reloads) })
	}
	g.Go(func() error {
		defer s.stopAll()
		for {
			select {
			case <-ctx.Done():
				return nil
			case err := <-s.failed:
				return err
			case <-reloads:
				s.reload(ctx, load)
			}
		}
	})
	return g.Wait()
}

// sweepTemps removes the temp files that runs killed mid-write left in
// our directories (spec, nodes, device state): those not of this process.
// It runs beside the resources, after their start-up work.
func sweepTemps(patterns []string, log *logrus.Entry) {
	for _, pattern := range patterns {
		removed, err := atomicfile.RemoveStaleTemps(pattern)
		for _, p := range removed {
			log.WithField("file", p).Info("removed a temp file of an interrupted write")
		}
		if err != nil {
			log.WithError(err).Warn("removing temp files of interrupted writes")
		}
	}
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
	// registry is the host devices' registry file ("" for simulated
	// devices); podResources the kubelet's PodResources socket: both to
	// keep IDs of earlier versions resolvable (legacyAliases).
	registry, podResources string
}

// build constructs the parts of resource i without touching the disk.
// Errors of the constructors are errors of the configuration, named by the
// field the user wrote.
func build(cfg *config.Config, i int, writer *cdi.Writer, start int64, log *logrus.Entry, m *metrics.Metrics) (*part, error) {
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
		// The kubelet must be able to read the longest list the resource
		// can send: every ID, the longest ones, all Unhealthy.
		n, replicas := rc.DeviceCount(), rc.ReplicaCount()
		longest := device.ReplicaID(device.ID(rc.IDPrefix, cfg.NodeName, strconv.Itoa(n-1)), replicas-1, replicas)
		numa := device.NoNUMA
		if rc.NUMANodes > 0 {
			numa = rc.NUMANodes - 1
		}
		if err := plugin.CheckListSize(rc.Name, n*max(replicas, 1), len(longest), numa); err != nil {
			return nil, &config.FieldError{Field: field("count"), Value: strconv.Itoa(n), Reason: err.Error()}
		}
	} else {
		// Host devices keep their IDs and indexes across restarts.
		opts.Registry = filepath.Join(cfg.StateDir, "resources", kind.SpecName()+".json")
		opts.SharedNodes = rc.SharedRel
		opts.ForgetAfter = rc.ForgetAfterOrDefault()
		podResources, resource := cfg.PodResourcesSocket, rc.Name
		opts.Holders = func(ctx context.Context) ([]string, error) {
			return metrics.HeldDevices(ctx, podResources, resource)
		}
		if rc.ContainerPath != "" {
			opts.ContainerPath = rc.ContainerPathOf
		}
		switch rc.Discovery() {
		case config.DiscoverPCI:
			sel := sysfs.PCISelector{Vendor: rc.PCI.Vendor, Device: rc.PCI.Device, Class: rc.PCI.Class, Driver: rc.PCI.Driver}
			opts.Discover, opts.DiscoverKind = sysfs.Discover(cfg.SysRoot, cfg.ProcRoot, sel), string(config.DiscoverPCI)
			opts.KernelEvents = sysfs.KernelEvents("pci")
		case config.DiscoverUSB:
			sel := sysfs.USBSelector{Vendor: rc.USB.Vendor, Product: rc.USB.Product, Serial: rc.USB.Serial}
			opts.Discover, opts.DiscoverKind = sysfs.DiscoverUSB(cfg.SysRoot, sel), string(config.DiscoverUSB)
			opts.KernelEvents = sysfs.KernelEvents("usb")
		default:
			opts.HostGlobs = rc.HostGlobs
			sysRoot := cfg.SysRoot
			opts.NUMAOf = func(t device.NodeType, major, minor uint32) int { return sysfs.NUMAOfNode(sysRoot, t, major, minor) }
		}
	}
	src, err := device.NewSource(opts)
	if errors.Is(err, device.ErrDeviceName) {
		return nil, &config.FieldError{Field: field("idPrefix"), Value: rc.IDPrefix, Reason: err.Error()}
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", rc.Name, err)
	}
	stateRoot := filepath.Join(cfg.StateDir, "devices")
	runner, err := newRunner(cfg, i, stateRoot, src, log, m)
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
		Metrics:          m,
	}, nil)
	switch {
	case errors.Is(err, plugin.ErrSocketPath):
		return nil, &config.FieldError{Field: "device-plugin-dir", Value: cfg.DevicePluginDir, Reason: err.Error()}
	case errors.Is(err, plugin.ErrAnnotationKey):
		return nil, &config.FieldError{Field: field("name"), Value: rc.Name, Reason: err.Error()}
	case err != nil:
		return nil, fmt.Errorf("%s: %w", rc.Name, err)
	}
	// The device state is mounted into containers when there is state to
	// show: a resource with prestart steps.
	specRes := cdi.Resource{Name: rc.Name, Kind: kind, EnvPrefix: rc.EnvPrefix, Socket: p.SocketPath()}
	if runner.HasSteps() {
		specRes.StateRoot = stateRoot
		specRes.NoStateMount = runner.BadState
	}
	spec := stateSpec{Spec: writer.Spec(specRes), runner: runner}
	return &part{
		name: rc.Name, kind: kind, src: src, runner: runner, spec: spec, log: log,
		registry: opts.Registry, podResources: cfg.PodResourcesSocket,
		resource: &plugin.Resource{Source: src, Spec: spec, Plugin: p, Recovery: runner, Log: log, Metrics: m},
	}, nil
}

// prepare creates the simulated nodes (or finds the host devices), gives
// every device its state and restores the faults an earlier run recorded.
// The spec is written by the resource, before it registers.
func (p *part) prepare() error {
	// No registry yet: the first start of a version that escapes host IDs
	// (the registry came with the escaping), or of the resource.
	first := false
	if p.registry != "" {
		_, err := os.Stat(p.registry)
		first = errors.Is(err, fs.ErrNotExist)
	}
	snap, err := p.src.Prepare()
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	if err := p.legacyAliases(snap, first); err != nil {
		if first {
			// Refuse the next start too: without the registry that this
			// start wrote, it is a first start again.
			_ = os.Remove(p.registry)
		}
		return fmt.Errorf("%s: %w", p.name, err)
	}
	// Every device has a state directory (mounted into its containers);
	// a failed preparation recorded by an earlier run keeps it unhealthy,
	// and so does an unusable state (that device alone).
	faults, err := p.runner.Init(snap)
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	if len(faults) > 0 {
		for name, problem := range faults {
			p.src.SetFault(name, problem)
		}
		p.src.Refresh()
	}
	p.log.WithField("spec", p.spec.Path()).WithField("devices", len(snap.Devices)).Info("resource prepared")
	return nil
}

// legacyAliases keeps the host device IDs of versions before the ':'
// escaping that the kubelet still holds (a checkpoint reuses their CDI
// names for container restarts) resolvable in the spec, to the same
// device; an ID that cannot be resolved so is an error (cdi.ErrLegacyID).
// first: no registry existed before this start (see cdi.LegacyAliases).
// Without a PodResources socket nothing is known: no aliases.
func (p *part) legacyAliases(snap *device.Snapshot, first bool) error {
	legacy := p.src.LegacyIDs()
	if len(legacy) == 0 {
		return nil
	}
	held, ok, err := metrics.DeviceHolders(context.Background(), p.podResources, p.name)
	if err != nil {
		return err
	}
	if !ok {
		p.log.WithField("socket", p.podResources).Warn("no PodResources API: host device IDs of versions before the ':' escaping that containers hold are not kept resolvable")
		return nil
	}
	aliases, err := cdi.LegacyAliases(snap, legacy, held, first)
	if err != nil {
		return err
	}
	for old, name := range aliases {
		p.log.WithField("old", old).WithField("device", name).WithField("holders", strings.Join(held[old], ",")).
			Info("keeping the device ID of an earlier version resolvable while the kubelet holds it")
	}
	p.spec.SetAliases(aliases)
	p.resource.Plugin.SetAliases(aliases) // PreStartContainer gets the checkpointed IDs
	return nil
}

// stateSpec is a resource's CDI spec whose writes first give every device
// its state directory when the spec mounts it: the spec never names a
// directory that does not exist (hot-plugged devices included). A device
// whose directory is unusable is made unhealthy by Ensure and its mount is
// left out of the spec (cdi.Resource.NoStateMount); the others go on.
type stateSpec struct {
	*cdi.Spec
	runner *prestart.Runner
}

func (s stateSpec) Write(snap *device.Snapshot) error {
	if s.runner.HasSteps() {
		if err := s.runner.Ensure(snap); err != nil {
			return err
		}
	}
	return s.Spec.Write(snap)
}

// newRunner builds the prestart runner of resource i from its steps; a
// command that does not parse is an error of its field.
func newRunner(cfg *config.Config, i int, stateRoot string, src *device.Source, log *logrus.Entry, m *metrics.Metrics) (*prestart.Runner, error) {
	rc := &cfg.Resources[i]
	opts := prestart.Options{Resource: rc.Name, StateRoot: stateRoot, Health: src, Log: log, Metrics: m,
		// Background recovery spares the devices containers hold.
		Holders: func(ctx context.Context) ([]string, error) {
			return metrics.HeldDevices(ctx, cfg.PodResourcesSocket, rc.Name)
		}}
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
