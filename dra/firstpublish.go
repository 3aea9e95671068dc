package dra

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// The first publish. The helper's ResourceSlice controller
// (k8s.io/dynamic-resource-allocation/resourceslice, v0.37.2) starts with
// the first PublishResources and writes nothing until its slice informer
// has synced, which it checks once a second (initInformer: `for
// !handler.HasSynced() { ... time.After(time.Second) }`): every driver on
// the helper publishes its devices a second after it starts. Before that
// first call the driver creates the slices of each pool that has none yet
// itself, as the controller would create them: the same generated name
// (index prefix, driver, node), owner (the Node), pool (generation 1, the
// slice count) and spec. The controller's informer then lists them when
// it starts, matches each to its desired slice by the index in its name,
// finds it equal and leaves it alone; it reconciles every later change,
// and any pool that had slices already (a driver restarted: its slices
// are updated by the controller, as before).

// sliceIndexMinLength is the least width of the hex index that starts the
// name of a slice (the controller's resourceSliceIndexMinLength).
const sliceIndexMinLength = 5

// sliceNamePrefix is the generateName of slice i of a pool of n slices of
// driver on node, as the ResourceSlice controller makes it:
// <index, hex, zero-padded>-<driver>-<node>-.
func sliceNamePrefix(driver, node string, i, n int) string {
	width := max(sliceIndexMinLength, len(strconv.FormatInt(int64(n-1), 16)))
	return fmt.Sprintf("%0*x-%s-%s-", width, i, driver, node)
}

// firstSlices is the ResourceSlices of pool as the ResourceSlice
// controller creates them for a pool that has none: generation 1 (the
// controller bumps a new pool's generation from 0), owned by the node
// (nodeUID).
func firstSlices(driver, node string, nodeUID types.UID, name string, pool resourceslice.Pool) []*resourceapi.ResourceSlice {
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: nodeUID, Controller: ptr.To(true)}}
	out := make([]*resourceapi.ResourceSlice, 0, len(pool.Slices))
	for i, s := range pool.Slices {
		out = append(out, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{GenerateName: sliceNamePrefix(driver, node, i, len(pool.Slices)), OwnerReferences: owner},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:                 driver,
				Pool:                   resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
				NodeName:               &node,
				Devices:                s.Devices,
				SharedCounters:         s.SharedCounters,
				PerDeviceNodeSelection: s.PerDeviceNodeSelection,
				PartitionTypeAttribute: s.PartitionTypeAttribute,
				SkipNodeOperations:     s.SkipNodeOperations,
			},
		})
	}
	return out
}

// existingPools lists the driver's slices on node and returns, by pool
// name, the pools that have some; nil when the List failed (the failure
// is logged).
func existingPools(ctx context.Context, client kubernetes.Interface, driver, node string, log *logrus.Entry) map[string]bool {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + driver +
		"," + resourceapi.ResourceSliceSelectorNodeName + "=" + node})
	if err != nil {
		log.WithError(err).Debug("listing the node's ResourceSlices; the ResourceSlice controller publishes them")
		return nil
	}
	have := map[string]bool{}
	for i := range list.Items {
		s := &list.Items[i]
		if s.Spec.Driver == driver && ptr.Deref(s.Spec.NodeName, "") == node {
			have[s.Spec.Pool.Name] = true
		}
	}
	return have
}

// publishAtOnce creates the slices of driver's pools on node (of UID
// nodeUID; "": read here) that have none in the API (see "The first
// publish" above), before the first PublishResources. existing is which
// pools have slices (existingPools; nil: listed here). Best effort: on any
// error it stops and leaves the rest to the controller, which creates what
// is missing and adopts what was created. It returns how many slices it
// created.
func publishAtOnce(ctx context.Context, client kubernetes.Interface, driver, node string, nodeUID types.UID, existing map[string]bool,
	log *logrus.Entry, pools map[string]resourceslice.Pool) int {
	have := existing
	if have == nil {
		if have = existingPools(ctx, client, driver, node, log); have == nil {
			return 0
		}
	}
	api := client.ResourceV1().ResourceSlices()
	n := 0
	for _, name := range slices.Sorted(maps.Keys(pools)) {
		if have[name] {
			continue // the controller reconciles what exists
		}
		if nodeUID == "" {
			nd, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				log.WithError(err).Debug("reading the node (the slices' owner); the ResourceSlice controller publishes the slices")
				return n
			}
			nodeUID = nd.UID
		}
		for _, s := range firstSlices(driver, node, nodeUID, name, pools[name]) {
			if _, err := api.Create(ctx, s, metav1.CreateOptions{}); err != nil {
				log.WithError(err).WithField("pool", name).Debug("creating a ResourceSlice; the ResourceSlice controller publishes it")
				return n
			}
			n++
		}
	}
	return n
}
