package prestart

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// overlapStep counts how many runs of it are under way at once, across
// runners.
type overlapStep struct {
	now, most *atomic.Int32
}

func (s overlapStep) Name() string           { return "overlap" }
func (s overlapStep) Timeout() time.Duration { return 5 * time.Second }
func (s overlapStep) Run(context.Context, *Target) error {
	n := s.now.Add(1)
	defer s.now.Add(-1)
	for {
		m := s.most.Load()
		if n <= m || s.most.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(50 * time.Millisecond)
	return nil
}

// TestStepsLockedAcrossProcesses: two runners of one resource (two
// processes: the old and the new instance of the DRA driver during a
// rolling update) share the device state, and never run steps on one
// device at once: each holds a lock on the device in LockDir (an open
// file description lock, which two processes, or two runners of one
// process, take in turn) while it runs them. Without LockDir, each
// runner's own lock alone keeps nothing of the other's out.
func TestStepsLockedAcrossProcesses(t *testing.T) {
	for _, c := range []struct {
		name   string
		locked bool
	}{{"with a lock dir", true}, {"without", false}} {
		t.Run(c.name, func(t *testing.T) {
			stateRoot := t.TempDir()
			lockDir := ""
			if c.locked {
				lockDir = filepath.Join(t.TempDir(), "locks")
			}
			var now, most atomic.Int32
			step := overlapStep{now: &now, most: &most}
			l, _ := test.NewNullLogger()
			var runners []*Runner
			for range 2 {
				r := NewRunner(Options{Resource: "example.com/sim", StateRoot: stateRoot, LockDir: lockDir, Steps: []Step{step},
					Budget: 5 * time.Second, Recovery: config.RecoverReset, Log: logrus.NewEntry(l)})
				if err := r.Ensure(&device.Snapshot{Devices: devs(1)}); err != nil {
					t.Fatal(err)
				}
				runners = append(runners, r)
			}
			var wg sync.WaitGroup
			errs := make([]error, 8)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = runners[i%2].Prepare(context.Background(), devs(1))
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("prepare %d: %v", i, err)
				}
			}
			if got := most.Load(); (got == 1) != c.locked {
				t.Fatalf("at most %d runs of the step on one device at once; locked %v", got, c.locked)
			}
			if s := state(t, runners[0], "sim-0"); c.locked && s.Generation != int64(len(errs)) {
				t.Errorf("generation %d after %d preparations", s.Generation, len(errs))
			}
		})
	}
}
