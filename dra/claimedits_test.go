package dra

import (
	"fmt"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// TestClaimEdits: what a claim's spec gives its containers is
// what the device plugin's Allocate gives a container with those devices:
// <ENV>_DEVICES with the claim's device IDs per resource, the bus
// identities of devices found by PCI or USB identity, and the resources'
// mounts (once per container path).
func TestClaimEdits(t *testing.T) {
	gpus := simDevices(2, "n1")
	gpus.Devices[0].Identity.PCIAddress = "0000:3b:00.0"
	gpus.Devices[1].Identity.PCIAddress = "0000:86:00.0"
	ttys := simDevices(1, "n1")
	ttys.Devices[0].Identity = device.Identity{USBBus: 1, USBDevice: 4}
	mount := cdi.Mount{HostPath: "/opt/lib", ContainerPath: "/usr/local/lib", ReadOnly: true}
	d := &claimSpecs{devs: &devices{}}
	for _, r := range []struct {
		res  Resource
		snap *device.Snapshot
	}{
		{Resource{Name: "example.com/gpu", EnvPrefix: "GPU", Mounts: []cdi.Mount{mount}}, gpus},
		{Resource{Name: "example.com/tty", Mounts: []cdi.Mount{mount}}, ttys},
		{Resource{Name: "example.com/sim", EnvPrefix: "SIM"}, simDevices(3, "n1")},
	} {
		res := &running{Resource: r.res}
		res.snap.Store(r.snap)
		d.devs.res = append(d.devs.res, res)
	}
	dev := func(res, id string) PreparedDevice { return PreparedDevice{Resource: res, ID: id} }
	for _, c := range []struct {
		name    string
		devices []PreparedDevice
		env     string
		mounts  int
	}{
		{"gpus, in the claim's order", []PreparedDevice{dev("example.com/gpu", "sim-n1-1"), dev("example.com/gpu", "sim-n1-0")},
			"[GPU_DEVICES=sim-n1-1,sim-n1-0 PCI_RESOURCE_EXAMPLE_COM_GPU=0000:86:00.0,0000:3b:00.0]", 1},
		{"usb without an env prefix, and a gpu: one mount", []PreparedDevice{dev("example.com/tty", "sim-n1-0"), dev("example.com/gpu", "sim-n1-0")},
			"[GPU_DEVICES=sim-n1-0 PCI_RESOURCE_EXAMPLE_COM_GPU=0000:3b:00.0 USB_RESOURCE_EXAMPLE_COM_TTY=001:004]", 1},
		{"simulated, a device twice", []PreparedDevice{dev("example.com/sim", "sim-n1-2"), dev("example.com/sim", "sim-n1-2")}, "[SIM_DEVICES=sim-n1-2]", 0},
		{"nothing of ours", nil, "[]", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := d.edits("u1", PreparedClaim{Namespace: "ns", Name: "c", Devices: c.devices})
			if fmt.Sprint(got.Env) != c.env || len(got.Mounts) != c.mounts || got.UID != "u1" || got.Name != "c" {
				t.Fatalf("env %v mounts %v, want %s and %d mounts", got.Env, got.Mounts, c.env, c.mounts)
			}
		})
	}
}
