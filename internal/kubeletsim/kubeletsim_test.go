package kubeletsim_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

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

	lis, err := net.Listen("unix", filepath.Join(dir, "p.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, optsServer{})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); <-done }()
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
