package device

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
)

// ErrEscape is returned for a path that would leave the dev root.
var ErrEscape = errors.New("path escapes the dev root")

// nodeMode is the permission of created nodes: any container user may open
// the device it was given.
const nodeMode = 0o666

// inRoot joins rel to root and checks, without following symlinks, that
// every existing parent below root is a real directory. rel must already be
// validated (config.ValidateRelPath).
func inRoot(root, rel string) (string, error) {
	p := filepath.Join(root, rel)
	if !strings.HasPrefix(p, root+string(os.PathSeparator)) {
		return "", fmt.Errorf("%q: %w", rel, ErrEscape)
	}
	dir := root
	parts := strings.Split(filepath.Dir(rel), string(os.PathSeparator))
	for _, comp := range parts {
		if comp == "." {
			continue
		}
		dir = filepath.Join(dir, comp)
		fi, err := os.Lstat(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		if !fi.IsDir() {
			return "", fmt.Errorf("%q is not a directory (symlinks are not followed): %w", dir, ErrEscape)
		}
	}
	return p, nil
}

// nodeOps makes and looks at device nodes: the system calls, or in tests
// that need no root a stand-in that keeps nodes as regular files (see
// fakeNodes in the tests). Every node the package makes or reads goes
// through it.
var nodeOps = struct {
	mknod       func(path string, mode uint32, dev int) error
	lstat, stat func(path string, st *unix.Stat_t) error
}{unix.Mknod, unix.Lstat, unix.Stat}

// nodeStatus inspects the node at p without following symlinks and says why
// it is not the wanted node (none when it is).
func nodeStatus(p string, t NodeType, major, minor uint32) Problem {
	var st unix.Stat_t
	if err := nodeOps.lstat(p, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return Problem{Cause: CauseMissing}
		}
		return Problem{Cause: CauseNodeError, Message: err.Error()}
	}
	got, ok := nodeType(st.Mode)
	if !ok {
		return Problem{Cause: CauseWrongNode, Message: "not a device node"}
	}
	gotMajor, gotMinor := unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev))
	if got != t || gotMajor != major || gotMinor != minor {
		return Problemf(CauseWrongNode, "is %s %d:%d, want %s %d:%d", got, gotMajor, gotMinor, t, major, minor)
	}
	return Problem{}
}

// EnsureNode makes root/rel a device node of type t and major:minor. A
// correct node is kept; anything else (wrong type or numbers, a symlink, a
// file) is replaced atomically by a rename over it. It reports whether it
// wrote anything.
func EnsureNode(root, rel string, t NodeType, major, minor uint32) (bool, error) {
	p, err := inRoot(root, rel)
	if err != nil {
		return false, err
	}
	status := nodeStatus(p, t, major, minor)
	if status.None() {
		return false, nil
	}
	if err := mkdirInRoot(root, filepath.Dir(rel)); err != nil {
		return false, err
	}
	mode := uint32(unix.S_IFCHR)
	if t == Block {
		mode = unix.S_IFBLK
	}
	if status.Cause == CauseMissing {
		// Nothing to replace: create it in place (nobody uses it before
		// the spec names it), then give it the mode we promise (mknod
		// honours the umask).
		if err := nodeOps.mknod(p, mode|nodeMode, int(unix.Mkdev(major, minor))); err != nil && !errors.Is(err, unix.EEXIST) {
			return false, fmt.Errorf("mknod %s: %w", p, err)
		} else if err == nil {
			if err := unix.Chmod(p, nodeMode); err != nil {
				return false, fmt.Errorf("chmod %s: %w", p, err)
			}
			return true, nil
		}
		// Created by someone else meanwhile: check and replace it below.
		if nodeStatus(p, t, major, minor).None() {
			return false, nil
		}
	}
	tmp := atomicfile.TempName(p)
	_ = os.Remove(tmp)
	if err := nodeOps.mknod(tmp, mode|nodeMode, int(unix.Mkdev(major, minor))); err != nil {
		return false, fmt.Errorf("mknod %s: %w", tmp, err)
	}
	// mknod honours the umask; set the mode we promise.
	if err := unix.Chmod(tmp, nodeMode); err != nil {
		_ = os.Remove(tmp)
		return false, fmt.Errorf("chmod %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		_ = os.Remove(tmp)
		return false, fmt.Errorf("rename %s: %w", p, err)
	}
	return true, nil
}

// mkdirInRoot creates the directories of rel under root, refusing symlinks.
func mkdirInRoot(root, rel string) error {
	if rel == "." {
		return nil
	}
	dir := root
	for _, comp := range strings.Split(rel, string(os.PathSeparator)) {
		dir = filepath.Join(dir, comp)
		fi, err := os.Lstat(dir)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
		case err != nil:
			return err
		case !fi.IsDir():
			return fmt.Errorf("%q is not a directory: %w", dir, ErrEscape)
		}
	}
	return nil
}

// hostNode stats a host device node at p. Symlinks are followed, but the
// target must stay inside root.
func hostNode(root, p string) (NodeType, uint32, uint32, error) {
	target, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", 0, 0, err
	}
	if !strings.HasPrefix(target, root+string(os.PathSeparator)) {
		return "", 0, 0, fmt.Errorf("%q resolves to %q: %w", p, target, ErrEscape)
	}
	var st unix.Stat_t
	if err := nodeOps.stat(target, &st); err != nil {
		return "", 0, 0, err
	}
	t, ok := nodeType(st.Mode)
	if !ok {
		return "", 0, 0, fmt.Errorf("%q is not a device node", p)
	}
	return t, unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)), nil
}

// nodeType is the device type of a stat mode; false for non-devices.
func nodeType(mode uint32) (NodeType, bool) {
	switch mode & unix.S_IFMT {
	case unix.S_IFCHR:
		return Char, true
	case unix.S_IFBLK:
		return Block, true
	}
	return "", false
}
