package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// TestPCIGPU: on the fixture machine, a resource that selects
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

// TestUSBSerial: a USB serial adapter found by vendor and
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

// sysTree makes sysfs and procfs trees below a temporary directory.
type sysTree struct {
	t         testing.TB
	sys, proc string
}

func newSysTree(t testing.TB) *sysTree {
	root := t.TempDir()
	return &sysTree{t: t, sys: filepath.Join(root, "sys"), proc: filepath.Join(root, "proc")}
}

func (s *sysTree) write(p, v string) {
	s.t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
		s.t.Fatal(err)
	}
}

func (s *sysTree) link(p, target string) {
	s.t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		s.t.Fatal(err)
	}
}

// function makes PCI function addr below bus (pci0000:xx), bound to
// driver ("" none), linked from bus/pci/devices as the kernel does; it
// returns its directory.
func (s *sysTree) function(bus, addr, vendor, dev, class, driver string, numa int) string {
	dir := filepath.Join(s.sys, "devices", bus, addr)
	for k, v := range map[string]string{"vendor": "0x" + vendor, "device": "0x" + dev, "class": "0x" + class, "numa_node": strconv.Itoa(numa)} {
		s.write(filepath.Join(dir, k), v)
	}
	if driver != "" {
		s.bind(dir, driver)
	}
	s.link(filepath.Join(s.sys, "bus", "pci", "devices", addr), "../../../devices/"+bus+"/"+addr)
	return dir
}

// bind binds the function at dir to driver.
func (s *sysTree) bind(dir, driver string) {
	s.t.Helper()
	if err := os.MkdirAll(filepath.Join(s.sys, "bus", "pci", "drivers", driver), 0o755); err != nil {
		s.t.Fatal(err)
	}
	s.link(filepath.Join(dir, "driver"), "../../../bus/pci/drivers/"+driver)
}

// registered makes a node the kernel registers below the function at dir
// (class drm, name card1, DEVNAME dri/card1).
func (s *sysTree) registered(dir, class, name, devname string, major, minor uint32) {
	d := filepath.Join(dir, class, name)
	s.write(filepath.Join(d, "dev"), fmt.Sprintf("%d:%d", major, minor))
	s.write(filepath.Join(d, "uevent"), fmt.Sprintf("MAJOR=%d\nMINOR=%d\nDEVNAME=%s", major, minor, devname))
}

// TestFoundKindsRoundTrip: each kind of function discovery
// finds in a tree made here goes the whole way: found by the real source,
// advertised, written into the spec by cdi/, and resolved by a fresh CDI
// cache with InjectDevices as containerd does: the container gets every
// node of the function with its numbers, once, and the spec carries the
// function's identity. (The NVIDIA GPU and the USB adapter: TestPCIGPU,
// TestUSBSerial.)
func TestFoundKindsRoundTrip(t *testing.T) {
	testutil.NeedMknod(t)
	type node struct {
		path         string
		major, minor int64
	}
	// A function bound to vfio-pci, in IOMMU group 42.
	vfioTree := func(s *sysTree) {
		vf := s.function("pci0000:00", "0000:3b:00.2", "8086", "154c", "020000", "vfio-pci", 0)
		if err := os.MkdirAll(filepath.Join(s.sys, "kernel", "iommu_groups", "42"), 0o755); err != nil {
			t.Fatal(err)
		}
		s.link(filepath.Join(vf, "iommu_group"), "../../../kernel/iommu_groups/42")
	}
	for _, c := range []struct {
		name, config, id string
		env              string // from Allocate
		tree             func(s *sysTree)
		nodes            map[string][2]uint32 // made below the dev root
		want             []node
		numa             int64 // -1: none
		annotations      map[string]string
	}{
		{
			name: "vfio-pci with an IOMMU group",
			config: `
- name: example.com/vf
  idPrefix: vf
  pci: {vendor: "8086", driver: vfio-pci}
`,
			tree:  vfioTree,
			nodes: map[string][2]uint32{"vfio/42": {243, 0}, "vfio/vfio": {10, 196}},
			id:    "vf-n1-0", env: "PCI_RESOURCE_EXAMPLE_COM_VF=0000:3b:00.2",
			want: []node{{"/dev/vfio/42", 243, 0}, {"/dev/vfio/vfio", 10, 196}}, numa: 0,
			annotations: map[string]string{"pci-driver": "vfio-pci", "iommu-group": "42", "pci-address": "0000:3b:00.2"},
		},
		{
			name: "vfio-pci, /dev/vfio/vfio named in sharedNodes too",
			config: `
- name: example.com/vf
  idPrefix: vf
  pci: {vendor: "8086", driver: vfio-pci}
  sharedNodes: [/dev/vfio/vfio]
`,
			tree:  vfioTree,
			nodes: map[string][2]uint32{"vfio/42": {243, 0}, "vfio/vfio": {10, 196}},
			id:    "vf-n1-0", env: "PCI_RESOURCE_EXAMPLE_COM_VF=0000:3b:00.2",
			want: []node{{"/dev/vfio/42", 243, 0}, {"/dev/vfio/vfio", 10, 196}}, numa: 0,
			annotations: map[string]string{"pci-driver": "vfio-pci", "iommu-group": "42", "pci-address": "0000:3b:00.2"},
		},
		{
			name: "DRM card and render node",
			config: `
- name: example.com/gpu
  idPrefix: gpu
  pci: {vendor: "1002", class: "03"}
`,
			tree: func(s *sysTree) {
				amd := s.function("pci0000:80", "0000:c1:00.0", "1002", "74a1", "038000", "amdgpu", 1)
				s.registered(amd, "drm", "card1", "dri/card1", 226, 1)
				s.registered(amd, "drm", "renderD128", "dri/renderD128", 226, 128)
			},
			nodes: map[string][2]uint32{"dri/card1": {226, 1}, "dri/renderD128": {226, 128}},
			id:    "gpu-n1-0", env: "PCI_RESOURCE_EXAMPLE_COM_GPU=0000:c1:00.0",
			want: []node{{"/dev/dri/card1", 226, 1}, {"/dev/dri/renderD128", 226, 128}}, numa: 1,
			annotations: map[string]string{"pci-driver": "amdgpu", "pci-class": "038000", "pci-address": "0000:c1:00.0"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newDirs(t)
			s := newSysTree(t)
			c.tree(s)
			for rel, n := range c.nodes {
				testutil.Mknod(t, filepath.Join(d.dev, rel), n[0], n[1])
			}
			cfg := writeConfig(t, "resources:"+c.config)
			r := startRun(t, d, []string{"--config", cfg, "--sys-root", s.sys, "--proc-root", s.proc}, map[string]string{"NODE_NAME": "n1"})
			u, err := r.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 1 })
			if err != nil {
				t.Fatalf("one healthy device: %v\n%s", err, r.stderr.String())
			}
			dev := u.Devices[0]
			if dev.ID != c.id || dev.Topology == nil || dev.Topology.Nodes[0].ID != c.numa {
				t.Fatalf("advertised %+v, want %s on NUMA node %d", dev, c.id, c.numa)
			}
			spec, err := resolve(context.Background(), d, r.c, c.id)
			if err != nil {
				t.Fatal(err)
			}
			var got []node
			for _, n := range spec.Linux.Devices {
				got = append(got, node{n.Path, n.Major, n.Minor})
			}
			slices.SortFunc(got, func(a, b node) int { return strings.Compare(a.path, b.path) })
			if !slices.Equal(got, c.want) {
				t.Fatalf("container nodes %v, want %v", got, c.want)
			}
			resp, err := r.c.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{c.id}}}})
			if err != nil {
				t.Fatal(err)
			}
			if k, v, _ := strings.Cut(c.env, "="); resp.ContainerResponses[0].Envs[k] != v {
				t.Fatalf("container envs %v, want %s", resp.ContainerResponses[0].Envs, c.env)
			}
			cache := testutil.FreshCDICache(t, d.cdi)
			var annotations map[string]string
			for _, name := range cache.ListDevices() {
				if strings.HasSuffix(name, "="+c.id) {
					annotations = cache.GetDevice(name).Annotations
				}
			}
			for k, v := range c.annotations {
				if got := annotations["cdi-device-plugin/"+k]; got != v {
					t.Errorf("annotation %s = %q, want %q (all %v)", k, got, v, annotations)
				}
			}
		})
	}
}

// TestGlobNUMA: a hostDevices resource gives each node the NUMA
// node of the device behind its numbers (/sys/dev/char/<major>:<minor>,
// whose device is a function with its numa_node, in a tree made here),
// reports it in ListAndWatch's TopologyInfo, and GetPreferredAllocation
// keeps a request on one NUMA node.
func TestGlobNUMA(t *testing.T) {
	d := newDirs(t)
	testutil.NeedMknod(t)
	s := newSysTree(t)
	for i, f := range []struct {
		bus, addr string
		numa      int
	}{{"pci0000:00", "0000:01:00.0", 0}, {"pci0000:80", "0000:81:00.0", 1}, {"pci0000:80", "0000:82:00.0", 1}} {
		name, minor := "ttyR"+strconv.Itoa(i), uint32(64+i)
		fn := s.function(f.bus, f.addr, "1415", "c158", "070002", "serial", f.numa)
		s.registered(fn, "tty", name, name, 4, minor)
		s.link(filepath.Join(fn, "tty", name, "device"), "../../../"+f.addr)
		s.link(filepath.Join(s.sys, "dev", "char", fmt.Sprintf("4:%d", minor)), "../../devices/"+f.bus+"/"+f.addr+"/tty/"+name)
		testutil.Mknod(t, filepath.Join(d.dev, name), 4, minor)
	}
	cfg := writeConfig(t, `
resources:
- name: example.com/serial
  idPrefix: tty
  hostDevices: ["ttyR*"]
`)
	r := startRun(t, d, []string{"--config", cfg, "--sys-root", s.sys}, map[string]string{"NODE_NAME": "n1"})
	u, err := r.wait(5*time.Second, func(u kubeletsim.Update) bool { return u.Healthy() == 3 })
	if err != nil {
		t.Fatalf("three healthy nodes: %v\n%s", err, r.stderr.String())
	}
	numa := map[string]int64{}
	for _, dev := range u.Devices {
		numa[dev.ID] = -1
		if dev.Topology != nil && len(dev.Topology.Nodes) == 1 {
			numa[dev.ID] = dev.Topology.Nodes[0].ID
		}
	}
	if want := map[string]int64{"tty-n1-ttyR0": 0, "tty-n1-ttyR1": 1, "tty-n1-ttyR2": 1}; !maps.Equal(numa, want) {
		t.Fatalf("NUMA nodes %v, want %v", numa, want)
	}
	resp, err := r.c.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: []string{"tty-n1-ttyR0", "tty-n1-ttyR1", "tty-n1-ttyR2"}, AllocationSize: 2,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].DeviceIDs; !slices.Equal(got, []string{"tty-n1-ttyR1", "tty-n1-ttyR2"}) {
		t.Fatalf("preferred %v, want the two on NUMA node 1", got)
	}
}
