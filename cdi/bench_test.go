package cdi

import (
	"strconv"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// BenchmarkBuildSpec10000 builds the spec of 10,000 devices, each with a
// node, an env variable and a state mount (what the plugin writes at
// start and on every change of the device set).
func BenchmarkBuildSpec10000(b *testing.B) {
	k, err := kindForResource("example.com/fpga")
	if err != nil {
		b.Fatal(err)
	}
	r := Resource{Name: "example.com/fpga", Kind: k, EnvPrefix: "FPGA", StateRoot: "/var/lib/cdi-device-plugin/devices"}
	snap := &device.Snapshot{Replicas: 1}
	for i := 0; i < 10000; i++ {
		n := "fpga-node1-" + strconv.Itoa(i)
		snap.Devices = append(snap.Devices, device.Device{Name: n, Index: i, HostPath: "/dev/fpga-" + strconv.Itoa(i),
			ContainerPath: "/dev/fpga-" + strconv.Itoa(i), Type: device.Char, Major: 1, Minor: 3, NUMANode: device.NoNUMA, Healthy: true})
	}
	b.ReportAllocs()
	for b.Loop() {
		spec, err := BuildSpec("bench", 1, r, snap)
		if err != nil {
			b.Fatal(err)
		}
		if len(spec.Devices) != 10000 {
			b.Fatalf("%d devices", len(spec.Devices))
		}
	}
}
