package main

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// settled waits until count() is at most want, and returns the last count.
func settled(count func() int, want int, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	n := count()
	for n > want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n = count()
	}
	return n
}

// TestKubeletRestarts: 100 kubelet restarts (directory wiped, kubelet.sock
// served again), every fifth one twice back to back: each restart that
// stays is followed by exactly one registration with the new kubelet, the
// plugin serves the endpoint it registered, and goroutines and file
// descriptors come back to where they were.
func TestKubeletRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("100 restarts")
	}
	d := newDirs(t)
	testutil.NeedMknod(t)
	r := startRun(t, d, nil, map[string]string{"NUMBER_DEVICES": "8", "RESOURCE_NAME": "example.com/sim"})
	// The first ListAndWatch stream ends with the first restart; the
	// baseline is taken with no client connection open, as it is after.
	_ = r.c.Close()
	time.Sleep(100 * time.Millisecond)
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)

	const restarts = 100
	var quick, regs int
	var worst time.Duration
	for i := 1; i <= restarts; i++ {
		served, err := r.kubelet.Restart()
		if err != nil {
			t.Fatal(err)
		}
		if i%5 == 0 {
			// Back to back: the plugin may still be re-registering with
			// the kubelet that just went away.
			time.Sleep(time.Duration(i%3) * time.Millisecond)
			if served, err = r.kubelet.Restart(); err != nil {
				t.Fatal(err)
			}
			quick++
		}
		reg, err := r.kubelet.WaitRegistration(5 * time.Second)
		if err != nil {
			t.Fatalf("restart %d: %v; log:\n%s", i, err, r.stderr.String())
		}
		regs++
		if reg.At.Before(served) {
			// A registration with the kubelet that went away; the one
			// with this kubelet is still to come.
			if reg, err = r.kubelet.WaitRegistration(5 * time.Second); err != nil {
				t.Fatalf("restart %d: no registration with the new kubelet: %v", i, err)
			}
			regs++
		}
		worst = max(worst, reg.At.Sub(served))
		// Exactly one with this kubelet: nothing more arrives. A
		// registration with a kubelet that went away (the first of two
		// back to back) can reach the channel after this one: its handler
		// outlives that kubelet's Stop. It is dated before served.
		quiet := time.After(30 * time.Millisecond)
	drain:
		for {
			select {
			case extra := <-r.kubelet.Regs:
				if extra.At.Before(served) {
					regs++
					continue
				}
				t.Fatalf("restart %d: a second registration %v after %v", i, extra.Request.Endpoint, extra.At.Sub(reg.At))
			case <-quiet:
				break drain
			}
		}
		c, err := kubeletsim.Dial(d.plugins, reg.Request.Endpoint)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		updates, err := c.Watch(ctx)
		if err == nil {
			_, err = kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 8 })
		}
		cancel()
		_ = c.Close()
		if err != nil {
			t.Fatalf("restart %d: endpoint %s: %v", i, reg.Request.Endpoint, err)
		}
		if reg.Request.Version != pluginapi.Version {
			t.Fatalf("version %q", reg.Request.Version)
		}
	}
	// Streams and connections end asynchronously; give them a moment.
	slack := 2
	g := settled(runtime.NumGoroutine, goroutines+slack, 5*time.Second)
	f := settled(func() int { return openFDs(t) }, fds+slack, 5*time.Second)
	t.Logf("%d restarts (%d back to back), %d registrations, slowest %v; goroutines %d -> %d, fds %d -> %d",
		restarts+quick, quick, regs, worst, goroutines, g, fds, f)
	if g > goroutines+slack || f > fds+slack {
		t.Fatalf("leak after %d restarts: goroutines %d -> %d, fds %d -> %d", restarts, goroutines, g, fds, f)
	}
}
