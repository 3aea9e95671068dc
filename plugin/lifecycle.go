package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// KubeletSocket is the kubelet's registration socket name in the plugin dir.
const KubeletSocket = "kubelet.sock"

// registerTimeout bounds one Register call.
const registerTimeout = 10 * time.Second

// SocketPath is the path of the plugin's socket.
func (p *Plugin) SocketPath() string { return filepath.Join(p.opts.Dir, p.opts.SocketName) }

// Run serves the plugin and keeps it registered until ctx is done:
// serve → register → watch. When the kubelet restarts it wipes the plugin
// directory and creates kubelet.sock again; both are seen through fsnotify
// and answered at once (a new socket if ours is gone, then Register). On
// return the socket is removed.
func (p *Plugin) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("fsnotify: %w", err)
	}
	defer w.Close()
	// Watch before serving, so no kubelet.sock event between the first
	// registration attempt and the watch is lost.
	if err := w.Add(p.opts.Dir); err != nil {
		return fmt.Errorf("watch %s: %w", p.opts.Dir, err)
	}
	sock := p.SocketPath()
	kubeletSock := filepath.Join(p.opts.Dir, KubeletSocket)
	for {
		srv, serveErr, err := p.serve()
		if err != nil {
			return err
		}
		stopServer := func() {
			srv.stop()
			if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
				p.log.WithError(err).Warn("removing socket")
			}
		}
		ourIno := inode(sock)
		registered := p.registerSoon(ctx) == nil
		retry := time.NewTimer(p.opts.RetryInterval)
		restart := false
		for !restart {
			select {
			case <-ctx.Done():
				retry.Stop()
				stopServer()
				return nil
			case err := <-serveErr:
				p.log.WithError(err).Warn("gRPC server stopped; serving again")
				restart = true
			case ev, ok := <-w.Events:
				if !ok {
					stopServer()
					return errors.New("fsnotify watcher closed")
				}
				// Events can be stale by the time they are read: act on
				// what is on disk now, so one kubelet restart gives one
				// new socket and one registration.
				switch {
				case ev.Name == sock && ev.Has(fsnotify.Remove|fsnotify.Rename):
					if inode(sock) != ourIno || ourIno == 0 {
						p.log.Info("our socket was removed (kubelet restart?); serving again")
						restart = true
					}
				case ev.Name == kubeletSock && ev.Has(fsnotify.Create):
					if ino := inode(kubeletSock); ino != 0 && (!registered || ino != p.kubeletIno) {
						p.log.Info("kubelet.sock created; registering again")
						registered = p.registerSoon(ctx) == nil
					}
				}
			case err := <-w.Errors:
				p.log.WithError(err).Warn("fsnotify error")
			case <-retry.C:
				// A safety net for missed events: re-check the socket and
				// retry a failed registration.
				if _, err := os.Lstat(sock); err != nil {
					restart = true
					break
				}
				if !registered {
					registered = p.registerSoon(ctx) == nil
				}
				retry.Reset(p.opts.RetryInterval)
			}
		}
		retry.Stop()
		stopServer()
	}
}

// server is one incarnation of the gRPC server on our socket.
type server struct {
	grpc *grpc.Server
	done chan struct{}
}

func (s *server) stop() {
	close(s.done) // ends ListAndWatch streams, so Stop does not wait on them
	s.grpc.Stop()
}

// serve listens on our socket (replacing a stale file) and serves in the
// background. The kubelet requires the socket to be served before Register.
func (p *Plugin) serve() (*server, <-chan error, error) {
	sock := p.SocketPath()
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("remove stale socket: %w", err)
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	s := &server{grpc: grpc.NewServer(), done: make(chan struct{})}
	pluginapi.RegisterDevicePluginServer(s.grpc, &stream{Plugin: p, done: s.done})
	errc := make(chan error, 1)
	go func() {
		if err := s.grpc.Serve(lis); err != nil {
			errc <- err
		}
	}()
	p.log.WithField("socket", sock).Debug("serving")
	return s, errc, nil
}

// stream binds ListAndWatch to one server incarnation.
type stream struct {
	*Plugin
	done chan struct{}
}

func (s *stream) ListAndWatch(_ *pluginapi.Empty, st pluginapi.DevicePlugin_ListAndWatchServer) error {
	return s.listAndWatch(st, s.done)
}

// registerSoon registers, retrying quickly for about a second: a
// kubelet.sock that was just created may not accept connections yet.
func (p *Plugin) registerSoon(ctx context.Context) error {
	kubeletSock := filepath.Join(p.opts.Dir, KubeletSocket)
	if _, err := os.Stat(kubeletSock); err != nil {
		return p.registerFailed(fmt.Errorf("register: %w", err))
	}
	var err error
	for delay := 5 * time.Millisecond; delay < time.Second; delay *= 2 {
		ino := inode(kubeletSock)
		if err = p.register(ctx); err == nil {
			p.kubeletIno = ino
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
	}
	return p.registerFailed(err)
}

// register tells the kubelet about our socket.
func (p *Plugin) register(ctx context.Context) error {
	kubeletSock := filepath.Join(p.opts.Dir, KubeletSocket)
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.opts.SocketName,
		ResourceName: p.opts.ResourceName,
		Options:      p.options(),
	})
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	p.log.WithField("socket", p.opts.SocketName).Info("registered with the kubelet")
	return nil
}

func (p *Plugin) registerFailed(err error) error {
	p.log.WithError(err).Warn("registration failed; will retry when kubelet.sock appears")
	return err
}

// inode returns the inode number of p, 0 when it does not exist.
func inode(p string) uint64 {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return 0
	}
	return st.Ino
}
