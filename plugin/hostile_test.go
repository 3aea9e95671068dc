package plugin

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestHostileRequests: requests the kubelet never sends get a clear
// InvalidArgument naming what is wrong (an ID quoted, cut at 128 bytes),
// and no answer.
func TestHostileRequests(t *testing.T) {
	p := newPlugin(t, testutil.ShortDir(t), snapshot(4, 0, 1), func(o *Options) { o.Preparer = &recorder{}; o.EnvPrefix = "SIM" })
	huge := make([]string, 100000)
	for i := range huge {
		huge[i] = "sim-0"
	}
	unknownMany := make([]string, 100000)
	for i := range unknownMany {
		unknownMany[i] = "nope-" + strings.Repeat("x", i%50)
	}
	long := strings.Repeat("a", 4096)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		ids  [][]string // nil: no container request at all
		want string
	}{
		{"no container requests", nil, "no container requests"},
		{"empty container request", [][]string{{}}, "empty container request"},
		{"duplicate IDs", [][]string{{"sim-0", "sim-1", "sim-0"}}, `device ID "sim-0" requested twice`},
		{"100,000 copies of one ID", [][]string{huge}, `device ID "sim-0" requested twice`},
		{"100,000 unknown IDs", [][]string{unknownMany}, `unknown device ID "nope-"`},
		{"unknown", [][]string{{"sim-0", "sim-9"}}, `unknown device ID "sim-9"`},
		{"slash", [][]string{{"sim-0/../sim-1"}}, `unknown device ID "sim-0/../sim-1"`},
		{"dots", [][]string{{".."}}, `unknown device ID ".."`},
		{"NUL", [][]string{{"sim-0\x00"}}, `unknown device ID "sim-0\x00"`},
		{"4 KiB", [][]string{{long}}, `unknown device ID "` + strings.Repeat("a", 128) + `..."`},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := &pluginapi.AllocateRequest{}
			for _, ids := range c.ids {
				req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
			}
			resp, err := p.Allocate(ctx, req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) || resp != nil {
				t.Fatalf("Allocate: %v (%v), want InvalidArgument with %q", status.Code(err), err, c.want)
			}
			if len(c.ids) != 1 || len(c.ids[0]) == 0 && c.name != "empty container request" {
				return
			}
			_, err = p.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: c.ids[0]})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), strings.Replace(c.want, "empty container request", "no device", 1)) {
				t.Fatalf("PreStartContainer: %v (%v)", status.Code(err), err)
			}
		})
	}
	if rec := p.opts.Preparer.(*recorder); len(rec.calls) != 0 {
		t.Fatalf("prepared on a refused request: %v", rec.calls)
	}
	// Preferred allocation: a size out of range and a must-include that is
	// not a device are refused; unknown available IDs are ignored.
	for _, c := range []struct {
		name  string
		req   *pluginapi.ContainerPreferredAllocationRequest
		want  string
		valid bool
	}{
		{"negative size", &pluginapi.ContainerPreferredAllocationRequest{AvailableDeviceIDs: []string{"sim-0"}, AllocationSize: -1}, "allocation size -1", false},
		{"unknown must-include", &pluginapi.ContainerPreferredAllocationRequest{AvailableDeviceIDs: []string{"sim-0"}, MustIncludeDeviceIDs: []string{"x\x00"}, AllocationSize: 1}, `unknown must-include device ID "x\x00"`, false},
		{"huge size", &pluginapi.ContainerPreferredAllocationRequest{AvailableDeviceIDs: append([]string{"sim-0", long}, unknownMany...), AllocationSize: 1 << 30}, "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, err := p.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{c.req}})
			if c.valid {
				if err != nil || len(resp.ContainerResponses[0].DeviceIDs) != 1 || resp.ContainerResponses[0].DeviceIDs[0] != "sim-0" {
					t.Fatalf("%+v %v", resp, err)
				}
				return
			}
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v (%v), want InvalidArgument with %q", status.Code(err), err, c.want)
			}
		})
	}
}
