package kubeletsim_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

func TestIsExtendedResourceName(t *testing.T) {
	for _, c := range []struct {
		name string
		want bool
	}{
		{"example.com/fpga", true},
		{"squat.ai/serial", true},
		{"fpga", false},
		{"kubernetes.io/fpga", false},
		{"requests.example.com/fpga", false},
		{"example.com/", false},
		{"example.com/bad name", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := kubeletsim.IsExtendedResourceName(c.name); got != c.want {
				t.Fatalf("kubeletsim.IsExtendedResourceName(%q) = %v, want %v", c.name, got, c.want)
			}
		})
	}
}

type optsServer struct {
	pluginapi.UnimplementedDevicePluginServer
}

func (optsServer) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{PreStartRequired: true}, nil
}

// TestRegister: like the kubelet, a registration is accepted only when the
// endpoint answers GetDevicePluginOptions; refused calls are recorded too.
func TestRegister(t *testing.T) {
	dir := testutil.ShortDir(t)
	k, err := kubeletsim.StartWith(dir, kubeletsim.Options{ConnectTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	register := func(r *pluginapi.RegisterRequest) error {
		c, err := grpc.NewClient("unix://"+k.Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = pluginapi.NewRegistrationClient(c).Register(context.Background(), r)
		return err
	}
	good := &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "p.sock", ResourceName: "example.com/x"}

	// Not served yet: refused.
	if err := register(good); err == nil || !strings.Contains(err.Error(), "not served") {
		t.Fatalf("register before serving: %v", err)
	}
	if c := <-k.Calls; c.Err == nil {
		t.Fatal("refused call recorded without error")
	}
	for _, bad := range []*pluginapi.RegisterRequest{
		{Version: "v1alpha", Endpoint: "p.sock", ResourceName: "example.com/x"},
		{Version: pluginapi.Version, Endpoint: "p.sock", ResourceName: "x"},
		{Version: pluginapi.Version, Endpoint: "../p.sock", ResourceName: "example.com/x"},
	} {
		if err := register(bad); err == nil {
			t.Fatalf("%v accepted", bad)
		}
		<-k.Calls
	}

	serveGRPC(t, filepath.Join(dir, "p.sock"), func(srv *grpc.Server) { pluginapi.RegisterDevicePluginServer(srv, optsServer{}) })
	if err := register(good); err != nil {
		t.Fatal(err)
	}
	reg, err := k.WaitRegistration(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if reg.Err != nil || reg.Options == nil || !reg.Options.PreStartRequired {
		t.Fatalf("accepted registration %+v", reg)
	}
}

// regServer is a driver's registration service answering info, and
// recording the status the kubelet sends back.
type regServer struct {
	registerapi.UnimplementedRegistrationServer
	info   atomic.Pointer[registerapi.PluginInfo]
	status chan *registerapi.RegistrationStatus
}

func (s *regServer) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return s.info.Load(), nil
}

func (s *regServer) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s.status <- st
	return &registerapi.RegistrationStatusResponse{}, nil
}

// TestRegisterDRA: a driver that is not a DRA plugin, lacks the v1
// service or names no endpoint is refused (ErrRefused) and told so; one
// that is registers; a socket nobody serves is an error of the call, not
// a refusal.
func TestRegisterDRA(t *testing.T) {
	dir := testutil.ShortDir(t)
	sock := filepath.Join(dir, "reg.sock")
	if _, err := kubeletsim.RegisterDRA(context.Background(), sock); err == nil || errors.Is(err, kubeletsim.ErrRefused) {
		t.Fatalf("nothing served: %v", err)
	}
	s := &regServer{status: make(chan *registerapi.RegistrationStatus, 1)}
	serveGRPC(t, sock, func(srv *grpc.Server) { registerapi.RegisterRegistrationServer(srv, s) })
	good := func() *registerapi.PluginInfo {
		return &registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: "d.example.com", Endpoint: filepath.Join(dir, "dra.sock"),
			SupportedVersions: []string{drav1.DRAPluginService}}
	}
	for _, c := range []struct {
		name string
		edit func(*registerapi.PluginInfo)
		want string
	}{
		{"device plugin", func(i *registerapi.PluginInfo) { i.Type = registerapi.DevicePlugin }, "plugin type"},
		{"no v1 service", func(i *registerapi.PluginInfo) { i.SupportedVersions = []string{"v1beta1.DRAPlugin"} }, "lack " + drav1.DRAPluginService},
		{"no endpoint", func(i *registerapi.PluginInfo) { i.Endpoint = "" }, "no endpoint"},
	} {
		t.Run(c.name, func(t *testing.T) {
			info := good()
			c.edit(info)
			s.info.Store(info)
			_, err := kubeletsim.RegisterDRA(context.Background(), sock)
			if !errors.Is(err, kubeletsim.ErrRefused) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want ErrRefused with %q", err, c.want)
			}
			if st := <-s.status; st.PluginRegistered || !strings.Contains(st.Error, c.want) {
				t.Fatalf("status sent %+v", st)
			}
		})
	}
	s.info.Store(good())
	d, err := kubeletsim.RegisterDRA(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if st := <-s.status; !st.PluginRegistered || d.Info.Name != "d.example.com" {
		t.Fatalf("status %+v, info %+v", st, d.Info)
	}
}

// serveGRPC serves on the unix socket sock, with the services register
// adds, until the test ends.
func serveGRPC(t *testing.T, sock string, register func(*grpc.Server)) {
	t.Helper()
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
}

// serveReg serves a registration service answering info on sock until
// the test ends.
func serveReg(t *testing.T, sock string, info *registerapi.PluginInfo) {
	t.Helper()
	s := &regServer{status: make(chan *registerapi.RegistrationStatus, 16)}
	s.info.Store(info)
	serveGRPC(t, sock, func(srv *grpc.Server) { registerapi.RegisterRegistrationServer(srv, s) })
}

// TestAwait: the plugin watcher registers a driver whose socket appears
// while it waits, with inotify and without (a socket is made before it
// listens, so an attempt on inotify's event can be refused: the poll
// tries again); it stops at once on a refusal or when the driver's
// process ended, and says what it last saw when no driver registered in
// time.
func TestAwait(t *testing.T) {
	info := func(dir string, typ string) *registerapi.PluginInfo {
		return &registerapi.PluginInfo{Type: typ, Name: "d.example.com", Endpoint: filepath.Join(dir, "dra.sock"),
			SupportedVersions: []string{drav1.DRAPluginService}}
	}
	for _, c := range []struct {
		name string
		w    kubeletsim.PluginWatcher
	}{
		{"inotify", kubeletsim.PluginWatcher{Connect: time.Second, Poll: 500 * time.Millisecond, Inotify: true}},
		{"poll", kubeletsim.PluginWatcher{Connect: time.Second, Poll: 10 * time.Millisecond}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := testutil.ShortDir(t)
			type result struct {
				d    *kubeletsim.DRA
				sock string
				err  error
			}
			got := make(chan result, 1)
			go func() {
				d, sock, err := c.w.Await(context.Background(), dir, 10*time.Second)
				got <- result{d, sock, err}
			}()
			time.Sleep(100 * time.Millisecond) // Await waits on an empty directory
			serveReg(t, filepath.Join(dir, "d-reg.sock"), info(dir, registerapi.DRAPlugin))
			r := <-got
			if r.err != nil {
				t.Fatal(r.err)
			}
			defer r.d.Close()
			if r.d.Info.Name != "d.example.com" || filepath.Base(r.sock) != "d-reg.sock" {
				t.Errorf("registered %q through %s", r.d.Info.Name, r.sock)
			}
		})
	}
	t.Run("a new instance beside the old", func(t *testing.T) {
		// A rolling update with a surge: the old instance's socket still
		// serves, and the watcher waits for the new one's.
		dir := testutil.ShortDir(t)
		old := filepath.Join(dir, "d-old-reg.sock")
		serveReg(t, old, info(dir, registerapi.DRAPlugin))
		w := kubeletsim.PluginWatcher{Connect: time.Second, Poll: 10 * time.Millisecond, Skip: old}
		got := make(chan string, 1)
		go func() {
			d, sock, err := w.Await(context.Background(), dir, 10*time.Second)
			if err == nil {
				_ = d.Close()
			}
			got <- fmt.Sprint(sock, err)
		}()
		time.Sleep(100 * time.Millisecond)
		select {
		case r := <-got:
			t.Fatalf("registered %s while only the old instance served", r)
		default:
		}
		serveReg(t, filepath.Join(dir, "d-new-reg.sock"), info(dir, registerapi.DRAPlugin))
		if r := <-got; r != filepath.Join(dir, "d-new-reg.sock")+"<nil>" {
			t.Errorf("registered %s, want the new instance's socket", r)
		}
	})
	t.Run("refused", func(t *testing.T) {
		dir := testutil.ShortDir(t)
		serveReg(t, filepath.Join(dir, "d-reg.sock"), info(dir, registerapi.DevicePlugin))
		start := time.Now()
		_, _, err := kubeletsim.PluginWatcher{Connect: time.Second, Poll: 10 * time.Millisecond}.Await(context.Background(), dir, 10*time.Second)
		if !errors.Is(err, kubeletsim.ErrRefused) || time.Since(start) > 5*time.Second {
			t.Errorf("error %v after %s, want ErrRefused at once", err, time.Since(start))
		}
	})
	t.Run("exited", func(t *testing.T) {
		exited := make(chan struct{})
		close(exited)
		_, _, err := kubeletsim.PluginWatcher{Connect: time.Second, Poll: time.Hour, Exited: exited}.Await(context.Background(), t.TempDir(), 10*time.Second)
		if !errors.Is(err, kubeletsim.ErrExited) {
			t.Errorf("error %v, want ErrExited", err)
		}
	})
	t.Run("not registered", func(t *testing.T) {
		dir := testutil.ShortDir(t)
		mute, err := net.Listen("unix", filepath.Join(dir, "mute-reg.sock")) // accepts, never answers
		if err != nil {
			t.Fatal(err)
		}
		defer mute.Close()
		_, _, err = kubeletsim.PluginWatcher{Connect: 20 * time.Millisecond, Poll: 10 * time.Millisecond}.Await(context.Background(), dir, 200*time.Millisecond)
		if !errors.Is(err, kubeletsim.ErrNotRegistered) || !strings.Contains(err.Error(), "within 200ms (last: GetInfo on ") {
			t.Errorf("error %v, want ErrNotRegistered with the last attempt's error", err)
		}
	})
}

// draServer answers NodePrepareResources and NodeUnprepareResources: claim
// "ok" with one device, claim "held" with an error, others not at all.
type draServer struct {
	drav1.UnimplementedDRAPluginServer
}

func (draServer) NodePrepareResources(_ context.Context, r *drav1.NodePrepareResourcesRequest) (*drav1.NodePrepareResourcesResponse, error) {
	out := &drav1.NodePrepareResourcesResponse{Claims: map[string]*drav1.NodePrepareResourceResponse{}}
	for _, c := range r.Claims {
		switch c.Name {
		case "ok":
			out.Claims[c.Uid] = &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{{PoolName: "p", DeviceName: "d0"}}}
		case "held":
			out.Claims[c.Uid] = &drav1.NodePrepareResourceResponse{Error: "held"}
		}
	}
	return out, nil
}

func (draServer) NodeUnprepareResources(_ context.Context, r *drav1.NodeUnprepareResourcesRequest) (*drav1.NodeUnprepareResourcesResponse, error) {
	out := &drav1.NodeUnprepareResourcesResponse{Claims: map[string]*drav1.NodeUnprepareResourceResponse{}}
	for _, c := range r.Claims {
		switch c.Name {
		case "ok":
			out.Claims[c.Uid] = &drav1.NodeUnprepareResourceResponse{}
		case "held":
			out.Claims[c.Uid] = &drav1.NodeUnprepareResourceResponse{Error: "held"}
		}
	}
	return out, nil
}

// TestPrepareClaim: a claim's answer is read as the kubelet reads it: the
// claim's devices, or an error for a claim not answered or answered with
// one.
func TestPrepareClaim(t *testing.T) {
	dir := testutil.ShortDir(t)
	serveGRPC(t, filepath.Join(dir, "dra.sock"), func(srv *grpc.Server) { drav1.RegisterDRAPluginServer(srv, draServer{}) })
	serveReg(t, filepath.Join(dir, "reg.sock"), &registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: "d.example.com",
		Endpoint: filepath.Join(dir, "dra.sock"), SupportedVersions: []string{drav1.DRAPluginService}})
	d, err := kubeletsim.RegisterDRA(context.Background(), filepath.Join(dir, "reg.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	claim := func(name string) *drav1.Claim { return &drav1.Claim{Namespace: "ns", Name: name, Uid: "uid-" + name} }
	if got, err := d.PrepareClaim(ctx, claim("ok")); err != nil || len(got.GetDevices()) != 1 {
		t.Errorf("claim ok: %v, %v", got, err)
	}
	if err := d.UnprepareClaim(ctx, claim("ok")); err != nil {
		t.Errorf("unprepare ok: %v", err)
	}
	for name, want := range map[string]string{"held": "claim held: held", "gone": "claim gone not answered"} {
		if _, err := d.PrepareClaim(ctx, claim(name)); err == nil || err.Error() != want {
			t.Errorf("prepare %s: %v, want %q", name, err, want)
		}
		if err := d.UnprepareClaim(ctx, claim(name)); err == nil || err.Error() != want {
			t.Errorf("unprepare %s: %v, want %q", name, err, want)
		}
	}
}

// TestPodResources: List answers the pods last set, or the error set
// (SetErr), and counts the calls.
func TestPodResources(t *testing.T) {
	sock := filepath.Join(testutil.ShortDir(t), "podres.sock")
	p, err := kubeletsim.ServePodResources(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	c, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	list := func() []*podresourcesapi.PodResources {
		t.Helper()
		r, err := podresourcesapi.NewPodResourcesListerClient(c).List(context.Background(), &podresourcesapi.ListPodResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return r.PodResources
	}
	if got := list(); len(got) != 0 {
		t.Fatalf("pods at first: %v", got)
	}
	p.Set(&podresourcesapi.PodResources{Name: "a", Namespace: "ns"})
	if got := list(); len(got) != 1 || got[0].Name != "a" {
		t.Fatalf("pods after Set: %v", got)
	}
	if n := p.Calls(); n != 2 {
		t.Errorf("%d List calls counted, want 2", n)
	}
	p.SetErr(status.Error(codes.Unavailable, "kubelet busy"))
	if _, err := podresourcesapi.NewPodResourcesListerClient(c).List(context.Background(), &podresourcesapi.ListPodResourcesRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("List with an error set: %v", err)
	}
	p.SetErr(nil)
	if got := list(); len(got) != 1 {
		t.Fatalf("pods after the error cleared: %v", got)
	}
	if n := p.Calls(); n != 4 {
		t.Errorf("%d List calls counted, want 4 (the failed one included)", n)
	}
}

// healthServer sends two health updates on each NodeWatchResources
// stream, then holds it open until the client ends it, as a driver does.
type healthServer struct {
	drahealthv1.UnimplementedDRAResourceHealthServer
}

func (healthServer) NodeWatchResources(_ *drahealthv1.NodeWatchResourcesRequest, s grpc.ServerStreamingServer[drahealthv1.NodeWatchResourcesResponse]) error {
	for _, h := range []drahealthv1.HealthStatus{drahealthv1.HealthStatus_HEALTHY, drahealthv1.HealthStatus_UNHEALTHY} {
		up := &drahealthv1.NodeWatchResourcesResponse{Devices: []*drahealthv1.DeviceHealth{{
			Device: &drahealthv1.DeviceIdentifier{PoolName: "p", DeviceName: "d0"}, Health: h}}}
		if err := s.Send(up); err != nil {
			return err
		}
	}
	<-s.Context().Done()
	return nil
}

// TestWatchHealth: the stand-in opens the health stream a kubelet opens
// on a registered driver and reads its updates until it is told to stop;
// a driver without the health service is told apart (ErrNoHealth), as the
// kubelet goes on without its health then.
func TestWatchHealth(t *testing.T) {
	register := func(t *testing.T, health bool) *kubeletsim.DRA {
		dir := testutil.ShortDir(t)
		serveGRPC(t, filepath.Join(dir, "dra.sock"), func(srv *grpc.Server) {
			drav1.RegisterDRAPluginServer(srv, draServer{})
			if health {
				drahealthv1.RegisterDRAResourceHealthServer(srv, healthServer{})
			}
		})
		serveReg(t, filepath.Join(dir, "reg.sock"), &registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: "d.example.com",
			Endpoint: filepath.Join(dir, "dra.sock"), SupportedVersions: []string{drav1.DRAPluginService}})
		d, err := kubeletsim.RegisterDRA(context.Background(), filepath.Join(dir, "reg.sock"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	t.Run("served", func(t *testing.T) {
		d := register(t, true)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		got := make(chan drahealthv1.HealthStatus, 4)
		done := make(chan error, 1)
		go func() {
			done <- d.WatchHealth(ctx, func(r *drahealthv1.NodeWatchResourcesResponse) {
				for _, dev := range r.GetDevices() {
					got <- dev.GetHealth()
				}
			})
		}()
		for _, want := range []drahealthv1.HealthStatus{drahealthv1.HealthStatus_HEALTHY, drahealthv1.HealthStatus_UNHEALTHY} {
			if h := <-got; h != want {
				t.Errorf("update %v, want %v", h, want)
			}
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("after the stop: %v, want context.Canceled", err)
		}
	})
	t.Run("not served", func(t *testing.T) {
		d := register(t, false)
		err := d.WatchHealth(context.Background(), func(*drahealthv1.NodeWatchResourcesResponse) { t.Error("an update from no service") })
		if !errors.Is(err, kubeletsim.ErrNoHealth) {
			t.Errorf("error %v, want ErrNoHealth", err)
		}
	})
}
