package bindmarker

import (
	"context"
	"encoding/json"
	"time"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/claimqueue"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
)

// Marker labels every ResourceClaim allocated devices of Driver that carry
// binding conditions with the node of those devices (NodeLabel =
// NodeValue): the one watch of every claim in the cluster, so that each
// node's driver watches only the claims of its node. A claim allocated
// again elsewhere is labelled again; a label is never removed (a claim
// deallocated keeps it, and its node's driver sees the deallocation).
type Marker struct {
	Client kubernetes.Interface
	// Driver is the DRA driver's name.
	Driver string
	Log    *logrus.Entry
	// Resync (default none) lists the claims again at this interval.
	Resync time.Duration
}

// nodeFor is the node claim c is to be labelled with, "" for none: the
// node of its devices of the driver that carry binding conditions (one
// node: the driver's devices are node-local).
func (m *Marker) nodeFor(c *resourceapi.ResourceClaim) string {
	if c.Status.Allocation == nil {
		return ""
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == m.Driver && len(r.BindingConditions) > 0 {
			return NodeOfPool(r.Pool)
		}
	}
	return ""
}

// Run marks claims until ctx is done; every goroutine it started has
// ended when it returns.
func (m *Marker) Run(ctx context.Context) error {
	log := m.Log
	if log == nil {
		log = logs.Discard()
	}
	q := claimqueue.Queue{
		Client: m.Client, Name: "bind-marker", Resync: m.Resync,
		Want: func(c *resourceapi.ResourceClaim) bool { return m.nodeFor(c) != "" },
		Sync: func(ctx context.Context, key types.NamespacedName, c *resourceapi.ResourceClaim) error {
			return m.mark(ctx, key, c, log)
		},
		Started: func(func(types.NamespacedName)) {
			log.WithField("driver", m.Driver).Info("marking the claims allocated with the driver's binding conditions for their node")
		},
		Failed: func(key types.NamespacedName, err error) {
			log.WithError(err).WithField("claim", key.String()).Warn("labelling a claim for its node's driver; tried again")
		},
	}
	return q.Run(ctx)
}

// mark labels claim c (nil: gone) with the node of its devices, unless it
// has no such node or is labelled so already.
func (m *Marker) mark(ctx context.Context, key types.NamespacedName, c *resourceapi.ResourceClaim, log *logrus.Entry) error {
	if c == nil {
		return nil
	}
	node := m.nodeFor(c)
	label, value := NodeLabel(m.Driver), NodeValue(node)
	if node == "" || c.Labels[label] == value {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{label: value}}})
	if _, err := m.Client.ResourceV1().ResourceClaims(c.Namespace).Patch(ctx, c.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	log.WithField("claim", key.String()).WithField("node", node).Debug("claim labelled for its node's driver")
	return nil
}
