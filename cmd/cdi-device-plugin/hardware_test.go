package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// h100 is a real machine's sysfs and procfs: one NVIDIA H100 at
// 0000:00:06.0 (device/sysfs/testdata/nvidia-h100-vm/README.md).
const h100 = "../../device/sysfs/testdata/nvidia-h100-vm"

// TestPCIGPU (issue 20): on the fixture machine, a resource that selects
// the NVIDIA function by its PCI identity advertises one device, with no
// NUMA node; a container that gets it sees /dev/nvidia0 with the shared
// nodes (the absent one skipped) and PCI_RESOURCE_EXAMPLE_COM_GPU, as a
// fresh CDI cache resolves the spec. Its node removed: Unhealthy.
func TestPCIGPU(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	// The machine's NVIDIA nodes (dev-nodes.txt), nvidia-uvm-tools left out.
	testutil.Mknod(t, filepath.Join(d.dev, "nvidia0"), 195, 0)
	testutil.Mknod(t, filepath.Join(d.dev, "nvidiactl"), 195, 255)
	testutil.Mknod(t, filepath.Join(d.dev, "nvidia-uvm"), 238, 0)
	cfg := writeConfig(t, `
resources:
- name: example.com/gpu
  idPrefix: gpu
  pci: {vendor: "10de", class: "0302", driver: nvidia}
  sharedNodes: [/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools]
  envPrefix: GPU
`)
	fixture, err := filepath.Abs(h100)
	if err != nil {
		t.Fatal(err)
	}
	r := startRun(t, d, []string{"--config", cfg, "--sys-root", filepath.Join(fixture, "sys"), "--proc-root", filepath.Join(fixture, "proc")},
		map[string]string{"NODE_NAME": "h100"})
	u, err := r.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 1 })
	if err != nil {
		t.Fatalf("one healthy GPU: %v\n%s", err, r.stderr.String())
	}
	if len(u.Devices) != 1 || u.Devices[0].ID != "gpu-h100-0" || u.Devices[0].Topology != nil {
		t.Fatalf("devices %+v: want gpu-h100-0 without NUMA node", u.Devices)
	}
	spec, err := resolve(context.Background(), d, r.c, "gpu-h100-0")
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range spec.Linux.Devices {
		nodes = append(nodes, n.Path)
	}
	slices.Sort(nodes)
	if want := []string{"/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"}; !slices.Equal(nodes, want) {
		t.Fatalf("container nodes %q, want %q", nodes, want)
	}
	resp, err := r.c.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"gpu-h100-0"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].Envs["PCI_RESOURCE_EXAMPLE_COM_GPU"]; got != "0000:00:06.0" {
		t.Fatalf("PCI_RESOURCE_EXAMPLE_COM_GPU=%q, want the H100's address (envs %v)", got, resp.ContainerResponses[0].Envs)
	}
	data, err := os.ReadFile(filepath.Join(d.cdi, "k8s.example.com-gpu.json"))
	if err != nil || !strings.Contains(string(data), `"cdi-device-plugin/pci-address":"0000:00:06.0"`) {
		t.Fatalf("spec without the identity annotations: %v\n%s", err, data)
	}
	t.Logf("the CDI spec written for the fixture machine:\n%s", data)
	if err := os.Remove(filepath.Join(d.dev, "nvidia0")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 0 && len(u.Devices) == 1 }); err != nil {
		t.Fatalf("node removed: %v", err)
	}
}

// TestUSBSerial (issue 20): a USB serial adapter found by vendor and
// product in a sysfs tree made here: its tty appears at the configured
// container path with its bus node, the container learns its bus:device,
// and a kernel event is not needed for the start.
func TestUSBSerial(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	sys := filepath.Join(t.TempDir(), "sys")
	write := func(p, v string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dev := filepath.Join(sys, "devices", "pci0000:00", "0000:00:14.0", "usb1", "1-2")
	for k, v := range map[string]string{"busnum": "1", "devnum": "4", "idVendor": "0403", "idProduct": "6001", "serial": "A10K",
		"dev": "189:3", "uevent": "DEVNAME=bus/usb/001/004", "1-2:1.0/ttyUSB0/tty/ttyUSB0/dev": "188:0",
		"1-2:1.0/ttyUSB0/tty/ttyUSB0/uevent": "DEVNAME=ttyUSB0", "../../numa_node": "1"} {
		write(filepath.Join(dev, k), v)
	}
	if err := os.MkdirAll(filepath.Join(sys, "bus", "usb", "devices"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../devices/pci0000:00/0000:00:14.0/usb1/1-2", filepath.Join(sys, "bus", "usb", "devices", "1-2")); err != nil {
		t.Fatal(err)
	}
	testutil.Mknod(t, filepath.Join(d.dev, "ttyUSB0"), 188, 0)
	testutil.Mknod(t, filepath.Join(d.dev, "bus", "usb", "001", "004"), 189, 3)
	cfg := writeConfig(t, `
resources:
- name: example.com/serial
  idPrefix: ser
  usb: {vendor: "0403", product: "6001"}
  containerPath: "/dev/ttyS{{.Index}}"
`)
	r := startRun(t, d, []string{"--config", cfg, "--sys-root", sys}, map[string]string{"NODE_NAME": "n1"})
	u, err := r.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 1 })
	if err != nil {
		t.Fatalf("one healthy adapter: %v\n%s", err, r.stderr.String())
	}
	if u.Devices[0].ID != "ser-n1-0" || u.Devices[0].Topology == nil || u.Devices[0].Topology.Nodes[0].ID != 1 {
		t.Fatalf("devices %+v: want ser-n1-0 on NUMA node 1 (its controller's)", u.Devices)
	}
	spec, err := resolve(context.Background(), d, r.c, "ser-n1-0")
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range spec.Linux.Devices {
		nodes = append(nodes, n.Path)
	}
	slices.Sort(nodes)
	if want := []string{"/dev/bus/usb/001/004", "/dev/ttyS0"}; !slices.Equal(nodes, want) {
		t.Fatalf("container nodes %q, want %q", nodes, want)
	}
	resp, err := r.c.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"ser-n1-0"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].Envs["USB_RESOURCE_EXAMPLE_COM_SERIAL"]; got != "001:004" {
		t.Fatalf("USB_RESOURCE_EXAMPLE_COM_SERIAL=%q, want 001:004", got)
	}
}
