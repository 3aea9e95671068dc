package kubeletsim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Errors of PluginWatcher.Await: the driver's process ended before it
// registered, or no driver registered in time.
var (
	ErrExited        = errors.New("the driver exited before it registered")
	ErrNotRegistered = errors.New("no accepted registration")
)

// PluginWatcher says how Await looks for a driver's registration socket.
type PluginWatcher struct {
	// Connect bounds each registration attempt.
	Connect time.Duration
	// Poll is how often the directory is read again; with Inotify it is
	// read again at once, too, when an entry appears in it (one inotify
	// instance while Await waits).
	Poll    time.Duration
	Inotify bool
	// Exited is closed when the driver's process ends (nil: not watched).
	Exited <-chan struct{}
	// Skip is a socket not to register through: that of the instance a
	// new one replaces, which serves until the new one registered (a
	// rolling update with a surge).
	Skip string
}

// Await registers the DRA driver that serves a registration socket in
// dir, as the kubelet's plugin watcher does: it tries every socket in dir
// (RegisterDRA), at once and again at every poll, until one registers or
// is refused (ErrRefused), Exited is closed (ErrExited), timeout passes
// (ErrNotRegistered, with the last attempt's error) or ctx is done. The
// kubelet tries again within a second; Await as often as it is told, so
// that the time to a registration is the driver's. It returns the driver
// and the socket it registered through.
func (w PluginWatcher) Await(ctx context.Context, dir string, timeout time.Duration) (*DRA, string, error) {
	var changes <-chan fsnotify.Event
	var watchErrs <-chan error
	if w.Inotify {
		fw, err := fsnotify.NewWatcher()
		if err != nil {
			return nil, "", err
		}
		defer fw.Close()
		if err := fw.Add(dir); err != nil {
			return nil, "", err
		}
		changes, watchErrs = fw.Events, fw.Errors
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var last error
	for {
		for _, sock := range sockets(dir) {
			if sock == w.Skip {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, w.Connect)
			d, err := RegisterDRA(cctx, sock)
			cancel()
			switch {
			case err == nil:
				return d, sock, nil
			case errors.Is(err, ErrRefused):
				return nil, sock, err
			}
			last = err
		}
		select {
		case <-changes:
		case err := <-watchErrs:
			return nil, "", err
		case <-time.After(w.Poll): // a socket made, not served yet
		case <-w.Exited:
			return nil, "", ErrExited
		case <-deadline.C:
			if last == nil {
				return nil, "", fmt.Errorf("%w within %s", ErrNotRegistered, timeout)
			}
			return nil, "", fmt.Errorf("%w within %s (last: %w)", ErrNotRegistered, timeout, last)
		case <-ctx.Done():
			return nil, "", ctx.Err()
		}
	}
}

// sockets are the unix sockets in dir.
func sockets(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if e.Type()&os.ModeSocket != 0 {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}
