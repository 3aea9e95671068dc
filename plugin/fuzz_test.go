package plugin

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// FuzzRequests sends what the fuzzer makes of a kubelet request (IDs split
// at '|', a must-include count, a size) to Allocate, PreStartContainer and
// GetPreferredAllocation of a plugin with 4 devices × 2 replicas. Every
// answer is a refusal with InvalidArgument, or right: Allocate answers
// with the devices asked for, preferred allocation holds the
// must-includes and only known available IDs, each once, at most size.
func FuzzRequests(f *testing.F) {
	for _, s := range []string{"sim-0::0", "sim-0::0|sim-1::1", "sim-0::0|sim-0::0", "", "|", "sim-9", "sim-0::0|../x|\x00", strings.Repeat("a", 300)} {
		f.Add(s, uint8(1), int32(2))
	}
	dir, err := os.MkdirTemp("", "fz")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = os.RemoveAll(dir) })
	log := logrus.New()
	log.SetOutput(discard{})
	o := Options{ResourceName: resourceName, PluginName: "fuzz", Dir: dir, SocketName: "fuzz.sock", Kind: testKind(f), Log: logrus.NewEntry(log), Preparer: &recorder{}}
	p, err := New(o, snapshot(4, 2, 2))
	if err != nil {
		f.Fatal(err)
	}
	known := map[string]bool{}
	for _, d := range p.state.Load().list {
		known[d.ID] = true
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, in string, nMust uint8, size int32) {
		ids := strings.Split(in, "|")
		refused := func(what string, err error) {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("%s(%q): %v, want InvalidArgument or an answer", what, ids, err)
			}
		}
		resp, err := p.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
		if err != nil {
			refused("Allocate", err)
		} else {
			for _, id := range ids {
				if !known[id] {
					t.Fatalf("Allocate(%q) accepted unknown %q", ids, id)
				}
			}
			if len(resp.ContainerResponses) != 1 || len(resp.ContainerResponses[0].CdiDevices) == 0 {
				t.Fatalf("Allocate(%q): %v", ids, resp)
			}
		}
		if _, err := p.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids}); err != nil {
			refused("PreStartContainer", err)
		}
		must := ids[:min(int(nMust), len(ids))]
		presp, err := p.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: ids, MustIncludeDeviceIDs: must, AllocationSize: size,
		}}})
		if err != nil {
			refused("GetPreferredAllocation", err)
			return
		}
		got := presp.ContainerResponses[0].DeviceIDs
		seen := map[string]bool{}
		for _, id := range got {
			if seen[id] || !known[id] || !slices.Contains(ids, id) && !slices.Contains(must, id) {
				t.Fatalf("preferred(%q, must %q, %d) = %q: %q twice, unknown or not available", ids, must, size, got, id)
			}
			seen[id] = true
		}
		for _, id := range must {
			if !seen[id] {
				t.Fatalf("preferred(%q, must %q, %d) = %q: must-include %q dropped", ids, must, size, got, id)
			}
		}
		if len(got) > int(size) && len(got) > len(must) {
			t.Fatalf("preferred(%q, must %q, %d) = %q: too many", ids, must, size, got)
		}
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
