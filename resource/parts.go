package resource

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/device/sysfs"
	"github.com/cdi-device-plugin/cdi-device-plugin/fault"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
	"github.com/cdi-device-plugin/cdi-device-plugin/podresources"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
)

// Options are what Build needs besides the configuration.
type Options struct {
	// Writer writes the spec.
	Writer *cdi.Writer
	// Socket is the socket this process serves for the resource, written
	// into the spec (cdi.Resource.Socket).
	Socket string
	// PrepareBeforeBind: this process prepares the resources with
	// prepareBeforeBind before binding, out of any kubelet call (the DRA
	// driver), so their steps get their whole budget; elsewhere (the
	// device plugin's PreStartContainer) it is cut to the kubelet's
	// (config.KubeletBudget).
	PrepareBeforeBind bool
	// Siblings: another process may serve the resource beside this one,
	// from Socket's directory (cdi.Resource.Siblings: the DRA driver
	// during a rolling update).
	Siblings bool
	// Log gets a resource field; nil: nothing is logged.
	Log     *logrus.Entry
	Metrics *metrics.Metrics
	// Holders, when set, returns device IDs held besides those the
	// kubelet's PodResources lists (the DRA driver's prepared claims):
	// background recovery spares them, and a vanished host device held so
	// is not forgotten.
	Holders func(ctx context.Context) ([]string, error)
	// Uevents, when set, opens the kernel's uevents of a resource found by
	// identity (pci, usb) in place of the NETLINK_KOBJECT_UEVENT socket:
	// a reader of kernel-shaped messages (tests).
	Uevents func() (io.ReadCloser, error)
	// Owners is the registry of host node owners of the process, the same
	// for every resource it builds (device.Options.Owners): a node claimed
	// by devices of two resources makes both Unhealthy (shared_node). Nil:
	// the resource's devices are checked against each other only.
	Owners *device.Owners
	// PodResources asks the kubelet's PodResources API (the socket of the
	// configuration; Build does not close it). Nil: each question is one
	// List on a connection of its own.
	PodResources *podresources.Client
}

// Parts are one configured resource, built.
type Parts struct {
	// Name is the extended resource name; Kind the CDI kind of its devices.
	Name   string
	Kind   cdi.Kind
	Source *device.Source
	Runner *prestart.Runner
	// Faults injects the resource's faults (simulated devices only):
	// run it beside the source.
	Faults *fault.Injector
	Spec   StateSpec
	// StateRoot holds the device state directories.
	StateRoot string
	Log       *logrus.Entry
	// registry is the host devices' registry file ("" for simulated
	// devices); podResources the kubelet's PodResources: both to keep IDs
	// of earlier versions resolvable (legacyAliases).
	registry, podResourcesSocket string
	podResources                 listPodResources
}

// listPodResources is one List of the kubelet's PodResources API.
type listPodResources func(ctx context.Context) (*podresources.Resources, error)

// Build constructs the parts of resource i of cfg without touching the
// disk. Errors of the constructors are errors of the configuration, named
// by the field the user wrote.
func Build(cfg *config.Config, i int, o Options) (*Parts, error) {
	rc := &cfg.Resources[i]
	field := func(name string) string { return cfg.ResourceField(i, name) }
	log := o.Log
	if log == nil {
		log = logs.Discard()
	}
	log = log.WithField("resource", rc.Name)
	kind, err := cdi.KindFor(rc.Domain, rc.Class)
	if err != nil {
		return nil, &config.FieldError{Field: field("name"), Value: rc.Name, Reason: "does not give a valid CDI kind: " + err.Error()}
	}
	socket := cfg.PodResourcesSocket
	podResources := listPodResources(func(ctx context.Context) (*podresources.Resources, error) { return podresources.List(ctx, socket) })
	if o.PodResources != nil {
		podResources = o.PodResources.List
	}
	resource := rc.Name
	holders := func(ctx context.Context) ([]string, error) {
		res, err := podResources(ctx)
		if err != nil {
			return nil, err
		}
		held := res.Held(resource)
		if o.Holders == nil {
			return held, nil
		}
		more, err := o.Holders(ctx)
		return append(held, more...), err
	}
	opts := device.Options{
		DevRoot:  cfg.DevRoot,
		IDPrefix: rc.IDPrefix, NodeName: cfg.NodeName,
		Replicas: rc.ReplicaCount(),
		Resource: rc.Name,
		Owners:   o.Owners,
		Log:      log,
	}
	if rc.Simulated() {
		opts.Count = rc.DeviceCount()
		opts.FilePrefix = rc.DeviceFilePrefix
		opts.Type = device.NodeType(rc.DeviceNode.Type.CDI())
		opts.Major, opts.Minor = *rc.DeviceNode.Major, *rc.DeviceNode.Minor
		opts.NUMANodes = rc.NUMANodes
	} else {
		// Host devices keep their IDs and indexes across restarts; a
		// registry that does not parse is rebuilt from the spec an earlier
		// run wrote, when it is ours.
		opts.Registry = filepath.Join(cfg.StateDir, "resources", kind.SpecName()+".json")
		specPath, owner, envPrefix := o.Writer.Path(kind), cfg.Owner(), rc.EnvPrefix
		opts.Described = func() ([]device.Described, error) { return describedBy(specPath, owner, kind, envPrefix) }
		opts.SharedNodes = rc.SharedRel
		opts.ForgetAfter = rc.ForgetAfterOrDefault()
		opts.Holders = holders
		sysRoot := cfg.SysRoot
		opts.DiskOf = func(major, minor uint32) (uint32, uint32, bool) { return sysfs.DiskOf(sysRoot, major, minor) }
		if rc.ContainerPath != "" {
			opts.ContainerPath = rc.ContainerPathOf
		}
		switch rc.Discovery() {
		case config.DiscoverPCI:
			sel := sysfs.PCISelector{Vendor: rc.PCI.Vendor, Device: rc.PCI.Device, Class: rc.PCI.Class, Driver: rc.PCI.Driver}
			opts.Discover, opts.DiscoverKind = sysfs.Discover(cfg.SysRoot, cfg.ProcRoot, sel, log), string(config.DiscoverPCI)
			opts.KernelEvents = kernelEvents(o.Uevents, "pci")
		case config.DiscoverUSB:
			sel := sysfs.USBSelector{Vendor: rc.USB.Vendor, Product: rc.USB.Product, Serial: rc.USB.Serial}
			opts.Discover, opts.DiscoverKind = sysfs.DiscoverUSB(cfg.SysRoot, sel, log), string(config.DiscoverUSB)
			opts.KernelEvents = kernelEvents(o.Uevents, "usb")
		default:
			opts.HostGlobs = rc.HostGlobs
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
	stateRoot := stateRoot(cfg.StateDir)
	faults := newInjector(rc, src, log, o.Metrics)
	runner, err := newRunner(cfg, i, stateRoot, src, holders, log, o.Metrics, o.PrepareBeforeBind && rc.PrepareBeforeBind, faults)
	if err != nil {
		return nil, err
	}
	// The device state is mounted into containers when there is state to
	// show: a resource with prestart steps.
	specRes := cdi.Resource{Name: rc.Name, Kind: kind, EnvPrefix: rc.EnvPrefix, Socket: o.Socket, Siblings: o.Siblings}
	if runner.HasSteps() {
		specRes.StateRoot = stateRoot
		specRes.NoStateMount = runner.BadState
	}
	return &Parts{
		Name: rc.Name, Kind: kind, Source: src, Runner: runner, Faults: faults, StateRoot: stateRoot, Log: log,
		Spec:     StateSpec{Spec: o.Writer.Spec(specRes), runner: runner},
		registry: opts.Registry, podResourcesSocket: socket, podResources: podResources,
	}, nil
}

// describedBy reads the devices the CDI spec at path describes, for a
// registry rebuilt from it (device.Options.Described). The spec must be
// there (device.ErrNoSpec), valid, of kind and written by owner
// (cdi.OwnerAnnotation; device.ErrForeignSpec); a
// device's index is its <envPrefix>_<index> variable (-1 without one), its
// identity its annotations.
func describedBy(path, owner string, kind cdi.Kind, envPrefix string) ([]device.Described, error) {
	spec, err := cdiapi.ReadSpec(path, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w %s (a reboot empties its directory)", device.ErrNoSpec, path)
	}
	if err != nil {
		return nil, fmt.Errorf("CDI spec %s: %w", path, err)
	}
	if got := spec.Annotations[cdi.OwnerAnnotation]; got != owner || spec.Kind != kind.String() {
		return nil, fmt.Errorf("%w: %s (kind %s, owner %q; ours: %s, %q)", device.ErrForeignSpec, path, spec.Kind, got, kind, owner)
	}
	out := make([]device.Described, 0, len(spec.Devices))
	for _, d := range spec.Devices {
		nodes := d.ContainerEdits.DeviceNodes
		if len(nodes) == 0 {
			return nil, fmt.Errorf("CDI spec %s: device %s has no node", path, d.Name)
		}
		n := nodes[0]
		hostPath := n.HostPath
		if hostPath == "" {
			hostPath = n.Path
		}
		ds := device.Described{Name: d.Name, Index: -1, Identity: device.IdentityFromAnnotations(cdi.IdentityAnnotationPrefix, d.Annotations),
			Node: device.Node{HostPath: hostPath, ContainerPath: n.Path, Type: device.NodeType(n.Type), Major: uint32(n.Major), Minor: uint32(n.Minor)}}
		for _, e := range d.ContainerEdits.Env {
			k, _, _ := strings.Cut(e, "=")
			if i, ok := strings.CutPrefix(k, envPrefix+"_"); ok && envPrefix != "" {
				if v, err := strconv.Atoi(i); err == nil && v >= 0 && strconv.Itoa(v) == i {
					ds.Index = v
				}
			}
		}
		out = append(out, ds)
	}
	return out, nil
}

// kernelEvents are the kernel events of subsystem: from open when set,
// else the kernel's socket.
func kernelEvents(open func() (io.ReadCloser, error), subsystem string) func(context.Context, func()) (func(), error) {
	if open != nil {
		return sysfs.KernelEventsFrom(open, subsystem)
	}
	return sysfs.KernelEvents(subsystem)
}

// Prepare creates the simulated nodes (or finds the host devices), gives
// every device its state and restores the faults an earlier run recorded.
// It returns the device IDs of earlier versions that are kept resolvable
// (see legacyAliases), old ID -> device. The spec is written by the
// follower (Follower), before the devices are published.
func (r *Parts) Prepare() (map[string]string, error) {
	// No registry yet: the first start of a version that escapes host IDs
	// (the registry came with the escaping), or of the resource.
	first := false
	if r.registry != "" {
		_, err := os.Stat(r.registry)
		first = errors.Is(err, fs.ErrNotExist)
	}
	snap, err := r.Source.Prepare()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.Name, err)
	}
	aliases, err := r.legacyAliases(snap, first)
	if err != nil {
		if first {
			// Refuse the next start too: without the registry that this
			// start wrote, it is a first start again.
			_ = os.Remove(r.registry)
		}
		return nil, fmt.Errorf("%s: %w", r.Name, err)
	}
	// Every device has a state directory (mounted into its containers);
	// a failed preparation recorded by an earlier run keeps it unhealthy,
	// and so does an unusable state (that device alone).
	faults, err := r.Runner.Init(snap)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.Name, err)
	}
	for name, problem := range faults {
		r.Source.SetFault(name, problem)
	}
	// The faults injected at start are there from the first publication.
	if r.Faults.Tick() || len(faults) > 0 {
		r.Source.Refresh()
	}
	r.Log.WithField("spec", r.Spec.Path()).WithField("devices", len(snap.Devices)).Info("resource prepared")
	return aliases, nil
}

// TempPatterns are the globs of the temp files that writes of this
// resource killed mid-way may have left: the spec, the simulated nodes,
// the host devices' registry.
func (r *Parts) TempPatterns() []string {
	out := []string{r.Spec.TempPattern()}
	if p := r.Source.TempPattern(); p != "" {
		out = append(out, p)
	}
	if r.registry != "" {
		out = append(out, atomicfile.TempPattern(r.registry))
	}
	return out
}

// stateRoot is where the device state directories of every resource are,
// below the state dir.
func stateRoot(stateDir string) string { return filepath.Join(stateDir, "devices") }

// lockDir holds a lock file per device (prestart.Options.LockDir), below
// the state dir and beside the device state directories, which are
// mounted into containers: two processes (the old and the new DRA driver
// of a rolling update) never run steps on one device at once.
func lockDir(stateDir string) string { return filepath.Join(stateDir, "locks") }

// StateTempPatterns are the globs of what device state writes killed
// mid-way may have left in the device state directories below stateDir:
// temp files of a device's state file, and the scratch directories a
// reset moved aside. Every resource's device state is there, so a command
// sweeps them once, beside each resource's TempPatterns.
func StateTempPatterns(stateDir string) []string {
	root := stateRoot(stateDir)
	return []string{
		filepath.Join(root, "*", ".*.tmp-*"),
		filepath.Join(root, "*", prestart.ScratchDir+".old-*"),
	}
}

// legacyAliases keeps the host device IDs of versions before the ':'
// escaping that the kubelet still holds (a checkpoint reuses their CDI
// names for container restarts) resolvable in the spec, to the same
// device; an ID that cannot be resolved so is an error (cdi.ErrLegacyID).
// first: no registry existed before this start (see cdi.LegacyAliases).
// Without a PodResources socket nothing is known: no aliases.
func (r *Parts) legacyAliases(snap *device.Snapshot, first bool) (map[string]string, error) {
	legacy := r.Source.LegacyIDs()
	if len(legacy) == 0 {
		return nil, nil
	}
	res, err := r.podResources(context.Background())
	if errors.Is(err, podresources.ErrNoSocket) {
		r.Log.WithField("socket", r.podResourcesSocket).Warn("no PodResources API: host device IDs of versions before the ':' escaping that containers hold are not kept resolvable")
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	held := res.Holders(r.Name)
	aliases, err := cdi.LegacyAliases(snap, legacy, held, first)
	if err != nil {
		return nil, err
	}
	for old, name := range aliases {
		r.Log.WithField("old", old).WithField("device", name).WithField("holders", strings.Join(held[old], ",")).
			Info("keeping the device ID of an earlier version resolvable while the kubelet holds it")
	}
	r.Spec.SetAliases(aliases)
	return aliases, nil
}

// StateSpec is a resource's CDI spec whose writes first give every device
// its state directory when the spec mounts it: the spec never names a
// directory that does not exist (hot-plugged devices included). A device
// whose directory is unusable is made unhealthy by Ensure and its mount is
// left out of the spec (cdi.Resource.NoStateMount); the others go on.
type StateSpec struct {
	*cdi.Spec
	runner *prestart.Runner
}

// Write ensures the state directories, then writes the spec of snap.
func (s StateSpec) Write(snap *device.Snapshot) error {
	if s.runner.HasSteps() {
		if err := s.runner.Ensure(snap); err != nil {
			return err
		}
	}
	return s.Spec.Write(snap)
}

// newRunner builds the prestart runner of resource i from its steps; a
// command that does not parse is an error of its field.
func newRunner(cfg *config.Config, i int, stateRoot string, src *device.Source, holders func(context.Context) ([]string, error), log *logrus.Entry, m *metrics.Metrics,
	preBind bool, faults prestart.Faults) (*prestart.Runner, error) {
	rc := &cfg.Resources[i]
	opts := prestart.Options{Resource: rc.Name, StateRoot: stateRoot, LockDir: lockDir(cfg.StateDir), Health: src, Log: log, Metrics: m, Faults: faults,
		// Background recovery spares the devices containers hold.
		Holders: holders}
	if p := rc.Prestart; p != nil {
		opts.Budget = p.Budget.Duration
		if k := config.KubeletBudget(opts.Budget); !preBind && k < opts.Budget {
			log.WithField("budget", opts.Budget).WithField("used", k).Warn("prestart budget cut to the kubelet's call limit here: " +
				"a longer budget applies to the DRA driver's preparation before binding (prepareBeforeBind) alone")
			opts.Budget = k
		}
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
