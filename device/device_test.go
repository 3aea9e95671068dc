package device

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

func rdev(t *testing.T, p string) (uint32, uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := nodeOps.lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode & unix.S_IFMT, unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev))
}

func TestEnsureNode(t *testing.T) {
	testutil.NeedMknod(t)
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
	testutil.NeedMknod(t)
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

func newSim(t *testing.T, root string, n, numa int) *Source {
	t.Helper()
	s, err := NewSource(Options{DevRoot: root, IDPrefix: "sim", NodeName: "node1", Count: n, FilePrefix: "sim", Type: Char, Major: 1, Minor: 3, NUMANodes: numa, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPrepareSnapshot(t *testing.T) {
	useFakeNodes(t)
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
	fn := useFakeNodes(t)
	root := t.TempDir()
	s := newSim(t, root, 3, 0)
	if _, err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	out := runSource(t, s)
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
	if err := fn.mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 5))); err != nil {
		t.Fatal(err)
	}
	wait(false, "wrong node") // still unhealthy; make sure the reason says why
	if p := s.Snapshot().Devices[1].Problem; p.Cause != CauseWrongNode || p.String() != "wrong_node: is c 1:5, want c 1:3" {
		t.Fatalf("problem %+v (%q), want a wrong node saying what it is", p, p)
	}
	_ = os.Remove(p)
	if err := fn.mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	wait(true, "restored")
	if h := s.Snapshot().Healthy(); h != 3 {
		t.Fatalf("healthy %d", h)
	}
}

func TestHostDevices(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	// Two nodes (4:64, 4:65): one node is one device, whatever its names.
	for i, n := range []string{"ttyX0", "ttyX1"} {
		if err := fn.mknod(filepath.Join(root, n), unix.S_IFCHR|0o666, int(unix.Mkdev(4, 64+uint32(i)))); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "ttyXfile"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "node")
	_ = fn.mknod(outside, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
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

	out := runSource(t, s)
	time.Sleep(20 * time.Millisecond)
	_ = os.Remove(filepath.Join(root, "ttyX0"))
	if err := fn.mknod(filepath.Join(root, "ttyX2"), unix.S_IFCHR|0o666, int(unix.Mkdev(4, 66))); err != nil {
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
	b := &Snapshot{Devices: []Device{{Name: "a", Healthy: false, Problem: Problem{Cause: CauseMissing}}}}
	c := &Snapshot{Devices: []Device{{Name: "a", Minor: 4, Healthy: true}}}
	if !SameDevices(a, b) || Equal(a, b) || SameDevices(a, c) || SameDevices(a, nil) {
		t.Fatal("SameDevices/Equal disagree with their contract")
	}
}

// waitSnap reads snapshots from out until cond holds.
func waitSnap(t *testing.T, s *Source, out <-chan *Snapshot, d time.Duration, what string, cond func(*Snapshot) bool) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case snap := <-out:
			if cond(snap) {
				return
			}
		case <-deadline:
			t.Fatalf("%s: last snapshot %+v", what, s.Snapshot().Devices)
		}
	}
}

func runSource(t *testing.T, s *Source) <-chan *Snapshot {
	t.Helper()
	out := make(chan *Snapshot, 1)
	testutil.Go(t, func(ctx context.Context) error { return s.Run(ctx, out) })
	return out
}

// TestWildcardDirectoriesWatched: a glob with wildcard
// directories sees nodes come and go in every matching directory,
// including directories created after start.
func TestWildcardDirectoriesWatched(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	fn.make(t, filepath.Join(root, "bus0", "n0"), 4, 64)
	if err := os.Mkdir(filepath.Join(root, "bus1"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := NewSource(Options{DevRoot: root, IDPrefix: "b", HostGlobs: []string{"bus*/n*"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	out := runSource(t, s)
	has := func(path string, healthy bool) func(*Snapshot) bool {
		return func(snap *Snapshot) bool {
			return slices.ContainsFunc(snap.Devices, func(d Device) bool { return d.ContainerPath == path && d.Healthy == healthy })
		}
	}
	fn.make(t, filepath.Join(root, "bus1", "n1"), 4, 65)
	waitSnap(t, s, out, 2*time.Second, "node in an existing wildcard directory", has("/dev/bus1/n1", true))
	if err := os.Remove(filepath.Join(root, "bus0", "n0")); err != nil {
		t.Fatal(err)
	}
	waitSnap(t, s, out, 2*time.Second, "node removed", has("/dev/bus0/n0", false))
	if err := os.Mkdir(filepath.Join(root, "bus2"), 0o755); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the new directory is seen before the node
	fn.make(t, filepath.Join(root, "bus2", "n2"), 4, 66)
	waitSnap(t, s, out, 2*time.Second, "node in a new wildcard directory", has("/dev/bus2/n2", true))
}

// TestHostIDsInjective (item 7): distinct paths give distinct, valid IDs;
// a path without '_' or ':' keeps the ID it always had.
func TestHostIDsInjective(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	// Six nodes: one node is one device, whatever its names.
	for i, p := range []string{"net/tun", "net_tun", "a_/b", "a/_b", "c:d", "c_d"} {
		fn.make(t, filepath.Join(root, p), 10, 200+uint32(i))
	}
	s, err := NewSource(Options{DevRoot: root, IDPrefix: "x", HostGlobs: []string{"net/tun", "net_tun", "a_/b", "a/_b", "c:d", "c_d"}})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := s.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, d := range snap.Devices {
		if prev, dup := seen[d.Name]; dup {
			t.Fatalf("%s and %s both have ID %q", prev, d.ContainerPath, d.Name)
		}
		seen[d.Name] = d.ContainerPath
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			t.Fatalf("%s: %v", d.Name, err)
		}
	}
	if len(snap.Devices) != 6 || seen["x-net_tun"] != "/dev/net/tun" {
		t.Fatalf("%v", seen)
	}
}

// TestRegistry: host devices keep IDs and indexes across sources (plugin
// restarts); a corrupt registry without a spec and an unknown version are refused,
// and entries the configuration no longer gives are dropped without their
// index being given to anyone else.
func TestRegistry(t *testing.T) {
	fn := useFakeNodes(t)
	root := t.TempDir()
	reg := filepath.Join(t.TempDir(), "resources", "serial.json")
	src := func(globs ...string) (*Source, *Snapshot, error) {
		s, err := NewSource(Options{DevRoot: root, IDPrefix: "ser", HostGlobs: globs, Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		snap, err := s.Prepare()
		return s, snap, err
	}
	index := func(snap *Snapshot) map[string]int {
		m := map[string]int{}
		for _, d := range snap.Devices {
			m[d.ContainerPath] = d.Index
		}
		return m
	}
	fn.make(t, filepath.Join(root, "ttyR3"), 4, 67)
	fn.make(t, filepath.Join(root, "ttyS0"), 4, 70)
	if _, snap, err := src("ttyR*", "ttyS*"); err != nil || !maps.Equal(index(snap), map[string]int{"/dev/ttyR3": 0, "/dev/ttyS0": 1}) {
		t.Fatalf("%v %v", index(snap), err)
	}
	fn.make(t, filepath.Join(root, "ttyR1"), 4, 65)
	_, snap, err := src("ttyR*", "ttyS*")
	if err != nil || !maps.Equal(index(snap), map[string]int{"/dev/ttyR3": 0, "/dev/ttyS0": 1, "/dev/ttyR1": 2}) {
		t.Fatalf("after restart with a new device: %v %v", index(snap), err)
	}
	// ttyS* is no longer configured: ttyS0 is forgotten, its index is not
	// reused.
	fn.make(t, filepath.Join(root, "ttyR0"), 4, 64)
	_, snap, err = src("ttyR*")
	if err != nil || !maps.Equal(index(snap), map[string]int{"/dev/ttyR3": 0, "/dev/ttyR1": 2, "/dev/ttyR0": 3}) {
		t.Fatalf("after dropping a glob: %v %v", index(snap), err)
	}

	if err := os.WriteFile(reg, []byte(`{"version": 7, "devices": []}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := src("ttyR*"); !errors.Is(err, ErrRegistryVersion) || !strings.Contains(err.Error(), reg) {
		t.Fatalf("unknown version: %v", err)
	}
	if err := os.WriteFile(reg, []byte("{garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Without a spec to rebuild it from (Options.Described), a corrupt
	// registry is refused and left as it is (TestRebuiltRegistry).
	if _, _, err := src("ttyR*"); !errors.Is(err, ErrRegistry) || !strings.Contains(err.Error(), reg) {
		t.Fatalf("corrupt registry: %v", err)
	}
	if kept, err := os.ReadFile(reg); err != nil || string(kept) != "{garbage" {
		t.Fatalf("corrupt registry changed: %q %v", kept, err)
	}
}

// TestLegacyHostSuffix: the escaping of versions before 654f80e ('/' as
// '_', nothing else), next to today's, for the paths that differ.
func TestLegacyHostSuffix(t *testing.T) {
	for _, c := range []struct{ rel, legacy, now string }{
		{"tun", "tun", "tun"},
		{"net/tun", "net_tun", "net_tun"},
		{"net_tun", "net_tun", "net:_tun"},
		{"a:b/c", "a:b_c", "a::b_c"},
	} {
		t.Run(c.rel, func(t *testing.T) {
			if got := LegacyHostSuffix(c.rel); got != c.legacy {
				t.Errorf("legacy %q, want %q", got, c.legacy)
			}
			if got := HostSuffix(c.rel); got != c.now {
				t.Errorf("now %q, want %q", got, c.now)
			}
		})
	}
}
