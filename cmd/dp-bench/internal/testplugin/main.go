// Command testplugin is a small, correct device plugin that can be told to
// break one rule of the kubelet's contract at a time (-fault), so that the
// tests of dp-bench can show that each contract check catches what it
// guards. Devices are the files <dev-dir>/dev-<i>: healthy while the file
// exists. It writes a CDI spec, registers after serving, re-registers when
// kubelet.sock is created again and removes its socket on SIGTERM.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// The faults, one rule each.
var faults = map[string]string{
	"register-before-serve": "registers before it serves (then serves and registers again)",
	"bad-version":           "registers API version v1alpha",
	"bad-resource":          "registers resource name \"tp\" (no domain)",
	"options-mismatch":      "Register says PreStartRequired=false, GetDevicePluginOptions true",
	"late-list":             "sends the first ListAndWatch list after -late",
	"partial-allocate":      "answers only the first ID of a container",
	"accept-unknown":        "answers unknown IDs instead of refusing them",
	"bad-cdi":               "returns CDI names its spec does not have",
	"preferred-drop-must":   "leaves must-include IDs out of the preferred allocation",
	"preferred-size":        "returns every available ID whatever the size",
	"preferred-unavailable": "prefers IDs that are not available",
	"prestart-fail":         "fails PreStartContainer",
	"no-change":             "never reports a device file's removal",
	"no-reregister":         "does not register again after a kubelet restart",
	"double-register":       "registers twice after a kubelet restart",
	"keep-socket":           "leaves its socket behind on SIGTERM",
}

const (
	resource = "example.com/tp"
	kind     = "example.com/tp"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "testplugin:", err)
		os.Exit(1)
	}
}

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	dir, devDir string
	count       int
	fault       map[string]bool
	late        time.Duration
	lateDone    atomic.Bool // only the first stream is late

	mu      sync.Mutex
	health  []bool
	changed chan struct{} // closed and replaced on every change
}

func run() error {
	var (
		p      = &plugin{fault: map[string]bool{}}
		cdiDir = flag.String("cdi-dir", "", "CDI spec directory")
		fault  = flag.String("fault", "", "comma-separated faults: "+strings.Join(faultNames(), ", "))
	)
	flag.StringVar(&p.dir, "dir", "", "socket directory (kubelet.sock)")
	flag.StringVar(&p.devDir, "dev-dir", "", "directory of the device files dev-<i>")
	flag.IntVar(&p.count, "count", 4, "devices")
	flag.DurationVar(&p.late, "late", 3*time.Second, "delay of the first list with -fault late-list")
	flag.Parse()
	for _, f := range strings.Split(*fault, ",") {
		if f == "" {
			continue
		}
		if _, ok := faults[f]; !ok {
			return fmt.Errorf("-fault=%q: unknown fault %q", *fault, f)
		}
		p.fault[f] = true
	}
	if p.dir == "" || p.devDir == "" || *cdiDir == "" {
		return errors.New("-dir, -dev-dir and -cdi-dir are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	p.changed = make(chan struct{})
	p.health = make([]bool, p.count)
	if err := p.writeSpec(*cdiDir); err != nil {
		return err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(p.devDir); err != nil {
		return err
	}
	if err := w.Add(p.dir); err != nil {
		return err
	}
	p.refresh()
	return p.serveLoop(ctx, w)
}

func faultNames() []string {
	var n []string
	for k := range faults {
		n = append(n, k)
	}
	return n
}

func (p *plugin) id(i int) string { return fmt.Sprintf("dev-%d", i) }

func (p *plugin) writeSpec(dir string) error {
	spec := &specs.Spec{Kind: kind}
	for i := 0; i < p.count; i++ {
		spec.Devices = append(spec.Devices, specs.Device{Name: p.id(i), ContainerEdits: specs.ContainerEdits{
			DeviceNodes: []*specs.DeviceNode{{Path: "/dev/tp-" + fmt.Sprint(i), HostPath: filepath.Join(p.devDir, p.id(i)), Type: "c", Major: 1, Minor: 3}}}})
	}
	v, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return err
	}
	spec.Version = v
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "example.com-tp.json"), b, 0o644)
}

// refresh reads the device files and wakes the streams on a change.
func (p *plugin) refresh() {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := false
	for i := range p.health {
		_, err := os.Lstat(filepath.Join(p.devDir, p.id(i)))
		if h := err == nil; h != p.health[i] {
			p.health[i] = h
			changed = true
		}
	}
	if changed && !p.fault["no-change"] {
		close(p.changed)
		p.changed = make(chan struct{})
	}
}

func (p *plugin) list() ([]*pluginapi.Device, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var devs []*pluginapi.Device
	for i, h := range p.health {
		health := pluginapi.Healthy
		if !h {
			health = pluginapi.Unhealthy
		}
		devs = append(devs, &pluginapi.Device{ID: p.id(i), Health: health})
	}
	return devs, p.changed
}

func (p *plugin) socket() string { return filepath.Join(p.dir, "tp.sock") }

// server is one incarnation of the gRPC server on the socket.
type server struct {
	srv  *grpc.Server
	lis  *net.UnixListener
	done chan struct{}
}

func (p *plugin) serve() (*server, error) {
	_ = os.Remove(p.socket())
	l, err := net.Listen("unix", p.socket())
	if err != nil {
		return nil, err
	}
	lis := l.(*net.UnixListener)
	if p.fault["keep-socket"] {
		lis.SetUnlinkOnClose(false)
	}
	s := &server{srv: grpc.NewServer(), lis: lis, done: make(chan struct{})}
	pluginapi.RegisterDevicePluginServer(s.srv, p)
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(lis)
	}()
	return s, nil
}

func (s *server) stop() {
	s.srv.Stop()
	<-s.done
}

// register registers, retrying for about a second: a kubelet.sock just
// created may not accept connections yet.
func (p *plugin) register(ctx context.Context) error {
	var err error
	for delay := 5 * time.Millisecond; delay < time.Second; delay *= 2 {
		if err = p.registerOnce(ctx); err == nil || status.Code(err) != codes.Unavailable {
			return err
		}
		time.Sleep(delay)
	}
	return err
}

func (p *plugin) registerOnce(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	req := &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "tp.sock", ResourceName: resource, Options: p.options()}
	if p.fault["bad-version"] {
		req.Version = "v1alpha"
	}
	if p.fault["bad-resource"] {
		req.ResourceName = "tp"
	}
	if p.fault["options-mismatch"] {
		req.Options = &pluginapi.DevicePluginOptions{PreStartRequired: false, GetPreferredAllocationAvailable: true}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, req)
	return err
}

func (p *plugin) serveLoop(ctx context.Context, w *fsnotify.Watcher) error {
	if p.fault["register-before-serve"] {
		_ = p.registerOnce(ctx) // refused: nothing is served yet
	}
	s, err := p.serve()
	if err != nil {
		return err
	}
	if err := p.register(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "testplugin: register:", err)
	}
	kubeletSock := filepath.Join(p.dir, "kubelet.sock")
	for {
		select {
		case <-ctx.Done():
			s.stop()
			if !p.fault["keep-socket"] {
				_ = os.Remove(p.socket())
			}
			return nil
		case ev := <-w.Events:
			switch {
			case ev.Name == kubeletSock && ev.Has(fsnotify.Create):
				if p.fault["no-reregister"] {
					continue
				}
				s.stop()
				if s, err = p.serve(); err != nil {
					return err
				}
				if err := p.register(ctx); err != nil {
					fmt.Fprintln(os.Stderr, "testplugin: register:", err)
				}
				if p.fault["double-register"] {
					_ = p.register(ctx)
				}
			case filepath.Dir(ev.Name) == p.devDir:
				p.refresh()
			}
		case err := <-w.Errors:
			return err
		}
	}
}

func (p *plugin) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{PreStartRequired: true, GetPreferredAllocationAvailable: true}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.options(), nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, st pluginapi.DevicePlugin_ListAndWatchServer) error {
	if p.fault["late-list"] && !p.lateDone.Swap(true) {
		select {
		case <-time.After(p.late):
		case <-st.Context().Done():
			return nil
		}
	}
	for {
		devs, changed := p.list()
		if err := st.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-st.Context().Done():
			return nil
		}
	}
}

// known returns the index of a device ID, -1 when unknown.
func (p *plugin) known(id string) int {
	for i := 0; i < p.count; i++ {
		if p.id(i) == id {
			return i
		}
	}
	return -1
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		cr := &pluginapi.ContainerAllocateResponse{}
		for k, id := range c.DevicesIds {
			i := p.known(id)
			if i < 0 && !p.fault["accept-unknown"] {
				return nil, fmt.Errorf("unknown device ID %q", id)
			}
			if k > 0 && p.fault["partial-allocate"] {
				break
			}
			name := kind + "=" + id
			if p.fault["bad-cdi"] {
				name = kind + "=nope-" + id
			}
			cr.CdiDevices = append(cr.CdiDevices, &pluginapi.CDIDevice{Name: name})
			cr.Envs = map[string]string{"TP_DEVICES": strings.Join(c.DevicesIds, ",")}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cr)
	}
	return resp, nil
}

func (p *plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.ContainerRequests {
		var ids []string
		taken := map[string]bool{}
		add := func(id string) {
			if !taken[id] && (len(ids) < int(c.AllocationSize) || p.fault["preferred-size"]) {
				taken[id] = true
				ids = append(ids, id)
			}
		}
		if !p.fault["preferred-drop-must"] {
			for _, id := range c.MustIncludeDeviceIDs {
				add(id)
			}
		}
		from := c.AvailableDeviceIDs
		if p.fault["preferred-unavailable"] {
			from = nil
			avail := map[string]bool{}
			for _, id := range c.AvailableDeviceIDs {
				avail[id] = true
			}
			for i := 0; i < p.count; i++ {
				if !avail[p.id(i)] {
					from = append(from, p.id(i))
				}
			}
			from = append(from, c.AvailableDeviceIDs...)
		}
		for _, id := range from {
			if !p.fault["preferred-drop-must"] || !contains(c.MustIncludeDeviceIDs, id) {
				add(id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func (p *plugin) PreStartContainer(_ context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	if p.fault["prestart-fail"] {
		return nil, errors.New("device on fire")
	}
	for _, id := range req.DevicesIds {
		if p.known(id) < 0 {
			return nil, fmt.Errorf("unknown device ID %q", id)
		}
	}
	return &pluginapi.PreStartContainerResponse{}, nil
}
