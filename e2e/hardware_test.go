//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// The real-hardware scenario's own deployment: devices found by their PCI
// and USB identity in a sysfs and procfs tree the suite makes on the node
// (below the state directory, which the plugin pod mounts), with their
// nodes in a dev root of their own.
const (
	hwNS     = "cdi-e2e-hw"
	hwGPU    = "e2e.cdi.dev/gpu"
	hwSerial = "e2e.cdi.dev/serial"
	hwRoot   = "/var/lib/cdi-device-plugin/e2e-hw"
	hwDev    = "/dev/e2e-hw"
)

func init() { suiteNamespaces = append(suiteNamespaces, hwNS) }

// hwFunction is the shell that makes an NVIDIA function in the tree, as
// the kernel and the driver show it (device/sysfs/testdata has the real
// machine's).
func hwFunction(addr string, minor, numa int) string {
	dir := hwRoot + "/sys/devices/pci0000:00/" + addr
	return fmt.Sprintf(`mkdir -p %[1]s %[2]s/sys/bus/pci/devices %[2]s/sys/bus/pci/drivers/nvidia %[2]s/proc/driver/nvidia/gpus/%[3]s
printf '0x10de\n' > %[1]s/vendor; printf '0x2330\n' > %[1]s/device; printf '0x030200\n' > %[1]s/class; printf '%[5]d\n' > %[1]s/numa_node
ln -sfn ../../../bus/pci/drivers/nvidia %[1]s/driver
ln -sfn ../../../devices/pci0000:00/%[3]s %[2]s/sys/bus/pci/devices/%[3]s
printf 'Model: \t NVIDIA H100 80GB HBM3\nBus Location: \t %[3]s\nDevice Minor: \t %[4]d\n' > %[2]s/proc/driver/nvidia/gpus/%[3]s/information
`, dir, hwRoot, addr, minor, numa)
}

const hwUSB = hwRoot + "/sys/devices/pci0000:00/0000:00:14.0/usb1/1-2"

// Scenario 12: real hardware. Two NVIDIA GPUs (one on NUMA node 1) found
// by {vendor: 10de}: a pod asking for one sees its /dev/nvidiaN with the
// shared nodes and PCI_RESOURCE_E2E_CDI_DEV_GPU. A USB serial adapter
// plugged in (its sysfs entry, then its nodes) is advertised; unplugged
// while no pod holds it, it is forgotten after forgetAfter (capacity 0).
func (c *cluster) scenarioHardware(t *testing.T, node string) {
	c.mustNodeSh(t, "rm -rf "+hwRoot+" "+hwDev+" && mkdir -p "+hwDev+"/bus/usb/001 && "+
		"mknod "+hwDev+"/nvidia0 c 195 0 && mknod "+hwDev+"/nvidia1 c 195 1 && mknod "+hwDev+"/nvidiactl c 195 255 && mknod "+hwDev+"/nvidia-uvm c 238 0 && "+
		"chmod 0666 "+hwDev+"/nvidia*\n"+hwFunction("0000:00:06.0", 0, -1)+hwFunction("0000:41:00.0", 1, 1))
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	// The dev root comes through DEV_ROOT: the DaemonSet sets it, and the
	// environment wins over the file.
	if err := os.WriteFile(cfg, []byte(`sysRoot: `+hwRoot+`/sys
procRoot: `+hwRoot+`/proc
resources:
- name: `+hwGPU+`
  idPrefix: e2e-gpu
  pci: {vendor: "10de", class: "0302", driver: nvidia}
  sharedNodes: [nvidiactl, nvidia-uvm, nvidia-uvm-tools]
  envPrefix: GPU
- name: `+hwSerial+`
  idPrefix: e2e-ser
  usb: {vendor: "0403", product: "6001"}
  containerPath: "/dev/ttyUSB{{.Index}}"
  forgetAfter: 5s
`), 0o644); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"NAMESPACE": hwNS, "PLUGIN_NAME": hwNS, "PLUGIN_CONFIG": cfg, "LOG_LEVEL": "debug", "DEV_ROOT": hwDev}
	c.deploy(t, "apply", vars)
	t.Cleanup(func() {
		c.deletePod(t, "g1")
		c.deploy(t, "delete", vars)
		_, _ = c.nodeSh("rm -rf " + hwDev + " " + hwRoot + " /var/run/cdi/k8s.e2e.cdi.dev-gpu.json /var/run/cdi/k8s.e2e.cdi.dev-serial.json " +
			"/var/lib/cdi-device-plugin/resources/k8s.e2e.cdi.dev-gpu.json /var/lib/cdi-device-plugin/resources/k8s.e2e.cdi.dev-serial.json")
	})
	t.Cleanup(func() { // before the delete above: the plugin's log on failure
		if !t.Failed() {
			return
		}
		if p, err := c.pluginPod(context.Background(), hwNS); err == nil {
			out, _ := c.logs(context.Background(), hwNS, p.Name, false)
			t.Logf("plugin pod %s log:\n%s", p.Name, out)
		}
		out, _ := c.nodeSh("find " + hwRoot + " " + hwDev + " | head -50")
		t.Logf("on the node:\n%s", out)
	})
	d := c.waitAllocatableOf(t, node, hwGPU, 2, 2*time.Minute)
	t.Logf("2 GPUs found by PCI identity, allocatable %v after the deploy", d.Round(time.Millisecond))

	c.createPod(t, c.testPodOf("g1", hwGPU, 1))
	c.waitRunning(t, "g1", 0, 2*time.Minute)
	out := c.mustExec(t, "g1", `ls /dev | grep nvidia | sort | tr '\n' ' '; echo; echo "$PCI_RESOURCE_E2E_CDI_DEV_GPU"; echo "$GPU_DEVICES"`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("pod output %q", out)
	}
	nodes, addr, id := strings.Fields(lines[0]), lines[1], lines[2]
	want := map[string][]string{
		"0000:00:06.0": {"nvidia-uvm", "nvidia0", "nvidiactl"},
		"0000:41:00.0": {"nvidia-uvm", "nvidia1", "nvidiactl"},
	}[addr]
	if want == nil || !slices.Equal(nodes, want) {
		t.Fatalf("pod sees /dev %v with PCI_RESOURCE_E2E_CDI_DEV_GPU=%q (device %s), want one GPU's node and the shared ones", nodes, addr, id)
	}
	t.Logf("pod g1 got %s (%s): /dev %v", id, addr, nodes)
	spec := c.mustNodeSh(t, "cat /var/run/cdi/k8s.e2e.cdi.dev-gpu.json")
	if !strings.Contains(spec, `"cdi-device-plugin/pci-address":"0000:41:00.0"`) {
		t.Errorf("spec without the identity of 0000:41:00.0:\n%s", spec)
	}

	ids := specIDsByAddress(t, spec)
	c.checkTopology(t, hwGPU, map[string][]int64{ids["0000:00:06.0"]: nil, ids["0000:41:00.0"]: {1}})
	c.unbindByUevent(t, node, "0000:00:06.0")

	// A USB serial adapter plugged in: the kernel's sysfs entry first, then
	// its nodes (the tty last, in the watched dev root).
	t0 := time.Now()
	c.mustNodeSh(t, `set -e
u=`+hwUSB+`
mkdir -p $u/1-2:1.0/ttyUSB0/tty/ttyUSB0 `+hwRoot+`/sys/bus/usb/devices
printf '1\n' > $u/busnum; printf '4\n' > $u/devnum; printf '0403\n' > $u/idVendor; printf '6001\n' > $u/idProduct; printf 'A10K\n' > $u/serial
printf '189:3\n' > $u/dev; printf 'DEVNAME=bus/usb/001/004\n' > $u/uevent; printf '1\n' > $u/../../numa_node
printf '188:0\n' > $u/1-2:1.0/ttyUSB0/tty/ttyUSB0/dev; printf 'DEVNAME=ttyUSB0\n' > $u/1-2:1.0/ttyUSB0/tty/ttyUSB0/uevent
ln -sfn ../../../devices/pci0000:00/0000:00:14.0/usb1/1-2 `+hwRoot+`/sys/bus/usb/devices/1-2
mknod `+hwDev+`/bus/usb/001/004 c 189 3
mknod `+hwDev+`/ttyUSB0 c 188 0`)
	c.waitAllocatableOf(t, node, hwSerial, 1, time.Minute)
	t.Logf("USB adapter plugged in: allocatable 1 after %v", time.Since(t0).Round(time.Millisecond))

	// Unplugged, held by nobody: Unhealthy, then forgotten after 5s.
	t0 = time.Now()
	c.mustNodeSh(t, "rm -f "+hwRoot+"/sys/bus/usb/devices/1-2 && rm -rf "+hwUSB+" && rm -f "+hwDev+"/bus/usb/001/004 "+hwDev+"/ttyUSB0")
	eventually(t, time.Minute, "the unplugged adapter forgotten (capacity 0)", func() (bool, string) {
		capacity, _, err := c.nodeResource(context.Background(), node, hwSerial)
		if err != nil {
			return false, err.Error()
		}
		return capacity == 0, fmt.Sprintf("capacity %d", capacity)
	})
	t.Logf("USB adapter unplugged: forgotten, capacity 0 after %v (forgetAfter 5s)", time.Since(t0).Round(time.Millisecond))
}

// specIDsByAddress maps the PCI addresses in a spec's device annotations
// to the devices' names (their IDs).
func specIDsByAddress(t *testing.T, spec string) map[string]string {
	t.Helper()
	var f struct {
		Devices []struct {
			Name        string            `json:"name"`
			Annotations map[string]string `json:"annotations"`
		} `json:"devices"`
	}
	if err := json.Unmarshal([]byte(spec), &f); err != nil {
		t.Fatalf("spec: %v\n%s", err, spec)
	}
	out := map[string]string{}
	for _, d := range f.Devices {
		if a := d.Annotations["cdi-device-plugin/pci-address"]; a != "" {
			out[a] = d.Name
		}
	}
	return out
}

// checkTopology: the kubelet lists the devices of res with the NUMA nodes
// their plugin reported (want: ID -> NUMA node IDs, nil for none), as a
// topology-aware agent reads them: PodResources GetAllocatableResources
// on the kubelet's socket, reached through E2E_NODE_ROOT (the node's root
// as this machine sees it; without it the check is skipped).
func (c *cluster) checkTopology(t *testing.T, res string, want map[string][]int64) {
	t.Helper()
	root := os.Getenv("E2E_NODE_ROOT")
	if root == "" {
		t.Logf("E2E_NODE_ROOT unset: the kubelet's device topology not checked")
		return
	}
	sock := filepath.Join(root, "var", "lib", "kubelet", "pod-resources", "kubelet.sock")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := map[string][]int64{}
	eventually(t, time.Minute, "the kubelet lists "+res+" with its topology", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := podresourcesapi.NewPodResourcesListerClient(conn).GetAllocatableResources(ctx, &podresourcesapi.AllocatableResourcesRequest{})
		if err != nil {
			return false, err.Error()
		}
		clear(got)
		for _, d := range r.GetDevices() {
			if d.GetResourceName() != res {
				continue
			}
			for _, id := range d.GetDeviceIds() {
				var numa []int64
				for _, n := range d.GetTopology().GetNodes() {
					numa = append(numa, n.GetID())
				}
				got[id] = numa
			}
		}
		if len(got) != len(want) {
			return false, fmt.Sprintf("devices %v", got)
		}
		for id, w := range want {
			if g, ok := got[id]; !ok || !slices.Equal(g, w) {
				return false, fmt.Sprintf("devices %v, want %v", got, want)
			}
		}
		return true, ""
	})
	t.Logf("the kubelet lists %s with NUMA nodes %v", res, got)
}

// unbindByUevent: a GPU unbound from its driver in the tree, which changes
// no node, is Unhealthy once a kernel uevent of the pci subsystem tells
// the plugin to look (allocatable 1), and Healthy again once rebound and
// told again (allocatable 2). The uevent is the machine's own (a real PCI
// device's uevent file written here): only a node that shares this
// machine's kernel (the local node, a kind node) receives it; elsewhere
// the step is skipped.
func (c *cluster) unbindByUevent(t *testing.T, node, addr string) {
	t.Helper()
	here, err := hostSh("cat /proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	if there := c.mustNodeSh(t, "cat /proc/sys/kernel/random/boot_id"); there != here {
		t.Logf("the node runs another kernel: no uevent sent from here")
		return
	}
	uevent := func() {
		t.Helper()
		if _, err := hostSh("echo change > $(ls -d /sys/bus/pci/devices/* | head -1)/uevent"); err != nil {
			t.Fatal(err)
		}
	}
	link := hwRoot + "/sys/devices/pci0000:00/" + addr + "/driver"
	for _, step := range []struct {
		what, sh string
		want     int64
	}{
		{"unbound", "rm " + link, 1},
		{"bound again", "ln -s ../../../bus/pci/drivers/nvidia " + link, 2},
	} {
		c.mustNodeSh(t, step.sh)
		t0 := time.Now()
		uevent()
		c.waitAllocatableOf(t, node, hwGPU, step.want, time.Minute)
		t.Logf("GPU %s %s, then a kernel uevent: allocatable %d after %v", addr, step.what, step.want, time.Since(t0).Round(time.Millisecond))
	}
}
