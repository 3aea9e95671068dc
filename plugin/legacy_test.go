package plugin

import (
	"context"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestPreStartContainerLegacyID: the kubelet starts a container again with
// the IDs it checkpointed, here one of a version before the ':' escaping
// (old-1, now sim-1). With the alias set, PreStartContainer prepares sim-1;
// without it, or for Allocate (the old ID is not advertised), it is an
// unknown ID.
func TestPreStartContainerLegacyID(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name     string
		replicas int
		ids      []string
	}{
		{"no replicas", 1, []string{"old-1"}},
		{"replicas", 2, []string{"old-1::1", "sim-2::0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &recorder{}
			p := newPlugin(t, testutil.ShortDir(t), snapshot(3, 0, c.replicas), func(o *Options) { o.Preparer = rec })
			req := &pluginapi.PreStartContainerRequest{DevicesIds: c.ids}
			if _, err := p.PreStartContainer(ctx, req); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "old-1") {
				t.Fatalf("without the alias: %v, want an unknown ID", err)
			}
			p.SetAliases(map[string]string{"old-1": "sim-1"})
			if _, err := p.PreStartContainer(ctx, req); err != nil {
				t.Fatal(err)
			}
			rec.mu.Lock()
			calls := slices.Clone(rec.calls)
			rec.mu.Unlock()
			want := "sim-1"
			if len(c.ids) > 1 {
				want = "sim-1,sim-2"
			}
			if len(calls) != 1 || strings.Join(calls[0], ",") != want {
				t.Fatalf("prepared %v, want %s", calls, want)
			}
			_, err := p.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: c.ids[:1]}}})
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("Allocate of an old ID: %v, want InvalidArgument", err)
			}
		})
	}
}
