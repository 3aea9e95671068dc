package sysfs

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// nodesOf lists found devices as "key: node node ...".
func nodesOf(found []device.Found) []string {
	var out []string
	for _, f := range found {
		s := f.Key + ":"
		for _, n := range append([]device.Node{f.Node}, f.Extra...) {
			s += fmt.Sprintf(" %s(%s %d:%d)", n.HostPath, n.Type, n.Major, n.Minor)
		}
		out = append(out, s)
	}
	return out
}

// TestFunctionOwnsItsNodes: on a server laid out
// as real ones are, a bridge, a switch port or a USB controller owns none
// of the nodes of the devices behind it; a function's nodes are those the
// kernel registers for it, down to the next device of a bus; a USB
// device's those of its interfaces, not those of the devices behind it.
func TestFunctionOwnsItsNodes(t *testing.T) {
	s := newServer(t)
	for _, c := range []struct {
		name string
		sel  PCISelector
		want []string
	}{
		// Root ports, switch ports, host bridge and xHCI: all Intel, none
		// with a node of its own.
		{"every Intel function", PCISelector{Vendor: "8086"}, nil},
		{"the GPU behind the switch", PCISelector{Vendor: "1002", Class: "03"},
			[]string{"0000:03:00.0: dri/card1(c 226:1) dri/renderD128(c 226:128)"}},
		// The NVMe's controller node and the disk the kernel registers
		// below it (its namespace, with its partition).
		{"the NVMe behind the switch", PCISelector{Vendor: "144d"},
			[]string{"0000:04:00.0: nvme0(c 240:0) nvme0n1(b 259:0) nvme0n1p1(b 259:1)"}},
		// The disk of a virtio-pci function is its virtio device's (bus
		// virtio), as on a real VM: not the function's.
		{"virtio-blk", PCISelector{Vendor: "1af4"}, nil},
		// A part of the function on the auxiliary bus is the function's.
		{"the ConnectX's RDMA part", PCISelector{Vendor: "15b3"},
			[]string{"0000:3b:00.0: infiniband/uverbs0(c 231:192)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			found, err := Discover(s.sys, s.proc, c.sel, nil)()
			if err != nil {
				t.Fatal(err)
			}
			if got := nodesOf(found); !slices.Equal(got, c.want) {
				t.Fatalf("found\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(c.want, "\n  "))
			}
		})
	}
	// PCIFunctions gives every function its own nodes alone.
	fns, skipped, err := PCIFunctions(s.sys, s.proc)
	if err != nil || len(skipped) != 0 || len(fns) != 12 {
		t.Fatalf("functions %+v, skipped %v, %v: want the server's 12", fns, skipped, err)
	}
	for _, f := range fns {
		if f.Vendor == "8086" && len(f.Nodes) != 0 {
			t.Errorf("%s (class %s) has nodes %+v, want none", f.Address, f.Class, f.Nodes)
		}
	}

	for _, c := range []struct {
		name string
		sel  USBSelector
		want []string
	}{
		{"the root hub", USBSelector{Vendor: "1d6b"}, []string{"1d6b:0002:0000:00:14.0: bus/usb/001/001(c 189:0)"}},
		{"the hub", USBSelector{Vendor: "05e3"}, []string{"port:1-1: bus/usb/001/002(c 189:1)"}},
		// A HID device (bus hid) below its interface is part of it.
		{"the receiver", USBSelector{Vendor: "046d"}, []string{"port:1-2: hidraw0(c 241:0) bus/usb/001/005(c 189:4)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			found, err := DiscoverUSB(s.sys, c.sel, nil)()
			if err != nil {
				t.Fatal(err)
			}
			if got := nodesOf(found); !slices.Equal(got, c.want) {
				t.Fatalf("found\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(c.want, "\n  "))
			}
		})
	}
}

// TestSelectorBeforeWalk: a function the selector does
// not pick is not read past its identity: its nodes are not looked for,
// so an NVIDIA information file that does not parse, of a GPU the selector
// leaves out, is no warning and skips nothing.
func TestSelectorBeforeWalk(t *testing.T) {
	tr := newTree(t)
	tr.function("pci0000:00", "0000:01:00.0", "10de", "2330", "030200", "nvidia", 0)
	tr.file(filepath.Join(tr.proc, "driver", "nvidia", "gpus", "0000:01:00.0", "information"), "Device Minor: \t 0\n")
	tr.function("pci0000:00", "0000:02:00.0", "10de", "1db4", "030200", "nvidia", 0)
	tr.file(filepath.Join(tr.proc, "driver", "nvidia", "gpus", "0000:02:00.0", "information"), "Device Minor: \t zero\n")
	log, hook := test.NewNullLogger()
	found, err := Discover(tr.sys, tr.proc, PCISelector{Vendor: "10de", Device: []string{"2330"}}, logrus.NewEntry(log))()
	if err != nil || len(found) != 1 || found[0].Key != "0000:01:00.0" {
		t.Fatalf("found %+v %v, want the H100 alone", found, err)
	}
	for _, e := range hook.AllEntries() {
		t.Errorf("logged %q %v: the function the selector leaves out was read past its identity", e.Message, e.Data)
	}
}
