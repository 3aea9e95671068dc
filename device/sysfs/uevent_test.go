package sysfs

import (
	"context"
	"crypto/rand"
	"errors"
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

// TestListenKernelOnly: a process that may send to the
// uevent group (CAP_NET_ADMIN in its network namespace) sends a
// kernel-shaped message from a netlink socket of its own: its sender port
// is not 0, the kernel's, so the listener drops it, as udev does; the
// kernel's own event sent after it is handled. Real sockets: skipped where
// the sandbox allows no uevent socket, no send to its group, or no uevent
// to be written.
func TestListenKernelOnly(t *testing.T) {
	// Of a subsystem no one else listens to: other listeners on this
	// machine drop it.
	const spoofSubsystem = "cdi-device-plugin-test"
	files, _ := filepath.Glob("/sys/bus/pci/devices/*/uevent")
	if len(files) == 0 {
		t.Skip("no PCI device here to send a uevent")
	}
	got := make(chan Uevent, 1024)
	l, err := Listen(context.Background(), func(ev Uevent) {
		select {
		case got <- ev:
		default:
		}
	}, "pci", spoofSubsystem)
	if err != nil {
		t.Skipf("no uevent socket here: %v", err)
	}
	defer l.Close()
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		t.Skipf("no uevent socket to send from: %v", err)
	}
	defer unix.Close(fd)
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		t.Fatal(err)
	}
	spoofed := fmt.Sprintf("/devices/virtual/%s/%x", spoofSubsystem, nonce)
	msg := "add@" + spoofed + "\x00ACTION=add\x00DEVPATH=" + spoofed + "\x00SUBSYSTEM=" + spoofSubsystem + "\x00SEQNUM=1\x00"
	if err := unix.Sendto(fd, []byte(msg), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}); err != nil {
		t.Skipf("cannot send to the uevent group: %v", err)
	}
	// The kernel's event, tagged with a UUID of ours (a synthetic uevent's
	// SYNTH_UUID), queued after the process's message.
	uuid := fmt.Sprintf("%x-%x-%x-%x-%x", nonce[:4], nonce[4:6], nonce[6:8], nonce[:2], nonce[2:8])
	if err := os.WriteFile(files[0], []byte("change "+uuid), 0); err != nil {
		t.Skipf("no uevent sent: %v", err)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-got:
			if ev.DevPath == spoofed {
				t.Fatalf("handled a process's message as the kernel's: %+v", ev)
			}
			if ev.Env["SYNTH_UUID"] == uuid {
				return
			}
		case <-deadline:
			t.Fatalf("the kernel's change event (SYNTH_UUID %s) not handled within 5s", uuid)
		}
	}
}

// scripted is a uevent socket's receive that gives datagrams with their
// senders in order, then blocks until closed.
type scripted struct {
	msgs   []string
	from   []unix.Sockaddr
	closed chan struct{}
}

func (s *scripted) recv(p []byte) (int, unix.Sockaddr, error) {
	if len(s.msgs) == 0 {
		<-s.closed
		return 0, nil, errors.New("use of closed file")
	}
	n := copy(p, s.msgs[0])
	from := s.from[0]
	s.msgs, s.from = s.msgs[1:], s.from[1:]
	return n, from, nil
}

// TestKernelSocketSender: through the seam that
// carries each datagram's sender, only those of port 0 (the kernel) reach
// the handler; a process's (port 4242) and one of no netlink address are
// dropped, and the listener ends cleanly on Close.
func TestKernelSocketSender(t *testing.T) {
	s := &scripted{closed: make(chan struct{})}
	for _, m := range []struct {
		path string
		from unix.Sockaddr
	}{
		{"/devices/from-a-process", &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Pid: 4242, Groups: 1}},
		{"/devices/no-sender", nil},
		{"/devices/pci0000:00/0000:00:06.0", &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}},
	} {
		s.msgs = append(s.msgs, "change@"+m.path+"\x00ACTION=change\x00SUBSYSTEM=pci\x00")
		s.from = append(s.from, m.from)
	}
	got := make(chan Uevent, 4)
	l := NewListener(context.Background(), &kernelSocket{recv: s.recv, close: func() error { close(s.closed); return nil }},
		func(ev Uevent) { got <- ev }, "pci")
	select {
	case ev := <-got:
		if ev.DevPath != "/devices/pci0000:00/0000:00:06.0" {
			t.Fatalf("handled %+v first, want the kernel's event alone", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the kernel's event not handled within 5s")
	}
	l.Close()
	if err := l.Err(); err != nil {
		t.Fatalf("Err after Close: %v", err)
	}
	if len(got) != 0 {
		t.Fatalf("handled %+v too", <-got)
	}
}
