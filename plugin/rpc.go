package plugin

// The five RPCs of the device plugin API, served for each incarnation of
// the server through its handler.

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// handler serves the device plugin API for one incarnation of the server:
// its ListAndWatch streams end when that incarnation stops.
type handler struct {
	pluginapi.UnimplementedDevicePluginServer
	p    *Plugin
	stop <-chan struct{}
}

func (h *handler) GetDevicePluginOptions(ctx context.Context, e *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return h.p.GetDevicePluginOptions(ctx, e)
}

func (h *handler) ListAndWatch(_ *pluginapi.Empty, st pluginapi.DevicePlugin_ListAndWatchServer) error {
	return h.p.listAndWatch(st, h.stop)
}

func (h *handler) Allocate(ctx context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	return h.p.Allocate(ctx, r)
}

func (h *handler) GetPreferredAllocation(ctx context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return h.p.GetPreferredAllocation(ctx, r)
}

func (h *handler) PreStartContainer(ctx context.Context, r *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return h.p.PreStartContainer(ctx, r)
}

// GetDevicePluginOptions advertises what is implemented.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.options(), nil
}

func (p *Plugin) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{PreStartRequired: p.opts.Preparer != nil, GetPreferredAllocationAvailable: true}
}

// listAndWatch sends the full list at once and again on every change, until
// the stream ends or stop (the serving incarnation's) is closed.
func (p *Plugin) listAndWatch(stream pluginapi.DevicePlugin_ListAndWatchServer, stop <-chan struct{}) error {
	p.streams.Add(1)
	p.opts.Metrics.Stream(p.opts.ResourceName, 1)
	defer func() {
		p.streams.Add(-1)
		p.opts.Metrics.Stream(p.opts.ResourceName, -1)
	}()
	for {
		v := p.state.Load()
		msg := v.message()
		if size := messageSize(msg); size > MaxListMessage {
			// Host devices can outgrow what the configuration allowed
			// for: the kubelet will not read this list.
			p.log.WithField("devices", len(v.list)).WithField("bytes", size).WithField("limit", MaxListMessage).
				Error("the device list is larger than the kubelet reads; it will not see these devices")
		}
		if err := stream.SendMsg(msg); err != nil {
			if stream.Context().Err() == nil {
				p.log.WithError(err).WithField("devices", len(v.list)).WithField("bytes", messageSize(msg)).
					Error("sending the device list to the kubelet failed")
			}
			return err
		}
		select {
		case <-v.changed:
		case <-stream.Context().Done():
			return nil
		case <-stop:
			return nil
		}
	}
}

// Allocate answers with CDI names, env, mounts and annotations of the
// requested devices. It does no I/O.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (resp *pluginapi.AllocateResponse, err error) {
	start := time.Now()
	defer func() {
		took := time.Since(start)
		p.opts.Metrics.ObserveRPC(p.opts.ResourceName, "Allocate", took, err)
		// One line per container request, built only when it is written
		// (each WithField would copy the entry's fields again).
		level, msg := logrus.InfoLevel, "allocate"
		if err != nil {
			level, msg = logrus.WarnLevel, "allocate refused"
		}
		if p.log.Logger.IsLevelEnabled(level) {
			for _, c := range req.ContainerRequests {
				f := logrus.Fields{"took": took, "devices": idList(c.DevicesIds)}
				if err != nil {
					f[logrus.ErrorKey] = err
				}
				p.log.WithFields(f).Log(level, msg)
			}
		}
		if resp != nil && p.log.Logger.IsLevelEnabled(logrus.DebugLevel) {
			p.log.WithField("response", resp.String()).Debug("allocate answer")
		}
	}()
	if len(req.ContainerRequests) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "%s: no container requests", p.opts.ResourceName)
	}
	v := p.state.Load()
	resp = &pluginapi.AllocateResponse{ContainerResponses: make([]*pluginapi.ContainerAllocateResponse, 0, len(req.ContainerRequests))}
	for _, creq := range req.ContainerRequests {
		cresp, err := p.allocateContainer(v, creq.DevicesIds)
		if err != nil {
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	return resp, nil
}

// physical returns the physical devices (indexes in v.snap.Devices) of the
// kubelet IDs, each once, in request order: replicas of one device are one
// device. No IDs, an unknown ID, an ID twice, and an unhealthy one when
// healthy is set, are refused with InvalidArgument naming the ID.
func (p *Plugin) physical(v *view, ids []string, healthy bool) ([]int, error) {
	if len(ids) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "%s: no device IDs", p.opts.ResourceName)
	}
	phys := make([]int, 0, len(ids))
	// A kubelet request names a few IDs: a scan of those seen so far
	// costs less than two maps (their tables outgrow a group at 8).
	var seen map[int]bool
	var asked map[string]bool
	small := len(ids) <= smallRequest
	if !small {
		seen, asked = make(map[int]bool, len(ids)), make(map[string]bool, len(ids))
	}
	for k, id := range ids {
		i, ok := v.ids[id]
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "%s: unknown device ID %s", p.opts.ResourceName, quoteID(id))
		}
		if (small && slices.Contains(ids[:k], id)) || asked[id] {
			return nil, status.Errorf(codes.InvalidArgument, "%s: device ID %s requested twice", p.opts.ResourceName, quoteID(id))
		}
		if !small {
			asked[id] = true
		}
		if d := v.snap.Devices[i]; healthy && !d.Healthy {
			return nil, status.Errorf(codes.InvalidArgument, "%s: device ID %s is unhealthy: %s", p.opts.ResourceName, quoteID(id), d.Problem)
		}
		if small && !slices.Contains(phys, i) || !small && !seen[i] {
			if !small {
				seen[i] = true
			}
			phys = append(phys, i)
		}
	}
	return phys, nil
}

// smallRequest is the most IDs a request may name for physical to check
// them by scanning instead of with maps.
const smallRequest = 16

// maxIDInMessage bounds how much of an ID an error or log line shows.
const maxIDInMessage = 128

// quoteID quotes an ID for a message, cut to maxIDInMessage bytes.
func quoteID(id string) string {
	if len(id) > maxIDInMessage {
		id = id[:maxIDInMessage] + "..."
	}
	return strconv.Quote(id)
}

// idList is the IDs of a request for a log line: at most 16 of them.
func idList(ids []string) string {
	const most = 16
	if len(ids) <= most {
		return strings.Join(ids, ",")
	}
	return strings.Join(ids[:most], ",") + ",... (" + strconv.Itoa(len(ids)) + " IDs)"
}

func (p *Plugin) allocateContainer(v *view, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	if len(ids) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "%s: empty container request", p.opts.ResourceName)
	}
	phys, err := p.physical(v, ids, true)
	if err != nil {
		return nil, err
	}
	strategies := p.opts.Strategies
	r := &pluginapi.ContainerAllocateResponse{Mounts: p.opts.Mounts}
	names := make([]string, len(phys))
	for k, i := range phys {
		names[k] = v.cdiNames[i]
	}
	if strategies.Includes(config.StrategyCDICRI) {
		devs := make([]pluginapi.CDIDevice, len(names)) // one allocation
		r.CdiDevices = make([]*pluginapi.CDIDevice, len(names))
		for k, n := range names {
			devs[k].Name = n
			r.CdiDevices[k] = &devs[k]
		}
	}
	if p.annotKey != "" || p.opts.AnnotationPrefix != "" {
		r.Annotations = make(map[string]string, 1+len(phys))
	}
	if p.annotKey != "" {
		// cdiapi.AnnotationValue, without parsing again the names that
		// newView made with Kind.QualifiedName (checked there).
		r.Annotations[p.annotKey] = strings.Join(names, ",")
	}
	if p.opts.AnnotationPrefix != "" {
		p.deviceAnnotations(v, r.Annotations, ids, phys)
	}
	if strategies.Includes(config.StrategyDeviceSpecs) {
		seen := map[string]bool{} // shared nodes once
		for _, i := range phys {
			d := v.snap.Devices[i]
			for _, n := range d.AllNodes() {
				if !seen[n.ContainerPath] {
					seen[n.ContainerPath] = true
					r.Devices = append(r.Devices, &pluginapi.DeviceSpec{ContainerPath: n.ContainerPath, HostPath: n.HostPath, Permissions: "rw"})
				}
			}
		}
	}
	if k, val := p.identityEnv(v, phys); k != "" {
		if r.Envs == nil {
			r.Envs = map[string]string{}
		}
		r.Envs[k] = val
	}
	if p.opts.EnvPrefix != "" {
		if r.Envs == nil {
			r.Envs = map[string]string{}
		}
		r.Envs[p.opts.EnvPrefix+"_DEVICES"] = strings.Join(ids, ",")
		// Without a CDI strategy the runtime never sees the spec's
		// per-device variables: send them here.
		if !strategies.AnyCDI() {
			for _, i := range phys {
				k, val := cdi.DeviceEnv(p.opts.EnvPrefix, v.snap.Devices[i])
				r.Envs[k] = val
			}
		}
	}
	return r, nil
}

// GetPreferredAllocation picks devices: must-includes first, then one NUMA
// node where possible, replicas spread over distinct physical devices.
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (resp *pluginapi.PreferredAllocationResponse, err error) {
	start := time.Now()
	defer func() {
		p.opts.Metrics.ObserveRPC(p.opts.ResourceName, "GetPreferredAllocation", time.Since(start), err)
		if resp != nil && p.log.Logger.IsLevelEnabled(logrus.DebugLevel) {
			p.log.WithField("response", resp.String()).Debug("preferred allocation")
		}
	}()
	v := p.state.Load()
	resp = &pluginapi.PreferredAllocationResponse{}
	for _, creq := range req.ContainerRequests {
		ids, err := preferred(v, creq.AvailableDeviceIDs, creq.MustIncludeDeviceIDs, int(creq.AllocationSize))
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s: %v", p.opts.ResourceName, err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// PreStartContainer prepares the container's devices (each physical device
// once, replicas included) and fails with the device, step and cause.
func (p *Plugin) PreStartContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (_ *pluginapi.PreStartContainerResponse, err error) {
	if p.opts.Preparer == nil {
		return &pluginapi.PreStartContainerResponse{}, nil
	}
	start := time.Now()
	defer func() {
		p.opts.Metrics.ObserveRPC(p.opts.ResourceName, "PreStartContainer", time.Since(start), err)
		l := p.log.WithField("devices", idList(req.DevicesIds)).
			WithField("steps", strings.Join(p.opts.Preparer.Steps(), ",")).WithField("took", time.Since(start))
		if err != nil {
			l.WithError(err).Warn("prestart failed")
		} else {
			l.Info("prestart")
		}
	}()
	v := p.state.Load()
	phys, err := p.physical(v, p.current(v, req.DevicesIds), false)
	if err != nil {
		return nil, err
	}
	devs := make([]device.Device, len(phys))
	for k, i := range phys {
		devs[k] = v.snap.Devices[i]
	}
	if err := p.opts.Preparer.Prepare(ctx, devs); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%s: %v", p.opts.ResourceName, err)
	}
	return &pluginapi.PreStartContainerResponse{}, nil
}

// deviceAnnotations adds to annots one annotation per physical device of
// phys: the IDs of ids requested of it (replicas), sorted, so the value
// does not depend on their order; its key is the view's (annotKeys).
func (p *Plugin) deviceAnnotations(v *view, annots map[string]string, ids []string, phys []int) {
	if len(ids) == len(phys) {
		// No replica asked twice: each device has one ID, in order.
		for k, i := range phys {
			annots[v.annotKeys[i]] = ids[k]
		}
		return
	}
	for _, i := range phys {
		var group []string
		for _, id := range ids {
			if v.ids[id] == i {
				group = append(group, id)
			}
		}
		slices.Sort(group)
		annots[v.annotKeys[i]] = strings.Join(group, ",")
	}
}

// identityEnv is device.IdentityEnv of the devices phys of v.
func (p *Plugin) identityEnv(v *view, phys []int) (string, string) {
	if !slices.ContainsFunc(phys, func(i int) bool {
		id := &v.snap.Devices[i].Identity
		return id.PCIAddress != "" || id.USBBus > 0
	}) {
		return "", "" // IdentityEnv's answer, without its slices
	}
	ids := make([]device.Identity, len(phys))
	for k, i := range phys {
		ids[k] = v.snap.Devices[i].Identity
	}
	return device.IdentityEnv(p.opts.ResourceName, ids)
}
