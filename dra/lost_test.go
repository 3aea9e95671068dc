package dra

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// TestCheckpointLost: a claim checkpoint that is gone while prepared
// claims of the driver are still on the node (their CDI specs, their
// device metadata specs, or PodResources listing them on containers) is
// not taken for a first start, which would remove the specs of claims
// whose containers still run and prepare their devices for others: the
// driver refuses to start, naming the claims and the files, and leaves
// them as they are. With no such trace it is a first start, and the
// checkpoint is created at once, so that a driver killed in its first
// Prepare does not leave a spec without a checkpoint.
func TestCheckpointLost(t *testing.T) {
	for _, c := range []struct {
		name string
		// before prepares what the node holds, after the driver stopped
		// and its checkpoint was removed.
		before func(h *harness)
		// refused: the start is refused, naming these.
		refused []string
	}{
		{"a claim spec", func(h *harness) {
			cl := h.claim("c", "sim-1")
			if r := h.prepare(cl)[cl.Uid]; r.Error != "" {
				h.t.Fatal(r.Error)
			}
		}, []string{"default/c", "k8s.sim.example.com-claim_uid-c.json"}},
		{"a device metadata spec", func(h *harness) {
			h.options = func(o *Options) { o.DeviceMetadata = true }
			h.stop()
			h.start()
			cl := h.claim("m", "sim-2")
			if r := h.prepare(cl)[cl.Uid]; r.Error != "" {
				h.t.Fatal(r.Error)
			}
			specs, _ := filepath.Glob(filepath.Join(h.cdiDir, "k8s.sim.example.com-claim_*.json"))
			for _, p := range specs {
				_ = os.Remove(p)
			}
		}, []string{"sim.example.com_metadata_uid-m_req.json"}},
		{"a claim PodResources lists", func(h *harness) {
			h.podres.Set(&podresourcesapi.PodResources{Name: "p", Namespace: claimNS, Containers: []*podresourcesapi.ContainerResources{{
				Name: "ctr", DynamicResources: []*podresourcesapi.DynamicResource{{ClaimName: "held", ClaimNamespace: claimNS,
					ClaimResources: []*podresourcesapi.ClaimResource{{DriverName: testDriver, PoolName: simPool, DeviceName: "sim-3"}}}}}}})
		}, []string{"default/held"}},
		{"nothing: a first start", func(*harness) {}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.start()
			c.before(h)
			h.stop()
			ckpt := filepath.Join(h.state, "dra", "checkpoint.json")
			if err := os.Remove(ckpt); err != nil {
				t.Fatal(err)
			}
			before, _ := filepath.Glob(filepath.Join(h.cdiDir, "*.json"))
			d := h.build()
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			if c.refused == nil {
				h.driver, h.cancel, h.done = d, cancel, make(chan error, 1)
				go func() { h.done <- d.Run(ctx) }()
				h.waitFor("the checkpoint created", func() bool { _, err := os.Stat(ckpt); return err == nil })
				return
			}
			err := d.Run(ctx)
			if !errors.Is(err, ErrCheckpointLost) {
				t.Fatalf("Run: %v, want %v", err, ErrCheckpointLost)
			}
			for _, s := range append([]string{ckpt}, c.refused...) {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("the error does not name %s: %v", s, err)
				}
			}
			after, _ := filepath.Glob(filepath.Join(h.cdiDir, "*.json"))
			if strings.Join(after, " ") != strings.Join(before, " ") {
				t.Errorf("specs before the refused start %v, after %v", before, after)
			}
			if _, err := os.Stat(ckpt); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a refused start wrote the checkpoint: %v", err)
			}
		})
	}
}
