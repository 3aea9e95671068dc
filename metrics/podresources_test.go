package metrics

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// claimPod is a pod whose containers hold DRA claims: claims[container]
// lists each claim's name and its resources.
func claimPod(ns, name string, containers map[string][]*podresourcesapi.DynamicResource) *podresourcesapi.PodResources {
	p := &podresourcesapi.PodResources{Namespace: ns, Name: name}
	for _, c := range []string{"a", "b"} {
		if dr, ok := containers[c]; ok {
			p.Containers = append(p.Containers, &podresourcesapi.ContainerResources{Name: c, DynamicResources: dr})
		}
	}
	return p
}

func claimResource(driver, pool, dev string, cdi ...string) *podresourcesapi.ClaimResource {
	cr := &podresourcesapi.ClaimResource{DriverName: driver, PoolName: pool, DeviceName: dev}
	for _, n := range cdi {
		cr.CdiDevices = append(cr.CdiDevices, &podresourcesapi.CDIDevice{Name: n})
	}
	return cr
}

// TestClaimDevices (issue 21): the devices DRA claims hold, from one List
// over a real socket: one entry per claim and device (a claim shared by
// two containers counts once), with its driver, pool, device and CDI
// names (a kubelet before 1.31 gives the CDI names alone); device-plugin
// devices are not among them. No socket is an error.
func TestClaimDevices(t *testing.T) {
	sock := filepath.Join(testutil.ShortDir(t), "pr.sock")
	shared := &podresourcesapi.DynamicResource{ClaimNamespace: "ns", ClaimName: "c1", ClaimResources: []*podresourcesapi.ClaimResource{
		claimResource("sim.example.com", "node1", "sim-0", "k8s.example.com/sim=sim-node1-0", "k8s.sim.example.com/claim=uid1"),
		claimResource("sim.example.com", "node1", "sim-1", "k8s.example.com/sim=sim-node1-1"),
	}}
	pr := testutil.ServePodResources(t, sock,
		claimPod("ns", "p", map[string][]*podresourcesapi.DynamicResource{"a": {shared}, "b": {shared}}),
		claimPod("other", "q", map[string][]*podresourcesapi.DynamicResource{"a": {{ClaimNamespace: "other", ClaimName: "c2",
			ClaimResources: []*podresourcesapi.ClaimResource{claimResource("gpu.vendor.com", "node1", "gpu-0")}}}}),
		// A kubelet before 1.31 names no driver, pool or device.
		claimPod("ns", "old", map[string][]*podresourcesapi.DynamicResource{"a": {{ClaimNamespace: "ns", ClaimName: "c3",
			ClaimResources: []*podresourcesapi.ClaimResource{claimResource("", "", "", "k8s.example.com/sim=sim-node1-2"), claimResource("", "", "", "k8s.example.com/sim=sim-node1-3")}}}}),
		&podresourcesapi.PodResources{Namespace: "ns", Name: "dp", Containers: []*podresourcesapi.ContainerResources{{Name: "c",
			Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "example.com/sim", DeviceIds: []string{"sim-node1-2"}}}}}},
	)
	got, err := ClaimDevices(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	want := []ClaimDevice{
		{Claim: "ns/c1", Driver: "sim.example.com", Pool: "node1", Device: "sim-0", CDIDevices: []string{"k8s.example.com/sim=sim-node1-0", "k8s.sim.example.com/claim=uid1"}},
		{Claim: "ns/c1", Driver: "sim.example.com", Pool: "node1", Device: "sim-1", CDIDevices: []string{"k8s.example.com/sim=sim-node1-1"}},
		{Claim: "other/c2", Driver: "gpu.vendor.com", Pool: "node1", Device: "gpu-0"},
		{Claim: "ns/c3", CDIDevices: []string{"k8s.example.com/sim=sim-node1-2"}},
		{Claim: "ns/c3", CDIDevices: []string{"k8s.example.com/sim=sim-node1-3"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if n := pr.Calls(); n != 1 {
		t.Fatalf("%d List calls, want 1", n)
	}
	if _, err := ClaimDevices(context.Background(), sock+".absent"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no socket: %v", err)
	}
}
