package device

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeNodes stands in for the node system calls in tests that need no
// root: a node is a regular file whose type and numbers are remembered by
// its inode, so globs, renames and inotify see real files, and stat reports
// a device node. Files it did not make are reported as they are.
type fakeNodes struct {
	mu    sync.Mutex
	nodes map[uint64]uint32 // inode -> mode (type) ; rdev kept beside
	rdev  map[uint64]uint64
}

// useFakeNodes installs the stand-in for the rest of the test. Tests that
// use it must not run in parallel (nodeOps is the package's).
func useFakeNodes(t testing.TB) *fakeNodes {
	t.Helper()
	f := &fakeNodes{nodes: map[uint64]uint32{}, rdev: map[uint64]uint64{}}
	saved := nodeOps
	nodeOps.mknod = f.mknod
	nodeOps.lstat = func(p string, st *unix.Stat_t) error { return f.fix(unix.Lstat(p, st), st) }
	nodeOps.stat = func(p string, st *unix.Stat_t) error { return f.fix(unix.Stat(p, st), st) }
	t.Cleanup(func() { nodeOps = saved })
	return f
}

// mknod makes the file under a temporary name, records it, and renames
// it into place (failing as mknod does when p exists), so that whoever the
// rename's event wakes sees a node, as with a real mknod.
func (f *fakeNodes) mknod(p string, mode uint32, dev int) error {
	if _, err := os.Lstat(p); err == nil {
		return unix.EEXIST
	}
	tmp := filepath.Join(filepath.Dir(p), ".fake-mknod-"+filepath.Base(p))
	fd, err := unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, mode&0o7777)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	_ = unix.Close(fd)
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	f.mu.Lock()
	f.nodes[st.Ino] = mode & unix.S_IFMT
	f.rdev[st.Ino] = uint64(dev)
	f.mu.Unlock()
	return unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, p, unix.RENAME_NOREPLACE)
}

func (f *fakeNodes) fix(err error, st *unix.Stat_t) error {
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if t, ok := f.nodes[st.Ino]; ok && st.Mode&unix.S_IFMT == unix.S_IFREG {
		st.Mode = st.Mode&^unix.S_IFMT | t
		st.Rdev = f.rdev[st.Ino]
	}
	return nil
}

// make makes a char node major:minor at p (parents included) through the
// stand-in, replacing what is there.
func (f *fakeNodes) make(t *testing.T, p string, major, minor uint32) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(p)
	if err := f.mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatal(err)
	}
}
