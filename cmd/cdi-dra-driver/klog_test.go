package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"k8s.io/klog/v2"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestKlogLoggerSetOnce: klog's process-wide logger (client-go's own
// lines go through it) is set once per process, not by every run: a later
// run writing it raced with the goroutines of libraries that read it
// (the resourceslice controller's informer of an earlier run, seen as a
// DATA RACE under go test -race). Here a goroutine that reads klog's
// logger runs while a second driver starts; with -race, a write by that
// start fails the test.
func TestKlogLoggerSetOnce(t *testing.T) {
	testutil.NeedMknod(t)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("resources:\n- name: example.com/sim\n  idPrefix: sim\n  count: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Each run in a subtest of its own: the first is stopped (its
	// goroutines joined) before the reader starts.
	for i := range 2 {
		t.Run(fmt.Sprint("run ", i), func(t *testing.T) { klogRun(t, cfg, i == 1) })
	}
}

func klogRun(t *testing.T, cfg string, read bool) {
	{
		d := newDirs(t)
		testutil.ServePodResources(t, d.podres)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		if read {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
						_ = klog.V(4).Enabled()
					}
				}
			}()
		}
		startDriver(t, d, "sim.example.com", "--config", cfg)
		close(stop)
		wg.Wait()
	}
}
