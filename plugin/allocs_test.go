//go:build !race

package plugin

import (
	"context"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// TestAllocateAllocations: an Allocate of 8 devices
// (CDI names for the CRI, the CDI annotation, one annotation per device,
// the env variable) makes at most 16 allocations: the response's parts
// each allocated once (the CDI devices in one array, the annotations' map
// at its size), the request checked without maps, the CDI names not
// parsed again. It made 50 before. (Not under the race detector, which
// allocates on its own.)
func TestAllocateAllocations(t *testing.T) {
	p, ids := benchPlugin(t, 8, 0, 1)
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}
	n := testing.AllocsPerRun(100, func() {
		if _, err := p.Allocate(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	})
	if n > 16 {
		t.Errorf("Allocate of 8 devices: %.0f allocations, want at most 16", n)
	}
}
