package device

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// adapter is a CP210x (10c4:ea60, serial 0001 unless product says another
// product without serial) at port as ttyUSB<tty>, keyed as the USB
// discovery keys it (key: the serial's or the port's).
func adapter(port string, tty uint32, key string) Found {
	return Found{Key: key, Node: Node{HostPath: "ttyUSB" + itoa(tty), Type: Char, Major: 188, Minor: tty}, NUMANode: NoNUMA,
		Identity: Identity{USBBus: 1, USBDevice: 3 + int(tty), USBVendor: "10c4", USBProduct: "ea60", USBSerial: "0001", USBPort: port}}
}

// TestUSBMatch: which device a source remembers a USB
// device found is, by the registry a run left: a registry of an earlier
// version (no ports recorded: the port a key names, else the one device
// left with the identity); two remembered devices one found device could
// be (the newest); another identity on a port (identity_changed only for
// the device last found there, else a new device under a key of its own).
func TestUSBMatch(t *testing.T) {
	const serialKey, portKey1, portKey2 = "10c4:ea60:0001", "port:1-1.1", "port:1-1.2"
	id := `"identity": {"usbVendor": "10c4", "usbProduct": "ea60", "usbSerial": "0001"}`
	entry := func(path, name string, index, minor int, extra string) string {
		return `{"path": "usb/` + path + `", "id": "` + name + `", "index": ` + string(rune('0'+index)) +
			`, "type": "c", "major": 188, "minor": ` + string(rune('0'+minor)) + `, "node": "ttyUSB` + string(rune('0'+minor)) + `", ` + extra + `}`
	}
	for _, c := range []struct {
		name     string
		registry []string
		found    []Found
		// want: what each ID names: "ttyUSBn@port", "missing", or
		// "changed" (identity_changed).
		want map[string]string
	}{
		{
			name:     "earlier version: A by its serial, B by its port, both plugged",
			registry: []string{entry(serialKey, "ser-0", 0, 0, id), entry(portKey2, "ser-1", 1, 1, id)},
			found:    []Found{adapter("1-1.1", 0, portKey1), adapter("1-1.2", 1, portKey2)},
			want:     map[string]string{"ser-0": "ttyUSB0@1-1.1", "ser-1": "ttyUSB1@1-1.2"},
		},
		{
			name:     "earlier version: A alone",
			registry: []string{entry(serialKey, "ser-0", 0, 0, id), entry(portKey2, "ser-1", 1, 1, id)},
			found:    []Found{adapter("1-1.1", 0, serialKey)},
			want:     map[string]string{"ser-0": "ttyUSB0@1-1.1", "ser-1": "missing"},
		},
		{
			name:     "earlier version: B alone",
			registry: []string{entry(serialKey, "ser-0", 0, 0, id), entry(portKey2, "ser-1", 1, 1, id)},
			found:    []Found{adapter("1-1.2", 1, serialKey)},
			want:     map[string]string{"ser-0": "missing", "ser-1": "ttyUSB1@1-1.2"},
		},
		{
			name: "two remembered on one port (edited by hand): the newest",
			registry: []string{entry(portKey1, "ser-0", 0, 0, id+`, "port": "1-1.1"`),
				entry(serialKey, "ser-1", 1, 1, id+`, "port": "1-1.1"`)},
			found: []Found{adapter("1-1.1", 2, portKey1)},
			want:  map[string]string{"ser-0": "missing", "ser-1": "ttyUSB2@1-1.1"},
		},
		{
			name:     "another product on the port it was last found at: changed",
			registry: []string{entry(portKey1, "ser-0", 0, 0, `"identity": {"usbVendor": "10c4", "usbProduct": "ea61"}, "port": "1-1.1"`)},
			found:    []Found{adapter("1-1.1", 0, portKey1)},
			want:     map[string]string{"ser-0": "changed"},
		},
		{
			name:     "another product on a port it left: a new device",
			registry: []string{entry(portKey1, "ser-0", 0, 0, `"identity": {"usbVendor": "10c4", "usbProduct": "ea61"}, "port": "1-1.3"`)},
			found:    []Found{adapter("1-1.1", 1, portKey1)},
			want:     map[string]string{"ser-0": "missing", "ser-1": "ttyUSB1@1-1.1"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			fn := useFakeNodes(t)
			root := t.TempDir()
			for i := range uint32(3) {
				fn.make(t, filepath.Join(root, "ttyUSB"+itoa(i)), 188, i)
			}
			registry := filepath.Join(t.TempDir(), "registry.json")
			if err := os.WriteFile(registry, []byte(`{"version": 1, "devices": [`+strings.Join(c.registry, ",")+`]}`), 0o600); err != nil {
				t.Fatal(err)
			}
			fd := &fakeDiscovery{}
			fd.set(c.found...)
			// Twice: the registry the first run wrote says the same.
			for _, run := range []string{"first run", "after a restart"} {
				src, err := NewSource(Options{DevRoot: root, IDPrefix: "ser", Discover: fd.discover, DiscoverKind: "usb", Registry: registry})
				if err != nil {
					t.Fatal(err)
				}
				snap, err := src.Prepare()
				if err != nil {
					t.Fatal(err)
				}
				got := map[string]string{}
				for _, d := range snap.Devices {
					switch d.Problem.Cause {
					case CauseMissing:
						got[d.Name] = "missing"
					case CauseIdentityChanged:
						got[d.Name] = "changed"
					default:
						got[d.Name] = filepath.Base(d.HostPath) + "@" + d.Identity.USBPort
					}
				}
				if len(got) != len(c.want) {
					t.Errorf("%s: %v, want %v", run, got, c.want)
				}
				for name, w := range c.want {
					if got[name] != w {
						t.Errorf("%s: %s names %q, want %q (all: %v)", run, name, got[name], w, got)
					}
				}
			}
			// The ports are recorded, and the keys are distinct.
			b, err := os.ReadFile(registry)
			if err != nil {
				t.Fatal(err)
			}
			var f registryFile
			if err := json.Unmarshal(b, &f); err != nil {
				t.Fatal(err)
			}
			for _, e := range f.Devices {
				if w := c.want[e.ID]; strings.Contains(w, "@") && e.Port != w[strings.Index(w, "@")+1:] {
					t.Errorf("registry: %s recorded at port %q, want %s", e.ID, e.Port, w)
				}
			}
		})
	}
}
