package dranames

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
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
