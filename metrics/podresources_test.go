package metrics

import (
	"path/filepath"
	"strings"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
	"github.com/cdi-device-plugin/cdi-device-plugin/podresources"
)

// TestPodDeviceAssignment: a scrape asks PodResources over a real socket
// and gives one pod_device_assignment series for every device of a served
// resource that a container holds (not those of other resources, nor DRA
// devices); no socket gives no series and no error; a failed List gives
// no series and counts an error.
func TestPodDeviceAssignment(t *testing.T) {
	const help = `# HELP cdi_device_plugin_pod_device_assignment 1 for each device a container holds, from the kubelet's PodResources API.
# TYPE cdi_device_plugin_pod_device_assignment gauge
`
	pods := []*podresourcesapi.PodResources{
		{Namespace: "team-a", Name: "p1", Containers: []*podresourcesapi.ContainerResources{
			{Name: "c", Devices: []*podresourcesapi.ContainerDevices{
				{ResourceName: "example.com/sim", DeviceIds: []string{"sim-0", "sim-1::0"}},
				{ResourceName: "example.com/other", DeviceIds: []string{"o-0"}},
			}},
			{Name: "d", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "example.com/fpga", DeviceIds: []string{"f-0"}}},
				DynamicResources: []*podresourcesapi.DynamicResource{{ClaimNamespace: "team-a", ClaimName: "c1", ClaimResources: []*podresourcesapi.ClaimResource{{DriverName: "d", PoolName: "p", DeviceName: "sim-2"}}}}},
		}},
		{Namespace: "team-b", Name: "p2", Containers: []*podresourcesapi.ContainerResources{
			{Name: "c", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "example.com/sim", DeviceIds: []string{"sim-1::1"}}}},
		}},
	}
	served := func() []string { return []string{"example.com/sim", "example.com/fpga"} }
	for _, tc := range []struct {
		name   string
		serve  bool
		fail   bool
		want   string
		errors float64
	}{
		{name: "answers", serve: true, want: help +
			`cdi_device_plugin_pod_device_assignment{container="c",device="sim-0",namespace="team-a",pod="p1",resource="example.com/sim"} 1
cdi_device_plugin_pod_device_assignment{container="c",device="sim-1::0",namespace="team-a",pod="p1",resource="example.com/sim"} 1
cdi_device_plugin_pod_device_assignment{container="c",device="sim-1::1",namespace="team-b",pod="p2",resource="example.com/sim"} 1
cdi_device_plugin_pod_device_assignment{container="d",device="f-0",namespace="team-a",pod="p1",resource="example.com/fpga"} 1
`},
		{name: "no socket"},
		{name: "a failed List", serve: true, fail: true, errors: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(testutil.ShortDir(t), "pr.sock")
			if tc.serve {
				pr := testutil.ServePodResources(t, sock, pods...)
				if tc.fail {
					pr.SetErr(status.Error(codes.Unavailable, "kubelet busy"))
				}
			}
			p := newPodResources(client(t, sock), served)
			if err := promtest.CollectAndCompare(p, strings.NewReader(tc.want)); err != nil {
				t.Fatal(err)
			}
			if got := promtest.ToFloat64(p.errors); got != tc.errors {
				t.Fatalf("pod_resources_errors_total %v, want %v", got, tc.errors)
			}
		})
	}
}

// TestPodDeviceAssignmentRegistered: WatchPodResources registers the
// assignment series and the error counter, with their help texts.
func TestPodDeviceAssignmentRegistered(t *testing.T) {
	m := New("test")
	sock := filepath.Join(testutil.ShortDir(t), "pr.sock")
	testutil.ServePodResources(t, sock, &podresourcesapi.PodResources{Namespace: "ns", Name: "p", Containers: []*podresourcesapi.ContainerResources{
		{Name: "c", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "example.com/sim", DeviceIds: []string{"sim-0"}}}}}})
	m.WatchPodResources(client(t, sock), func() []string { return []string{"example.com/sim"} })
	want := `# HELP cdi_device_plugin_pod_device_assignment 1 for each device a container holds, from the kubelet's PodResources API.
# TYPE cdi_device_plugin_pod_device_assignment gauge
cdi_device_plugin_pod_device_assignment{container="c",device="sim-0",namespace="ns",pod="p",resource="example.com/sim"} 1
# HELP cdi_device_plugin_pod_resources_errors_total Failed reads of the kubelet's PodResources API.
# TYPE cdi_device_plugin_pod_resources_errors_total counter
cdi_device_plugin_pod_resources_errors_total 0
`
	if err := promtest.GatherAndCompare(m.Registry(), strings.NewReader(want),
		Namespace+"_pod_device_assignment", Namespace+"_pod_resources_errors_total"); err != nil {
		t.Fatal(err)
	}
	var nilMetrics *Metrics
	nilMetrics.WatchPodResources(client(t, sock), nil) // metrics off: nothing
}

// client is a PodResources client of sock, closed when the test ends.
func client(t *testing.T, sock string) *podresources.Client {
	c := podresources.New(sock)
	t.Cleanup(func() { _ = c.Close() })
	return c
}
