package dra

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

// withConfig adds configuration to the allocation of claim c in the API,
// as the scheduler copies it there from the class and the claim.
func (h *harness) withConfig(c *drav1.Claim, cfgs ...resourceapi.DeviceAllocationConfiguration) {
	h.t.Helper()
	claims := h.client.ResourceV1().ResourceClaims(c.Namespace)
	rc, err := claims.Get(context.Background(), c.Name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	rc.Status.Allocation.Devices.Config = append(rc.Status.Allocation.Devices.Config, cfgs...)
	if _, err := claims.Update(context.Background(), rc, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func opaque(source resourceapi.AllocationConfigSource, driver string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{Source: source, Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(`{"mode":"fast"}`)}}}}
}

// TestOpaqueConfigRefused: opaque configuration
// addressed to the driver, from the class or the claim, is refused at
// prepare: the error names the claim and says that the driver takes
// none; nothing is prepared or checkpointed. Configuration for another
// driver is not ours and is ignored.
func TestOpaqueConfigRefused(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	for _, c := range []struct {
		name string
		cfg  []resourceapi.DeviceAllocationConfiguration
		want string // "": prepared
	}{
		{"from the class", []resourceapi.DeviceAllocationConfiguration{opaque(resourceapi.AllocationConfigSourceClass, testDriver)},
			"claim default/from-the-class: opaque configuration for " + testDriver + " from the class (all requests): the driver takes no opaque configuration"},
		{"from the claim", []resourceapi.DeviceAllocationConfiguration{
			opaque(resourceapi.AllocationConfigSourceClaim, "gpu.other.com", "other"), opaque(resourceapi.AllocationConfigSourceClaim, testDriver, "req")},
			"claim default/from-the-claim: opaque configuration for " + testDriver + " from the claim (requests req): the driver takes no opaque configuration"},
		{"for another driver", []resourceapi.DeviceAllocationConfiguration{opaque(resourceapi.AllocationConfigSourceClaim, "gpu.other.com")}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := strings.ReplaceAll(c.name, " ", "-")
			cl := h.claim(name, "sim-2")
			h.withConfig(cl, c.cfg...)
			got := h.prepare(cl)[cl.Uid]
			_, checkpointed := h.checkpointed()[k8stypes.UID(cl.Uid)]
			if c.want == "" {
				if got.Error != "" || !checkpointed {
					t.Fatalf("not prepared: %q", got.Error)
				}
				if r := h.unprepare(cl)[cl.Uid]; r.Error != "" {
					t.Fatal(r.Error)
				}
				return
			}
			if !strings.Contains(got.Error, c.want) {
				t.Fatalf("error %q, want it to say %q", got.Error, c.want)
			}
			if checkpointed || len(got.Devices) > 0 {
				t.Fatalf("prepared: %v", got.Devices)
			}
			if s := h.deviceState("sim-n1-2"); s.Generation != 0 {
				t.Fatalf("the device was prepared: %+v", s)
			}
		})
	}
}
