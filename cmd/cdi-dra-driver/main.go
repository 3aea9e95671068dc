// Command cdi-dra-driver is the DRA (Dynamic Resource Allocation) kubelet
// plugin of the configured resources: the same configuration, devices,
// CDI spec and prestart steps as cdi-device-plugin, published in
// ResourceSlices and prepared for ResourceClaims (package dra).
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
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/dra"
	"github.com/cdi-device-plugin/cdi-device-plugin/fault"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/command"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
	"github.com/cdi-device-plugin/cdi-device-plugin/resource"
)

var version = "dev"

// Defaults of the driver's own flags.
const (
	DefaultRegistrarDir = "/var/lib/kubelet/plugins_registry"
	DefaultPluginsDir   = "/var/lib/kubelet/plugins"
)

// CheckpointFile is the claim checkpoint, below the state dir.
const CheckpointFile = "dra/checkpoint.json"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.LookupEnv, os.Stderr, kubeclient.NewDRA)
	stop()
	os.Exit(code)
}

// flags are the driver's own flags, beside config's.
type flags struct {
	kubeconfig, driverName, registrarDir, pluginsDir, staleClaimGrace, deviceMetadata, deviceStatus, podUID string
}

func (f *flags) extra() []config.Extra {
	return []config.Extra{
		{Name: "kubeconfig", Env: "KUBECONFIG", Usage: "kubeconfig file (default: the in-cluster configuration)", Value: &f.kubeconfig},
		{Name: "driver-name", Env: "DRIVER_NAME", Usage: "DRA driver name (default <class>.<domain> of the first resource without replicas above 1, else of the first)", Value: &f.driverName},
		{Name: "kubelet-registrar-dir", Env: "KUBELET_REGISTRAR_DIR", Usage: "the kubelet's plugin registration directory (default " + DefaultRegistrarDir + ")",
			Default: DefaultRegistrarDir, Value: &f.registrarDir},
		{Name: "kubelet-plugins-dir", Env: "KUBELET_PLUGINS_DIR", Usage: "the kubelet's plugins directory; the driver's socket is <dir>/<driver>/dra.sock (default " + DefaultPluginsDir + ")",
			Default: DefaultPluginsDir, Value: &f.pluginsDir},
		{Name: "stale-claim-grace", Env: "STALE_CLAIM_GRACE", Usage: "how long a prepared claim must be gone from the API before the driver drops it and releases its devices (default " + dra.DefaultCleanupGrace.String() + ")",
			Default: dra.DefaultCleanupGrace.String(), Value: &f.staleClaimGrace},
		{Name: "device-metadata", Env: "DEVICE_METADATA", Usage: "give a claim's containers its devices' attributes in the file the kubelet plugin helper mounts " +
			"(KEP-5304: /var/run/kubernetes.io/dra-device-attributes/...; true or false, default true)",
			Default: "true", Value: &f.deviceMetadata},
		{Name: "device-status", Env: "DEVICE_STATUS", Usage: "write each prepared claim's status.devices (a Ready condition and the device's data; KEP-4817): " +
			"one API write per prepared claim (true or false, default true)",
			Default: "true", Value: &f.deviceStatus},
		{Name: "pod-uid", Env: "POD_UID", Usage: "the UID of the driver's pod (the downward API's metadata.uid): set, a new instance of the driver " +
			"registers and serves beside the old one during a rolling update, with sockets named after it (kubelet 1.33 and later); " +
			"empty, one instance at a time (default empty)",
			Value: &f.podUID},
	}
}

// podUIDPattern is what --pod-uid may hold: it names the sockets.
var podUIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// run runs the driver until ctx is done and returns the exit status: 0 on
// a clean shutdown, 2 for bad configuration (before anything is touched),
// 1 for any other failure.
func run(ctx context.Context, args []string, env config.Env, stderr io.Writer, client func(string) (kubeclient.DRA, error)) int {
	var f flags
	cfg, exit := command.Load(config.DRADriver, version, args, env, stderr, f.extra()...)
	if cfg == nil {
		return exit
	}
	logger := logs.New(stderr, cfg)
	log := logrus.NewEntry(logger).WithField("plugin", cfg.PluginName)
	d, err := build(cfg, f, client, log)
	if err != nil {
		fmt.Fprintln(stderr, "cdi-dra-driver:", err)
		if errors.Is(err, config.ErrInvalid) {
			return 2
		}
		return 1
	}
	if err := d.serve(ctx); err != nil {
		command.Exiting(log, err, stderr)
		return 1
	}
	log.Info("shut down cleanly")
	return 0
}

// driver is the built driver and what serve needs besides.
type driver struct {
	cfg        *config.Config
	log        *logrus.Entry
	parts      []*resource.Parts
	kinds      []cdi.Kind
	checkpoint *dra.Checkpoint
	opts       dra.Options
	metrics    *metrics.Metrics
}

// maxSocketPath is the longest unix socket path Linux accepts.
const maxSocketPath = 107

// build checks what the configuration alone could not and builds every
// part, touching nothing on disk: an error of the configuration is a
// FieldError naming the flag or field.
func build(cfg *config.Config, f flags, client func(string) (kubeclient.DRA, error), log *logrus.Entry) (*driver, error) {
	if f.driverName == "" {
		f.driverName = dra.DefaultDriverName(cfg)
	}
	if err := dra.CheckDriverName("driver-name", f.driverName); err != nil {
		return nil, err
	}
	if cfg.NodeName == "" {
		return nil, &config.FieldError{Field: "node-name", Reason: "required: the driver publishes the node's devices in a pool named after it (NODE_NAME)"}
	}
	pluginDir := filepath.Join(f.pluginsDir, f.driverName)
	uid := types.UID(f.podUID)
	if f.podUID != "" && !podUIDPattern.MatchString(f.podUID) {
		return nil, &config.FieldError{Field: "pod-uid", Value: f.podUID, Reason: "must be a pod UID: 1 to 64 letters, digits, '.', '_' or '-' (it names the driver's sockets)"}
	}
	draSock := filepath.Join(pluginDir, dra.SocketFile(uid))
	for _, c := range []struct{ field, dir, sock string }{
		{"kubelet-registrar-dir", f.registrarDir, filepath.Join(f.registrarDir, dra.RegistrarSocketFile(f.registrarDir, f.driverName, uid))},
		{"kubelet-plugins-dir", f.pluginsDir, draSock},
	} {
		if !filepath.IsAbs(c.dir) || filepath.Clean(c.dir) != c.dir {
			return nil, &config.FieldError{Field: c.field, Value: c.dir, Reason: "must be a clean absolute path"}
		}
		if len(c.sock) > maxSocketPath {
			return nil, &config.FieldError{Field: c.field, Value: c.dir, Reason: fmt.Sprintf("the socket %s would be longer than %d bytes", c.sock, maxSocketPath)}
		}
	}
	if err := dra.CheckDeviceNames(cfg); err != nil {
		return nil, err
	}
	grace, err := time.ParseDuration(f.staleClaimGrace)
	if err != nil || grace <= 0 {
		return nil, &config.FieldError{Field: "stale-claim-grace", Value: f.staleClaimGrace, Reason: "must be a positive duration (such as 5m)"}
	}
	metadata, err := strconv.ParseBool(f.deviceMetadata)
	if err != nil {
		return nil, &config.FieldError{Field: "device-metadata", Value: f.deviceMetadata, Reason: "must be true or false"}
	}
	status, err := strconv.ParseBool(f.deviceStatus)
	if err != nil {
		return nil, &config.FieldError{Field: "device-status", Value: f.deviceStatus, Reason: "must be true or false"}
	}
	if fi, err := os.Stat(cfg.DevRoot); err != nil || !fi.IsDir() {
		return nil, &config.FieldError{Field: "dev-root", Value: cfg.DevRoot, Reason: "must be an existing directory"}
	}
	// Three clients, each with a client-side rate limit of its own
	// (kubeclient.DRA).
	clients, err := client(f.kubeconfig)
	if err != nil {
		return nil, &config.FieldError{Field: "kubeconfig", Value: f.kubeconfig, Reason: "no API client (empty: the in-cluster configuration): " + err.Error()}
	}
	kc, sc, cc := clients.Client, clients.Status, clients.Cleanup
	d := &driver{cfg: cfg, log: log, checkpoint: dra.NewCheckpoint(filepath.Join(cfg.StateDir, CheckpointFile))}
	if cfg.MetricsAddress != "" {
		d.metrics = metrics.New(version)
	}
	start := time.Now().UnixNano()
	writer := cdi.NewWriter(cfg.CDIDir, cfg.Owner(), start)
	d.opts = dra.Options{DriverName: f.driverName, NodeName: cfg.NodeName, Client: kc, StatusClient: sc, CleanupClient: cc,
		RegistrarDir: f.registrarDir, PluginDir: pluginDir, Writer: writer, Checkpoint: d.checkpoint, RollingUpdateUID: uid,
		PodResources: cfg.PodResourcesSocket, Log: log, Metrics: d.metrics, CleanupGrace: grace,
		CleanupSpread: dra.DefaultCleanupInterval, DeviceMetadata: metadata, NoDeviceStatus: !status}
	// One registry of node owners for every resource: a host node in
	// devices of two resources publishes neither.
	owners := device.NewOwners(log)
	for i := range cfg.Resources {
		rc := &cfg.Resources[i]
		name := rc.Name
		p, err := resource.Build(cfg, i, resource.Options{Writer: writer, Socket: draSock, Siblings: uid != "", PrepareBeforeBind: true, Log: log, Metrics: d.metrics, Owners: owners,
			// Prepared claims hold their devices: no background
			// re-preparation resets them, and a vanished one is not
			// forgotten.
			Holders: func(context.Context) ([]string, error) { return d.checkpoint.Held(name), nil }})
		if err != nil {
			return nil, err
		}
		d.kinds = append(d.kinds, p.Kind)
		d.parts = append(d.parts, p)
		var mounts []cdi.Mount
		for _, m := range rc.Mounts {
			mounts = append(mounts, cdi.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, ReadOnly: m.ReadOnly})
		}
		d.opts.Resources = append(d.opts.Resources, dra.Resource{Name: rc.Name, Kind: p.Kind, IDPrefix: rc.IDPrefix, EnvPrefix: rc.EnvPrefix,
			Mounts: mounts, Source: p.Source, Spec: p.Spec, Runner: p.Runner, Faults: p.Faults, Replicas: rc.ReplicaCount(), PrepareBeforeBind: rc.PrepareBeforeBind})
	}
	return d, nil
}

// serve prepares the resources (nodes, device state), removes our stale
// specs, reads the claim checkpoint and runs the driver until ctx is
// done; with a metrics address it serves the metrics and probes. Specs,
// claim specs, device nodes and the checkpoint are kept on shutdown.
func (d *driver) serve(ctx context.Context) error {
	for _, p := range d.parts {
		if _, err := p.Prepare(); err != nil {
			return err
		}
	}
	removed, err := d.opts.Writer.RemoveStale(d.kinds)
	for _, p := range removed {
		d.log.WithField("spec", p).Info("removed the CDI spec of a resource no longer configured")
	}
	if err != nil {
		d.log.WithError(err).Warn("removing stale CDI specs")
	}
	if err := d.checkpoint.Load(); err != nil {
		return err
	}
	d.opts.BootID = bootID(d.cfg.ProcRoot, d.log)
	drv, err := dra.New(d.opts)
	if err != nil {
		return err
	}
	dra.SetKlogLog(d.log)
	g, ctx := errgroup.WithContext(ctx)
	if d.cfg.FaultControl {
		faults := make([]*fault.Injector, len(d.parts))
		for i, p := range d.parts {
			faults[i] = p.Faults
		}
		serveFaults, err := fault.Open(d.cfg.StateDir, config.DRADriver, func() []*fault.Injector { return faults }, d.log, d.metrics)
		if err != nil {
			return err
		}
		g.Go(func() error { return serveFaults(ctx) })
	}
	if d.metrics != nil {
		server := metrics.NewServer(d.metrics)
		server.SetChecks(map[string]metrics.Check{"driver": drv.Alive},
			map[string]metrics.Check{"driver": func(context.Context) error { return drv.Ready() }})
		ln, err := net.Listen("tcp", d.cfg.MetricsAddress)
		if err != nil {
			return fmt.Errorf("metrics address: %w", err)
		}
		d.log.WithField("address", ln.Addr().String()).Info("serving /metrics, /healthz and /readyz")
		g.Go(func() error { return server.Serve(ctx, ln) })
	}
	temps := append(resource.StateTempPatterns(d.cfg.StateDir), d.checkpoint.TempPattern())
	for _, p := range d.parts {
		temps = append(temps, p.TempPatterns()...)
	}
	g.Go(func() error {
		command.SweepTemps(temps, d.log)
		return nil
	})
	g.Go(func() error { return drv.Run(ctx) })
	return g.Wait()
}

// bootID is the kernel's boot ID ("" when it cannot be read: a claim is
// then never prepared again after a reboot).
func bootID(procRoot string, log *logrus.Entry) string {
	p := filepath.Join(procRoot, "sys", "kernel", "random", "boot_id")
	b, err := os.ReadFile(p)
	if err != nil {
		log.WithError(err).Warn("cannot read the boot ID; claims prepared before a reboot are not prepared again")
		return ""
	}
	return strings.TrimSpace(string(b))
}
