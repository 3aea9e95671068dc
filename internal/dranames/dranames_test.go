package dranames

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
)

// TestMaxLabel: the limit is Kubernetes's own, which this package cannot
// import (the device plugin's binary links no Kubernetes library).
func TestMaxLabel(t *testing.T) {
	if MaxLabel != validation.DNS1123LabelMaxLength {
		t.Fatalf("MaxLabel %d, Kubernetes says %d", MaxLabel, validation.DNS1123LabelMaxLength)
	}
	for _, name := range []string{DeviceName("sim", 0), DeviceName("GPU_x.y", 12), DeviceName(string(make([]byte, 100)), 4096)} {
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			t.Errorf("%q: %v", name, errs)
		}
	}
}

// TestDefaultDriverName: <class>.<domain> of the first resource
// without replicas above 1; of the first resource when all have replicas
// (the rule of the versions that did not publish those, kept so that an
// upgrade does not rename the driver).
func TestDefaultDriverName(t *testing.T) {
	one, two := 1, 2
	sim := config.Resource{Name: "example.com/sim", Domain: "example.com", Class: "sim"}
	simOne := config.Resource{Name: "example.com/sim", Domain: "example.com", Class: "sim", Replicas: &one}
	shared := config.Resource{Name: "example.com/shared", Domain: "example.com", Class: "shared", Replicas: &two}
	fpga := config.Resource{Name: "example.org/fpga", Domain: "example.org", Class: "fpga"}
	for _, c := range []struct {
		name string
		res  []config.Resource
		want string
	}{
		{"no resources", nil, ""},
		{"one", []config.Resource{sim}, "sim.example.com"},
		{"the first of two", []config.Resource{fpga, sim}, "fpga.example.org"},
		{"replicas 1 is published", []config.Resource{simOne, fpga}, "sim.example.com"},
		{"the first published", []config.Resource{shared, sim, fpga}, "sim.example.com"},
		{"none published", []config.Resource{shared}, "shared.example.com"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := DefaultDriverName(&config.Config{Resources: c.res}); got != c.want {
				t.Fatalf("%q, want %q", got, c.want)
			}
		})
	}
}

// TestPoolName: a pool per resource, <node>/<the ID
// prefix as a DNS label>.
func TestPoolName(t *testing.T) {
	for _, c := range []struct{ node, prefix, want string }{
		{"n1", "sim", "n1/sim"},
		{"node-1.example.com", "GPU_x.y", "node-1.example.com/gpu-x-y"},
	} {
		if got := PoolName(c.node, c.prefix); got != c.want {
			t.Errorf("PoolName(%q, %q) = %q, want %q", c.node, c.prefix, got, c.want)
		}
	}
}
