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

// BenchmarkRemoveStale looks through a CDI dir of a busy node at start:
// the resource's spec and 100 per-claim specs, none of them stale.
func BenchmarkRemoveStale(b *testing.B) {
	dir := b.TempDir()
	w := NewWriter(dir, "bench", 1)
	k, err := kindForResource("example.com/fpga")
	if err != nil {
		b.Fatal(err)
	}
	r := Resource{Name: "example.com/fpga", Kind: k, EnvPrefix: "FPGA"}
	snap := &device.Snapshot{Replicas: 1}
	for i := range 8 {
		snap.Devices = append(snap.Devices, device.Device{Name: "fpga-" + strconv.Itoa(i), Index: i, HostPath: "/dev/null",
			ContainerPath: "/dev/fpga-" + strconv.Itoa(i), Type: device.Char, Major: 1, Minor: 3, NUMANode: device.NoNUMA, Healthy: true})
	}
	if err := w.Write(r, snap); err != nil {
		b.Fatal(err)
	}
	ck, err := ClaimKind("fpga.example.com")
	if err != nil {
		b.Fatal(err)
	}
	for i := range 100 {
		c := Claim{Namespace: "default", Name: "c" + strconv.Itoa(i), UID: "0000-" + strconv.Itoa(i),
			Env: []string{"A=1"}, Mounts: []Mount{{HostPath: "/tmp", ContainerPath: "/x", ReadOnly: true}}}
		if _, _, err := w.WriteClaimSpec(ck, c); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		removed, err := w.RemoveStale([]Kind{k})
		if err != nil || len(removed) != 0 {
			b.Fatalf("removed %v: %v", removed, err)
		}
	}
}
