package bindmarker

import (
	"context"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

const driver = "sim.example.com"

func claim(name string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	if len(results) > 0 {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	}
	return c
}

func result(drv, pool string, bc ...string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: drv, Pool: pool, Device: "sim-0", BindingConditions: bc}
}

// TestMarker: a claim allocated devices of the driver that carry binding
// conditions is labelled with their node, and again when it is allocated
// on another node; a claim of another driver, one without binding
// conditions, and one not allocated are left alone.
func TestMarker(t *testing.T) {
	cs := fake.NewClientset(
		claim("bound", result(driver, "n1/sim", driver+"/prepared")),
		claim("plain", result(driver, "n1/sim")),
		claim("other", result("gpu.other.com", "n1/gpu", "gpu.other.com/attached")),
		claim("pending"),
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	testutil.Go(t, (&Marker{Client: cs, Driver: driver}).Run)
	label := NodeLabel(driver)
	get := func(name string) *resourceapi.ResourceClaim {
		c, err := cs.ResourceV1().ResourceClaims("ns").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	waitLabel := func(name, want string) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); get(name).Labels[label] != want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: label %q, want %q", name, get(name).Labels[label], want)
			}
		}
	}
	waitLabel("bound", "n1")
	c := get("bound")
	c.Status.Allocation.Devices.Results[0].Pool = "n2/sim"
	if _, err := cs.ResourceV1().ResourceClaims("ns").UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLabel("bound", "n2")
	for _, name := range []string{"plain", "other", "pending"} {
		if v, ok := get(name).Labels[label]; ok {
			t.Errorf("%s labelled %q", name, v)
		}
	}
}
