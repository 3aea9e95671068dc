package dra

import (
	"context"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/latest"
)

// The handover guard. While the node still reports a resource as an
// extended resource (status.allocatable or status.capacity above zero), or
// a container holds a device of it through the device plugin (PodResources),
// the kubelet may take the resource's name for a device-plugin resource and
// fail the start of a container that DRA serves (kubelets 1.36.3 and 1.37.2,
// for 5 minutes after the device plugin left: the device manager's
// GetDeviceRunContainerOptions asks PreStartContainer of it with no check
// for DRA; docs/operations.md, "Kubernetes versions"). Every device of the
// resource then carries the handover taint, so that pods wait Pending
// instead.

// nodeReport is, by resource name, whether the node reports it.
type nodeReport map[string]bool

// pollResult is, by resource name, whether device-plugin containers hold
// devices of it; err: PodResources could not tell.
type pollResult struct {
	held map[string]bool
	err  error
}

// guard is one resource's handover guard.
type guard struct {
	// nodeKnown, heldKnown: the node was seen, PodResources answered.
	nodeKnown, heldKnown bool
	node, held           bool
	// told: the guard's state was logged (once both were known), wasUp
	// what it said.
	told, wasUp bool
}

func (g *guard) isUp() bool { return !g.nodeKnown || !g.heldKnown || g.node || g.held }

// handoverGuard is the handover guard of the driver's resources: their
// guards' state (owned by the slice loop), what the node reports of them
// (watchNode, on nodes) and what PodResources says device-plugin
// containers hold (poll, whose result the loop hands to held).
type handoverGuard struct {
	*guards
	nodeName string
	client   kubernetes.Interface
	// holders is, by resource name, the device IDs device-plugin
	// containers hold (the kubelet's PodResources).
	holders func(context.Context) (map[string][]string, error)
	// nodes: the node's reported resources (latest); polled: a poll's
	// result.
	nodes  chan nodeReport
	polled chan pollResult
}

func newHandoverGuard(names []string, node string, client kubernetes.Interface,
	holders func(context.Context) (map[string][]string, error), log *logrus.Entry) *handoverGuard {
	return &handoverGuard{guards: newGuards(names, log), nodeName: node, client: client, holders: holders,
		nodes: make(chan nodeReport, 1), polled: make(chan pollResult, 1)}
}

// guards are the guards of the driver's resources, owned by its loop.
type guards struct {
	names []string
	g     []guard
	log   *logrus.Entry
	// noPodResources: PodResources could not tell (logged once).
	noPodResources bool
}

func newGuards(names []string, log *logrus.Entry) *guards {
	return &guards{names: names, g: make([]guard, len(names)), log: log}
}

func (gs *guards) up(i int) bool { return gs.g[i].isUp() }

func (gs *guards) anyUp() bool {
	for i := range gs.g {
		if gs.g[i].isUp() {
			return true
		}
	}
	return false
}

// anyUnknown reports whether a guard has not heard from the node or from
// PodResources yet (or PodResources failed since).
func (gs *guards) anyUnknown() bool {
	for i := range gs.g {
		if !gs.g[i].nodeKnown || !gs.g[i].heldKnown {
			return true
		}
	}
	return false
}

func (gs *guards) node(n nodeReport) {
	for i, name := range gs.names {
		g := &gs.g[i]
		if n[name] && !g.isUp() {
			// PodResources is not asked while the guard is down: what it
			// said last is stale now. The guard comes down again only
			// after it says afresh that no container holds a device.
			g.heldKnown = false
		}
		g.nodeKnown, g.node = true, n[name]
	}
	gs.logChanges()
}

func (gs *guards) held(p pollResult) {
	switch {
	case p.err != nil && !gs.noPodResources:
		gs.log.WithError(p.err).Warn("cannot tell which devices device-plugin containers hold; the handover taint stays")
	case p.err == nil && gs.noPodResources:
		gs.log.Info("PodResources answers again")
	}
	gs.noPodResources = p.err != nil
	for i, name := range gs.names {
		gs.g[i].heldKnown, gs.g[i].held = p.err == nil, p.held[name]
	}
	gs.logChanges()
}

// logChanges says, once the node and PodResources were both heard from and
// then once per change, whether a resource's guard is up, and why.
func (gs *guards) logChanges() {
	for i := range gs.g {
		g := &gs.g[i]
		up := g.isUp()
		heard := g.nodeKnown && (g.heldKnown || gs.noPodResources)
		if (g.told && up == g.wasUp) || (!g.told && !heard) {
			continue
		}
		g.told, g.wasUp = true, up
		log := gs.log.WithField("resource", gs.names[i])
		if !up {
			log.Info("handover guard down: the node does not report the resource and no device-plugin container holds a device of it; its devices are published without the handover taint")
			continue
		}
		var why []string
		if g.node {
			why = append(why, "the node reports it as an extended resource")
		}
		if g.held {
			why = append(why, "a device-plugin container holds a device of it")
		}
		switch {
		case !g.heldKnown && gs.noPodResources:
			why = append(why, "PodResources cannot tell whether device-plugin containers hold devices")
		case !g.heldKnown:
			why = append(why, "PodResources not asked yet")
		}
		log.WithField("because", strings.Join(why, "; ")).Warn("handover guard up: the devices carry the handover taint")
	}
}

// primeTimeout bounds the node GET and the PodResources List of the first
// look (firstlook.go): a slow API server or kubelet delays the first
// slices by at most this (Options.FirstPublishHold then applies).
const primeTimeout = time.Second

// apply hands the first look's answers to the guards: what no one
// answered leaves its guard up (the taint stays until the node watch or
// the poll tells). It returns the node's UID ("" when the GET failed),
// which the first slices name as their owner.
func (h *handoverGuard) apply(l guardLook) types.UID {
	var uid types.UID
	if l.node != nil {
		h.node(h.reported(l.node))
		uid = l.node.UID
	}
	h.held(l.held)
	return uid
}

// poll asks PodResources which resources device-plugin containers hold
// devices of.
func (h *handoverGuard) poll(ctx context.Context) pollResult {
	held, err := h.holders(ctx)
	if err != nil {
		return pollResult{err: err}
	}
	out := map[string]bool{}
	for name, ids := range held {
		out[name] = len(ids) > 0
	}
	return pollResult{held: out}
}

// reported is which of the resources the node reports as extended
// resources.
func (h *handoverGuard) reported(n *corev1.Node) nodeReport {
	out := nodeReport{}
	for _, r := range h.names {
		name := corev1.ResourceName(r)
		a, c := n.Status.Allocatable[name], n.Status.Capacity[name]
		out[r] = !a.IsZero() || !c.IsZero()
	}
	return out
}

// watchNode watches the driver's own Node (a field-selected list and
// watch) and hands the loop which resources it reports, until ctx is done.
func (h *handoverGuard) watchNode(ctx context.Context) error {
	sel := fields.OneTermEqualSelector("metadata.name", h.nodeName).String()
	nodes := h.client.CoreV1().Nodes()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return nodes.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return nodes.Watch(ctx, o)
		},
	}
	send := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok && n.Name == h.nodeName {
			latest.Send(h.nodes, h.reported(n))
		}
	}
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: cache.ToListWatcherWithWatchListSemantics(lw, h.client),
		ObjectType:    &corev1.Node{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    send,
			UpdateFunc: func(_, n any) { send(n) },
			DeleteFunc: func(any) { latest.Send(h.nodes, nodeReport{}) },
		},
	})
	ctrl.RunWithContext(ctx)
	return nil
}
