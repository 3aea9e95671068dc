package plugin

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

func benchPlugin(b testing.TB, n, numa, replicas int) (*Plugin, []string) {
	b.Helper()
	snap := snapshot(n, numa, replicas)
	p, err := New(Options{ResourceName: resourceName, PluginName: "bench", Dir: b.TempDir(), SocketName: "b.sock",
		Kind: testKind(b), Strategies: config.Strategies{config.StrategyCDICRI, config.StrategyCDIAnnotations}, EnvPrefix: "SIM", AnnotationPrefix: "example.com/sim"}, snap)
	if err != nil {
		b.Fatal(err)
	}
	var ids []string
	for _, d := range snap.Devices {
		for r := 0; r < replicas; r++ {
			ids = append(ids, device.ReplicaID(d.Name, r, replicas))
		}
	}
	return p, ids
}

func BenchmarkAllocate8(b *testing.B) {
	p, ids := benchPlugin(b, 8, 0, 1)
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Allocate(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllocate8Logged: as BenchmarkAllocate8 with the info line per
// call written to a file, as the plugin runs by default.
func BenchmarkAllocate8Logged(b *testing.B) {
	p, ids := benchPlugin(b, 8, 0, 1)
	f, err := os.Create(filepath.Join(b.TempDir(), "log"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	l := logrus.New()
	l.SetOutput(f)
	l.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: time.RFC3339Nano})
	p.log = logrus.NewEntry(l).WithField("plugin", "bench").WithField("resource", resourceName)
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Allocate(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllocate10000IDs: 8 IDs (2 devices' replicas and 6 others)
// out of 10,000 (2,500 devices × 4 replicas): the answer must not grow
// with the number of devices.
func BenchmarkAllocate10000IDs(b *testing.B) {
	p, ids := benchPlugin(b, 2500, 4, 4)
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{
		ids[0], ids[1], ids[4], ids[5], ids[2000], ids[4000], ids[8000], ids[9999]}}}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Allocate(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPreferredAllocation(b *testing.B) {
	for _, c := range []struct {
		name                 string
		n, numa, replicas, k int
	}{
		{"8dev-2numa-size2", 8, 2, 1, 2},
		{"64dev-4numa-4rep-size8", 64, 4, 4, 8},
		// 10,000 IDs available, as with a config of 2,500 devices × 4.
		{"2500dev-4numa-4rep-size4", 2500, 4, 4, 4},
		{"2500dev-4numa-4rep-size64", 2500, 4, 4, 64},
	} {
		b.Run(c.name, func(b *testing.B) {
			p, ids := benchPlugin(b, c.n, c.numa, c.replicas)
			req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
				AvailableDeviceIDs: ids, MustIncludeDeviceIDs: ids[len(ids)-1:], AllocationSize: int32(c.k)}}}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.GetPreferredAllocation(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkUpdateHealth10000IDs: one device's health flips at 10,000 IDs
// (a node removed and put back): the new view and the bytes ListAndWatch
// sends for it.
func BenchmarkUpdateHealth10000IDs(b *testing.B) {
	p, _ := benchPlugin(b, 2500, 4, 4)
	p.state.Load().message()
	healthy := p.state.Load().snap
	sick := withHealth(healthy, 3, false, "missing")
	next := sick
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Update(next); err != nil {
			b.Fatal(err)
		}
		p.state.Load().message()
		if next == sick {
			next = healthy
		} else {
			next = sick
		}
	}
}

// BenchmarkUpdateDevices10000IDs: the device set changes (a view built
// from scratch).
func BenchmarkUpdateDevices10000IDs(b *testing.B) {
	p, _ := benchPlugin(b, 2500, 4, 4)
	a, c := p.state.Load().snap, snapshot(2501, 4, 4)
	next := c
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Update(next); err != nil {
			b.Fatal(err)
		}
		if next == c {
			next = a
		} else {
			next = c
		}
	}
}

// BenchmarkListAndWatchMessage10000IDs encodes the ListAndWatch message of
// 10,000 IDs, as gRPC does for every send.
func BenchmarkListAndWatchMessage10000IDs(b *testing.B) {
	p, _ := benchPlugin(b, 2500, 4, 4)
	msg := &pluginapi.ListAndWatchResponse{Devices: p.state.Load().list}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := proto.Marshal(msg); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPreferred10k(b *testing.B) {
	p, ids := benchPlugin(b, 2500, 2, 4)
	v := p.state.Load()
	b.ResetTimer()
	for b.Loop() {
		if _, err := preferred(v, ids, nil, 8); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkListAndWatchDecode10000IDs decodes it, as the kubelet does.
func BenchmarkListAndWatchDecode10000IDs(b *testing.B) {
	p, _ := benchPlugin(b, 2500, 4, 4)
	msg, err := proto.Marshal(&pluginapi.ListAndWatchResponse{Devices: p.state.Load().list})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		var r pluginapi.ListAndWatchResponse
		if err := proto.Unmarshal(msg, &r); err != nil {
			b.Fatal(err)
		}
	}
}
