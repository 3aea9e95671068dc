package sysfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Uevent is one kernel uevent: what happened (add, remove, bind, unbind,
// change, move), to which device (its sysfs path below /sys) of which
// subsystem, with the rest of its environment.
type Uevent struct {
	Action, DevPath, Subsystem string
	Env                        map[string]string
}

// ParseUevent reads a message of the kernel's NETLINK_KOBJECT_UEVENT
// socket: "ACTION@DEVPATH" then KEY=VALUE fields, NUL-separated. Messages
// udev re-broadcasts ("libudev" header) are not the kernel's: false.
func ParseUevent(msg []byte) (Uevent, bool) {
	fields := bytes.Split(bytes.TrimRight(msg, "\x00"), []byte{0})
	if len(fields) == 0 || bytes.HasPrefix(fields[0], []byte("libudev")) {
		return Uevent{}, false
	}
	action, path, ok := strings.Cut(string(fields[0]), "@")
	if !ok || action == "" || !strings.HasPrefix(path, "/") {
		return Uevent{}, false
	}
	ev := Uevent{Action: action, DevPath: path, Env: map[string]string{}}
	for _, f := range fields[1:] {
		if k, v, ok := strings.Cut(string(f), "="); ok {
			ev.Env[k] = v
		}
	}
	ev.Subsystem = ev.Env["SUBSYSTEM"]
	if a := ev.Env["ACTION"]; a != "" {
		ev.Action = a
	}
	return ev, true
}

// ActionLost is the action of the event a listener hands on when the
// kernel dropped events (its socket buffer was full): rescan everything.
// It passes any subsystem filter.
const ActionLost = "lost"

// Listener hands the kernel's uevents of some subsystems to a function,
// as udev listens to them, until its context is done or Close.
type Listener struct {
	done   chan struct{}
	closer io.Closer
	once   sync.Once
	stop   func() bool
	err    error
}

// Listen opens a NETLINK_KOBJECT_UEVENT socket bound to the kernel's
// multicast group and calls handle, from its one reader goroutine, with
// the events of subsystems (all when none). It needs no privilege, and no
// particular network namespace: the kernel (4.18 and later) sends them to
// every one owned by the initial user namespace. Only the kernel's
// messages are events: a datagram a process sent to the group (which
// CAP_NET_ADMIN in the socket's network namespace allows) has a sender
// port other than 0 and is dropped, as udev drops it.
func Listen(ctx context.Context, handle func(Uevent), subsystems ...string) (*Listener, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return nil, fmt.Errorf("uevent socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("uevent socket bind: %w", err)
	}
	// Through the runtime poller, so Close unblocks a pending read.
	f := os.NewFile(uintptr(fd), "uevent")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("uevent socket: %w", err)
	}
	return NewListener(ctx, &kernelSocket{recv: recvFrom(rc), close: f.Close}, handle, subsystems...), nil
}

// kernelSocket reads the datagrams of a uevent socket that the kernel
// sent (sender port 0), dropping those of processes.
type kernelSocket struct {
	// recv receives one datagram into p, with its sender's address.
	recv   func(p []byte) (int, unix.Sockaddr, error)
	close  func() error
	closed atomic.Bool
}

func (k *kernelSocket) Read(p []byte) (int, error) {
	for {
		n, from, err := k.recv(p)
		if err != nil {
			if k.closed.Load() {
				return 0, os.ErrClosed
			}
			return 0, err
		}
		if fromKernel(from) {
			return n, nil
		}
	}
}

func (k *kernelSocket) Close() error {
	k.closed.Store(true)
	return k.close()
}

// fromKernel reports whether a datagram from sender is the kernel's: a
// netlink address of port 0, which no process can bind.
func fromKernel(sender unix.Sockaddr) bool {
	nl, ok := sender.(*unix.SockaddrNetlink)
	return ok && nl.Pid == 0
}

// recvFrom receives one datagram at a time from the socket of rc, with its
// sender's address, waiting in the runtime poller.
func recvFrom(rc syscall.RawConn) func(p []byte) (int, unix.Sockaddr, error) {
	return func(p []byte) (n int, from unix.Sockaddr, err error) {
		rerr := rc.Read(func(fd uintptr) bool {
			for {
				n, from, err = unix.Recvfrom(int(fd), p, 0)
				if !errors.Is(err, unix.EINTR) {
					return !errors.Is(err, unix.EAGAIN)
				}
			}
		})
		if rerr != nil {
			return 0, nil, rerr
		}
		if err != nil {
			return 0, nil, os.NewSyscallError("recvfrom", err)
		}
		return n, from, nil
	}
}

// NewListener reads messages (one per Read, as a datagram socket gives
// them) from r and hands the events of subsystems to handle; Close closes
// r. Tests feed it through a socket pair: every message r gives is taken
// for the kernel's (Listen's reader gives no other).
func NewListener(ctx context.Context, r io.ReadCloser, handle func(Uevent), subsystems ...string) *Listener {
	l := &Listener{done: make(chan struct{}), closer: r}
	l.stop = context.AfterFunc(ctx, l.closeReader)
	want := map[string]bool{}
	for _, s := range subsystems {
		want[s] = true
	}
	go func() {
		defer close(l.done)
		buf := make([]byte, 64*1024)
		for {
			n, err := r.Read(buf)
			if errors.Is(err, unix.ENOBUFS) {
				// The kernel dropped events our buffer had no room for:
				// whatever they were, a rescan sees what they changed.
				handle(Uevent{Action: ActionLost})
				continue
			}
			if err != nil {
				if !errors.Is(err, os.ErrClosed) && !errors.Is(err, io.EOF) && ctx.Err() == nil {
					l.err = err
				}
				return
			}
			ev, ok := ParseUevent(buf[:n])
			if ok && (len(want) == 0 || want[ev.Subsystem]) {
				handle(ev)
			}
		}
	}()
	return l
}

func (l *Listener) closeReader() { l.once.Do(func() { _ = l.closer.Close() }) }

// Err is why the listener ended (nil when closed or its context done).
func (l *Listener) Err() error {
	<-l.done
	return l.err
}

// Close stops listening and waits for the reader.
func (l *Listener) Close() {
	l.stop()
	l.closeReader()
	<-l.done
}

// KernelEvents is device.Options.KernelEvents for devices of subsystems:
// every uevent of theirs asks for a rescan.
func KernelEvents(subsystems ...string) func(ctx context.Context, changed func()) (func(), error) {
	return func(ctx context.Context, changed func()) (func(), error) {
		l, err := Listen(ctx, func(Uevent) { changed() }, subsystems...)
		if err != nil {
			return nil, err
		}
		return l.Close, nil
	}
}

// KernelEventsFrom is KernelEvents reading the kernel-shaped messages
// from the reader open returns instead of the kernel's socket (tests: one
// end of a socket pair).
func KernelEventsFrom(open func() (io.ReadCloser, error), subsystems ...string) func(ctx context.Context, changed func()) (func(), error) {
	return func(ctx context.Context, changed func()) (func(), error) {
		r, err := open()
		if err != nil {
			return nil, err
		}
		return NewListener(ctx, r, func(Uevent) { changed() }, subsystems...).Close, nil
	}
}
