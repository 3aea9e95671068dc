// Package inotify is the one directory watcher of the binary: a minimal
// inotify watcher (reads go through the runtime poller, so Close unblocks a
// pending Read) and Stream, its one reader goroutine, which every part that
// watches directories (the device nodes, the CDI spec, the configuration
// file, the kubelet's plugin directory) uses.
package inotify

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// EntryChanges asks only for changes of a directory's entries. fsnotify
// would also subscribe to IN_MODIFY, and every write to /dev/null on the
// node is such an event for a watcher of /dev: a flood we do not need.
const EntryChanges = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// Event is one inotify event.
type Event struct {
	// Dir is the watched directory, Name the entry in it ("" for the
	// directory itself).
	Dir, Name string
	Mask      uint32
}

// Watcher watches directories with one mask.
type Watcher struct {
	f    *os.File
	mask uint32
	mu   sync.Mutex
	wds  map[int32]string
	dirs map[string]int32
}

// New returns a watcher that watches directories for mask.
func New(mask uint32) (*Watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	return &Watcher{f: os.NewFile(uintptr(fd), "inotify"), mask: mask, wds: map[int32]string{}, dirs: map[string]int32{}}, nil
}

// Add watches dir; watching a directory twice is a no-op.
func (w *Watcher) Add(dir string) error {
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
	if err := rc.Control(func(fd uintptr) { wd, werr = unix.InotifyAddWatch(int(fd), dir, w.mask) }); err != nil {
		return err
	}
	if werr != nil {
		return fmt.Errorf("inotify watch %s: %w", dir, werr)
	}
	w.wds[int32(wd)] = dir
	w.dirs[dir] = int32(wd)
	return nil
}

// Watching reports whether dir is watched.
func (w *Watcher) Watching(dir string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.dirs[dir]
	return ok
}

// Read blocks until events arrive and returns them (buf must hold at least
// one event with its name). It forgets directories whose watch the kernel
// dropped (IN_IGNORED: removed, unmounted), so they can be added again.
func (w *Watcher) Read(buf []byte) ([]Event, error) {
	n, err := w.f.Read(buf)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var evs []Event
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
		off += unix.SizeofInotifyEvent + int(ev.Len)
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		e := Event{Dir: w.wds[ev.Wd], Name: string(name), Mask: ev.Mask}
		if ev.Mask&unix.IN_IGNORED != 0 {
			delete(w.dirs, e.Dir)
			delete(w.wds, ev.Wd)
		}
		evs = append(evs, e)
	}
	return evs, nil
}

// Close stops watching; a pending Read returns an error.
func (w *Watcher) Close() error { return w.f.Close() }

// Stream is a Watcher read by one goroutine: the events of each read
// arrive on Events, in order. The kernel queues what the receiver has not
// taken yet (merging repeats; past its limit, one IN_Q_OVERFLOW event).
type Stream struct {
	w         *Watcher
	buf       []byte // the reader's
	events    chan []Event
	done      chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
	stopAfter func() bool
	err       error
}

// readBufSize holds 60 events of the longest name (16 + 256 bytes); a read
// takes the whole events that fit and the kernel keeps the rest. The
// buffer is the Stream's, on the heap: a buffer local to the reader would
// be on its stack, and the 64 KiB one there kept a 128 KiB stack per
// stream for the life of the process.
const readBufSize = 16 * 1024

// Watch watches dirs for mask and starts the one reader. The stream ends
// when ctx is done, on Close, or when reading fails: Events is then
// closed and Err says why (nil after ctx or Close). Whoever called Watch
// calls Close, which waits for the reader, before returning.
func Watch(ctx context.Context, mask uint32, dirs ...string) (*Stream, error) {
	w, err := New(mask)
	if err != nil {
		return nil, err
	}
	for _, d := range dirs {
		if err := w.Add(d); err != nil {
			_ = w.Close()
			return nil, err
		}
	}
	s := &Stream{w: w, buf: make([]byte, readBufSize), events: make(chan []Event), done: make(chan struct{}), closed: make(chan struct{})}
	s.stopAfter = context.AfterFunc(ctx, s.closeWatcher)
	go s.read()
	return s, nil
}

func (s *Stream) read() {
	defer close(s.done)
	defer close(s.events)
	for {
		evs, err := s.w.Read(s.buf)
		if err != nil {
			select {
			case <-s.closed: // our own close made the read fail
			default:
				s.err = err
			}
			return
		}
		select {
		case s.events <- evs:
		case <-s.closed:
			return
		}
	}
}

// closeWatcher closes the watcher once; a pending Read returns.
func (s *Stream) closeWatcher() {
	s.closeOnce.Do(func() {
		close(s.closed)
		_ = s.w.Close()
	})
}

// Events delivers the events of each read; it is closed when the stream
// ends.
func (s *Stream) Events() <-chan []Event { return s.events }

// Add watches dir too; watching a directory twice is a no-op.
func (s *Stream) Add(dir string) error { return s.w.Add(dir) }

// Watching reports whether dir is watched (the kernel drops the watch of a
// removed directory).
func (s *Stream) Watching(dir string) bool { return s.w.Watching(dir) }

// Err is why the stream ended, nil when it was closed or its context done.
// It waits for the end.
func (s *Stream) Err() error {
	<-s.done
	return s.err
}

// Close stops watching and waits for the reader.
func (s *Stream) Close() {
	s.stopAfter()
	s.closeWatcher()
	<-s.done
}
