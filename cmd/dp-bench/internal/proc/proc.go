// Package proc starts and measures the processes dp-bench runs: the
// plugin or driver under test, the control plane's binaries, and the
// baselines (dp-bench itself, exiting at once or idle). Every one is
// started through dp-bench itself in a helper mode (RunHelper), so that
// all are timed from the same instant: the helper applies the bind mounts
// (in the private mount namespace it was started in), writes
// CLOCK_MONOTONIC to fd 3 and calls execve; "process start" is that
// instant. Read gives a process's CPU, wake-ups and memory from /proc.
package proc

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Proc is a started plugin, driver, control-plane or baseline process.
type Proc struct {
	cmd  *exec.Cmd
	argv []string
	// Start is when its execve began (the helper's timestamp).
	Start time.Time
	out   *tailBuffer
	done  chan struct{} // closed when Wait returned
	err   error         // Wait's result, set before done is closed
}

// Start starts argv with env through the helper; binds, when any, are
// applied in a private mount namespace, with scratch (an empty directory)
// for its overlays.
func Start(argv, env []string, binds []Bind, scratch string) (*Proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(helperSpec{Mode: "exec", Argv: argv, Env: env, Binds: binds, Scratch: scratch})
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(self)
	cmd.Env = []string{HelperEnv + "=" + string(raw)}
	p := &Proc{cmd: cmd, argv: argv, out: &tailBuffer{max: 64 << 10}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if len(binds) > 0 {
		cmd.SysProcAttr.Unshareflags = syscall.CLONE_NEWNS
	}
	err = cmd.Start()
	_ = w.Close()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	var buf [8]byte
	if _, err := io.ReadFull(r, buf[:]); err != nil {
		<-p.done
		return nil, fmt.Errorf("start %s: %w: %s", argv[0], p.err, p.out.String())
	}
	now := time.Now()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		p.Kill()
		return nil, err
	}
	p.Start = now.Add(-time.Duration(ts.Nano() - int64(binary.LittleEndian.Uint64(buf[:]))))
	return p, nil
}

// Pid is the process ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Name is the program it runs (argv[0]).
func (p *Proc) Name() string { return p.argv[0] }

// Log is the tail of what the process wrote.
func (p *Proc) Log() string { return p.out.String() }

// LogTail is the last n bytes of Log.
func (p *Proc) LogTail(n int) string { return Tail(p.Log(), n) }

// Tail is the last n bytes of s, marked as cut when it is.
func Tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// Done is closed when the process has ended; Err is then its exit.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is how the process ended (Wait's error), once Done is closed.
func (p *Proc) Err() error {
	<-p.done
	return p.err
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits up to timeout for the process to end and returns whether it
// did and Wait's error.
func (p *Proc) Wait(timeout time.Duration) (bool, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return true, p.err
	case <-t.C:
		return false, nil
	}
}

// Kill ends the process and waits for it.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Terminate sends SIGTERM and waits up to timeout, then kills. It returns
// whether the process ended on SIGTERM in time, and Wait's error.
func (p *Proc) Terminate(timeout time.Duration) (bool, error) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if ok, err := p.Wait(timeout); ok {
		return true, err
	}
	p.Kill()
	return false, p.err
}

// StartIdle starts the idle baseline: dp-bench itself, blocked until
// SIGTERM.
func StartIdle() (*Proc, error) { return startSelf("sleep") }

// ExitBaseline is the time from execve to exit of a Go binary (dp-bench
// itself) that exits at once.
func ExitBaseline() (time.Duration, error) {
	p, err := startSelf("exit")
	if err != nil {
		return 0, err
	}
	if err := p.Err(); err != nil {
		return 0, fmt.Errorf("baseline process: %w", err)
	}
	return time.Since(p.Start), nil
}

// startSelf starts dp-bench itself in the helper mode named.
func startSelf(mode string) (*Proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return Start([]string{self}, []string{HelperEnv + `={"mode":"` + mode + `"}`}, nil, "")
}

// Sleep waits d or until ctx is done.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
