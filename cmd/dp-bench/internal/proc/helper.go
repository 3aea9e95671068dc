package proc

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// HelperEnv names the variable that makes dp-bench (or a test binary of
// its packages) the helper: its main calls RunHelper with the variable's
// value before anything else.
const HelperEnv = "DP_BENCH_HELPER"

// helperSpec is what the helper execs, passed as JSON in HelperEnv.
type helperSpec struct {
	// Mode: "exec" runs Argv; "exit" exits at once; "sleep" blocks until
	// SIGTERM (the last two are the baselines, reached through "exec").
	Mode  string   `json:"mode"`
	Argv  []string `json:"argv,omitempty"`
	Env   []string `json:"env,omitempty"`
	Binds []Bind   `json:"binds,omitempty"`
	// Scratch is an empty directory for the overlays' upper layers.
	Scratch string `json:"scratch,omitempty"`
}

// Bind mounts Src (a host directory) at Dst as the plugin sees it.
type Bind struct{ Src, Dst string }

// RunHelper runs the helper mode named by raw (HelperEnv's value) and
// returns the exit status (it returns only on failure in "exec" mode).
func RunHelper(raw string) int {
	var s helperSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fmt.Fprintln(os.Stderr, "dp-bench helper:", err)
		return 127
	}
	switch s.Mode {
	case "exit":
		return 0
	case "sleep":
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
		<-ch
		return 0
	case "exec":
		err := helperExec(s)
		fmt.Fprintln(os.Stderr, "dp-bench helper:", err)
		return 127
	}
	fmt.Fprintf(os.Stderr, "dp-bench helper: unknown mode %q\n", s.Mode)
	return 127
}

func helperExec(s helperSpec) error {
	if len(s.Argv) == 0 {
		return errors.New("no command")
	}
	if len(s.Binds) > 0 {
		// The namespace is new (CLONE_NEWNS); nothing done here reaches
		// the host's mounts.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make / private: %w", err)
		}
		if err := unix.Mount("tmpfs", s.Scratch, "tmpfs", 0, "mode=0700"); err != nil {
			return fmt.Errorf("scratch tmpfs: %w", err)
		}
		for i, b := range s.Binds {
			if err := mountAt(b, filepath.Join(s.Scratch, fmt.Sprint(i))); err != nil {
				return err
			}
		}
	}
	path, err := exec.LookPath(s.Argv[0])
	if err != nil {
		return err
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return err
	}
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(ts.Nano()))
	f := os.NewFile(3, "start")
	if _, err := f.Write(buf[:]); err != nil {
		return fmt.Errorf("start pipe: %w", err)
	}
	_ = f.Close()
	return unix.Exec(path, s.Argv, s.Env)
}

// mountAt bind-mounts b.Src at b.Dst. A Dst that does not exist is made in
// an overlay over its deepest existing ancestor (upper layer in scratch),
// so the host's directory is neither changed nor hidden; mounts below that
// ancestor are not seen through the overlay.
func mountAt(b Bind, scratch string) error {
	if _, err := os.Stat(b.Dst); err != nil {
		anc := filepath.Dir(b.Dst)
		for {
			if _, err := os.Stat(anc); err == nil || anc == "/" {
				break
			}
			anc = filepath.Dir(anc)
		}
		if anc == "/" {
			return fmt.Errorf("bind %s: refusing to put an overlay over /", b.Dst)
		}
		upper, work := filepath.Join(scratch, "upper"), filepath.Join(scratch, "work")
		for _, d := range []string{upper, work} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", anc, upper, work)
		if err := unix.Mount("overlay", anc, "overlay", 0, opts); err != nil {
			return fmt.Errorf("overlay over %s: %w", anc, err)
		}
		if err := os.MkdirAll(b.Dst, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount(b.Src, b.Dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", b.Src, b.Dst, err)
	}
	return nil
}
