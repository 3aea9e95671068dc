package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// proc is a started plugin or baseline process.
type proc struct {
	cmd *exec.Cmd
	// Start is when its execve began (the helper's timestamp).
	Start time.Time
	out   *tailBuffer
	done  chan struct{} // closed when Wait returned
	err   error         // Wait's result, set before done is closed
}

// startProc starts argv with env through the helper; binds, when any, are
// applied in a private mount namespace, with scratch (an empty directory)
// for its overlays.
func startProc(argv, env []string, binds []bind, scratch string) (*proc, error) {
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
	cmd.Env = []string{helperEnv + "=" + string(raw)}
	p := &proc{cmd: cmd, out: &tailBuffer{max: 64 << 10}, done: make(chan struct{})}
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
		p.kill()
		return nil, err
	}
	p.Start = now.Add(-time.Duration(ts.Nano() - int64(binary.LittleEndian.Uint64(buf[:]))))
	return p, nil
}

// Pid is the process ID.
func (p *proc) Pid() int { return p.cmd.Process.Pid }

// Log is the tail of what the process wrote.
func (p *proc) Log() string { return p.out.String() }

// Exited reports whether the process has ended.
func (p *proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits up to timeout for the process to end and returns whether it
// did and Wait's error.
func (p *proc) wait(timeout time.Duration) (bool, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return true, p.err
	case <-t.C:
		return false, nil
	}
}

// kill ends the process and waits for it.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// terminate sends SIGTERM and waits up to timeout, then kills. It returns
// whether the process ended on SIGTERM in time, and Wait's error.
func (p *proc) terminate(timeout time.Duration) (bool, error) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if ok, err := p.wait(timeout); ok {
		return true, err
	}
	p.kill()
	return false, p.err
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

// procStats is what /proc says of a process at one moment.
type procStats struct {
	CPU      time.Duration // on-CPU time of all its threads (schedstat)
	Switches int64         // voluntary context switches of all its threads: wake-ups
	RSS      int64         // resident set size, bytes
}

// readProc sums the threads of pid. Threads that ended take their counts
// with them; Go rarely ends threads.
func readProc(pid int) (procStats, error) {
	var s procStats
	base := fmt.Sprintf("/proc/%d", pid)
	tasks, err := os.ReadDir(filepath.Join(base, "task"))
	if err != nil {
		return s, err
	}
	for _, t := range tasks {
		dir := filepath.Join(base, "task", t.Name())
		b, err := os.ReadFile(filepath.Join(dir, "schedstat"))
		if err != nil {
			continue // the thread ended
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			ns, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return s, fmt.Errorf("%s/schedstat: %w", dir, err)
			}
			s.CPU += time.Duration(ns)
		}
		v, err := statusField(filepath.Join(dir, "status"), "voluntary_ctxt_switches:")
		if err == nil {
			s.Switches += v
		}
	}
	kb, err := statusField(filepath.Join(base, "status"), "VmRSS:")
	if err != nil {
		return s, err
	}
	s.RSS = kb << 10
	return s, nil
}

// statusField reads the first number after name in a /proc status file.
func statusField(path, name string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name); ok {
			fs := strings.Fields(rest)
			if len(fs) == 0 {
				break
			}
			return strconv.ParseInt(fs[0], 10, 64)
		}
	}
	return 0, errors.New(path + ": no " + name)
}
