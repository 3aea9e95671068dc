package sysfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseUevent(t *testing.T) {
	for _, c := range []struct {
		name string
		msg  string
		ok   bool
		want Uevent
	}{
		{"pci add", "add@/devices/pci0000:00/0000:00:06.0\x00ACTION=add\x00DEVPATH=/devices/pci0000:00/0000:00:06.0\x00SUBSYSTEM=pci\x00PCI_SLOT_NAME=0000:00:06.0\x00SEQNUM=4242\x00", true,
			Uevent{Action: "add", DevPath: "/devices/pci0000:00/0000:00:06.0", Subsystem: "pci"}},
		{"pci unbind", "unbind@/devices/pci0000:00/0000:00:06.0\x00ACTION=unbind\x00DEVPATH=/devices/pci0000:00/0000:00:06.0\x00SUBSYSTEM=pci\x00DRIVER=nvidia\x00", true,
			Uevent{Action: "unbind", DevPath: "/devices/pci0000:00/0000:00:06.0", Subsystem: "pci"}},
		{"usb remove", "remove@/devices/pci0000:00/0000:00:14.0/usb1/1-1\x00ACTION=remove\x00SUBSYSTEM=usb\x00DEVTYPE=usb_device\x00", true,
			Uevent{Action: "remove", DevPath: "/devices/pci0000:00/0000:00:14.0/usb1/1-1", Subsystem: "usb"}},
		{"udev's re-broadcast", "libudev\x00\xfe\xed\xca\xfe", false, Uevent{}},
		{"no header", "ACTION=add\x00", false, Uevent{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := ParseUevent([]byte(c.msg))
			if ok != c.ok || got.Action != c.want.Action || got.DevPath != c.want.DevPath || got.Subsystem != c.want.Subsystem {
				t.Fatalf("got %+v %v, want %+v %v", got, ok, c.want, c.ok)
			}
		})
	}
}

// TestListenerFiltersAndEnds feeds kernel-shaped datagrams through a
// socket pair: only the chosen subsystem reaches the handler, and the
// listener ends with its context.
func TestListenerFiltersAndEnds(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	r, w := os.NewFile(uintptr(fds[0]), "r"), os.NewFile(uintptr(fds[1]), "w")
	defer w.Close()
	var mu sync.Mutex
	var got []string
	seen := make(chan struct{}, 8)
	ctx, cancel := context.WithCancel(context.Background())
	l := NewListener(ctx, r, func(ev Uevent) {
		mu.Lock()
		got = append(got, ev.Action+" "+ev.Subsystem)
		mu.Unlock()
		seen <- struct{}{}
	}, "pci")
	for _, m := range []string{
		"add@/devices/x/usb1/1-1\x00SUBSYSTEM=usb\x00",
		"unbind@/devices/pci0000:00/0000:00:06.0\x00SUBSYSTEM=pci\x00",
		"libudev\x00junk",
		"bind@/devices/pci0000:00/0000:00:06.0\x00SUBSYSTEM=pci\x00",
	} {
		if _, err := w.WriteString(m); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		select {
		case <-seen:
		case <-time.After(2 * time.Second):
			t.Fatal("events not handled within 2s")
		}
	}
	cancel()
	if err := l.Err(); err != nil {
		t.Fatalf("Err after cancel: %v", err)
	}
	l.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0] != "unbind pci" || got[1] != "bind pci" {
		t.Fatalf("handled %q, want the two pci events", got)
	}
}

// TestListenKernel opens the real uevent socket (skipped where the
// sandbox refuses it) and closes it.
func TestListenKernel(t *testing.T) {
	l, err := Listen(context.Background(), func(Uevent) {}, "pci")
	if err != nil {
		t.Skipf("no uevent socket here: %v", err)
	}
	done := make(chan struct{})
	go func() { l.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not end the reader")
	}
}

// TestListenInOwnNetns: a listener whose socket was made in a network
// namespace of its own, as a pod's without hostNetwork, receives a real
// kernel uevent of the pci subsystem (the kernel, 4.18 and later, sends
// them to every network namespace of the initial user namespace): why the
// DaemonSet needs no hostNetwork for resources found by identity.
func TestListenInOwnNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace of its own, and a PCI device's uevent file to write")
	}
	files, _ := filepath.Glob("/sys/bus/pci/devices/*/uevent")
	if len(files) == 0 {
		t.Skip("no PCI device here to send a uevent")
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(files[0]))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimPrefix(dir, "/sys")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan Uevent, 64)
	type opened struct {
		l   *Listener
		err error
	}
	ch := make(chan opened)
	go func() {
		// Never unlocked: the thread, in its own network namespace, ends
		// with this goroutine. The socket keeps the namespace it was made in.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- opened{err: fmt.Errorf("unshare: %w", err)}
			return
		}
		l, err := Listen(ctx, func(ev Uevent) {
			select {
			case got <- ev:
			default:
			}
		}, "pci")
		ch <- opened{l, err}
	}()
	o := <-ch
	if o.err != nil {
		t.Skipf("no listener in a network namespace of its own: %v", o.err)
	}
	defer o.l.Close()
	if err := os.WriteFile(files[0], []byte("change"), 0); err != nil {
		t.Skipf("no uevent sent: %v", err)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-got:
			if ev.Action == "change" && ev.DevPath == want {
				return
			}
		case <-deadline:
			t.Fatalf("no change event of %s reached a listener in its own network namespace", want)
		}
	}
}

// enobufsReader fails its first read as a netlink socket whose buffer
// overflowed does, then blocks until closed.
type enobufsReader struct {
	once   sync.Once
	closed chan struct{}
}

func (r *enobufsReader) Read([]byte) (int, error) {
	first := false
	r.once.Do(func() { first = true })
	if first {
		return 0, unix.ENOBUFS
	}
	<-r.closed
	return 0, os.ErrClosed
}

func (r *enobufsReader) Close() error { close(r.closed); return nil }

// TestListenerLost: when the kernel drops events (ENOBUFS), the listener
// says so (ActionLost, whatever the filter) and goes on listening.
func TestListenerLost(t *testing.T) {
	got := make(chan Uevent, 1)
	l := NewListener(context.Background(), &enobufsReader{closed: make(chan struct{})}, func(ev Uevent) { got <- ev }, "pci")
	select {
	case ev := <-got:
		if ev.Action != ActionLost {
			t.Fatalf("event %+v, want %s", ev, ActionLost)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no event for the lost ones")
	}
	l.Close()
	if err := l.Err(); err != nil {
		t.Fatalf("Err after Close: %v (the listener must go on after ENOBUFS)", err)
	}
}
