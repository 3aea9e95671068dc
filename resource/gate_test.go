package resource

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/latest"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

func dev(name string, index int, healthy bool) device.Device {
	d := device.Device{Name: name, Index: index, HostPath: "/dev/null", ContainerPath: "/dev/" + name, Type: device.Char, Major: 1, Minor: 3, NUMANode: device.NoNUMA}
	if !healthy {
		d.SetProblem(device.Problem{Cause: device.CauseMissing})
	} else {
		d.Healthy = true
	}
	return d
}

func snap(devs ...device.Device) *device.Snapshot { return &device.Snapshot{Devices: devs} }

// TestGate: a healthy device the written spec does not describe as it is
// is reported unhealthy, for the reason given (or "not in the spec yet");
// a described one, or one already unhealthy, keeps its health.
func TestGate(t *testing.T) {
	moved := dev("a", 0, true)
	moved.HostPath = "/dev/zero"
	failed := device.Problem{Cause: device.CauseNotInSpec, Message: "writing the CDI spec failed: disk full"}
	for _, c := range []struct {
		name          string
		snap, written *device.Snapshot
		why           device.Problem
		want          map[string]device.Cause
	}{
		{"nothing written", snap(dev("a", 0, true), dev("b", 1, true)), nil, device.Problem{},
			map[string]device.Cause{"a": device.CauseNotInSpec, "b": device.CauseNotInSpec}},
		{"all written", snap(dev("a", 0, true), dev("b", 1, true)), snap(dev("a", 0, true), dev("b", 1, false)), device.Problem{},
			map[string]device.Cause{"a": device.CauseNone, "b": device.CauseNone}},
		{"one new, write failed", snap(dev("a", 0, true), dev("b", 1, true)), snap(dev("a", 0, true)), failed,
			map[string]device.Cause{"a": device.CauseNone, "b": device.CauseNotInSpec}},
		{"changed node", snap(moved), snap(dev("a", 0, true)), device.Problem{},
			map[string]device.Cause{"a": device.CauseNotInSpec}},
		{"unhealthy keeps its cause", snap(dev("a", 0, false)), nil, device.Problem{},
			map[string]device.Cause{"a": device.CauseMissing}},
		{"yielded", snap(dev("a", 0, true)), nil, device.Problem{Cause: device.CauseYielded, Message: "taken over"},
			map[string]device.Cause{"a": device.CauseYielded}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Gate(c.snap, c.written, c.why)
			for _, d := range got.Devices {
				if d.Problem.Cause != c.want[d.Name] || d.Healthy != (c.want[d.Name] == device.CauseNone) {
					t.Errorf("%s: healthy %v, cause %q; want cause %q", d.Name, d.Healthy, d.Problem.Cause, c.want[d.Name])
				}
			}
			if c.why.Message != "" && got.Devices[len(got.Devices)-1].Problem != c.why {
				t.Errorf("problem %q, want %q", got.Devices[len(got.Devices)-1].Problem, c.why)
			}
			for i := range c.snap.Devices { // the input is not changed
				if c.snap.Devices[i].Healthy != (c.snap.Devices[i].Problem.Cause == device.CauseNone) {
					t.Fatal("the input snapshot was changed")
				}
			}
		})
	}
}

// source publishes the snapshots the test sends.
type source struct {
	first *device.Snapshot
	in    chan *device.Snapshot
}

func (s *source) Snapshot() *device.Snapshot { return s.first }
func (s *source) Run(ctx context.Context, out chan *device.Snapshot) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case snap := <-s.in:
			latest.Send(out, snap)
		}
	}
}

// failing is a spec that fails its writes while fail is set.
type failing struct {
	*cdi.Spec
	mu   sync.Mutex
	fail bool
}

func (s *failing) set(v bool) { s.mu.Lock(); s.fail = v; s.mu.Unlock() }
func (s *failing) Write(snap *device.Snapshot) error {
	s.mu.Lock()
	fail := s.fail
	s.mu.Unlock()
	if fail {
		return errors.New("disk full")
	}
	return s.Spec.Write(snap)
}

// checker is a publisher that checks, at every update, that each healthy
// device resolves in the spec directory with a fresh CDI cache, as a
// runtime would resolve it: the spec is on disk before a device is
// published.
type checker struct {
	t    *testing.T
	dir  string
	kind cdi.Kind
	got  chan *device.Snapshot
}

func (c *checker) Update(s *device.Snapshot) error {
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(c.dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return err
	}
	for _, d := range s.Devices {
		name, _ := c.kind.QualifiedName(d.Name)
		if d.Healthy && cache.GetDevice(name) == nil {
			c.t.Errorf("%s published healthy before the spec on disk described it", name)
		}
	}
	c.got <- s
	return nil
}

// TestFollowerPublishesWhatTheSpecDescribes: the follower writes the spec
// before it publishes; a device added while writes fail is published
// unhealthy (not in the spec), and healthy once a retry wrote it.
func TestFollowerPublishesWhatTheSpecDescribes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cdi")
	kind, err := cdi.KindFor("example.com", "sim")
	if err != nil {
		t.Fatal(err)
	}
	spec := &failing{Spec: cdi.NewWriter(dir, "test", 1).Spec(cdi.Resource{Name: "example.com/sim", Kind: kind})}
	src := &source{first: snap(dev("sim-0", 0, true)), in: make(chan *device.Snapshot)}
	pub := &checker{t: t, dir: dir, kind: kind, got: make(chan *device.Snapshot, 16)}
	f := &Follower{Resource: "example.com/sim", Source: src, Spec: spec, Publish: pub, RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond}
	if err := f.Start(); err != nil {
		t.Fatal(err)
	}
	if s := <-pub.got; s.Healthy() != 1 {
		t.Fatalf("first publication: %d healthy, want 1", s.Healthy())
	}
	testutil.Go(t, f.Run)
	wait := func(what string, cond func(*device.Snapshot) bool) {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case s := <-pub.got:
				if cond(s) {
					return
				}
			case <-timeout:
				t.Fatalf("%s: not published within 5s", what)
			}
		}
	}
	spec.set(true)
	src.in <- snap(dev("sim-0", 0, true), dev("sim-1", 1, true))
	wait("sim-1 held back", func(s *device.Snapshot) bool {
		return len(s.Devices) == 2 && s.Devices[0].Healthy && s.Devices[1].Problem.Cause == device.CauseNotInSpec
	})
	if err := f.Alive(context.Background()); err != nil {
		t.Fatal(err)
	}
	spec.set(false)
	wait("sim-1 written by a retry", func(s *device.Snapshot) bool { return s.Healthy() == 2 })
	if _, err := os.Stat(spec.Path()); err != nil {
		t.Fatal(err)
	}
}
