package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// concurrencyConfig: 8 devices × 2 replicas with reset and reprogram steps.
const concurrencyConfig = `
resources:
- name: example.com/sim
  idPrefix: sim
  envPrefix: SIM
  count: 8
  replicas: 2
  prestart:
    steps: [{type: reset}, {type: reprogram}]
`

// TestConcurrentCalls: 16 clients × 1,000 mixed Allocate,
// GetPreferredAllocation and PreStartContainer calls while two devices'
// nodes come and go and the configuration is reloaded (another resource
// added and removed). The only errors are the ones the kubelet expects
// (a device that just became unhealthy); preferred allocations are sets of
// available IDs of the requested size, must-includes kept, each ID once.
// Run under -race by make test.
func TestConcurrentCalls(t *testing.T) {
	if testing.Short() {
		t.Skip("16,000 calls")
	}
	d := newDirs(t)
	testutil.NeedMknod(t)
	cm := newConfigMapDir(t, concurrencyConfig)
	r := startRun(t, d, []string{"--config", cm.path(), "--node-name", "n"}, nil)
	var ids []string
	for i := range 8 {
		for rep := range 2 {
			ids = append(ids, fmt.Sprintf("sim-n-%d::%d", i, rep))
		}
	}
	churned := func(id string) bool { return strings.HasPrefix(id, "sim-n-6:") || strings.HasPrefix(id, "sim-n-7:") }

	ctx, cancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	var flips, reloads atomic.Int64
	bg.Add(2)
	go func() { // devices come and go
		defer bg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			p := filepath.Join(d.dev, fmt.Sprintf("sim-%d", 6+i%2))
			if i%4 < 2 {
				_ = os.Remove(p)
			} else {
				mknod(t, d, filepath.Base(p), 1, 3)
			}
			flips.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	go func() { // reloads: another resource added, then removed
		defer bg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			body := concurrencyConfig
			if i%2 == 0 {
				body += "- name: example.com/extra\n  idPrefix: extra\n  count: 2\n"
			}
			cm.update(body)
			reloads.Add(1)
			time.Sleep(50 * time.Millisecond)
		}
	}()

	const clients, calls = 16, 1000
	var wg sync.WaitGroup
	var expected atomic.Int64 // refusals of a device that just became unhealthy
	errs := make(chan error, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := kubeletsim.Dial(d.plugins, r.reg.Request.Endpoint)
			if err != nil {
				errs <- err
				return
			}
			defer func() { _ = cl.Close() }()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for n := range calls {
				pick := func(k int) []string {
					p := rng.Perm(len(ids))[:k]
					out := make([]string, k)
					for i, j := range p {
						out[i] = ids[j]
					}
					return out
				}
				var err error
				var asked []string
				switch n % 3 {
				case 0:
					asked = pick(1 + rng.IntN(4))
					_, err = cl.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: asked}}})
				case 1:
					avail := pick(2 + rng.IntN(len(ids)-2))
					must := avail[:rng.IntN(2)]
					size := len(must) + 1 + rng.IntN(len(avail)-len(must))
					var resp *pluginapi.PreferredAllocationResponse
					resp, err = cl.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
						AvailableDeviceIDs: avail, MustIncludeDeviceIDs: must, AllocationSize: int32(size),
					}}})
					if err == nil {
						steady := len(slices.DeleteFunc(slices.Clone(avail), churned))
						if perr := checkPreferred(resp.ContainerResponses[0].DeviceIDs, avail, must, size, min(size, steady)); perr != nil {
							errs <- fmt.Errorf("client %d call %d: %w", c, n, perr)
							return
						}
					}
				case 2:
					asked = pick(1 + rng.IntN(3))
					_, err = cl.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: asked})
				}
				if err == nil {
					continue
				}
				// A device whose node just went is refused (Allocate) or
				// fails its steps (PreStartContainer): the kubelet
				// expects both for a device it saw unhealthy.
				if status.Code(err) != codes.Unavailable && slices.ContainsFunc(asked, churned) && strings.Contains(err.Error(), "sim-n-") {
					expected.Add(1)
					continue
				}
				errs <- fmt.Errorf("client %d call %d (%v): %w", c, n, asked, err)
				return
			}
		}()
	}
	wg.Wait()
	cancel()
	bg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("%v", err)
	}
	t.Logf("%d calls by %d clients; %d node changes, %d reloads; %d refusals of a device that had just gone",
		clients*calls, clients, flips.Load(), reloads.Load(), expected.Load())
	if flips.Load() < 10 || reloads.Load() < 2 {
		t.Errorf("too little churn to test anything: %d node changes, %d reloads", flips.Load(), reloads.Load())
	}
	if t.Failed() {
		t.Logf("log:\n%s", r.stderr.String())
	}
}

// checkPreferred: the answer holds every must-include, only available
// IDs, each once, at most size of them and at least least (the IDs of
// devices that are healthy throughout, up to size).
func checkPreferred(got, avail, must []string, size, least int) error {
	seen := map[string]bool{}
	for _, id := range got {
		if seen[id] {
			return fmt.Errorf("preferred %v: %s twice", got, id)
		}
		seen[id] = true
		if !slices.Contains(avail, id) {
			return fmt.Errorf("preferred %v: %s not available (%v)", got, id, avail)
		}
	}
	for _, id := range must {
		if !seen[id] {
			return fmt.Errorf("preferred %v: must-include %s dropped", got, id)
		}
	}
	if len(got) > size || len(got) < least {
		return fmt.Errorf("preferred %v: %d IDs for size %d, %d of them healthy throughout", got, len(got), size, least)
	}
	return nil
}
