package dra

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
)

// TestFirstSlicesSchedulable: the slices the driver creates first are the
// final ones: the handover guard is resolved before the first publish (one
// GET of the node, one PodResources List), so on a node that does not
// report the resource and where no device-plugin container holds a device,
// no device of the first slices carries the handover taint (it came off
// only with a second write, about a second later, before). Where the node
// reports the resource, or PodResources cannot answer, the first slices
// carry it, as before (the latter after Options.FirstPublishHold). Where
// PodResources answers only after the first look's bound (a loaded node),
// the first publish waits for the answer: no taint for want of one.
func TestFirstSlicesSchedulable(t *testing.T) {
	for _, c := range []struct {
		name    string
		setup   func(h *harness)
		tainted bool
	}{
		{"nothing of the device plugin", func(*harness) {}, false},
		{"the node reports the resource", func(h *harness) {
			n, err := h.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
			if err != nil {
				h.t.Fatal(err)
			}
			n.Status.Allocatable = corev1.ResourceList{resName: apiresource.MustParse("4")}
			if _, err := h.client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
				h.t.Fatal(err)
			}
		}, true},
		{"PodResources cannot answer", func(h *harness) {
			// Not at a first start: that one asks PodResources whether a
			// checkpoint was lost, and waits for it.
			h.start()
			h.stop()
			// Its slices gone too, so that the restart creates them.
			h.deleteSlices()
			h.podres.SetErr(errors.New("kubelet restarting"))
			// The first publish waits that long for an answer, then
			// goes out tainted.
			h.options = func(o *Options) { o.FirstPublishHold = 300 * time.Millisecond }
		}, true},
		{"PodResources answers after the first look's bound", func(h *harness) {
			// A loaded node, as in a rollout of many nodes at once: the
			// first publish waits for the answer instead of tainting the
			// devices for want of it.
			h.start()
			h.stop()
			h.deleteSlices()
			h.podres.SetDelay(primeTimeout + 500*time.Millisecond)
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, nil)
			c.setup(h)
			var mu sync.Mutex
			var first []*resourceapi.ResourceSlice
			h.client.PrependReactor("create", "resourceslices", func(a clienttesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				defer mu.Unlock()
				first = append(first, a.(clienttesting.CreateAction).GetObject().(*resourceapi.ResourceSlice).DeepCopy())
				return false, nil, nil
			})
			h.start()
			h.waitFor("the first slice created", func() bool { mu.Lock(); defer mu.Unlock(); return len(first) > 0 })
			mu.Lock()
			defer mu.Unlock()
			s := first[0]
			if len(s.Spec.Devices) != 4 {
				t.Fatalf("first slice: %d devices, want 4", len(s.Spec.Devices))
			}
			for _, d := range s.Spec.Devices {
				if got := hasTaint(d, TaintHandover); got != c.tainted {
					t.Errorf("%s in the first slice: handover taint %v, want %v", d.Name, got, c.tainted)
				}
			}
		})
	}
}

// TestFirstLookBesideStart: the answers the first publish needs (the
// node, and which pools have slices) are asked for as the driver starts,
// beside its checkpoint check, spec writes and the kubelet plugin's
// start, not once it serves: at a first start, where the checkpoint check
// waits for PodResources, a PodResources that answers only after the
// driver read its node and listed its slices still lets the driver start
// (asked after it served, the check waited until its bound and the start
// was refused), and the first slices carry no taint.
func TestFirstLookBesideStart(t *testing.T) {
	h := newHarness(t, nil)
	gate := make(chan struct{})
	var mu sync.Mutex
	var got, listed, closed bool
	seen := func(a clienttesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		switch a.GetResource().Resource {
		case "nodes":
			got = true
		case "resourceslices":
			listed = true
		}
		if got && listed && !closed {
			close(gate)
			closed = true
		}
		return false, nil, nil
	}
	h.client.PrependReactor("get", "nodes", seen)
	h.client.PrependReactor("list", "resourceslices", seen)
	h.podres.SetGate(gate)
	h.start()
	pub := h.published()
	if len(pub) != 4 {
		t.Fatalf("%d devices published, want 4", len(pub))
	}
	for name, d := range pub {
		if hasTaint(d, TaintHandover) {
			t.Errorf("%s: handover taint in the first slices", name)
		}
	}
}
