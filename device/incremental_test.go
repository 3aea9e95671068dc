package device

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestNodeEventsRescanOnlyTheirDevices: an event that names a simulated
// node re-checks that node alone, and the snapshot published is the one a
// full rescan of the disk gives.
func TestNodeEventsRescanOnlyTheirDevices(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	s := newSim(t, root, 200, 2)
	if _, err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	out := runSource(t, s)
	time.Sleep(20 * time.Millisecond) // let the watch start
	scans := s.fullScans.Load()
	node := func(i string) string { return filepath.Join(root, "sim-"+i) }
	steps := []struct {
		name string
		do   func() error
		cond func(*Snapshot) bool
	}{
		{"node 3 removed", func() error { return os.Remove(node("3")) },
			func(s *Snapshot) bool { return !s.Devices[3].Healthy && s.Devices[3].Problem.Cause == CauseMissing }},
		{"node 3 back with other numbers", func() error { return fn.mknod(node("3"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 5))) },
			func(s *Snapshot) bool { return !s.Devices[3].Healthy && s.Devices[3].Problem.Cause == CauseWrongNode }},
		{"node 3 right again", func() error {
			if err := os.Remove(node("3")); err != nil {
				return err
			}
			return fn.mknod(node("3"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
		}, func(s *Snapshot) bool { return s.Healthy() == 200 }},
		{"node 199 renamed away", func() error { return os.Rename(node("199"), node("x")) },
			func(s *Snapshot) bool { return !s.Devices[199].Healthy }},
		{"an unrelated entry, then node 199 renamed back", func() error {
			if err := os.WriteFile(filepath.Join(root, "sim-0x"), nil, 0o644); err != nil {
				return err
			}
			return os.Rename(node("x"), node("199"))
		}, func(s *Snapshot) bool { return s.Healthy() == 200 }},
		{"two nodes at once", func() error {
			if err := os.Remove(node("10")); err != nil {
				return err
			}
			return os.Remove(node("150"))
		}, func(s *Snapshot) bool { return !s.Devices[10].Healthy && !s.Devices[150].Healthy && s.Healthy() == 198 }},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		waitSnap(t, s, out, 2*time.Second, st.name, st.cond)
		if cur, full := s.Snapshot(), s.scan(); !Equal(cur, full) {
			t.Fatalf("%s: published %+v\nfull rescan %+v", st.name, cur.Devices, full.Devices)
		}
	}
	if n := s.fullScans.Load() - scans; n != 0 {
		t.Errorf("%d full rescans for events that name nodes, want 0", n)
	}

	// A fault (set while the node is missing) applies to the node when it
	// comes back.
	s.SetFault(s.Snapshot().Devices[10].Name, Problem{Cause: CausePrepareFailed, Message: "step reset failed"})
	if err := fn.mknod(node("10"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	waitSnap(t, s, out, 2*time.Second, "node 10 back, faulted", func(s *Snapshot) bool {
		return s.Devices[10].Problem == Problem{Cause: CausePrepareFailed, Message: "step reset failed"} && !s.Devices[10].Healthy
	})
	if cur, full := s.Snapshot(), s.scan(); !Equal(cur, full) {
		t.Fatalf("faulted: published %+v\nfull rescan %+v", cur.Devices, full.Devices)
	}
}

// TestNodeDirectoryRemoved: nodes in a directory of their own; removing
// the directory reports every device, and putting it back heals them (the
// directory events are not node events: a full rescan answers them).
func TestNodeDirectoryRemoved(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	s, err := NewSource(Options{DevRoot: root, IDPrefix: "sim", NodeName: "node1", Count: 5, FilePrefix: "sub/sim", Type: Char, Major: 1, Minor: 3, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	out := runSource(t, s)
	time.Sleep(20 * time.Millisecond)
	if err := os.RemoveAll(filepath.Join(root, "sub")); err != nil {
		t.Fatal(err)
	}
	waitSnap(t, s, out, 2*time.Second, "directory removed", func(s *Snapshot) bool { return s.Healthy() == 0 })
	for i := 0; i < 5; i++ {
		fn.make(t, filepath.Join(root, "sub", "sim-"+string(rune('0'+i))), 1, 3)
	}
	waitSnap(t, s, out, 2*time.Second, "directory back", func(s *Snapshot) bool { return s.Healthy() == 5 })
	if cur, full := s.Snapshot(), s.scan(); !Equal(cur, full) {
		t.Fatalf("published %+v\nfull rescan %+v", cur.Devices, full.Devices)
	}
}
