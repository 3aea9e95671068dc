package podresources

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"

	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// BenchmarkList: one List of 10 pods on a real socket, on the client's
// kept connection and on a connection of its own (what every caller but
// the DRA driver did before this package).
func BenchmarkList(b *testing.B) {
	sock := filepath.Join(testutil.ShortDir(b), "pr.sock")
	var pods []*podresourcesapi.PodResources
	for i := range 10 {
		pods = append(pods, dpPod("ns", "p"+strconv.Itoa(i), map[string]map[string][]string{"a": {"example.com/sim": {"sim-" + strconv.Itoa(i)}}}))
	}
	testutil.ServePodResources(b, sock, pods...)
	ctx := context.Background()
	b.Run("kept", func(b *testing.B) {
		c := New(sock)
		defer func() { _ = c.Close() }()
		for b.Loop() {
			if _, err := c.List(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("own", func(b *testing.B) {
		for b.Loop() {
			if _, err := List(ctx, sock); err != nil {
				b.Fatal(err)
			}
		}
	})
}
