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

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/inotify"
)

// KubeletSocket is the kubelet's registration socket name in the plugin dir.
const KubeletSocket = "kubelet.sock"

// registerTimeout bounds one Register call.
const registerTimeout = 10 * time.Second

// SocketPath is the path of the plugin's socket.
func (p *Plugin) SocketPath() string { return filepath.Join(p.opts.Dir, p.opts.SocketName) }

// Run serves the plugin and keeps it registered until ctx is done:
// serve → register → watch. When the kubelet restarts it wipes the plugin
// directory and creates kubelet.sock again; both are seen through the
// directory's inotify stream and answered at once (a new socket if ours is
// gone, then Register). Registration runs beside the loop, so a kubelet
// that accepts the connection but hangs never keeps the loop from
// answering events. While registered, nothing wakes the loop but events.
// On return the socket is removed.
func (p *Plugin) Run(ctx context.Context) error {
	// Watch before serving, so no kubelet.sock event between the first
	// registration attempt and the watch is lost.
	w, err := inotify.Watch(ctx, inotify.EntryChanges, p.opts.Dir)
	if err != nil {
		return fmt.Errorf("watch %s: %w", p.opts.Dir, err)
	}
	defer w.Close()
	r := &runner{p: p, ctx: ctx, sock: p.SocketPath(), kubeletSock: filepath.Join(p.opts.Dir, KubeletSocket), retry: time.NewTimer(0)}
	r.retry.Stop()
	defer r.retry.Stop()
	for {
		if err := r.serve(); err != nil {
			return err
		}
		restart, err := r.loop(w)
		r.stop()
		if !restart {
			return err
		}
	}
}

// runner is Run's state, owned by its goroutine: one incarnation of the
// server at a time, the registration attempt beside it, and the kubelet
// we are registered with. Each event has its method.
type runner struct {
	p                 *Plugin
	ctx               context.Context
	sock, kubeletSock string

	srv        *server
	ourIno     fileID // our socket as this incarnation created it
	reg        *registrar
	registered bool
	kubeletIno fileID // the kubelet.sock we are registered with
	failures   int    // failed attempts since the last registration
	retry      *time.Timer
}

// serve starts an incarnation of the server and registers it.
func (r *runner) serve() error {
	srv, err := r.p.serve()
	if err != nil {
		return err
	}
	r.srv, r.ourIno = srv, inode(r.sock)
	r.reg = &registrar{p: r.p, sock: r.kubeletSock}
	r.registered = false
	r.reg.start(r.ctx)
	return nil
}

// stop ends the incarnation: the attempt, the server, its socket.
func (r *runner) stop() {
	r.retry.Stop()
	r.reg.stop()
	r.srv.stop(r.p.log)
	r.p.registered.Store(false)
}

// loop dispatches events until ctx is done (false, nil), the incarnation
// must be replaced (true) or the watch fails (false, its error).
func (r *runner) loop(w *inotify.Stream) (restart bool, err error) {
	for {
		select {
		case <-r.ctx.Done():
			return false, nil
		case reply := <-r.p.pings:
			close(reply)
		case err := <-r.srv.errc:
			r.p.log.WithError(err).Warn("gRPC server stopped; serving again")
			return true, nil
		case err := <-r.reg.done():
			r.registrationDone(err)
		case evs, ok := <-w.Events():
			if !ok {
				if err := w.Err(); err != nil {
					return false, fmt.Errorf("watching %s: %w", r.p.opts.Dir, err)
				}
				return false, nil
			}
			if r.dirChanged(evs) {
				return true, nil
			}
		case <-r.retry.C:
			if !r.registered && !r.reg.running() {
				r.reg.start(r.ctx)
			}
		}
	}
}

// registrationDone takes the result of a registration attempt.
func (r *runner) registrationDone(err error) {
	ino := r.reg.finish()
	p := r.p
	p.opts.Metrics.Registered(p.opts.ResourceName, err)
	p.registered.Store(err == nil)
	if err == nil {
		if !r.kubeletIno.none() && ino != r.kubeletIno {
			// Registered with another kubelet than before.
			p.opts.Metrics.KubeletRestart(p.opts.ResourceName)
		}
		r.registered, r.kubeletIno = true, ino
		if r.failures > 0 {
			p.log.WithField("attempts", r.failures+1).Info("registered after failed attempts")
		}
		r.failures = 0
		if p.opts.Registered != nil {
			p.opts.Registered()
		}
		return
	}
	l := p.log.WithError(err)
	if r.failures == 0 {
		l.Warn("registration failed; retrying when kubelet.sock appears")
	} else {
		l.Debug("registration failed again")
	}
	r.failures++
	// The kubelet.sock the attempt dialed refused us: try again later.
	// None now: its creation is the signal. Another one (created after the
	// attempt looked; its creation event was taken for the attempt): at
	// once.
	switch now := inode(r.kubeletSock); {
	case now.none():
	case now != ino:
		r.reg.start(r.ctx)
	default:
		r.retry.Reset(p.opts.RetryInterval)
	}
}

// dirChanged takes a batch of the plugin directory's events and reports
// whether our socket is gone. Events can be stale by the time they are
// read: it acts on what is on disk now, so one kubelet restart gives one
// new socket and one registration.
func (r *runner) dirChanged(evs []inotify.Event) (restart bool) {
	for _, ev := range evs {
		switch {
		case ev.Mask&unix.IN_Q_OVERFLOW != 0:
			// Events were lost: look at the disk.
			r.p.log.Warn("inotify queue overflow; checking the sockets")
			if _, err := os.Lstat(r.sock); err != nil {
				return true
			}
			r.kubeletSockAppeared()
		case ev.Name == r.p.opts.SocketName && ev.Mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0:
			if inode(r.sock) != r.ourIno || r.ourIno.none() {
				r.p.log.Info("our socket was removed (kubelet restart?); serving again")
				return true
			}
		case ev.Name == KubeletSocket && ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
			r.kubeletSockAppeared()
		}
	}
	return false
}

// kubeletSockAppeared registers with the kubelet.sock on disk unless an
// attempt under way dials it (or has not dialed yet: it will), or we are
// registered with it. One that dialed another kubelet cannot reach this
// one and is replaced.
func (r *runner) kubeletSockAppeared() {
	ino := inode(r.kubeletSock)
	if ino.none() || r.reg.targets(ino) || r.reg.targets(fileID{}) || (r.registered && ino == r.kubeletIno) {
		return
	}
	r.p.log.Info("kubelet.sock created; registering again")
	r.registered = false
	r.p.registered.Store(false)
	r.retry.Stop()
	r.reg.start(r.ctx)
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
	// replacement's preparation of the same device. Calls run on
	// streamWorkers goroutines that stay (Stop ends them), not on a new
	// goroutine each, which grew its stack call after call.
	s := &server{grpc: grpc.NewServer(grpc.ForceServerCodecV2(wireCodec{}), grpc.WaitForHandlers(true),
		grpc.NumStreamWorkers(streamWorkers)), sock: sock, done: make(chan struct{}), errc: make(chan error, 1)}
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

// streamWorkers is how many calls the server runs on goroutines it keeps:
// ListAndWatch holds one for as long as the kubelet watches, a
// PreStartContainer one while it prepares; a call beyond them gets a
// goroutine of its own, as every call did before. A new goroutine starts
// with a small stack and grows it by copying as the call goes deeper:
// under a stream of Allocate calls that copying was 7% of the plugin's
// CPU; on kept goroutines the same calls take 14% less CPU, and
// Allocate's round trip is 6-14% shorter (cmd/dp-bench). gRPC marks
// NumStreamWorkers experimental; should it go, so does this.
const streamWorkers = 4

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
