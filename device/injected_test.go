package device

import (
	"testing"
	"time"
)

// TestInjected: an injected fault makes a device whose node is fine
// unhealthy, before a preparation's fault and a hold; clearing it leaves
// the others as they were (a preparation's success, which clears its own
// fault, never clears an injected one), in the snapshots Refresh makes and
// Run publishes.
func TestInjected(t *testing.T) {
	useFakeNodes(t)
	root := t.TempDir()
	s := newSim(t, root, 3, 0)
	if _, err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	lost := Problem{Cause: CauseMissing, Message: "injected fault: lost", Evict: true}
	s.SetInjected("sim-node1-0", lost)
	if d := s.Refresh().Devices[0]; d.Healthy || d.Problem != lost {
		t.Fatalf("before Run: %+v", d)
	}
	out := runSource(t, s)
	prestart := Problemf(CausePrepareFailed, "step reset: exit status 1")
	ecc := Problemf(CauseInjected, "ECC error")
	for _, c := range []struct {
		name string
		do   func()
		want [3]Problem
	}{
		{"a preparation's fault stays behind the injected one", func() {
			s.SetFault("sim-node1-0", prestart)
			s.SetInjected("sim-node1-1", ecc)
		}, [3]Problem{lost, ecc, {}}},
		{"the preparation heals; the injected fault stays", func() {
			s.SetFault("sim-node1-0", Problem{})
			s.SetInjected("sim-node1-2", ecc)
		}, [3]Problem{lost, ecc, ecc}},
		{"cleared: healthy again", func() { s.SetInjected("sim-node1-0", Problem{}) }, [3]Problem{{}, ecc, ecc}},
		{"cleared: a preparation's fault shows again", func() {
			s.SetFault("sim-node1-1", prestart)
			s.SetInjected("sim-node1-1", Problem{})
		}, [3]Problem{{}, prestart, ecc}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.do()
			waitSnap(t, s, out, 2*time.Second, c.name, func(snap *Snapshot) bool {
				for i, want := range c.want {
					if snap.Devices[i].Problem != want || snap.Devices[i].Healthy != want.None() {
						return false
					}
				}
				return true
			})
		})
	}
}
