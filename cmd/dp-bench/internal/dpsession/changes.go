package dpsession

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
	"github.com/cdi-device-plugin/cdi-device-plugin/device/sysfs"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
)

// catchUp takes the lists that arrived since the last one read: they are
// the current state.
func (x *session) catchUp() error {
	for more := true; more; {
		select {
		case u, ok := <-x.updates:
			if !ok {
				return errors.New("ListAndWatch stream ended")
			}
			x.last = u
		default:
			more = false
		}
	}
	return nil
}

// healthySet is the sorted healthy IDs of u.
func healthySet(u kubeletsim.Update) string {
	var ids []string
	for _, d := range u.Devices {
		if d.Health == pluginapi.Healthy {
			ids = append(ids, d.ID)
		}
	}
	sort.Strings(ids)
	return strings.Join(ids, "\x00")
}

// change removes the device file, waits for a list with fewer healthy IDs,
// puts the file back as it was and waits for the original list.
func (x *session) change() error {
	if x.r.Remove == "" {
		x.res.Skip("listandwatch-change", "no device file to remove given")
		return nil
	}
	if err := x.catchUp(); err != nil {
		return err
	}
	before := healthySet(x.last)
	var st unix.Stat_t
	if err := unix.Lstat(x.r.Remove, &st); err != nil {
		return fmt.Errorf("removeDevice: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(x.r.Remove)); err != nil {
		return err
	}
	t0 := time.Now()
	if err := os.Remove(x.r.Remove); err != nil {
		return err
	}
	raw, err := rawEvent(w, x.r.Remove, t0)
	if err != nil {
		return err
	}
	u, err := kubeletsim.WaitFor(x.updates, x.s.Change, func(u kubeletsim.Update) bool { return healthySet(u) != before })
	if err != nil {
		x.res.Fail("listandwatch-change", "removal of %s not reported within %s", x.r.Remove, x.s.Change)
	} else {
		x.res.Measure("removed-update", report.Ms(u.At.Sub(t0)), report.Ms(raw))
	}
	// Put it back as it was.
	if st.Mode&unix.S_IFMT == unix.S_IFREG {
		err = os.WriteFile(x.r.Remove, nil, os.FileMode(st.Mode&0o7777))
	} else {
		err = unix.Mknod(x.r.Remove, st.Mode, int(st.Rdev))
	}
	if err != nil {
		return fmt.Errorf("restore %s: %w", x.r.Remove, err)
	}
	if x.res.Checks["listandwatch-change"].Status == report.Fail {
		return nil
	}
	if x.last, err = kubeletsim.WaitFor(x.updates, x.s.Change, func(u kubeletsim.Update) bool { return healthySet(u) == before }); err != nil {
		x.res.Fail("listandwatch-change", "return of %s not reported within %s", x.r.Remove, x.s.Change)
		return nil
	}
	x.res.Pass("listandwatch-change", "removal and return reported")
	return nil
}

// uevent changes the device tree (Uevent.Change), makes the kernel send a
// uevent (writes "change" to Uevent.Trigger) and waits for a list that
// differs. The baseline is the uevent as a listener of our own receives it.
func (x *session) uevent(ctx context.Context) error {
	if x.t.Uevent == nil {
		return nil // not checked: the tables say n/a
	}
	if err := x.catchUp(); err != nil {
		return err
	}
	before := healthySet(x.last)
	if err := x.r.ChangeDevices(); err != nil {
		return err
	}
	got := make(chan time.Time, 16)
	l, err := sysfs.Listen(ctx, func(sysfs.Uevent) {
		select {
		case got <- time.Now():
		default:
		}
	})
	if err != nil {
		x.res.Skip("uevent-change", "no uevent socket: %v", err)
		return nil
	}
	defer l.Close()
	t0 := time.Now()
	if err := os.WriteFile(x.t.Uevent.Trigger, []byte("change"), 0); err != nil {
		x.res.Skip("uevent-change", "cannot trigger a uevent through %s: %v", x.t.Uevent.Trigger, err)
		return nil
	}
	var raw time.Duration
	select {
	case at := <-got:
		raw = at.Sub(t0)
	case <-time.After(5 * time.Second):
		x.res.Fail("uevent-change", "no uevent within 5s of writing %s", x.t.Uevent.Trigger)
		return nil
	}
	u, err := kubeletsim.WaitFor(x.updates, x.s.Change, func(u kubeletsim.Update) bool { return healthySet(u) != before })
	if err != nil {
		x.res.Fail("uevent-change", "the change was not reported within %s of the uevent", x.s.Change)
		return nil
	}
	x.last = u
	x.res.Measure("uevent-update", report.Ms(u.At.Sub(t0)), report.Ms(raw))
	x.res.Pass("uevent-change", "a change seen only through a kernel uevent reported")
	return nil
}

// rawEvent waits for an inotify event naming path and returns its delay
// from t.
func rawEvent(w *fsnotify.Watcher, path string, t time.Time) (time.Duration, error) {
	timeout := time.After(5 * time.Second)
	for {
		select {
		case ev := <-w.Events:
			if ev.Name == path {
				return time.Since(t), nil
			}
		case err := <-w.Errors:
			return 0, err
		case <-timeout:
			return 0, errors.New("no inotify event for " + path)
		}
	}
}

// idle measures CPU and wake-ups over the idle window, the ListAndWatch
// stream open and nothing else happening, next to an idle Go process over
// the same window; then resident memory.
func (x *session) idle(ctx context.Context) error {
	base, err := proc.StartIdle()
	if err != nil {
		return err
	}
	defer func() { _, _ = base.Terminate(5 * time.Second) }()
	if x.s.Idle > 0 {
		// Let the plugin and the baseline settle: the start-up of one and
		// the calls just made to the other are not idleness.
		if err := proc.Sleep(ctx, time.Second); err != nil {
			return err
		}
		p0, b0, err := readBoth(x.p, base)
		if err != nil {
			return err
		}
		t0 := time.Now()
		if err := proc.Sleep(ctx, x.s.Idle); err != nil {
			return err
		}
		p1, b1, err := readBoth(x.p, base)
		if err != nil {
			return err
		}
		perMin := float64(time.Minute) / float64(time.Since(t0))
		x.res.Measure("idle-cpu", report.Ms(p1.CPU-p0.CPU)*perMin, report.Ms(b1.CPU-b0.CPU)*perMin)
		x.res.Measure("idle-wakeups", float64(p1.Switches-p0.Switches)*perMin, float64(b1.Switches-b0.Switches)*perMin)
	}
	ps, bs, err := readBoth(x.p, base)
	if err != nil {
		return err
	}
	x.res.Measure("rss", report.MiB(ps.RSS), report.MiB(bs.RSS))
	return nil
}

// readBoth reads /proc of the plugin p and of its baseline, in turn.
func readBoth(p, base *proc.Proc) (proc.Stats, proc.Stats, error) {
	ps, err := proc.Read(p.Pid())
	if err != nil {
		return ps, proc.Stats{}, err
	}
	bs, err := proc.Read(base.Pid())
	return ps, bs, err
}

// sigterm stops the plugin with SIGTERM and checks its socket is gone.
func (x *session) sigterm() {
	x.closeStream()
	sock := filepath.Join(x.r.Host.SocketDir, x.reg.Request.Endpoint)
	ok, err := x.p.Terminate(x.s.Term)
	x.stopped = true
	if !ok {
		x.res.Fail("sigterm-socket", "still running %s after SIGTERM", x.s.Term)
		return
	}
	if _, serr := os.Lstat(sock); serr == nil {
		x.res.Fail("sigterm-socket", "%s left behind (exit: %v)", x.reg.Request.Endpoint, exitText(err))
		return
	}
	x.res.Pass("sigterm-socket", "removed (exit: %s)", exitText(err))
}

func exitText(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}
