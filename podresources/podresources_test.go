package podresources

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// dpPod is a pod whose containers hold device-plugin devices:
// containers[container][resource] lists the device IDs.
func dpPod(ns, name string, containers map[string]map[string][]string) *podresourcesapi.PodResources {
	p := &podresourcesapi.PodResources{Namespace: ns, Name: name}
	for _, c := range []string{"a", "b"} {
		res, ok := containers[c]
		if !ok {
			continue
		}
		cr := &podresourcesapi.ContainerResources{Name: c}
		for _, r := range []string{"example.com/sim", "example.com/other"} {
			if ids, ok := res[r]; ok {
				cr.Devices = append(cr.Devices, &podresourcesapi.ContainerDevices{ResourceName: r, DeviceIds: ids})
			}
		}
		p.Containers = append(p.Containers, cr)
	}
	return p
}

// serve serves pods on a real socket and returns a client of it, closed
// when the test ends.
func serve(t *testing.T, pods ...*podresourcesapi.PodResources) (*Client, *testutil.PodResources, string) {
	t.Helper()
	sock := filepath.Join(testutil.ShortDir(t), "pr.sock")
	pr := testutil.ServePodResources(t, sock, pods...)
	c := New(sock)
	t.Cleanup(func() { _ = c.Close() })
	return c, pr, sock
}

// TestClaimDevices: the devices DRA claims hold, from one List over a
// real socket: one entry per claim and device (a claim shared by two
// containers counts once), with its driver, pool, device and CDI names (a
// kubelet before 1.31 gives the CDI names alone); device-plugin devices
// are not among them. No socket is an error.
func TestClaimDevices(t *testing.T) {
	shared := &podresourcesapi.DynamicResource{ClaimNamespace: "ns", ClaimName: "c1", ClaimResources: []*podresourcesapi.ClaimResource{
		claimResource("sim.example.com", "node1", "sim-0", "k8s.example.com/sim=sim-node1-0", "k8s.sim.example.com/claim=uid1"),
		claimResource("sim.example.com", "node1", "sim-1", "k8s.example.com/sim=sim-node1-1"),
	}}
	c, pr, sock := serve(t,
		claimPod("ns", "p", map[string][]*podresourcesapi.DynamicResource{"a": {shared}, "b": {shared}}),
		claimPod("other", "q", map[string][]*podresourcesapi.DynamicResource{"a": {{ClaimNamespace: "other", ClaimName: "c2",
			ClaimResources: []*podresourcesapi.ClaimResource{claimResource("gpu.vendor.com", "node1", "gpu-0")}}}}),
		// A kubelet before 1.31 names no driver, pool or device.
		claimPod("ns", "old", map[string][]*podresourcesapi.DynamicResource{"a": {{ClaimNamespace: "ns", ClaimName: "c3",
			ClaimResources: []*podresourcesapi.ClaimResource{claimResource("", "", "", "k8s.example.com/sim=sim-node1-2"), claimResource("", "", "", "k8s.example.com/sim=sim-node1-3")}}}}),
		&podresourcesapi.PodResources{Namespace: "ns", Name: "dp", Containers: []*podresourcesapi.ContainerResources{{Name: "c",
			Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "example.com/sim", DeviceIds: []string{"sim-node1-2"}}}}}},
	)
	res, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := res.Claims()
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
	if _, err := List(context.Background(), sock+".absent"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("no socket: %v", err)
	}
}

// TestFold: what one List over a real socket says, by accessor: the
// device IDs device-plugin containers hold (all, by resource, of one
// resource), their holders, and the devices DRA claims hold, deduplicated
// by claim and device (driver, pool, device name and CDI names).
func TestFold(t *testing.T) {
	claim := func(ns, name string, crs ...*podresourcesapi.ClaimResource) *podresourcesapi.DynamicResource {
		return &podresourcesapi.DynamicResource{ClaimNamespace: ns, ClaimName: name, ClaimResources: crs}
	}
	for _, tc := range []struct {
		name string
		pods []*podresourcesapi.PodResources
		// held: Held("example.com/sim"); byRes: HeldByResource;
		// holders: Holders("example.com/sim").
		held    []string
		byRes   map[string][]string
		holders map[string][]string
		claims  []ClaimDevice
	}{
		{name: "no pods", byRes: map[string][]string{}, holders: map[string][]string{}},
		{name: "one container, two resources",
			pods:    []*podresourcesapi.PodResources{dpPod("ns", "p", map[string]map[string][]string{"a": {"example.com/sim": {"sim-0", "sim-1"}, "example.com/other": {"o-0"}}})},
			held:    []string{"sim-0", "sim-1"},
			byRes:   map[string][]string{"example.com/sim": {"sim-0", "sim-1"}, "example.com/other": {"o-0"}},
			holders: map[string][]string{"sim-0": {"ns/p/a"}, "sim-1": {"ns/p/a"}}},
		{name: "replicas of one device in two pods",
			pods: []*podresourcesapi.PodResources{
				dpPod("ns", "p", map[string]map[string][]string{"a": {"example.com/sim": {"sim-0::0"}}, "b": {"example.com/sim": {"sim-1::0"}}}),
				dpPod("other", "q", map[string]map[string][]string{"a": {"example.com/sim": {"sim-0::1"}}}),
			},
			held:    []string{"sim-0::0", "sim-1::0", "sim-0::1"},
			byRes:   map[string][]string{"example.com/sim": {"sim-0::0", "sim-1::0", "sim-0::1"}},
			holders: map[string][]string{"sim-0::0": {"ns/p/a"}, "sim-1::0": {"ns/p/b"}, "sim-0::1": {"other/q/a"}}},
		{name: "a device two containers list",
			pods:    []*podresourcesapi.PodResources{dpPod("ns", "p", map[string]map[string][]string{"a": {"example.com/sim": {"sim-0"}}, "b": {"example.com/sim": {"sim-0"}}})},
			held:    []string{"sim-0", "sim-0"},
			byRes:   map[string][]string{"example.com/sim": {"sim-0", "sim-0"}},
			holders: map[string][]string{"sim-0": {"ns/p/a", "ns/p/b"}}},
		{name: "another resource only",
			pods:    []*podresourcesapi.PodResources{dpPod("ns", "p", map[string]map[string][]string{"a": {"example.com/other": {"o-0"}}})},
			byRes:   map[string][]string{"example.com/other": {"o-0"}},
			holders: map[string][]string{}},
		{name: "claims: a claim shared by two containers and two pods counts once",
			pods: []*podresourcesapi.PodResources{
				claimPod("ns", "p", map[string][]*podresourcesapi.DynamicResource{"a": {claim("ns", "c", claimResource("d", "pool", "sim-0"))}, "b": {claim("ns", "c", claimResource("d", "pool", "sim-0"))}}),
				claimPod("ns", "q", map[string][]*podresourcesapi.DynamicResource{"a": {claim("ns", "c", claimResource("d", "pool", "sim-0"))}}),
			},
			byRes: map[string][]string{}, holders: map[string][]string{},
			claims: []ClaimDevice{{Claim: "ns/c", Driver: "d", Pool: "pool", Device: "sim-0"}}},
		{name: "claims: the same device in two claims, or two namespaces, counts twice",
			pods: []*podresourcesapi.PodResources{
				claimPod("ns", "p", map[string][]*podresourcesapi.DynamicResource{"a": {claim("ns", "c", claimResource("d", "pool", "sim-0")), claim("ns", "e", claimResource("d", "pool", "sim-0"))}}),
				claimPod("other", "q", map[string][]*podresourcesapi.DynamicResource{"a": {claim("other", "c", claimResource("d", "pool", "sim-0"))}}),
			},
			byRes: map[string][]string{}, holders: map[string][]string{},
			claims: []ClaimDevice{
				{Claim: "ns/c", Driver: "d", Pool: "pool", Device: "sim-0"},
				{Claim: "ns/e", Driver: "d", Pool: "pool", Device: "sim-0"},
				{Claim: "other/c", Driver: "d", Pool: "pool", Device: "sim-0"},
			}},
		{name: "claims: driver, pool, device and CDI names each tell devices apart",
			pods: []*podresourcesapi.PodResources{claimPod("ns", "p", map[string][]*podresourcesapi.DynamicResource{"a": {claim("ns", "c",
				claimResource("d", "pool", "sim-0", "k/c=x"),
				claimResource("d2", "pool", "sim-0", "k/c=x"),
				claimResource("d", "pool2", "sim-0", "k/c=x"),
				claimResource("d", "pool", "sim-1", "k/c=x"),
				claimResource("d", "pool", "sim-0", "k/c=y"),
				claimResource("d", "pool", "sim-0", "k/c=x", "k/c=y"),
				claimResource("d", "pool", "sim-0", "k/c=x"), // the first again
			)}})},
			byRes: map[string][]string{}, holders: map[string][]string{},
			claims: []ClaimDevice{
				{Claim: "ns/c", Driver: "d", Pool: "pool", Device: "sim-0", CDIDevices: []string{"k/c=x"}},
				{Claim: "ns/c", Driver: "d2", Pool: "pool", Device: "sim-0", CDIDevices: []string{"k/c=x"}},
				{Claim: "ns/c", Driver: "d", Pool: "pool2", Device: "sim-0", CDIDevices: []string{"k/c=x"}},
				{Claim: "ns/c", Driver: "d", Pool: "pool", Device: "sim-1", CDIDevices: []string{"k/c=x"}},
				{Claim: "ns/c", Driver: "d", Pool: "pool", Device: "sim-0", CDIDevices: []string{"k/c=y"}},
				{Claim: "ns/c", Driver: "d", Pool: "pool", Device: "sim-0", CDIDevices: []string{"k/c=x", "k/c=y"}},
			}},
		{name: "claims: a kubelet before 1.31 (CDI names alone)",
			pods: []*podresourcesapi.PodResources{claimPod("ns", "p", map[string][]*podresourcesapi.DynamicResource{
				"a": {claim("ns", "c", claimResource("", "", "", "k/c=x"), claimResource("", "", "", "k/c=y"))},
				"b": {claim("ns", "c", claimResource("", "", "", "k/c=x"))},
			})},
			byRes: map[string][]string{}, holders: map[string][]string{},
			claims: []ClaimDevice{{Claim: "ns/c", CDIDevices: []string{"k/c=x"}}, {Claim: "ns/c", CDIDevices: []string{"k/c=y"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, pr, _ := serve(t, tc.pods...)
			res, err := c.List(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Held("example.com/sim"); !reflect.DeepEqual(got, tc.held) {
				t.Errorf("Held: %q, want %q", got, tc.held)
			}
			if got := res.HeldByResource(); !reflect.DeepEqual(got, tc.byRes) {
				t.Errorf("HeldByResource: %q, want %q", got, tc.byRes)
			}
			if got := res.Holders("example.com/sim"); !reflect.DeepEqual(got, tc.holders) {
				t.Errorf("Holders: %q, want %q", got, tc.holders)
			}
			if got := res.Claims(); !reflect.DeepEqual(got, tc.claims) {
				t.Errorf("Claims: %+v\nwant %+v", got, tc.claims)
			}
			var n int
			for _, ids := range tc.byRes {
				n += len(ids)
			}
			if got := len(res.Devices()); got != n {
				t.Errorf("%d Devices, want %d", got, n)
			}
			if n := pr.Calls(); n != 1 {
				t.Errorf("%d List calls, want 1", n)
			}
		})
	}
}

// TestResourcesImmutable: what an accessor returns is the caller's: a
// change to it changes nothing the next call returns.
func TestResourcesImmutable(t *testing.T) {
	c, _, _ := serve(t,
		dpPod("ns", "p", map[string]map[string][]string{"a": {"example.com/sim": {"sim-0"}}}),
		claimPod("ns", "q", map[string][]*podresourcesapi.DynamicResource{"a": {{ClaimNamespace: "ns", ClaimName: "c",
			ClaimResources: []*podresourcesapi.ClaimResource{claimResource("d", "pool", "sim-1", "k/c=x")}}}}))
	res, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	res.Held("example.com/sim")[0] = "x"
	res.HeldByResource()["example.com/sim"][0] = "x"
	res.Holders("example.com/sim")["sim-0"][0] = "x"
	res.Devices()[0].ID = "x"
	cl := res.Claims()
	cl[0].Claim, cl[0].CDIDevices[0] = "x", "x"
	if got := res.Held("example.com/sim"); !reflect.DeepEqual(got, []string{"sim-0"}) {
		t.Errorf("Held after changes: %q", got)
	}
	if got := res.Holders("example.com/sim"); !reflect.DeepEqual(got, map[string][]string{"sim-0": {"ns/p/a"}}) {
		t.Errorf("Holders after changes: %q", got)
	}
	if got := res.Claims(); !reflect.DeepEqual(got, []ClaimDevice{{Claim: "ns/c", Driver: "d", Pool: "pool", Device: "sim-1", CDIDevices: []string{"k/c=x"}}}) {
		t.Errorf("Claims after changes: %+v", got)
	}
}

// TestClientErrors: a missing socket is ErrNoSocket (and fs.ErrNotExist)
// naming the socket, without a List; a List that fails is an error naming
// the socket, asked once on a fresh connection and once more on a fresh
// one when it failed on the kept connection; a List answers again once
// the kubelet does; a closed client is ErrClosed.
func TestClientErrors(t *testing.T) {
	ctx := context.Background()
	t.Run("missing socket", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "absent.sock")
		c := New(sock)
		defer func() { _ = c.Close() }()
		_, err := c.List(ctx)
		if !errors.Is(err, ErrNoSocket) || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), sock) {
			t.Fatalf("no socket: %v", err)
		}
		if c.conn != nil {
			t.Fatal("connected without a socket")
		}
	})
	t.Run("failed List", func(t *testing.T) {
		c, pr, sock := serve(t)
		pr.SetErr(status.Error(codes.Unavailable, "kubelet busy"))
		_, err := c.List(ctx)
		if status.Code(errors.Unwrap(err)) != codes.Unavailable || errors.Is(err, ErrNoSocket) || !strings.Contains(err.Error(), "PodResources List on "+sock) {
			t.Fatalf("failed List: %v", err)
		}
		if n := pr.Calls(); n != 1 {
			t.Fatalf("%d List calls on a fresh connection, want 1", n)
		}
		// On the kept connection: once more on a new one.
		if _, err := c.List(ctx); status.Code(errors.Unwrap(err)) != codes.Unavailable {
			t.Fatalf("failed List: %v", err)
		}
		if n := pr.Calls(); n != 3 {
			t.Fatalf("%d List calls, want 3 (a failure on the kept connection is asked again)", n)
		}
		pr.SetErr(nil)
		if _, err := c.List(ctx); err != nil {
			t.Fatalf("List once the kubelet answers: %v", err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		c, pr, _ := serve(t)
		if _, err := c.List(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.List(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("List after Close: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if n := pr.Calls(); n != 1 {
			t.Fatalf("%d List calls, want 1", n)
		}
	})
}

// TestClientKeepsConnection: Lists share one connection, also at once;
// after the kubelet restarts on the same path (a new server, a new
// socket) the next List answers what the new one says, at once.
func TestClientKeepsConnection(t *testing.T) {
	ctx := context.Background()
	c, pr, sock := serve(t, dpPod("ns", "p", map[string]map[string][]string{"a": {"example.com/sim": {"sim-0"}}}))
	if _, err := c.List(ctx); err != nil {
		t.Fatal(err)
	}
	kept := c.conn
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			_, err := c.List(ctx)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if c.conn != kept {
		t.Fatal("a new connection for a List on a kubelet that answers")
	}
	if n := pr.Calls(); n != 9 {
		t.Fatalf("%d List calls, want 9", n)
	}

	pr.Stop()
	pr2 := testutil.ServePodResources(t, sock, dpPod("ns", "q", map[string]map[string][]string{"a": {"example.com/sim": {"sim-1"}}}))
	res, err := c.List(ctx)
	if err != nil {
		t.Fatalf("List after the kubelet restarted: %v", err)
	}
	if got := res.Holders("example.com/sim"); !reflect.DeepEqual(got, map[string][]string{"sim-1": {"ns/q/a"}}) {
		t.Fatalf("after the restart: %q", got)
	}
	if n := pr2.Calls(); n != 1 {
		t.Fatalf("%d List calls on the new kubelet, want 1", n)
	}
}
