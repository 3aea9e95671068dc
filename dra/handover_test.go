package dra

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestSlicesHealthAndTaints: the node's ResourceSlice lists the
// four devices, each id the name the spec on disk gives it; a device
// whose node is removed gets the unhealthy taint and is Unhealthy on the
// kubelet's health stream, and both clear when it is back.
func TestSlicesHealthAndTaints(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.waitFor("4 devices without taints", func() bool {
		p := h.published()
		return len(p) == 4 && !slices.ContainsFunc([]string{"sim-0", "sim-1", "sim-2", "sim-3"}, func(n string) bool { return len(p[n].Taints) > 0 })
	})
	spec, err := cdiapi.ReadSpec(filepath.Join(h.cdiDir, "k8s.example.com-sim.json"), 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range spec.Devices {
		names = append(names, spec.Kind+"="+d.Name)
	}
	for name, d := range h.published() {
		id := d.Attributes[resourceapi.QualifiedName(testDriver+"/"+AttrID)]
		if id.StringValue == nil || !slices.Contains(names, *id.StringValue) {
			t.Errorf("%s: id %v is not a device of the spec (%v)", name, id.StringValue, names)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*deadline)
	defer cancel()
	stream, err := h.kl.Health.NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	health := func(want map[string]drahealthv1.HealthStatus) {
		t.Helper()
		for {
			r, err := stream.Recv()
			if err != nil {
				t.Fatalf("health stream: %v", err)
			}
			got := map[string]drahealthv1.HealthStatus{}
			for _, d := range r.Devices {
				if d.Device.PoolName == PoolName(node, "sim") {
					got[d.Device.DeviceName] = d.Health
				}
			}
			if fmt.Sprint(got) == fmt.Sprint(want) {
				return
			}
		}
	}
	healthy := drahealthv1.HealthStatus_HEALTHY
	health(map[string]drahealthv1.HealthStatus{"sim-0": healthy, "sim-1": healthy, "sim-2": healthy, "sim-3": healthy})

	if err := os.Remove(filepath.Join(h.dev, "sim-2")); err != nil {
		t.Fatal(err)
	}
	h.waitFor("sim-2 tainted unhealthy", func() bool { d := h.published()["sim-2"]; return hasTaint(d, TaintUnhealthy) })
	if hasTaint(h.published()["sim-1"], TaintUnhealthy) {
		t.Fatal("sim-1 tainted too")
	}
	health(map[string]drahealthv1.HealthStatus{"sim-0": healthy, "sim-1": healthy, "sim-2": drahealthv1.HealthStatus_UNHEALTHY, "sim-3": healthy})
	testutil.Mknod(t, filepath.Join(h.dev, "sim-2"), 1, 3)
	h.waitFor("sim-2 healthy again", func() bool { return len(h.published()["sim-2"].Taints) == 0 })
	health(map[string]drahealthv1.HealthStatus{"sim-0": healthy, "sim-1": healthy, "sim-2": healthy, "sim-3": healthy})
}

// TestHandoverGuard: while the node reports the resource as
// an extended resource, or a container holds a device of it through the
// device plugin, every device carries the handover taint; once neither
// holds, none does.
func TestHandoverGuard(t *testing.T) {
	h := newHarness(t, nil)
	setNode := func(n int64) {
		t.Helper()
		nd, err := h.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		q := *apiresource.NewQuantity(n, apiresource.DecimalSI)
		nd.Status.Allocatable = corev1.ResourceList{corev1.ResourceName(resName): q}
		nd.Status.Capacity = corev1.ResourceList{corev1.ResourceName(resName): q}
		if _, err := h.client.CoreV1().Nodes().UpdateStatus(context.Background(), nd, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	all := func(taint bool) func() bool {
		return func() bool {
			p := h.published()
			if len(p) != 4 {
				return false
			}
			for _, d := range p {
				if hasTaint(d, TaintHandover) != taint {
					return false
				}
			}
			return true
		}
	}
	setNode(4)
	h.start()
	h.waitFor("handover taint while the node reports the resource", all(true))
	setNode(0)
	h.waitFor("no handover taint once it reports none", all(false))

	h.podres.Set(&podresourcesapi.PodResources{Name: "dp-pod", Namespace: "default", Containers: []*podresourcesapi.ContainerResources{{
		Name: "ctr", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: resName, DeviceIds: []string{"sim-n1-0"}}}}}})
	// The poll runs only while a guard is up: the node reporting the
	// resource again raises it, and PodResources then keeps it up.
	setNode(4)
	h.waitFor("handover taint again", all(true))
	setNode(0)
	time.Sleep(100 * time.Millisecond) // five polls
	if !all(true)() {
		t.Fatal("handover taint gone while a device-plugin container holds a device")
	}
	h.podres.Set()
	h.waitFor("no handover taint once no container holds a device", all(false))
}

// TestStopTaintsDevices: a driver that stops leaves its
// devices tainted handover in its slices, which the kubelet wipes only 30
// s after the driver unregistered: meanwhile the scheduler allocates none
// of them, so a node switched back to the device plugin gets no new pod
// served through a driver that is gone. Started again, the driver
// publishes them untainted.
func TestStopTaintsDevices(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	untainted := func() bool {
		p := h.published()
		return len(p) == 4 && !slices.ContainsFunc([]string{"sim-0", "sim-1", "sim-2", "sim-3"}, func(n string) bool { return len(p[n].Taints) > 0 })
	}
	h.waitFor("4 devices without taints", untainted)
	h.stop()
	p := h.published()
	if len(p) != 4 {
		t.Fatalf("%d devices left in the slices after the stop, want 4", len(p))
	}
	for name, d := range p {
		if !hasTaint(d, TaintHandover) || d.Taints[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
			t.Errorf("%s after the stop: taints %+v, want %s/%s:NoSchedule", name, d.Taints, testDriver, TaintHandover)
		}
	}
	h.start()
	h.waitFor("untainted again after the start", untainted)
}
