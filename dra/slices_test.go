package dra

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

const testDriver = "sim.example.com"

func simDevices(n int, node string) *device.Snapshot {
	s := &device.Snapshot{Replicas: 1}
	for i := range n {
		s.Devices = append(s.Devices, device.Device{Name: device.ID("sim", node, fmt.Sprint(i)), Index: i, HostPath: fmt.Sprintf("/dev/sim-%d", i),
			ContainerPath: fmt.Sprintf("/dev/sim-%d", i), Type: device.Char, Major: 1, Minor: 3, NUMANode: device.NoNUMA, Healthy: true})
	}
	return s
}

func kindOf(t *testing.T, domain, class string) cdi.Kind {
	t.Helper()
	k, err := cdi.KindFor(domain, class)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func str(a resourceapi.DeviceAttribute) string {
	switch {
	case a.StringValue != nil:
		return *a.StringValue
	case a.IntValue != nil:
		return fmt.Sprint(*a.IntValue)
	}
	return "?"
}

func attrs(d resourceapi.Device) map[string]string {
	out := map[string]string{}
	for k, v := range d.Attributes {
		out[string(k)] = str(v)
	}
	return out
}

func taints(d resourceapi.Device) []string {
	var out []string
	for _, t := range d.Taints {
		out = append(out, t.Key+"="+t.Value+":"+string(t.Effect))
	}
	return out
}

// TestSlices: the devices as the ResourceSlices list them:
// named by index, their attributes (the id equal to the spec's CDI name),
// the unhealthy and handover taints, at most 64 devices per slice, a
// device the spec does not describe left out, and one empty slice for a
// resource without devices; a pool per resource.
func TestSlices(t *testing.T) {
	k := kindOf(t, "example.com", "sim")
	unhealthy := simDevices(2, "n1")
	unhealthy.Devices[1].SetProblem(device.Problem{Cause: device.CauseMissing, Message: "gone"})
	notInSpec := simDevices(2, "n1")
	notInSpec.Devices[1].SetProblem(device.Problem{Cause: device.CauseNotInSpec})
	pci := simDevices(1, "n1")
	pci.Devices[0].NUMANode = 1
	pci.Devices[0].Identity = device.Identity{PCIAddress: "0000:3b:00.0", PCIVendor: "10de", PCIDevice: "2330", PCIClass: "030200", PCIDriver: "nvidia"}
	usb := simDevices(1, "n1")
	usb.Devices[0].Identity = device.Identity{USBBus: 1, USBDevice: 4, USBVendor: "0403", USBProduct: "6001", USBSerial: "A10K"}
	long := simDevices(1, "a-node-name-long-enough-to-push-the-cdi-name-past-sixty-four-chars")
	q := func(n string) string { return testDriver + "/" + n }
	for _, c := range []struct {
		name   string
		res    []Published
		slices []int                        // devices per slice
		attrs  map[string]map[string]string // by device: attributes expected (subset)
		absent map[string][]string          // by device: attributes that must be absent
		taints map[string][]string          // by device: exactly these taints
	}{
		{"simulated", []Published{{Resource: "example.com/sim", Kind: k, IDPrefix: "sim", Snapshot: simDevices(2, "n1")}}, []int{2},
			map[string]map[string]string{"sim-0": {q("resource"): "example.com/sim", q("index"): "0", q("id"): "k8s.example.com/sim=sim-n1-0"},
				"sim-1": {q("index"): "1", q("id"): "k8s.example.com/sim=sim-n1-1"}},
			map[string][]string{"sim-0": {q("numaNode"), q("pciAddress"), q("firmwareSHA256"), q("usbBus")}},
			map[string][]string{"sim-0": nil, "sim-1": nil}},
		{"unhealthy tainted", []Published{{Resource: "example.com/sim", Kind: k, IDPrefix: "sim", Snapshot: unhealthy}}, []int{2}, nil, nil,
			map[string][]string{"sim-0": nil, "sim-1": {q("unhealthy") + "=missing:NoSchedule"}}},
		{"handover taints every device", []Published{{Resource: "example.com/sim", Kind: k, IDPrefix: "sim", Snapshot: unhealthy, Handover: true}}, []int{2}, nil, nil,
			map[string][]string{"sim-0": {q("handover") + "=:NoSchedule"}, "sim-1": {q("unhealthy") + "=missing:NoSchedule", q("handover") + "=:NoSchedule"}}},
		{"not in the spec left out", []Published{{Resource: "example.com/sim", Kind: k, IDPrefix: "sim", Snapshot: notInSpec}}, []int{1}, nil, nil,
			map[string][]string{"sim-0": nil}},
		{"pci identity and NUMA", []Published{{Resource: "example.com/gpu", Kind: kindOf(t, "example.com", "gpu"), IDPrefix: "GPU_x", Snapshot: pci, FirmwareSHA256: "ab12"}}, []int{1},
			map[string]map[string]string{"gpu-x-0": {q("numaNode"): "1", "resource.kubernetes.io/numaNode": "1", q("pciAddress"): "0000:3b:00.0",
				"resource.kubernetes.io/pciBusID": "0000:3b:00.0", q("pciVendor"): "10de", q("pciDevice"): "2330", q("pciClass"): "030200", q("pciDriver"): "nvidia",
				q("firmwareSHA256"): "ab12"}}, nil, nil},
		{"usb identity", []Published{{Resource: "example.com/tty", Kind: kindOf(t, "example.com", "tty"), IDPrefix: "tty", Snapshot: usb}}, []int{1},
			map[string]map[string]string{"tty-0": {q("usbBus"): "1", q("usbDevice"): "4", q("usbVendor"): "0403", q("usbProduct"): "6001", q("usbSerial"): "A10K"}},
			map[string][]string{"tty-0": {q("pciAddress"), q("numaNode")}}, nil},
		{"an id too long for an attribute is left out", []Published{{Resource: "example.com/sim", Kind: k, IDPrefix: "sim", Snapshot: long}}, []int{1},
			map[string]map[string]string{"sim-0": {q("index"): "0"}}, map[string][]string{"sim-0": {q("id")}}, nil},
		{"two resources, 130 devices: a pool each, 64 per slice", []Published{
			{Resource: "example.com/sim", Kind: k, IDPrefix: "sim", Snapshot: simDevices(100, "")},
			{Resource: "example.com/fpga", Kind: kindOf(t, "example.com", "fpga"), IDPrefix: "fpga", Snapshot: simDevices(30, "")},
		}, []int{30, 64, 36}, map[string]map[string]string{"sim-99": {q("resource"): "example.com/sim"}, "fpga-29": {q("resource"): "example.com/fpga", q("id"): "k8s.example.com/fpga=sim-29"}}, nil, nil},
		{"no devices: one empty slice", []Published{{Resource: "example.com/sim", Kind: k, IDPrefix: "sim", Snapshot: &device.Snapshot{Replicas: 1}}}, []int{0}, nil, nil, nil},
		{"nothing published yet: one empty slice", []Published{{Resource: "example.com/sim", Kind: k, IDPrefix: "sim"}}, []int{0}, nil, nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			pools := Pools(testDriver, "n1", c.res)
			if len(pools) != len(c.res) {
				t.Fatalf("%d pools for %d resources", len(pools), len(c.res))
			}
			// The slices of every pool, pools by name.
			var got []resourceslice.Slice
			for _, name := range slices.Sorted(maps.Keys(pools)) {
				got = append(got, pools[name].Slices...)
				for _, s := range pools[name].Slices {
					for _, d := range s.Devices {
						if want := PoolName("n1", resourcePrefix(c.res, d)); name != want {
							t.Errorf("%s in pool %s, want %s", d.Name, name, want)
						}
					}
				}
			}
			if len(got) != len(c.slices) {
				t.Fatalf("%d slices, want %d", len(got), len(c.slices))
			}
			byName := map[string]resourceapi.Device{}
			for i, s := range got {
				if len(s.Devices) != c.slices[i] {
					t.Errorf("slice %d: %d devices, want %d", i, len(s.Devices), c.slices[i])
				}
				for _, d := range s.Devices {
					if _, dup := byName[d.Name]; dup {
						t.Errorf("device %s twice", d.Name)
					}
					byName[d.Name] = d
					if len(d.Attributes) > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
						t.Errorf("%s: %d attributes", d.Name, len(d.Attributes))
					}
				}
			}
			for name, want := range c.attrs {
				a := attrs(byName[name])
				for k, v := range want {
					if a[k] != v {
						t.Errorf("%s: attribute %s = %q, want %q", name, k, a[k], v)
					}
				}
			}
			for name, keys := range c.absent {
				a := attrs(byName[name])
				for _, k := range keys {
					if v, ok := a[k]; ok {
						t.Errorf("%s: attribute %s = %q, want none", name, k, v)
					}
				}
			}
			for name, want := range c.taints {
				d, ok := byName[name]
				if !ok {
					t.Errorf("no device %s", name)
					continue
				}
				if got := taints(d); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%s: taints %v, want %v", name, got, want)
				}
			}
		})
	}
}

// resourcePrefix is the ID prefix of the resource of d among res.
func resourcePrefix(res []Published, d resourceapi.Device) string {
	a := d.Attributes[resourceapi.QualifiedName(testDriver+"/"+AttrResource)]
	for _, p := range res {
		if a.StringValue != nil && p.Resource == *a.StringValue {
			return p.IDPrefix
		}
	}
	return "?"
}

func TestDeviceName(t *testing.T) {
	for _, c := range []struct {
		prefix string
		index  int
		want   string
	}{
		{"sim", 0, "sim-0"},
		{"GPU_x.y", 12, "gpu-x-y-12"},
		{"-_-", 3, "device-3"},
		{"a123456789b123456789c123456789d123456789e123456789f123456789g123456789", 4096,
			"a123456789b123456789c123456789d123456789e123456789f1234567-4096"},
	} {
		t.Run(c.want, func(t *testing.T) {
			got := DeviceName(c.prefix, c.index)
			if got != c.want || len(got) > 63 {
				t.Fatalf("DeviceName(%q, %d) = %q, want %q", c.prefix, c.index, got, c.want)
			}
		})
	}
}

func TestDriverAndDeviceNameChecks(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"sim.example.com", true},
		{"Sim.example.com", false},
		{"sim_x.example.com", false},
		{"a123456789b123456789c123456789d123456789e123456789f123456789.com", false}, // 64 characters
	} {
		t.Run(c.name, func(t *testing.T) {
			err := CheckDriverName("driver-name", c.name)
			if (err == nil) != c.ok {
				t.Fatalf("err %v", err)
			}
			var fe *config.FieldError
			if err != nil && (!asFieldError(err, &fe) || fe.Field != "driver-name" || fe.Value != c.name) {
				t.Fatalf("not a FieldError naming driver-name and the value: %v", err)
			}
		})
	}
	cfg := &config.Config{ConfigFile: "x", Resources: []config.Resource{{Name: "example.com/sim", IDPrefix: "sim", Domain: "example.com", Class: "sim"},
		{Name: "example.com/sim2", IDPrefix: "SIM", Domain: "example.com", Class: "sim2"}}}
	if got := DefaultDriverName(cfg); got != "sim.example.com" {
		t.Fatalf("default driver name %q", got)
	}
	var fe *config.FieldError
	if err := CheckDeviceNames(cfg); !asFieldError(err, &fe) || fe.Field != "resources[1].idPrefix" {
		t.Fatalf("ID prefixes giving one device name: %v", err)
	}
	cfg.Resources[1].IDPrefix = "sim2"
	if err := CheckDeviceNames(cfg); err != nil {
		t.Fatal(err)
	}
}

func asFieldError(err error, fe **config.FieldError) bool { return errors.As(err, fe) }

// TestSlicesBindingConditions: the devices of a resource with
// PrepareBeforeBind carry the binding condition <driver>/prepared and the
// failure condition <driver>/prepareFailed; those of another resource
// carry neither.
func TestSlicesBindingConditions(t *testing.T) {
	k := kindOf(t, "example.com", "sim")
	d := simDevices(1, "n1").Devices[0]
	for _, pbb := range []bool{true, false} {
		got := Device(testDriver, Published{Resource: "example.com/sim", Kind: k, IDPrefix: "sim", PrepareBeforeBind: pbb}, d)
		wantBC, wantBF := []string(nil), []string(nil)
		if pbb {
			wantBC, wantBF = []string{testDriver + "/prepared"}, []string{testDriver + "/prepareFailed"}
		}
		if !slices.Equal(got.BindingConditions, wantBC) || !slices.Equal(got.BindingFailureConditions, wantBF) {
			t.Errorf("prepareBeforeBind %v: binding conditions %v, failure conditions %v; want %v, %v", pbb, got.BindingConditions, got.BindingFailureConditions, wantBC, wantBF)
		}
	}
}
