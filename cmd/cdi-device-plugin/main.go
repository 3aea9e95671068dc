// Command cdi-device-plugin is a kubelet device plugin that creates
// simulated device nodes (or exposes host ones), describes them in CDI
// specs and hands them to containers by CDI name.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/fault"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/command"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/dranames"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
	"github.com/cdi-device-plugin/cdi-device-plugin/plugin"
	"github.com/cdi-device-plugin/cdi-device-plugin/podresources"
	"github.com/cdi-device-plugin/cdi-device-plugin/resource"
)

var version = "dev"

// gcPercent is the garbage collector's target once the plugin is in
// service, when the environment sets no GOGC. The plugin's live heap is
// small (0.9 MiB at 8 devices after dp-bench's calls): at Go's 100 the heap
// grows to the runtime's 4 MiB minimum between collections, and the
// scavenger keeps what it reached; at 50 the minimum is 2 MiB. Measured
// (docs/benchmarks.md): 2 MiB less resident memory at 8 devices and at
// 10,000 IDs, no difference in CPU over a bench round.
const gcPercent = 50

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.LookupEnv, os.Stderr)
	stop()
	os.Exit(code)
}

// gcTarget lowers the GC target to gcPercent at the plugin's first
// registration, unless the environment sets GOGC (the runtime has read
// it). The start-up runs at Go's default: it allocates in one burst
// (package init, configuration, spec, gRPC), garbage once registered, and
// a collection in its middle delayed the registration by 2 ms.
type gcTarget struct {
	keep bool // GOGC is set
	once sync.Once
}

func newGCTarget(env config.Env) *gcTarget {
	_, set := env("GOGC")
	return &gcTarget{keep: set}
}

// inService is called after every registration; the first sets the
// target. It does not block.
func (g *gcTarget) inService() {
	if !g.keep {
		g.once.Do(func() { debug.SetGCPercent(gcPercent) })
	}
}

// run runs the plugin until ctx is done and returns the exit status: 0 on
// a clean shutdown, 2 for bad configuration, 1 for any other failure.
func run(ctx context.Context, args []string, env config.Env, stderr io.Writer) int {
	var driverName string
	extra := config.Extra{Name: "driver-name", Env: "DRIVER_NAME", Value: &driverName,
		Usage: "the DRA driver's name, to recognise its claims' devices that PodResources names without CDI names (default <class>.<domain> of the first resource without replicas above 1, as the driver's)"}
	cfg, exit := command.Load(config.DevicePlugin, version, args, env, stderr, extra)
	if cfg == nil {
		return exit
	}
	logger := logs.New(stderr, cfg)
	log := logrus.NewEntry(logger).WithField("plugin", cfg.PluginName)
	// A reload reads the same flags and environment, and the file again.
	load := func() (*config.Config, error) {
		var ignored string // the same flags and environment: the same name
		e := extra
		e.Value = &ignored
		return config.LoadWith(config.DevicePlugin, args, env, io.Discard, e)
	}
	if err := serve(ctx, cfg, driverName, load, logger, log, newGCTarget(env)); err != nil {
		command.Exiting(log, err, stderr)
		if errors.Is(err, config.ErrInvalid) {
			return 2
		}
		return 1
	}
	log.Info("shut down cleanly")
	return 0
}

// openUevents, when set, opens the kernel's uevents of a resource found by
// identity in place of its NETLINK_KOBJECT_UEVENT socket (tests inject
// events through it).
var openUevents func() (io.ReadCloser, error)

// serve builds every resource first (the constructors check what the
// configuration alone could not, before anything is written), then
// prepares them (nodes, device state), removes our stale specs and runs
// the resources until ctx is done; with a metrics address, it serves the
// metrics and probes; with a config file, it applies the file's changes.
// Specs and device nodes are kept on shutdown: a container restarting
// while the plugin is being upgraded must still resolve its CDI names.
func serve(ctx context.Context, cfg *config.Config, driverName string, load func() (*config.Config, error), logger *logrus.Logger, log *logrus.Entry, gc *gcTarget) error {
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
	s.registered = gc.inService
	s.driverName = driverName
	s.podres = podresources.New(cfg.PodResourcesSocket)
	defer func() { _ = s.podres.Close() }()
	if err := os.MkdirAll(cfg.DevicePluginDir, 0o750); err != nil {
		return fmt.Errorf("device plugin dir: %w", err)
	}
	g, ctx := errgroup.WithContext(ctx)
	if _, err := s.apply(ctx, cfg); err != nil {
		s.stopAll()
		return err
	}
	if server != nil {
		m.WatchPodResources(s.podres, s.servedResources)
		ln, err := net.Listen("tcp", cfg.MetricsAddress)
		if err != nil {
			s.stopAll()
			return fmt.Errorf("metrics address: %w", err)
		}
		log.WithField("address", ln.Addr().String()).Info("serving /metrics, /healthz and /readyz")
		g.Go(func() error { return server.Serve(ctx, ln) })
	}
	if cfg.FaultControl {
		serveFaults, err := fault.Open(cfg.StateDir, config.DevicePlugin, s.injectors, log, m)
		if err != nil {
			s.stopAll()
			return err
		}
		g.Go(func() error { return serveFaults(ctx) })
	}
	temps := resource.StateTempPatterns(cfg.StateDir)
	for _, in := range s.running {
		temps = append(temps, in.part.TempPatterns()...)
	}
	g.Go(func() error {
		command.SweepTemps(temps, log)
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

// part is one configured resource, built: the shared parts and the
// device plugin that serves them.
type part struct {
	*resource.Parts
	name string
	kind cdi.Kind
	// resource runs it all once prepared.
	resource *plugin.Resource
}

// build constructs the parts of resource i without touching the disk.
// Errors of the constructors are errors of the configuration, named by the
// field the user wrote. driverName is the DRA driver's name (--driver-name;
// empty: its default), whose claims the claim guard recognises.
// owners is the process's registry of host node owners, shared by every
// resource (resource.Options.Owners); podres its PodResources client.
func build(cfg *config.Config, i int, writer *cdi.Writer, owners *device.Owners, start int64, log *logrus.Entry, m *metrics.Metrics, podres *podresources.Client, driverName string, registered func()) (*part, error) {
	rc := &cfg.Resources[i]
	field := func(name string) string { return cfg.ResourceField(i, name) }
	if rc.Simulated() {
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
	}
	socket := plugin.SocketName(cfg.PluginName, rc.Name, start)
	// The claim guard needs the source, which the holders it gives
	// resource.Build are asked of only once the resource runs.
	guard := &plugin.ClaimGuard{PodResources: podres}
	res, err := resource.Build(cfg, i, resource.Options{Writer: writer, Socket: filepath.Join(cfg.DevicePluginDir, socket), Log: log, Metrics: m,
		// A device a DRA claim holds (a node switched back from the DRA
		// driver) is in use: no background re-preparation resets it, and
		// a vanished one is not forgotten.
		Holders: guard.Held, Uevents: openUevents, Owners: owners, PodResources: podres})
	if err != nil {
		return nil, err
	}
	if driverName == "" {
		driverName = dranames.DefaultDriverName(cfg)
	}
	guard.Source, guard.Log = res.Source, res.Log
	guard.Match = plugin.ClaimMatch{Kind: res.Kind, IDPrefix: rc.IDPrefix, Drivers: []string{driverName}}
	if cfg.NodeName != "" {
		// The DRA driver's pool of the resource on this node, and the
		// node's one pool of earlier versions (claims allocated before
		// an upgrade).
		guard.Match.Pools = []string{dranames.PoolName(cfg.NodeName, rc.IDPrefix), cfg.NodeName}
	}
	var preparer plugin.Preparer // a nil interface, not a nil *Runner
	if res.Runner.HasSteps() {
		preparer = res.Runner
	}
	var mounts []*pluginapi.Mount
	for _, m := range rc.Mounts {
		mounts = append(mounts, &pluginapi.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, ReadOnly: m.ReadOnly})
	}
	p, err := plugin.New(plugin.Options{
		ResourceName:     rc.Name,
		PluginName:       cfg.PluginName,
		Dir:              cfg.DevicePluginDir,
		SocketName:       socket,
		Kind:             res.Kind,
		EnvPrefix:        rc.EnvPrefix,
		AnnotationPrefix: rc.AnnotationPrefix,
		Strategies:       cfg.DeviceListStrategy,
		Mounts:           mounts,
		Preparer:         preparer,
		Registered:       func() { guard.Registered(); registered() },
		Log:              res.Log,
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
	return &part{
		Parts: res, name: rc.Name, kind: res.Kind,
		resource: &plugin.Resource{Source: res.Source, Spec: res.Spec, Plugin: p, Recovery: res.Runner, Faults: res.Faults, Claims: guard, Log: res.Log, Metrics: m},
	}, nil
}

// prepare prepares the shared parts (nodes, device state, see
// resource.Parts.Prepare); PreStartContainer gets the device IDs of an
// earlier version that the kubelet still holds.
func (p *part) prepare() error {
	aliases, err := p.Prepare()
	if err != nil {
		return err
	}
	if len(aliases) > 0 {
		p.resource.Plugin.SetAliases(aliases) // PreStartContainer gets the checkpointed IDs
	}
	return nil
}
