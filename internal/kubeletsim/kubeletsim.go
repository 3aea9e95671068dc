// Package kubeletsim is a kubelet stand-in for tests and the bench tool: it
// serves the Registration service on <dir>/kubelet.sock over a real unix
// socket, records registrations, and talks to plugins the way the kubelet's
// device manager does (ListAndWatch, Allocate, GetPreferredAllocation). A
// restart wipes the directory as the kubelet does. RegisterDRA registers
// and calls a DRA driver as the kubelet's plugin watcher and DRA manager
// do, and PluginWatcher.Await waits for one's socket to register through;
// ServePodResources serves the kubelet's PodResources List; Pods prepares
// the DRA claims of the pods bound to many nodes, as their kubelets do
// (dp-bench's fleet).
//
// Register is handled like the kubelet's registration server
// (pkg/kubelet/cm/devicemanager/plugin/v1beta1): the version must be a
// supported one and the resource an extended resource name; then, before
// Register returns, the plugin's endpoint is dialled and asked for its
// options (GetDevicePluginOptions), and a plugin that does not answer is
// refused.
package kubeletsim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/validation"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Registration is one Register call as the kubelet saw it.
type Registration struct {
	// At is when the call arrived.
	At      time.Time
	Request *pluginapi.RegisterRequest
	// Options is the plugin's answer to GetDevicePluginOptions on its
	// endpoint during the call (what the kubelet acts on), nil when the
	// endpoint did not answer.
	Options *pluginapi.DevicePluginOptions
	// Err is why the call was refused, nil when it was accepted.
	Err error
}

// Options tune the stand-in.
type Options struct {
	// ConnectTimeout bounds the call to the plugin's endpoint during
	// Register (the kubelet's is 10 s, the default).
	ConnectTimeout time.Duration
}

// Kubelet serves the registration socket.
type Kubelet struct {
	pluginapi.UnimplementedRegistrationServer

	dir  string
	opts Options
	// Regs receives accepted registrations (64 buffered; more are dropped).
	Regs chan Registration
	// Calls receives every Register call, accepted or refused (64
	// buffered; more are dropped).
	Calls chan Registration

	mu  sync.Mutex
	srv *grpc.Server
	wg  sync.WaitGroup // the Serve goroutine
}

// Start serves <dir>/kubelet.sock.
func Start(dir string) (*Kubelet, error) { return StartWith(dir, Options{}) }

// StartWith serves <dir>/kubelet.sock with opts.
func StartWith(dir string, opts Options) (*Kubelet, error) {
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = 10 * time.Second
	}
	k := &Kubelet{dir: dir, opts: opts, Regs: make(chan Registration, 64), Calls: make(chan Registration, 64)}
	if err := k.start(); err != nil {
		return nil, err
	}
	return k, nil
}

// Dir is the plugin directory.
func (k *Kubelet) Dir() string { return k.dir }

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
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		_ = srv.Serve(lis)
	}()
	return nil
}

// Register validates like the kubelet (version, extended resource name,
// endpoint a file in the directory), then calls GetDevicePluginOptions on
// the endpoint as the kubelet does before it answers, and records the call.
func (k *Kubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	reg := Registration{At: time.Now(), Request: r}
	reg.Options, reg.Err = k.validate(ctx, r)
	send(k.Calls, reg)
	if reg.Err != nil {
		return nil, reg.Err
	}
	send(k.Regs, reg)
	return &pluginapi.Empty{}, nil
}

func send(ch chan Registration, r Registration) {
	select {
	case ch <- r:
	default:
	}
}

func (k *Kubelet) validate(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.DevicePluginOptions, error) {
	if !slices.Contains(pluginapi.SupportedVersions[:], r.Version) {
		return nil, fmt.Errorf("unsupported version %q, supported %v", r.Version, pluginapi.SupportedVersions)
	}
	if !IsExtendedResourceName(r.ResourceName) {
		return nil, fmt.Errorf("invalid resource name %q: not an extended resource name", r.ResourceName)
	}
	if r.Endpoint == "" || filepath.Base(r.Endpoint) != r.Endpoint {
		return nil, fmt.Errorf("bad endpoint %q: must be a file name in %s", r.Endpoint, k.dir)
	}
	c, err := Dial(k.dir, r.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("endpoint %s: %w", r.Endpoint, err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, k.opts.ConnectTimeout)
	defer cancel()
	opts, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		return nil, fmt.Errorf("endpoint %s not served: GetDevicePluginOptions: %w", r.Endpoint, err)
	}
	return opts, nil
}

// IsExtendedResourceName reports whether name is an extended resource name
// as the kubelet's v1helper.IsExtendedResourceName decides it: a domain
// outside kubernetes.io, not "requests.", a valid qualified name.
func IsExtendedResourceName(name string) bool {
	if !strings.Contains(name, "/") || strings.Contains(name, "kubernetes.io/") || strings.HasPrefix(name, "requests.") {
		return false
	}
	return len(validation.IsQualifiedName("requests."+name)) == 0
}

// Stop stops serving, waits for the server to end and removes kubelet.sock.
func (k *Kubelet) Stop() {
	k.mu.Lock()
	srv := k.srv
	k.srv = nil
	k.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
	k.wg.Wait()
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
