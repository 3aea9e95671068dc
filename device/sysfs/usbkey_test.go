package sysfs

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// usbSource is the device source of a resource of CP210x adapters on
// server s, remembering its devices in registry, with the adapters' nodes
// made below its dev root when nodes can be made here (then health is
// checked too).
type usbSource struct {
	*device.Source
	s     *server
	nodes bool
}

func newUSBSource(t *testing.T, s *server, registry, dev string) *usbSource {
	t.Helper()
	src, err := device.NewSource(device.Options{
		DevRoot: dev, IDPrefix: "ser", NodeName: "n1", Registry: registry,
		Discover: DiscoverUSB(s.sys, USBSelector{Vendor: "10c4", Product: "ea60"}, nil), DiscoverKind: "usb",
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Prepare(); err != nil {
		t.Fatal(err)
	}
	return &usbSource{Source: src, s: s, nodes: testutil.CanMknod() == nil}
}

// adapterAt is what a device must be to be the adapter of tty ttyUSB<tty>
// at port: its own node, its USB node and device number.
type adapterAt struct {
	port        string
	tty, devnum int
	missing     bool // unplugged: still listed, Unhealthy (missing)
}

// check says whether snap's devices, by index, are want (name: the ID
// each must keep), and returns their names.
func (u *usbSource) check(t *testing.T, snap *device.Snapshot, want []adapterAt, names []string) []string {
	t.Helper()
	if len(snap.Devices) != len(want) {
		t.Fatalf("%d devices %+v, want %d", len(snap.Devices), snap.Devices, len(want))
	}
	var got []string
	for i, w := range want {
		d := snap.Devices[i]
		got = append(got, d.Name)
		if d.Index != i {
			t.Errorf("device %d is %s with index %d", i, d.Name, d.Index)
		}
		if i < len(names) && d.Name != names[i] {
			t.Errorf("device %d is %s, want %s", i, d.Name, names[i])
		}
		tty := filepath.Base(d.HostPath)
		if tty != "ttyUSB"+itoa(w.tty) || d.Identity.USBDevice != w.devnum || d.Identity.USBSerial != "0001" {
			t.Errorf("device %d (%s) is %s, USB device %d: want the adapter at %s (ttyUSB%d, device %d)", i, d.Name, tty, d.Identity.USBDevice, w.port, w.tty, w.devnum)
		}
		if u.nodes {
			if w.missing && d.Problem.Cause != device.CauseMissing {
				t.Errorf("device %d (%s) unplugged: %v %v, want missing", i, d.Name, d.Healthy, d.Problem)
			}
			if !w.missing && !d.Healthy {
				t.Errorf("device %d (%s) plugged: %v, want healthy", i, d.Name, d.Problem)
			}
		}
	}
	return got
}

// TestUSBSameSerial: two adapters that share vendor,
// product and serial (0001, as cheap CP210x ship) are two devices with
// IDs of their own; when the first is unplugged the second keeps its own
// ID and index (the first's stays listed, missing), and no ID ever names
// the other adapter, across a restart too.
func TestUSBSameSerial(t *testing.T) {
	s := newServer(t)
	registry := filepath.Join(t.TempDir(), "registry.json")
	dev := t.TempDir()
	first := adapterAt{port: "1-1.1", tty: 0, devnum: 3}
	second := adapterAt{port: "1-1.2", tty: 1, devnum: 4}
	u := newUSBSource(t, s, registry, dev)
	if u.nodes {
		testutil.Mknod(t, filepath.Join(dev, "ttyUSB0"), 188, 0)
		testutil.Mknod(t, filepath.Join(dev, "ttyUSB1"), 188, 1)
		testutil.Mknod(t, filepath.Join(dev, "bus", "usb", "001", "003"), 189, 2)
		testutil.Mknod(t, filepath.Join(dev, "bus", "usb", "001", "004"), 189, 3)
	}
	names := u.check(t, u.Refresh(), []adapterAt{first, second}, nil)
	if names[0] == names[1] {
		t.Fatalf("both adapters are %s", names[0])
	}

	t.Run("first unplugged", func(t *testing.T) {
		s.unplug(s.adapter1)
		gone := first
		gone.missing = true
		u.check(t, u.Refresh(), []adapterAt{gone, second}, names)
	})
	t.Run("restart with the second alone", func(t *testing.T) {
		// Whatever ID the second gets after a restart, the first's never
		// names it. (A copy of the registry: u goes on below.)
		b, err := os.ReadFile(registry)
		if err != nil {
			t.Fatal(err)
		}
		copied := filepath.Join(t.TempDir(), "registry.json")
		if err := os.WriteFile(copied, b, 0o600); err != nil {
			t.Fatal(err)
		}
		r := newUSBSource(t, s, copied, dev)
		snap := r.Refresh()
		for _, d := range snap.Devices {
			if d.Name == names[0] && filepath.Base(d.HostPath) != "ttyUSB0" {
				t.Errorf("the first adapter's ID %s names %s", d.Name, d.HostPath)
			}
			if d.Name == names[1] && filepath.Base(d.HostPath) != "ttyUSB1" {
				t.Errorf("the second adapter's ID %s names %s", d.Name, d.HostPath)
			}
		}
	})
	t.Run("first plugged back", func(t *testing.T) {
		s.adapter1 = s.adapter("1-1.1", 6, 0)
		if u.nodes {
			testutil.Mknod(t, filepath.Join(dev, "bus", "usb", "001", "006"), 189, 5)
		}
		first := adapterAt{port: "1-1.1", tty: 0, devnum: 6}
		u.check(t, u.Refresh(), []adapterAt{first, second}, names)
		// And after a restart with both plugged in.
		r := newUSBSource(t, s, registry, dev)
		r.check(t, r.Refresh(), []adapterAt{first, second}, names)
	})
}

// TestUSBSerialKept: an adapter whose serial was unique
// when found keeps its ID when a second with that serial is plugged in
// (which gets an ID of its own), and the second keeps its own when the
// first is unplugged.
func TestUSBSerialKept(t *testing.T) {
	s := newServer(t)
	s.unplug(s.adapter2)
	u := newUSBSource(t, s, filepath.Join(t.TempDir(), "registry.json"), t.TempDir())
	u.nodes = false
	first := adapterAt{port: "1-1.1", tty: 0, devnum: 3}
	names := u.check(t, u.Refresh(), []adapterAt{first}, nil)
	s.adapter2 = s.adapter("1-1.2", 4, 1)
	second := adapterAt{port: "1-1.2", tty: 1, devnum: 4}
	names = append(names, u.check(t, u.Refresh(), []adapterAt{first, second}, names[:1])[1])
	if names[0] == names[1] {
		t.Fatalf("both adapters are %s", names[0])
	}
	s.unplug(s.adapter1)
	u.check(t, u.Refresh(), []adapterAt{first, second}, names)
}

// byID is what snap says of each device: the tty of its own node and its
// port, or "missing" when it is listed but was not found (missing with no
// message: not a node that was looked at, as where nodes cannot be made).
func byID(snap *device.Snapshot) map[string]string {
	out := map[string]string{}
	for _, d := range snap.Devices {
		if d.Problem.Cause == device.CauseMissing && d.Problem.Message == "" {
			out[d.Name] = "missing"
			continue
		}
		out[d.Name] = filepath.Base(d.HostPath) + "@" + d.Identity.USBPort
	}
	return out
}

// TestUSBTwinsAcrossRestart: adapter A (serial 0001,
// unique when found: known by its serial) and adapter B, plugged in later
// with the same serial (known by its port), keep their IDs across a
// restart whatever is plugged in then, and an ID never names the other
// adapter: once two adapters with one serial were seen, the serial alone
// no longer decides while both are remembered; the port they were last
// found at does. A lone adapter still keeps its ID on another port.
func TestUSBTwinsAcrossRestart(t *testing.T) {
	a, b := "ttyUSB0@1-1.1", "ttyUSB1@1-1.2"
	for _, c := range []struct {
		name string
		// before: what changes while the first run still runs; after:
		// while the plugin is down.
		before, after func(s *server)
		// want: what each of A's and B's IDs names after the restart;
		// other: what the one device with another ID names, "" none.
		wantA, wantB, other string
	}{
		{name: "(a) only B, A unplugged while down", after: func(s *server) { s.unplug(s.adapter1) },
			wantA: "missing", wantB: b},
		{name: "(b) both plugged", wantA: a, wantB: b},
		{name: "(c) only B, A unplugged before the restart", before: func(s *server) { s.unplug(s.adapter1) },
			wantA: "missing", wantB: b},
		{name: "only A", after: func(s *server) { s.unplug(s.adapter2) }, wantA: a, wantB: "missing"},
		{name: "A on another port: not known by its serial while B is remembered", after: func(s *server) {
			s.unplug(s.adapter1)
			s.unplug(s.adapter2)
			s.adapter1 = s.adapter("1-1.3", 7, 0)
		}, wantA: "missing", wantB: "missing", other: "ttyUSB0@1-1.3"},
		{name: "swapped ports: each ID stays on its port", after: func(s *server) {
			s.unplug(s.adapter1)
			s.unplug(s.adapter2)
			s.adapter2 = s.adapter("1-1.1", 8, 1)
			s.adapter1 = s.adapter("1-1.2", 9, 0)
		}, wantA: "ttyUSB1@1-1.1", wantB: "ttyUSB0@1-1.2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newServer(t)
			s.unplug(s.adapter2)
			registry, dev := filepath.Join(t.TempDir(), "registry.json"), t.TempDir()
			u := newUSBSource(t, s, registry, dev)
			snap := u.Refresh()
			if len(snap.Devices) != 1 {
				t.Fatalf("A alone: %+v", snap.Devices)
			}
			idA := snap.Devices[0].Name
			s.adapter2 = s.adapter("1-1.2", 4, 1)
			got := byID(u.Refresh())
			idB := ""
			for id := range got {
				if id != idA {
					idB = id
				}
			}
			if got[idA] != a || got[idB] != b || len(got) != 2 {
				t.Fatalf("B plugged in: %v, want %s on %s and another on %s", got, idA, a, b)
			}
			if c.before != nil {
				c.before(s)
				u.Refresh()
			}
			if c.after != nil {
				c.after(s)
			}
			r := newUSBSource(t, s, registry, dev)
			got = byID(r.Refresh())
			if got[idA] != c.wantA || got[idB] != c.wantB {
				t.Errorf("after the restart: A's ID %s names %q, want %q; B's ID %s names %q, want %q (all: %v)",
					idA, got[idA], c.wantA, idB, got[idB], c.wantB, got)
			}
			delete(got, idA)
			delete(got, idB)
			var others []string
			for _, w := range got {
				others = append(others, w)
			}
			if want := []string{c.other}; (c.other == "" && len(others) != 0) || (c.other != "" && !slices.Equal(others, want)) {
				t.Errorf("after the restart: other devices %v, want %q", others, c.other)
			}
		})
	}
}

// TestUSBSerialMovesAcrossRestart: an adapter whose serial is the only one
// seen keeps its ID when it is found on another port after a restart.
func TestUSBSerialMovesAcrossRestart(t *testing.T) {
	s := newServer(t)
	s.unplug(s.adapter2)
	registry, dev := filepath.Join(t.TempDir(), "registry.json"), t.TempDir()
	snap := newUSBSource(t, s, registry, dev).Refresh()
	if len(snap.Devices) != 1 {
		t.Fatalf("A alone: %+v", snap.Devices)
	}
	id := snap.Devices[0].Name
	s.unplug(s.adapter1)
	s.adapter1 = s.adapter("1-1.3", 7, 0)
	got := byID(newUSBSource(t, s, registry, dev).Refresh())
	if len(got) != 1 || got[id] != "ttyUSB0@1-1.3" {
		t.Fatalf("moved to 1-1.3: %v, want %s on ttyUSB0@1-1.3", got, id)
	}
}
