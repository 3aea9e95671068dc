package device

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/inotify"
)

// benchSim is a prepared source of n simulated devices on fake nodes.
func benchSim(b *testing.B, n int) (*Source, string, chan *Snapshot) {
	b.Helper()
	useFakeNodes(b)
	root := b.TempDir()
	s, err := NewSource(Options{DevRoot: root, IDPrefix: "sim", NodeName: "node1", Count: n, FilePrefix: "sim", Type: Char, Major: 1, Minor: 3, Replicas: 1})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Prepare(); err != nil {
		b.Fatal(err)
	}
	return s, root, make(chan *Snapshot, 1)
}

// BenchmarkNodeEvent10000: one simulated node of 10,000 removed and made
// again, each answered as Run answers the inotify event that names it
// (two snapshots published per op).
func BenchmarkNodeEvent10000(b *testing.B) {
	s, root, out := benchSim(b, 10000)
	fn := nodeOps.mknod
	name := "sim-" + strconv.Itoa(4321)
	p := filepath.Join(root, name)
	ev := []inotify.Event{{Dir: root, Name: name, Mask: unix.IN_DELETE}}
	b.ReportAllocs()
	for b.Loop() {
		if err := os.Remove(p); err != nil {
			b.Fatal(err)
		}
		s.publishEvents(out, ev, false)
		if s.Snapshot().Devices[4321].Healthy {
			b.Fatal("removed node healthy")
		}
		if err := fn(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			b.Fatal(err)
		}
		s.publishEvents(out, ev, false)
		if !s.Snapshot().Devices[4321].Healthy {
			b.Fatal("node made again unhealthy")
		}
	}
	if n := s.fullScans.Load(); n != 0 {
		b.Fatalf("%d full rescans", n)
	}
}

// BenchmarkRescan10000: a full rescan of 10,000 simulated devices that
// changes nothing (an event the source cannot place: a directory's).
func BenchmarkRescan10000(b *testing.B) {
	s, root, out := benchSim(b, 10000)
	ev := []inotify.Event{{Dir: root, Mask: unix.IN_ATTRIB}}
	b.ReportAllocs()
	for b.Loop() {
		s.publishEvents(out, ev, false)
	}
}
