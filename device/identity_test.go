package device

import (
	"reflect"
	"testing"
)

// TestIdentityAnnotationsRoundTrip: IdentityFromAnnotations reads back
// every field Annotations writes (a registry rebuilt from a spec keys its
// devices by them); the port is written nowhere.
func TestIdentityAnnotationsRoundTrip(t *testing.T) {
	for _, c := range []struct {
		name string
		id   Identity
	}{
		{"none", Identity{}},
		{"pci", Identity{PCIAddress: "0000:41:00.0", PCIVendor: "10de", PCIDevice: "2330", PCIClass: "030200", PCIDriver: "vfio-pci", IOMMUGroup: "42"}},
		{"usb", Identity{USBBus: 1, USBDevice: 4, USBVendor: "10c4", USBProduct: "ea60", USBSerial: "0001", USBPort: "1-1.2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := c.id
			want.USBPort = ""
			if got := IdentityFromAnnotations("p/", c.id.Annotations("p/")); !reflect.DeepEqual(got, want) {
				t.Fatalf("read back %+v, want %+v", got, want)
			}
		})
	}
}
