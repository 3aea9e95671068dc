package dra

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

// BenchmarkPrepareUnprepare is a new claim's NodePrepareResources and its
// NodeUnprepareResources through the kubelet stand-in's gRPC calls, as
// dp-bench times them, without the API server's round trip (the fake
// clientset answers the helper's GET): the driver with the PodResources
// stand-in, logging at info to nowhere, no steps, its state and checkpoint
// on the test's temporary directory (the disk here) and the CDI dir on a
// tmpfs (/dev/shm) as dp-bench puts them. For a profile:
//
//	go test -run '^$' -bench PrepareUnprepare -cpuprofile cpu.out ./dra/
func BenchmarkPrepareUnprepare(b *testing.B) {
	for _, n := range []int{1, 8} {
		b.Run(fmt.Sprintf("%ddevices", n), func(b *testing.B) {
			h := newHarness(b, map[string]string{"NUMBER_DEVICES": "8", "PRESTART_STEPS": "none"})
			if shm, err := os.MkdirTemp("/dev/shm", "dra-bench-"); err == nil {
				b.Cleanup(func() { _ = os.RemoveAll(shm) })
				h.cdiDir = shm
			}
			h.options = func(o *Options) {
				l := logrus.New()
				l.SetOutput(io.Discard)
				if os.Getenv("BENCH_LOG") != "" {
					l.SetOutput(os.Stderr)
				}
				o.Log = logrus.NewEntry(l)
			}
			h.start()
			devs := make([]string, n)
			for i := range devs {
				devs[i] = fmt.Sprintf("sim-%d", i)
			}
			claims := make([]*drav1.Claim, b.N)
			for i := range claims {
				claims[i] = h.claim(fmt.Sprintf("c%d", i), devs...)
			}
			ctx := context.Background()
			var prep, unprep time.Duration
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				resp, err := h.kl.Prepare(ctx, claims[i])
				t1 := time.Now()
				prep += t1.Sub(t0)
				if err != nil || resp.Claims[claims[i].Uid].Error != "" {
					b.Fatalf("prepare: %v %v", err, resp)
				}
				uresp, err := h.kl.Unprepare(ctx, claims[i])
				if err != nil || uresp.Claims[claims[i].Uid].Error != "" {
					b.Fatalf("unprepare: %v %v", err, uresp)
				}
				unprep += time.Since(t1)
			}
			b.ReportMetric(float64(prep.Microseconds())/float64(b.N), "prepare-µs/op")
			b.ReportMetric(float64(unprep.Microseconds())/float64(b.N), "unprepare-µs/op")
		})
	}
}
