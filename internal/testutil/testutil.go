// Package testutil holds what the tests of several packages share: short
// socket directories, device nodes, a fresh CDI cache. Only tests import
// it.
package testutil

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"golang.org/x/sys/unix"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// ShortDir is a temporary directory with a path short enough for unix
// sockets (their paths are limited to 107 bytes; t.TempDir() paths are
// long), removed when the test ends.
func ShortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "cdp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// CanMknod reports why device nodes cannot be made here (nil: they can):
// it needs CAP_MKNOD, root in practice.
func CanMknod() error {
	d, err := os.MkdirTemp("", "mknod")
	if err != nil {
		return err
	}
	defer os.RemoveAll(d)
	return unix.Mknod(filepath.Join(d, "probe"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
}

// NeedMknod skips the test when device nodes cannot be made here.
func NeedMknod(t testing.TB) {
	t.Helper()
	if err := CanMknod(); err != nil {
		t.Skipf("cannot mknod (%v): run as root", err)
	}
}

// Mknod makes a character device node major:minor, mode 0666, at p (its
// parents included), replacing what is there.
func Mknod(t testing.TB, p string, major, minor uint32) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatal(err)
	}
}

// Watch dials a plugin's endpoint in dir as the kubelet does and opens its
// ListAndWatch stream; both end when the test ends (or ctx is done).
func Watch(ctx context.Context, t testing.TB, dir, endpoint string) (*kubeletsim.Client, <-chan kubeletsim.Update) {
	t.Helper()
	c, err := kubeletsim.Dial(dir, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(func() { cancel(); _ = c.Close() })
	updates, err := c.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return c, updates
}

// PodResources is the kubelet's PodResources List (kubeletsim's).
type PodResources = kubeletsim.PodResources

// ServePodResources serves the PodResources API on the unix socket sock,
// answering pods, until the test ends (the server is stopped and its
// goroutine joined).
func ServePodResources(t testing.TB, sock string, pods ...*podresourcesapi.PodResources) *PodResources {
	t.Helper()
	p, err := kubeletsim.ServePodResources(sock, pods...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// Go runs f in the background until the test ends: then its context is
// cancelled and it must return, within 5 s, without an error. The
// returned function cancels it early (the end is still awaited then).
func Go(t testing.TB, f func(ctx context.Context) error) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("background run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("background run did not return within 5s of its cancel")
		}
	})
	return cancel
}

// FreshCDICache reads the specs in dir with a new CDI cache, as a runtime
// that starts (containerd) does, and fails the test on any spec error.
func FreshCDICache(t testing.TB, dir string) *cdiapi.Cache {
	t.Helper()
	c, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := c.GetErrors(); len(errs) != 0 {
		t.Fatalf("cache errors: %v", errs)
	}
	return c
}

// SyncBuffer is a goroutine-safe log sink: what a process or a logger
// wrote, read while it still writes.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// HelpFlags are the names of the flags a usage message of package flag
// (a command's -h) lists, in its order (by name).
func HelpFlags(usage string) []string {
	var out []string
	for _, l := range strings.Split(usage, "\n") {
		if rest, ok := strings.CutPrefix(l, "  -"); ok {
			out = append(out, strings.Fields(rest)[0])
		}
	}
	return out
}
