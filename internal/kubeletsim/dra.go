package kubeletsim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// DRA is a DRA driver as the kubelet sees it: registered through its
// registration socket, then called on the endpoint it named.
type DRA struct {
	// Info is the driver's answer to GetInfo.
	Info *registerapi.PluginInfo
	// Node calls NodePrepareResources and NodeUnprepareResources, Health
	// NodeWatchResources, on the driver's endpoint.
	Node   drav1.DRAPluginClient
	Health drahealthv1.DRAResourceHealthClient
	conn   *grpc.ClientConn
}

// ErrRefused is returned by RegisterDRA for a driver the kubelet would
// refuse; other errors are those of the calls (a socket not served yet).
var ErrRefused = errors.New("registration refused")

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
			return nil, "", fmt.Errorf("%w within %s (last: %v)", ErrNotRegistered, timeout, last)
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

// RegisterDRA registers the driver serving the registration socket sock
// as the kubelet's plugin watcher and DRA manager do: GetInfo must name a
// DRA plugin that offers the v1 DRA service; the registration is then
// confirmed (NotifyRegistrationStatus) and the endpoint dialled.
func RegisterDRA(ctx context.Context, sock string) (*DRA, error) {
	rc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	reg := registerapi.NewRegistrationClient(rc)
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetInfo on %s: %w", sock, err)
	}
	var refused error
	switch {
	case info.Type != registerapi.DRAPlugin:
		refused = fmt.Errorf("plugin type %q, want %q", info.Type, registerapi.DRAPlugin)
	case !slices.Contains(info.SupportedVersions, drav1.DRAPluginService):
		refused = fmt.Errorf("services %v lack %s", info.SupportedVersions, drav1.DRAPluginService)
	case info.Endpoint == "":
		refused = errors.New("no endpoint")
	}
	status := &registerapi.RegistrationStatus{PluginRegistered: refused == nil}
	if refused != nil {
		status.Error = refused.Error()
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, status); err != nil {
		return nil, fmt.Errorf("NotifyRegistrationStatus on %s: %w", sock, err)
	}
	if refused != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrRefused, info.Name, refused)
	}
	conn, err := grpc.NewClient("unix://"+info.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &DRA{Info: info, Node: drav1.NewDRAPluginClient(conn), Health: drahealthv1.NewDRAResourceHealthClient(conn), conn: conn}, nil
}

// Close closes the connection to the endpoint.
func (c *DRA) Close() error { return c.conn.Close() }

// Prepare asks the driver to prepare claims, as the kubelet does for a
// pod's claims of one driver.
func (c *DRA) Prepare(ctx context.Context, claims ...*drav1.Claim) (*drav1.NodePrepareResourcesResponse, error) {
	return c.Node.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: claims})
}

// Unprepare asks the driver to unprepare claims.
func (c *DRA) Unprepare(ctx context.Context, claims ...*drav1.Claim) (*drav1.NodeUnprepareResourcesResponse, error) {
	return c.Node.NodeUnprepareResources(ctx, &drav1.NodeUnprepareResourcesRequest{Claims: claims})
}
