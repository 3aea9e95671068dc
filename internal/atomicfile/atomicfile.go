// Package atomicfile replaces files so that a reader sees the old content
// or the new one, never a part, and never the new one with another mode;
// and so that the new content survives a crash once Write returns.
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// tag is in the name of every temp file this process makes: its pid and
// start time, since a plugin in a container is pid 1 in every run.
var tag = strconv.Itoa(os.Getpid()) + "." + strconv.FormatInt(time.Now().UnixNano(), 36)

// Tag marks the temp names of this process (see RemoveStaleTemps). Code
// that makes temp files by other means than Write puts it in their names.
func Tag() string { return tag }

// TempName is the temp file name for path of this process, for a caller
// that creates it itself (a device node). It matches TempPattern(path).
func TempName(path string) string { return tempPrefix(path) + tag }

// tempPrefix is what the names of path's temp files begin with.
func tempPrefix(path string) string {
	return filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
}

// Write replaces path with what fill writes to f: a temp file in the same
// directory, given mode, synced, renamed over path, then the directory
// synced. fill may read f back (by f.Name()) to check it. On any error the
// temp file is removed and path is untouched.
func Write(path string, mode os.FileMode, fill func(f *os.File) error) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(TempName(path))+"-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	err = f.Chmod(mode) // before any byte is visible under path
	if err == nil {
		err = fill(f)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// WriteBytes replaces path with data (see Write).
func WriteBytes(path string, data []byte, mode os.FileMode) error {
	return Write(path, mode, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
}

// SyncDir makes the entries of dir durable (a rename, a new file).
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// TempPattern is the glob of the temp files that Write makes for path.
func TempPattern(path string) string {
	return tempPrefix(path) + "*"
}

// RemoveStaleTemps removes the files (or directories) matching pattern (a
// TempPattern, or a glob of them) that another process made: what a run
// killed mid-write left. This process's own, which carry Tag, may be
// writes in flight and are left alone; time stamps cannot tell them apart
// (the kernel's file clock lags time.Now by up to a tick). Only one plugin
// runs on a node's directories at a time. It returns what it removed.
func RemoveStaleTemps(pattern string) ([]string, error) {
	matches, err := filepath.Glob(pattern)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, p := range matches {
		if strings.Contains(filepath.Base(p), tag) {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}
