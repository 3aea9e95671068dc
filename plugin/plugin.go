// Package plugin serves the kubelet device plugin API (v1beta1) for one
// resource: registration and its lifecycle, ListAndWatch, Allocate and
// GetPreferredAllocation. It reads devices only from snapshots.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/ping"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
)

// Options configure the plugin of one resource.
type Options struct {
	// ResourceName is the extended resource, e.g. example.com/fpga.
	ResourceName string
	// PluginName names the plugin in CDI annotation keys.
	PluginName string
	// Dir is the kubelet device plugin directory (kubelet.sock lives there).
	Dir string
	// SocketName is our socket's file name in Dir (see SocketName).
	SocketName string
	// Kind is the CDI kind of the resource's devices.
	Kind cdi.Kind
	// EnvPrefix, AnnotationPrefix: see docs/configuration.md.
	EnvPrefix, AnnotationPrefix string
	// Strategies say how Allocate hands devices over (default cdi-cri).
	Strategies config.Strategies
	// Mounts are added to every container allocation.
	Mounts []*pluginapi.Mount
	// Preparer runs before every container start; nil: PreStartContainer
	// is not required.
	Preparer Preparer
	// RetryInterval bounds the wait between registration attempts when no
	// kubelet.sock event arrives (default 5 s).
	RetryInterval time.Duration
	// Registered, when set, is called by Run's loop after every
	// successful registration (ClaimGuard.Registered); it must not block.
	Registered func()
	Log        *logrus.Entry
	// Metrics, when set, records the calls, registrations and devices.
	Metrics *metrics.Metrics
}

// Preparer prepares devices before a container start (prestart.Runner).
type Preparer interface {
	Prepare(ctx context.Context, devs []device.Device) error
	// Steps names the steps, in order.
	Steps() []string
}

// Plugin is the device plugin server of one resource.
// Its RPC methods are served through a handler per server incarnation.
type Plugin struct {
	opts     Options
	log      *logrus.Entry
	annotKey string
	state    atomic.Pointer[view]
	// updateMu serialises Update, so views are published in order.
	updateMu sync.Mutex

	// registered: the last registration with the current kubelet worked;
	// streams: open ListAndWatch streams (what readiness looks at).
	registered atomic.Bool
	streams    atomic.Int32
	// pings are answered by Run's loop (liveness).
	pings chan chan struct{}
	// aliases: device IDs of an earlier version (SetAliases).
	aliases atomic.Pointer[map[string]string]
}

// view is everything the RPCs need, computed once per snapshot, so that
// the answers need no I/O and little work.
type view struct {
	snap     *device.Snapshot
	ids      map[string]int // kubelet ID -> index in snap.Devices
	order    map[string]int // kubelet ID -> position in list
	list     []*pluginapi.Device
	cdiNames []string
	// annotKeys are the devices' annotation keys (AnnotationPrefix-<index>),
	// by index in snap.Devices; nil without a prefix.
	annotKeys []string
	changed   chan struct{} // closed when a newer view replaces this one

	// wire is list encoded, made by the first send (or patched from the
	// previous view's by nextView).
	wire     atomic.Pointer[wireList]
	wireOnce sync.Once
}

// message is what ListAndWatch sends for the view: the encoded list
// (wireCodec sends its bytes), or the message itself if it cannot be
// encoded (gRPC then fails the send with the reason).
func (v *view) message() any {
	v.wireOnce.Do(func() {
		if v.wire.Load() != nil {
			return
		}
		if w, err := encodeList(v.list); err == nil {
			v.wire.Store(w)
		}
	})
	if w := v.wire.Load(); w != nil {
		return w
	}
	return &pluginapi.ListAndWatchResponse{Devices: v.list}
}

// Errors of New for settings that the configuration cannot check alone.
var (
	// ErrSocketPath: the socket path would be longer than a unix socket
	// path may be.
	ErrSocketPath = errors.New("socket path too long")
	// ErrAnnotationKey: the plugin and resource names give no valid CDI
	// annotation key (cdi-annotations strategy).
	ErrAnnotationKey = errors.New("no valid CDI annotation key")
)

// maxSocketPath is the longest unix socket path Linux accepts (108 bytes
// including the terminating NUL).
const maxSocketPath = 107

// SocketName is the socket file of a resource for a process started at
// start (Unix ns): unique per process start.
func SocketName(plugin, resource string, start int64) string {
	return socketPrefix(plugin, resource) + strconv.FormatInt(start, 10) + ".sock"
}

func socketPrefix(plugin, resource string) string {
	return plugin + "-" + strings.NewReplacer("/", "_", ".", "_").Replace(resource) + "-"
}

// New returns a plugin advertising the devices of snap (none when nil).
func New(opts Options, snap *device.Snapshot) (*Plugin, error) {
	if snap == nil {
		snap = &device.Snapshot{}
	}
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = 5 * time.Second
	}
	if opts.Log == nil {
		opts.Log = logs.Discard()
	}
	if len(opts.Strategies) == 0 {
		opts.Strategies = config.Strategies{config.StrategyCDICRI}
	}
	if sock := filepath.Join(opts.Dir, opts.SocketName); len(sock) > maxSocketPath {
		return nil, fmt.Errorf("%w: %q is longer than %d bytes", ErrSocketPath, sock, maxSocketPath)
	}
	p := &Plugin{opts: opts, log: opts.Log, pings: make(chan chan struct{})}
	if opts.Strategies.Includes(config.StrategyCDIAnnotations) {
		key, err := cdiapi.AnnotationKey(opts.PluginName, opts.ResourceName)
		if err != nil {
			return nil, fmt.Errorf("%w for plugin %q and resource %q: %w", ErrAnnotationKey, opts.PluginName, opts.ResourceName, err)
		}
		p.annotKey = key
	}
	v, err := p.newView(snap)
	if err != nil {
		return nil, err
	}
	p.state.Store(v)
	return p, nil
}

func (p *Plugin) newView(snap *device.Snapshot) (*view, error) {
	v := &view{
		snap:     snap,
		ids:      make(map[string]int, len(snap.Devices)*max(snap.Replicas, 1)),
		order:    make(map[string]int, len(snap.Devices)*max(snap.Replicas, 1)),
		cdiNames: make([]string, len(snap.Devices)),
		changed:  make(chan struct{}),
	}
	for i, d := range snap.Devices {
		name, err := p.opts.Kind.QualifiedName(d.Name)
		if err != nil {
			return nil, err
		}
		v.cdiNames[i] = name
		if p.opts.AnnotationPrefix != "" {
			v.annotKeys = append(v.annotKeys, p.opts.AnnotationPrefix+"-"+strconv.Itoa(d.Index))
		}
		health := pluginapi.Healthy
		if !d.Healthy {
			health = pluginapi.Unhealthy
		}
		var topo *pluginapi.TopologyInfo
		if d.NUMANode != device.NoNUMA {
			topo = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.NUMANode)}}}
		}
		for r := 0; r < max(snap.Replicas, 1); r++ {
			id := device.ReplicaID(d.Name, r, snap.Replicas)
			v.ids[id] = i
			v.order[id] = len(v.list)
			v.list = append(v.list, &pluginapi.Device{ID: id, Health: health, Topology: topo})
		}
	}
	return v, nil
}

// nextView is the view of snap after old. When only health changed (the
// same devices, the same replicas) it shares old's immutable parts (ID
// maps, CDI names, annotation keys, the device messages of the devices whose health did
// not change) and makes new messages for the others only: a health change
// costs a copy of the list's pointers, not a rebuild of every ID.
func (p *Plugin) nextView(old *view, snap *device.Snapshot) (*view, error) {
	if old == nil || old.snap.Replicas != snap.Replicas || !device.SameDevices(old.snap, snap) {
		return p.newView(snap)
	}
	v := &view{snap: snap, ids: old.ids, order: old.order, list: old.list, cdiNames: old.cdiNames, annotKeys: old.annotKeys, changed: make(chan struct{})}
	perDevice := max(snap.Replicas, 1)
	cloned := false
	var changed []int // list entries
	for i := range snap.Devices {
		if snap.Devices[i].Healthy == old.snap.Devices[i].Healthy {
			continue
		}
		if !cloned {
			v.list, cloned = slices.Clone(old.list), true
		}
		health := pluginapi.Healthy
		if !snap.Devices[i].Healthy {
			health = pluginapi.Unhealthy
		}
		// The replicas of device i are its perDevice entries from
		// i*perDevice on (newView lists them so).
		for k := i * perDevice; k < (i+1)*perDevice; k++ {
			was := old.list[k]
			v.list[k] = &pluginapi.Device{ID: was.ID, Health: health, Topology: was.Topology}
			changed = append(changed, k)
		}
	}
	// The bytes follow the list: the old view's as they are, or patched.
	if w := old.wire.Load(); w != nil {
		if len(changed) == 0 {
			v.wire.Store(w)
		} else if pw, err := w.patch(v.list, changed); err == nil {
			v.wire.Store(pw)
		}
	}
	return v, nil
}

// Update publishes a new snapshot to ListAndWatch streams and Allocate.
func (p *Plugin) Update(snap *device.Snapshot) error {
	p.updateMu.Lock()
	defer p.updateMu.Unlock()
	v, err := p.nextView(p.state.Load(), snap)
	if err != nil {
		return err
	}
	old := p.state.Swap(v)
	close(old.changed)
	p.record(old.snap, snap)
	return nil
}

// record counts the devices by health and the devices whose health
// changed, with the reason.
func (p *Plugin) record(old, cur *device.Snapshot) {
	m := p.opts.Metrics
	if m == nil {
		return
	}
	healthy := cur.Healthy()
	m.Devices(p.opts.ResourceName, healthy, len(cur.Devices)-healthy)
	if device.SameDevices(old, cur) {
		// The same devices in the same order: no map needed.
		for i, d := range cur.Devices {
			if old.Devices[i].Healthy != d.Healthy {
				m.HealthTransition(p.opts.ResourceName, d.Healthy, d.Problem.Cause.String())
			}
		}
		return
	}
	was := make(map[string]bool, len(old.Devices))
	for _, d := range old.Devices {
		was[d.Name] = d.Healthy
	}
	for _, d := range cur.Devices {
		if h, known := was[d.Name]; (known && h != d.Healthy) || (!known && !d.Healthy) {
			m.HealthTransition(p.opts.ResourceName, d.Healthy, d.Problem.Cause.String())
		}
	}
}

// Ready reports whether the kubelet uses the plugin: the registration with
// the current kubelet worked and a ListAndWatch stream is open.
func (p *Plugin) Ready() error {
	switch {
	case !p.registered.Load():
		return errors.New("not registered with the kubelet")
	case p.streams.Load() == 0:
		return errors.New("registered, but the kubelet has no ListAndWatch stream open")
	}
	return nil
}

// Alive reports whether Run's loop answers within ctx.
func (p *Plugin) Alive(ctx context.Context) error {
	return ping.Ask(ctx, p.pings, "the registration loop")
}
