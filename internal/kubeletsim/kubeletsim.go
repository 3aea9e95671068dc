// Package kubeletsim is a kubelet stand-in for tests and the bench tool: it
// serves the Registration service on <dir>/kubelet.sock over a real unix
// socket, records registrations, and talks to plugins the way the kubelet's
// device manager does (ListAndWatch, Allocate, GetPreferredAllocation). A
// restart wipes the directory as the kubelet does.
package kubeletsim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Registration is one Register call as the kubelet saw it.
type Registration struct {
	At      time.Time
	Request *pluginapi.RegisterRequest
}

// Kubelet serves the registration socket.
type Kubelet struct {
	pluginapi.UnimplementedRegistrationServer

	dir string
	// Regs receives accepted registrations (64 buffered; more are dropped).
	Regs chan Registration

	mu  sync.Mutex
	srv *grpc.Server
}

// Start serves <dir>/kubelet.sock.
func Start(dir string) (*Kubelet, error) {
	k := &Kubelet{dir: dir, Regs: make(chan Registration, 64)}
	if err := k.start(); err != nil {
		return nil, err
	}
	return k, nil
}

// Socket is the kubelet.sock path.
func (k *Kubelet) Socket() string { return filepath.Join(k.dir, "kubelet.sock") }

func (k *Kubelet) start() error {
	_ = os.Remove(k.Socket())
	lis, err := net.Listen("unix", k.Socket())
	if err != nil {
		return err
	}
	// A Serve that starts after Stop closes the listener; closing must
	// not unlink the path, which a restart has given to the next socket.
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	k.mu.Lock()
	k.srv = srv
	k.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
	return nil
}

// Register validates like the kubelet (version, endpoint inside the dir,
// the endpoint served) and records the call.
func (k *Kubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if r.Version != pluginapi.Version {
		return nil, fmt.Errorf("unsupported version %q", r.Version)
	}
	if r.Endpoint == "" || filepath.Base(r.Endpoint) != r.Endpoint {
		return nil, fmt.Errorf("bad endpoint %q", r.Endpoint)
	}
	if _, err := os.Stat(filepath.Join(k.dir, r.Endpoint)); err != nil {
		return nil, fmt.Errorf("endpoint not served: %w", err)
	}
	select {
	case k.Regs <- Registration{At: time.Now(), Request: r}:
	default:
	}
	return &pluginapi.Empty{}, nil
}

// Stop stops serving and removes kubelet.sock.
func (k *Kubelet) Stop() {
	k.mu.Lock()
	srv := k.srv
	k.srv = nil
	k.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
	_ = os.Remove(k.Socket())
}

// Restart does what a kubelet restart does to the plugin directory: stop,
// remove every file in it (plugin sockets included), then serve
// kubelet.sock again. It returns the time kubelet.sock was served again.
func (k *Kubelet) Restart() (time.Time, error) {
	k.Stop()
	entries, err := os.ReadDir(k.dir)
	if err != nil {
		return time.Time{}, err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(k.dir, e.Name())); err != nil {
			return time.Time{}, err
		}
	}
	t := time.Now()
	return t, k.start()
}

// WaitRegistration returns the next registration or an error after timeout.
func (k *Kubelet) WaitRegistration(timeout time.Duration) (Registration, error) {
	select {
	case r := <-k.Regs:
		return r, nil
	case <-time.After(timeout):
		return Registration{}, errors.New("no registration within " + timeout.String())
	}
}

// Client talks to one plugin's socket as the device manager does.
type Client struct {
	conn *grpc.ClientConn
	pluginapi.DevicePluginClient
}

// Dial connects to the plugin endpoint in dir.
func Dial(dir, endpoint string) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, DevicePluginClient: pluginapi.NewDevicePluginClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Update is one ListAndWatch message and when it arrived.
type Update struct {
	At      time.Time
	Devices []*pluginapi.Device
}

// Healthy counts the healthy devices of u.
func (u Update) Healthy() int {
	n := 0
	for _, d := range u.Devices {
		if d.Health == pluginapi.Healthy {
			n++
		}
	}
	return n
}

// Health returns the health of device id ("" when not listed).
func (u Update) Health(id string) string {
	for _, d := range u.Devices {
		if d.ID == id {
			return d.Health
		}
	}
	return ""
}

// Watch runs ListAndWatch until ctx is done; updates arrive on the
// returned channel, which is closed when the stream ends.
func (c *Client) Watch(ctx context.Context) (<-chan Update, error) {
	st, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		return nil, err
	}
	out := make(chan Update, 256)
	go func() {
		defer close(out)
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			out <- Update{At: time.Now(), Devices: r.Devices}
		}
	}()
	return out, nil
}

// WaitFor reads updates until cond holds, the channel closes or timeout.
func WaitFor(updates <-chan Update, timeout time.Duration, cond func(Update) bool) (Update, error) {
	deadline := time.After(timeout)
	for {
		select {
		case u, ok := <-updates:
			if !ok {
				return Update{}, errors.New("ListAndWatch stream ended")
			}
			if cond(u) {
				return u, nil
			}
		case <-deadline:
			return Update{}, errors.New("condition not met within " + timeout.String())
		}
	}
}

// WaitEnded waits for the stream behind updates to end, draining updates.
func WaitEnded(updates <-chan Update, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		select {
		case _, ok := <-updates:
			if !ok {
				return nil
			}
		case <-deadline:
			return errors.New("stream still open after " + timeout.String())
		}
	}
}
