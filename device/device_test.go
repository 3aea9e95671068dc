package device

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// needMknod skips when the test cannot create device nodes (not root).
func needMknod(t *testing.T) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "probe")
	if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Skipf("cannot mknod here (%v): run as root", err)
	}
}

func rdev(t *testing.T, p string) (uint32, uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode & unix.S_IFMT, unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev))
}

func TestEnsureNode(t *testing.T) {
	needMknod(t)
	root := t.TempDir()
	p := filepath.Join(root, "sub", "dev-0")

	wrote, err := EnsureNode(root, "sub/dev-0", Char, 1, 3)
	if err != nil || !wrote {
		t.Fatalf("create: %v %v", wrote, err)
	}
	if typ, ma, mi := rdev(t, p); typ != unix.S_IFCHR || ma != 1 || mi != 3 {
		t.Fatalf("node %o %d:%d", typ, ma, mi)
	}
	fi, _ := os.Stat(p)
	if fi.Mode().Perm() != 0o666 {
		t.Fatalf("mode %v", fi.Mode())
	}
	// Idempotent: a correct node is kept (same inode).
	var before, after unix.Stat_t
	_ = unix.Lstat(p, &before)
	if wrote, err := EnsureNode(root, "sub/dev-0", Char, 1, 3); err != nil || wrote {
		t.Fatalf("second call rewrote: %v %v", wrote, err)
	}
	_ = unix.Lstat(p, &after)
	if before.Ino != after.Ino {
		t.Fatal("correct node was replaced")
	}

	wrong := []struct {
		name string
		make func() error
	}{
		{"wrong numbers", func() error { return unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 5))) }},
		{"block instead of char", func() error { return unix.Mknod(p, unix.S_IFBLK|0o666, int(unix.Mkdev(1, 3))) }},
		{"regular file", func() error { return os.WriteFile(p, []byte("x"), 0o644) }},
		{"symlink to a good node", func() error {
			good := filepath.Join(root, "good")
			_ = unix.Mknod(good, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
			return os.Symlink(good, p)
		}},
	}
	for _, w := range wrong {
		t.Run(w.name, func(t *testing.T) {
			_ = os.Remove(p)
			if err := w.make(); err != nil {
				t.Fatal(err)
			}
			wrote, err := EnsureNode(root, "sub/dev-0", Char, 1, 3)
			if err != nil || !wrote {
				t.Fatalf("replace: %v %v", wrote, err)
			}
			if typ, ma, mi := rdev(t, p); typ != unix.S_IFCHR || ma != 1 || mi != 3 {
				t.Fatalf("node %o %d:%d", typ, ma, mi)
			}
		})
	}
	left, _ := filepath.Glob(filepath.Join(root, "sub", ".*tmp*"))
	if len(left) != 0 {
		t.Fatalf("temp files left: %v", left)
	}
}

func TestEnsureNodeRefusesSymlinkedParent(t *testing.T) {
	needMknod(t)
	root, outside := t.TempDir(), t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "escape")); err != nil {
		t.Fatal(err)
	}
	_, err := EnsureNode(root, "escape/dev-0", Char, 1, 3)
	if !errors.Is(err, ErrEscape) {
		t.Fatalf("got %v, want ErrEscape", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("wrote outside the root: %v", entries)
	}
}

func newSim(t *testing.T, root string, n int, numa int) *Source {
	t.Helper()
	s, err := NewSource(Options{DevRoot: root, IDPrefix: "sim", NodeName: "node1", Count: n, FilePrefix: "sim", Type: Char, Major: 1, Minor: 3, NUMANodes: numa, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPrepareSnapshot(t *testing.T) {
	needMknod(t)
	root := t.TempDir()
	s := newSim(t, root, 4, 2)
	snap, err := s.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Devices) != 4 || snap.Healthy() != 4 {
		t.Fatalf("%+v", snap)
	}
	wantNUMA := []int{0, 0, 1, 1}
	for i, d := range snap.Devices {
		if d.Name != "sim-node1-"+string(rune('0'+i)) || d.ContainerPath != "/dev/sim-"+string(rune('0'+i)) ||
			d.HostPath != filepath.Join(root, "sim-"+string(rune('0'+i))) || d.NUMANode != wantNUMA[i] {
			t.Errorf("device %d: %+v", i, d)
		}
	}
}

// TestHealthFollowsNodes removes, replaces and restores a node and expects
// a snapshot for each change, promptly.
func TestHealthFollowsNodes(t *testing.T) {
	needMknod(t)
	root := t.TempDir()
	s := newSim(t, root, 3, 0)
	if _, err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan *Snapshot, 1)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, out) }()
	p := filepath.Join(root, "sim-1")
	wait := func(healthy bool, why string) {
		t.Helper()
		deadline := time.After(2 * time.Second)
		for {
			select {
			case snap := <-out:
				if snap.Devices[1].Healthy == healthy {
					return
				}
			case <-deadline:
				t.Fatalf("%s: device 1 never became healthy=%v", why, healthy)
			}
		}
	}
	time.Sleep(20 * time.Millisecond) // let the watch start
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	wait(false, "removed")
	if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 5))); err != nil {
		t.Fatal(err)
	}
	wait(false, "wrong node") // still unhealthy; make sure the reason says why
	if r := s.Snapshot().Devices[1].Reason; r == "" || r == "missing" {
		t.Fatalf("reason %q", r)
	}
	_ = os.Remove(p)
	if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	wait(true, "restored")
	if h := s.Snapshot().Healthy(); h != 3 {
		t.Fatalf("healthy %d", h)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestHostDevices(t *testing.T) {
	needMknod(t)
	root := t.TempDir()
	for _, n := range []string{"ttyX0", "ttyX1"} {
		if err := unix.Mknod(filepath.Join(root, n), unix.S_IFCHR|0o666, int(unix.Mkdev(4, 64))); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "ttyXfile"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "node")
	_ = unix.Mknod(outside, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	_ = os.Symlink(outside, filepath.Join(root, "ttyXlink"))

	s, err := NewSource(Options{DevRoot: root, IDPrefix: "serial", HostGlobs: []string{"ttyX*"}})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := s.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Devices) != 2 || snap.Devices[0].Name != "serial-ttyX0" || snap.Devices[1].ContainerPath != "/dev/ttyX1" ||
		snap.Devices[0].Major != 4 || snap.Devices[0].Minor != 64 {
		t.Fatalf("only the two real nodes inside the root: %+v", snap.Devices)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan *Snapshot, 1)
	go func() { _ = s.Run(ctx, out) }()
	time.Sleep(20 * time.Millisecond)
	_ = os.Remove(filepath.Join(root, "ttyX0"))
	if err := unix.Mknod(filepath.Join(root, "ttyX2"), unix.S_IFCHR|0o666, int(unix.Mkdev(4, 66))); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(2 * time.Second)
	for {
		select {
		case snap := <-out:
			if len(snap.Devices) == 3 && !snap.Devices[0].Healthy && snap.Devices[2].Healthy && snap.Devices[2].Minor == 66 {
				return // the vanished device stays known but unhealthy, the new one appears
			}
		case <-deadline:
			t.Fatalf("last snapshot %+v", s.Snapshot().Devices)
		}
	}
}

func TestSameDevices(t *testing.T) {
	a := &Snapshot{Devices: []Device{{Name: "a", Healthy: true}}}
	b := &Snapshot{Devices: []Device{{Name: "a", Healthy: false, Reason: "missing"}}}
	c := &Snapshot{Devices: []Device{{Name: "a", Minor: 4, Healthy: true}}}
	if !SameDevices(a, b) || Equal(a, b) || SameDevices(a, c) || SameDevices(a, nil) {
		t.Fatal("SameDevices/Equal disagree with their contract")
	}
}

func TestSendLatest(t *testing.T) {
	ch := make(chan int, 1)
	for i := 1; i <= 5; i++ {
		SendLatest(ch, i)
	}
	if v := <-ch; v != 5 {
		t.Fatalf("got %d, want the latest", v)
	}
}
