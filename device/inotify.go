package device

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// watchMask asks only for changes of the directory's entries. fsnotify
// would also subscribe to IN_MODIFY, and every write to /dev/null on the
// node is such an event for a watcher of /dev: a flood we do not need.
const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// dirWatcher is a minimal inotify watcher of directories. Reads go through
// the runtime poller, so Close unblocks a pending read.
type dirWatcher struct {
	f    *os.File
	mu   sync.Mutex
	wds  map[int32]string
	dirs map[string]int32
}

func newDirWatcher() (*dirWatcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	return &dirWatcher{f: os.NewFile(uintptr(fd), "inotify"), wds: map[int32]string{}, dirs: map[string]int32{}}, nil
}

// add watches dir; watching a directory twice is a no-op.
func (w *dirWatcher) add(dir string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.dirs[dir]; ok {
		return nil
	}
	rc, err := w.f.SyscallConn()
	if err != nil {
		return err
	}
	var wd int
	var werr error
	if err := rc.Control(func(fd uintptr) { wd, werr = unix.InotifyAddWatch(int(fd), dir, watchMask) }); err != nil {
		return err
	}
	if werr != nil {
		return fmt.Errorf("inotify watch %s: %w", dir, werr)
	}
	w.wds[int32(wd)] = dir
	w.dirs[dir] = int32(wd)
	return nil
}

// watching reports whether dir is watched.
func (w *dirWatcher) watching(dir string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.dirs[dir]
	return ok
}

// read blocks until events arrive; what they name does not matter, as the
// source rescans. It forgets directories whose watch the kernel dropped
// (IN_IGNORED), so they are watched again once they exist.
func (w *dirWatcher) read(buf []byte) error {
	n, err := w.f.Read(buf)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		off += unix.SizeofInotifyEvent + int(ev.Len)
		if ev.Mask&unix.IN_IGNORED != 0 {
			delete(w.dirs, w.wds[ev.Wd])
			delete(w.wds, ev.Wd)
		}
	}
	return nil
}

func (w *dirWatcher) close() error { return w.f.Close() }
