package dra

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// resourcePublisher hands the driver's pools to the ResourceSlice
// controller (kubeletplugin.Helper).
type resourcePublisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// slicePublisher publishes the node's ResourceSlices: the first time at
// once (publishAtOnce), later changes spaced by its coalescer, nothing
// when the pools did not change; and, as the driver stops, the handover
// taint on every device (taintOnStop). The slice loop owns it: only
// published and first may be read from elsewhere.
type slicePublisher struct {
	driver, node string
	client       kubernetes.Interface
	log          *logrus.Entry
	co           *coalescer
	// last is what was published last (nil: nothing yet).
	last map[string]resourceslice.Pool
	// nodeUID is the node's UID when known before the first publish (the
	// owner of the slices it creates); "": publishAtOnce reads it.
	nodeUID types.UID
	// existing, when set before the first publish, is which of the
	// driver's pools on the node have slices (the first look's List);
	// nil: publishAtOnce lists them.
	existing map[string]bool
	// first is closed once the devices were first handed to the
	// ResourceSlice controller (published).
	first chan struct{}
	// metrics counts the publishes (nil: none).
	metrics *metrics.DRA
}

// publish hands pools to the controller through helper, unless they are
// what it has already or the coalescer holds them back (its C fires when
// they may go).
func (p *slicePublisher) publish(ctx context.Context, helper resourcePublisher, pools map[string]resourceslice.Pool) error {
	if (p.last != nil && reflect.DeepEqual(pools, p.last)) || !p.co.ready() {
		return nil
	}
	if p.last == nil {
		publishAtOnce(ctx, p.client, p.driver, p.node, p.nodeUID, p.existing, p.log, pools) // not a second later (firstpublish.go)
	}
	p.co.published()
	err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: pools})
	p.metrics.SlicesPublished(err)
	if err != nil {
		return fmt.Errorf("publish the ResourceSlices: %w", err)
	}
	n, ns := 0, 0
	for _, pool := range pools {
		ns += len(pool.Slices)
		for _, s := range pool.Slices {
			n += len(s.Devices)
		}
	}
	p.log.WithField("devices", n).WithField("slices", ns).WithField("pools", len(pools)).Debug("ResourceSlices published")
	p.last = pools
	if !p.published() {
		close(p.first)
	}
	return nil
}

// published reports whether the devices were handed to the ResourceSlice
// controller; it may be called from any goroutine.
func (p *slicePublisher) published() bool {
	select {
	case <-p.first:
		return true
	default:
		return false
	}
}

// due fires when a publish the coalescer held back may go; the loop then
// calls fired and publishes.
func (p *slicePublisher) due() <-chan time.Time { return p.co.C() }

// fired drops the trailing publish that due announced.
func (p *slicePublisher) fired() { p.co.fired() }

// stopTaintTimeout bounds the slice updates of a driver that stops.
const stopTaintTimeout = 5 * time.Second

// taintOnStop puts the handover taint on every device of the node's
// slices as the driver stops. The kubelet wipes a gone driver's slices
// only 30 s after it unregistered; meanwhile the scheduler would still
// allocate their devices to pods that no driver can prepare (a node
// switched back to the device plugin, whose pods asking for the extended
// resource would go through DRA). A driver that starts again publishes its
// devices as they are. Best effort: a failure is logged.
func (p *slicePublisher) taintOnStop() {
	ctx, cancel := context.WithTimeout(context.Background(), stopTaintTimeout)
	defer cancel()
	taint := resourceapi.DeviceTaint{Key: p.driver + "/" + TaintHandover, Effect: resourceapi.DeviceTaintEffectNoSchedule}
	list, err := p.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.driver=" + p.driver + ",spec.nodeName=" + p.node})
	if err != nil {
		p.log.WithError(err).Warn("stopping: could not list the ResourceSlices to taint their devices")
		return
	}
	n := 0
	for i := range list.Items {
		s := list.Items[i].DeepCopy()
		// The field selector is the API server's; a fake client ignores it.
		if s.Spec.Driver != p.driver || s.Spec.NodeName == nil || *s.Spec.NodeName != p.node {
			continue
		}
		changed := false
		for j := range s.Spec.Devices {
			dv := &s.Spec.Devices[j]
			if !slices.ContainsFunc(dv.Taints, func(t resourceapi.DeviceTaint) bool { return t.Key == taint.Key }) {
				dv.Taints = append(dv.Taints, taint)
				changed = true
				n++
			}
		}
		if !changed {
			continue
		}
		if _, err := p.client.ResourceV1().ResourceSlices().Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			p.log.WithError(err).WithField("slice", s.Name).Warn("stopping: could not taint the devices of a ResourceSlice")
		}
	}
	p.log.WithField("devices", n).Info("stopping: the devices carry the handover taint until the driver publishes them again")
}
