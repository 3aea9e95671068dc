package device

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestHolds: a device held elsewhere (a DRA claim) is
// unhealthy for its hold while its node is fine, in the snapshot Refresh
// makes and in those Run publishes; the hold is independent of the faults
// (a preparation's success clears its fault, not the hold) and yields to
// the node's own problem; released, the device is healthy again.
func TestHolds(t *testing.T) {
	useFakeNodes(t)
	root := t.TempDir()
	s := newSim(t, root, 3, 0)
	if _, err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	held := Problemf(CauseHeldByDRA, "held by DRA claim ns/c")
	s.SetHolds(map[string]Problem{"sim-node1-1": held, "sim-node1-2": held})
	snap := s.Refresh()
	if snap.Devices[0].Problem != (Problem{}) || snap.Devices[1].Problem != held || snap.Devices[2].Problem != held {
		t.Fatalf("before Run: %+v", snap.Devices)
	}
	out := runSource(t, s)
	prestart := Problemf(CausePrepareFailed, "step reset: exit status 1")
	for _, c := range []struct {
		name string
		do   func()
		want [3]Problem
	}{
		{"a fault comes before the hold", func() { s.SetFault("sim-node1-1", prestart) }, [3]Problem{{}, prestart, held}},
		{"the fault cleared, the hold stays", func() { s.SetFault("sim-node1-1", Problem{}) }, [3]Problem{{}, held, held}},
		{"the node's problem comes first", func() {
			if err := os.Remove(filepath.Join(root, "sim-2")); err != nil {
				t.Fatal(err)
			}
		}, [3]Problem{{}, held, {Cause: CauseMissing}}},
		{"released", func() { s.SetHolds(map[string]Problem{"sim-node1-2": held}) }, [3]Problem{{}, {}, {Cause: CauseMissing}}},
		{"the holds cleared, a fault stays", func() {
			s.SetFault("sim-node1-0", prestart)
			s.SetHolds(nil)
		}, [3]Problem{prestart, {}, {Cause: CauseMissing}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.do()
			waitSnap(t, s, out, 2*time.Second, c.name, func(snap *Snapshot) bool {
				for i, want := range c.want {
					if got := snap.Devices[i].Problem; got.Cause != want.Cause || (want.Message != "" && got != want) || got.None() != snap.Devices[i].Healthy {
						return false
					}
				}
				return true
			})
			// What the source would publish now, with both calls made.
			for i, want := range c.want {
				if got := s.scan().Devices[i].Problem; got.Cause != want.Cause {
					t.Fatalf("device %d: %+v, want %+v", i, got, want)
				}
			}
		})
	}
}
