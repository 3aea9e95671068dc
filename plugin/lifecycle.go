package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/sirupsen/logrus"
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
// and answered at once (a new socket if ours is gone, then Register).
// Registration runs beside the loop, so a kubelet that accepts the
// connection but hangs never keeps the loop from answering events. While
// registered, nothing wakes the loop but events. On return the socket is
// removed.
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
	var (
		kubeletIno fileID // the kubelet.sock we are registered with
		failures   int    // failed attempts since the last registration
	)
	for {
		srv, err := p.serve()
		if err != nil {
			return err
		}
		ourIno := inode(sock)
		reg := &registrar{p: p, sock: kubeletSock}
		reg.start(ctx)
		registered := false
		retry := time.NewTimer(0)
		retry.Stop()
		restart := false
		for !restart {
			select {
			case <-ctx.Done():
				retry.Stop()
				reg.stop()
				srv.stop(p.log)
				p.registered.Store(false)
				return nil
			case reply := <-p.pings:
				close(reply)
			case err := <-srv.errc:
				p.log.WithError(err).Warn("gRPC server stopped; serving again")
				restart = true
			case err := <-reg.done():
				ino := reg.finish()
				p.opts.Metrics.Registered(p.opts.ResourceName, err)
				p.registered.Store(err == nil)
				if err == nil {
					if !kubeletIno.none() && ino != kubeletIno {
						// Registered with another kubelet than before.
						p.opts.Metrics.KubeletRestart(p.opts.ResourceName)
					}
					registered, kubeletIno = true, ino
					if failures > 0 {
						p.log.WithField("attempts", failures+1).Info("registered after failed attempts")
					}
					failures = 0
					break
				}
				l := p.log.WithError(err)
				if failures == 0 {
					l.Warn("registration failed; retrying when kubelet.sock appears")
				} else {
					l.Debug("registration failed again")
				}
				failures++
				// The kubelet.sock the attempt dialed refused us: try
				// again later. None now: its creation is the signal.
				// Another one (created after the attempt looked; its
				// creation event was taken for the attempt): at once.
				switch now := inode(kubeletSock); {
				case now.none():
				case now != ino:
					reg.start(ctx)
				default:
					retry.Reset(p.opts.RetryInterval)
				}
			case ev, ok := <-w.Events:
				if !ok {
					reg.stop()
					srv.stop(p.log)
					return errors.New("fsnotify watcher closed")
				}
				// Events can be stale by the time they are read: act on
				// what is on disk now, so one kubelet restart gives one
				// new socket and one registration.
				switch {
				case ev.Name == sock && ev.Has(fsnotify.Remove|fsnotify.Rename):
					if inode(sock) != ourIno || ourIno.none() {
						p.log.Info("our socket was removed (kubelet restart?); serving again")
						restart = true
					}
				case ev.Name == kubeletSock && ev.Has(fsnotify.Create):
					// An attempt that has not dialed yet dials this one
					// (or fails for want of it, and is started again
					// when it reports); one that dialed another kubelet
					// cannot reach this one and is replaced.
					ino := inode(kubeletSock)
					if ino.none() || reg.targets(ino) || reg.targets(fileID{}) || (registered && ino == kubeletIno) {
						break
					}
					p.log.Info("kubelet.sock created; registering again")
					registered = false
					p.registered.Store(false)
					retry.Stop()
					reg.start(ctx)
				}
			case err := <-w.Errors:
				// An overflow may have hidden events: look at the disk.
				p.log.WithError(err).Warn("fsnotify error; checking the sockets")
				if _, err := os.Lstat(sock); err != nil {
					restart = true
				} else if ino := inode(kubeletSock); !ino.none() && !reg.targets(ino) && (!registered || ino != kubeletIno) {
					reg.start(ctx)
				}
			case <-retry.C:
				if !registered && !reg.running() {
					reg.start(ctx)
				}
			}
		}
		retry.Stop()
		reg.stop()
		srv.stop(p.log)
		p.registered.Store(false)
	}
}

// registrar runs one registration attempt at a time, beside Run's loop
// (which alone calls its methods).
type registrar struct {
	p    *Plugin
	sock string
	cur  *attempt
}

type attempt struct {
	dialed atomic.Pointer[fileID] // the kubelet.sock it dialed last; nil: none yet
	cancel context.CancelFunc
	errc   chan error    // its result
	done   chan struct{} // closed when its goroutine has returned
}

// start cancels the attempt under way, if any, and starts a new one.
func (r *registrar) start(ctx context.Context) {
	r.stop()
	actx, cancel := context.WithCancel(ctx)
	a := &attempt{cancel: cancel, errc: make(chan error, 1), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.errc <- r.p.registerSoon(actx, func(ino fileID) { a.dialed.Store(&ino) })
	}()
	r.cur = a
}

// done is the channel the current attempt reports on (nil: none).
func (r *registrar) done() <-chan error {
	if r.cur == nil {
		return nil
	}
	return r.cur.errc
}

// finish forgets the attempt whose result was received from done and
// returns the kubelet.sock it dialed last (none: it found none).
func (r *registrar) finish() fileID {
	ino := r.cur.ino()
	r.cur.cancel()
	r.cur = nil
	return ino
}

// ino is the kubelet.sock the attempt dialed last; none before it dials.
func (a *attempt) ino() fileID {
	if p := a.dialed.Load(); p != nil {
		return *p
	}
	return fileID{}
}

func (r *registrar) running() bool { return r.cur != nil }

// targets reports whether the attempt under way dialed the kubelet.sock
// ino (none: it has not dialed yet).
func (r *registrar) targets(ino fileID) bool { return r.cur != nil && r.cur.ino() == ino }

// stop cancels the attempt under way and waits for it.
func (r *registrar) stop() {
	if r.cur == nil {
		return
	}
	r.cur.cancel()
	<-r.cur.done
	r.cur = nil
}

// server is one incarnation of the gRPC server on our socket.
type server struct {
	grpc *grpc.Server
	sock string
	done chan struct{}
	errc chan error
	wg   sync.WaitGroup
}

// stop ends the streams, stops serving, waits for the handlers and the
// serving goroutine, and removes the socket.
func (s *server) stop(log *logrus.Entry) {
	close(s.done) // ends ListAndWatch streams, so Stop does not wait on them
	s.grpc.Stop()
	s.wg.Wait()
	if err := os.Remove(s.sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.WithError(err).Warn("removing socket")
	}
}

// serve listens on our socket (replacing a stale file) and serves in the
// background. The kubelet requires the socket to be served before Register.
func (p *Plugin) serve() (*server, error) {
	sock := p.SocketPath()
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	// Only the kubelet (root) connects. The directory is the kubelet's,
	// 0750 or narrower, so the moment before this chmod exposes nothing.
	// A socket removed meanwhile (a kubelet restart wiping the directory)
	// is no error: its removal is seen and it is served again.
	if err := os.Chmod(sock, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
		_ = lis.Close()
		return nil, fmt.Errorf("socket mode: %w", err)
	}
	// The codec sends ListAndWatch's pre-encoded lists as they are.
	// Stop waits for the handlers: a PreStartContainer in flight (its
	// context cancelled by Stop, its steps bounded by their budget) ends
	// before the server is gone, so none outlives it and overlaps the
	// replacement's preparation of the same device.
	s := &server{grpc: grpc.NewServer(grpc.ForceServerCodecV2(wireCodec{}), grpc.WaitForHandlers(true)), sock: sock, done: make(chan struct{}), errc: make(chan error, 1)}
	pluginapi.RegisterDevicePluginServer(s.grpc, &handler{p: p, stop: s.done})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.grpc.Serve(lis); err != nil {
			s.errc <- err
		}
	}()
	p.log.WithField("socket", sock).Debug("serving")
	p.removeDeadSockets()
	return s, nil
}

// removeDeadSockets removes the sockets of this resource that earlier runs
// of the plugin left when they were killed: nobody accepts connections on
// them. A live one (another instance during a rolling update) is kept.
func (p *Plugin) removeDeadSockets() {
	prefix := socketPrefix(p.opts.PluginName, p.opts.ResourceName)
	entries, err := os.ReadDir(p.opts.Dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if e.Type() != fs.ModeSocket || name == p.opts.SocketName || !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, ".sock") {
			continue
		}
		path := filepath.Join(p.opts.Dir, name)
		conn, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			_ = conn.Close()
			continue
		}
		if !errors.Is(err, unix.ECONNREFUSED) {
			continue
		}
		if err := os.Remove(path); err == nil {
			p.log.WithField("socket", name).Info("removed the socket of a plugin run that was killed")
		}
	}
}

// handler serves the device plugin API for one incarnation of the server:
// its ListAndWatch streams end when that incarnation stops.
type handler struct {
	pluginapi.UnimplementedDevicePluginServer
	p    *Plugin
	stop <-chan struct{}
}

func (h *handler) GetDevicePluginOptions(ctx context.Context, e *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return h.p.GetDevicePluginOptions(ctx, e)
}

func (h *handler) ListAndWatch(_ *pluginapi.Empty, st pluginapi.DevicePlugin_ListAndWatchServer) error {
	return h.p.listAndWatch(st, h.stop)
}

func (h *handler) Allocate(ctx context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	return h.p.Allocate(ctx, r)
}

func (h *handler) GetPreferredAllocation(ctx context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return h.p.GetPreferredAllocation(ctx, r)
}

func (h *handler) PreStartContainer(ctx context.Context, r *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return h.p.PreStartContainer(ctx, r)
}

// registerSoon registers, retrying quickly for about a second: a
// kubelet.sock that was just created may not accept connections yet.
// dialing is told which kubelet.sock each try dials.
func (p *Plugin) registerSoon(ctx context.Context, dialing func(fileID)) error {
	kubeletSock := filepath.Join(p.opts.Dir, KubeletSocket)
	if _, err := os.Stat(kubeletSock); err != nil {
		return fmt.Errorf("register: %w", err)
	}
	var err error
	for delay := 5 * time.Millisecond; delay < time.Second; delay *= 2 {
		dialing(inode(kubeletSock))
		if err = p.register(ctx); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
	}
	return err
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

// fileID tells one file from another that replaced it at the same path:
// an inode number alone can be reused at once (a kubelet restart removes
// kubelet.sock and creates a new one, often with the same number).
type fileID struct {
	ino   uint64
	ctime unix.Timespec
}

func (f fileID) none() bool { return f == fileID{} }

// inode identifies the file at p, the zero fileID when it does not exist.
func inode(p string) fileID {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return fileID{}
	}
	return fileID{ino: st.Ino, ctime: st.Ctim}
}
