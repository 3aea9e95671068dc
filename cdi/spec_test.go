package cdi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

func testResource(t *testing.T) Resource {
	t.Helper()
	k, err := kindForResource("example.com/fpga")
	if err != nil {
		t.Fatal(err)
	}
	return Resource{Name: "example.com/fpga", Kind: k, EnvPrefix: "FPGA"}
}

func TestKindForResource(t *testing.T) {
	for _, c := range []struct {
		in, want string
		ok       bool
	}{
		{"example.com/fpga", "k8s.example.com/fpga", true},
		{"acme.io/serial-port", "k8s.acme.io/serial-port", true},
		{"nodomain", "", false},
		{"example.com/9lives", "", false},
		{"example.com/bad/class", "", false},
	} {
		t.Run(c.in, func(t *testing.T) {
			k, err := kindForResource(c.in)
			if (err == nil) != c.ok {
				t.Fatalf("err %v", err)
			}
			if c.ok && k.String() != c.want {
				t.Fatalf("kind %q, want %q", k, c.want)
			}
		})
	}
}

// TestRoundTrip writes a spec from real nodes, then resolves and injects
// the devices with a fresh CDI cache, as containerd does.
func TestRoundTrip(t *testing.T) {
	devRoot, cdiDir := t.TempDir(), filepath.Join(t.TempDir(), "cdi")
	src, err := device.NewSource(device.Options{DevRoot: devRoot, IDPrefix: "fpga", NodeName: "n1", Count: 3, FilePrefix: "fpga", Type: device.Char, Major: 1, Minor: 7})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := src.Prepare()
	if err != nil {
		t.Skipf("cannot create device nodes here (%v): run as root", err)
	}
	w := NewWriter(cdiDir, "test-plugin", 1)
	res := testResource(t)
	if err := w.Write(res, snap); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(w.Path(res.Kind))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Fatalf("spec mode %v, want 0644", fi.Mode().Perm())
	}
	if tmps, _ := filepath.Glob(filepath.Join(cdiDir, ".*.tmp-*")); len(tmps) != 0 {
		t.Fatalf("temp files left: %v", tmps)
	}

	fresh := testutil.FreshCDICache(t, cdiDir)
	want := []string{"k8s.example.com/fpga=fpga-n1-0", "k8s.example.com/fpga=fpga-n1-1", "k8s.example.com/fpga=fpga-n1-2"}
	if got := fresh.ListDevices(); !slices.Equal(got, want) {
		t.Fatalf("devices %v, want %v", got, want)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	unresolved, err := fresh.InjectDevices(spec, want[0], want[2])
	if err != nil || len(unresolved) != 0 {
		t.Fatalf("inject: %v %v", unresolved, err)
	}
	if len(spec.Linux.Devices) != 2 {
		t.Fatalf("linux devices %+v", spec.Linux.Devices)
	}
	for i, idx := range []string{"0", "2"} {
		d := spec.Linux.Devices[i]
		if d.Path != "/dev/fpga-"+idx || d.Type != "c" || d.Major != 1 || d.Minor != 7 {
			t.Errorf("device %d: %+v", i, d)
		}
		// The node the spec points at exists on the host with those numbers.
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(devRoot, "fpga-"+idx), &st); err != nil ||
			unix.Major(uint64(st.Rdev)) != 1 || unix.Minor(uint64(st.Rdev)) != 7 {
			t.Errorf("host node %s: %v", idx, err)
		}
	}
	if !slices.Contains(spec.Process.Env, "FPGA_0=/dev/fpga-0") || !slices.Contains(spec.Process.Env, "FPGA_2=/dev/fpga-2") ||
		slices.Contains(spec.Process.Env, "FPGA_1=/dev/fpga-1") {
		t.Fatalf("env %v", spec.Process.Env)
	}
	allowed := 0
	for _, r := range spec.Linux.Resources.Devices {
		if r.Allow && r.Major != nil && *r.Major == 1 && r.Minor != nil && *r.Minor == 7 {
			allowed++
		}
	}
	if allowed != 2 {
		t.Fatalf("cgroup rules %+v", spec.Linux.Resources.Devices)
	}
}

func TestRewriteAndRemoveStale(t *testing.T) {
	dir := t.TempDir()
	w := NewWriter(dir, "me", 1)
	snap := func(n int) *device.Snapshot {
		s := &device.Snapshot{Replicas: 1}
		for i := 0; i < n; i++ {
			s.Devices = append(s.Devices, device.Device{Name: "d-" + string(rune('0'+i)), Index: i, HostPath: "/dev/d", ContainerPath: "/dev/d", Type: device.Char, Major: 1, Minor: 3, NUMANode: device.NoNUMA})
		}
		return s
	}
	a := testResource(t)
	bKind, _ := NewKind("k8s.example.com", "gone")
	b := Resource{Name: "example.com/gone", Kind: bKind}
	for _, r := range []Resource{a, b} {
		if err := w.Write(r, snap(2)); err != nil {
			t.Fatal(err)
		}
	}
	// Somebody else's spec in the same directory.
	other := NewWriter(dir, "someone-else", 1)
	oKind, _ := NewKind("vendor.com", "gpu")
	if err := other.Write(Resource{Name: "vendor.com/gpu", Kind: oKind}, snap(1)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "broken.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Ours by its annotation, of a kind not kept, but no valid spec: the
	// CDI library's full read decides, and it is left alone.
	invalid := filepath.Join(dir, "ours-invalid.json")
	if err := os.WriteFile(invalid, []byte(`{"kind":"k8s.example.com/gone2","annotations":{"`+OwnerAnnotation+`":"me"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// A rewrite replaces the device set.
	if err := w.Write(a, snap(3)); err != nil {
		t.Fatal(err)
	}
	removed, err := w.RemoveStale([]Kind{a.Kind})
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != w.Path(bKind) {
		t.Fatalf("removed %v", removed)
	}
	for _, p := range []string{w.Path(a.Kind), other.Path(oKind), filepath.Join(dir, "broken.json"), invalid} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s should stay: %v", p, err)
		}
	}
	s, err := cdiapi.ReadSpec(w.Path(a.Kind), 0)
	if err != nil || len(s.Devices) != 3 {
		t.Fatalf("rewritten spec: %v", err)
	}
}

// TestCheck tells our own spec from one removed, changed, or written by a
// process that started after us.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	snap := &device.Snapshot{Devices: []device.Device{{Name: "fpga-0", HostPath: "/dev/null", ContainerPath: "/dev/fpga-0", Type: device.Char, Major: 1, Minor: 3}}}
	res := testResource(t)
	w := NewWriter(dir, "ns/plugin", 100)
	s := w.Spec(res)
	if st, _ := s.Check(); st != Missing {
		t.Fatalf("before the first write: %v", st)
	}
	if err := s.Write(snap); err != nil {
		t.Fatal(err)
	}
	if st, why := s.Check(); st != Intact {
		t.Fatalf("after our write: %v %s", st, why)
	}
	older := NewWriter(dir, "ns/plugin", 50)
	if err := older.Write(res, snap); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Check(); st != Changed {
		t.Fatalf("written by an older process: %v", st)
	}
	if err := os.WriteFile(s.Path(), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Check(); st != Changed {
		t.Fatalf("garbage: %v", st)
	}
	newer := NewWriter(dir, "other-ns/plugin", 200)
	if err := newer.Write(res, snap); err != nil {
		t.Fatal(err)
	}
	if st, why := s.Check(); st != Superseded || !strings.Contains(why, "other-ns/plugin") {
		t.Fatalf("written by a newer process: %v %s", st, why)
	}
}

// TestWriteRefusesMissingMountSource: the spec never names a state
// directory that does not exist.
func TestWriteRefusesMissingMountSource(t *testing.T) {
	dir, state := t.TempDir(), t.TempDir()
	res := testResource(t)
	res.StateRoot = state
	w := NewWriter(dir, "me", 1)
	snap := &device.Snapshot{Devices: []device.Device{{Name: "fpga-0", HostPath: "/dev/null", ContainerPath: "/dev/fpga-0", Type: device.Char, Major: 1, Minor: 3}}}
	if err := w.Write(res, snap); !errors.Is(err, ErrMissingPath) {
		t.Fatalf("got %v, want ErrMissingPath", err)
	}
	if _, err := os.Stat(w.Path(res.Kind)); !os.IsNotExist(err) {
		t.Fatalf("spec written: %v", err)
	}
	if err := os.Mkdir(filepath.Join(state, "fpga-0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(res, snap); err != nil {
		t.Fatal(err)
	}
}

func TestBuildSpecRejectsBadName(t *testing.T) {
	snap := &device.Snapshot{Devices: []device.Device{{Name: "bad/name", Type: device.Char, Major: 1, ContainerPath: "/dev/x"}}}
	if _, err := BuildSpec("me", 1, testResource(t), snap); err == nil {
		t.Fatal("accepted an invalid device name")
	}
}

// TestCheckOwnerGone: a spec written by a newer process
// names that process's plugin socket; while the socket is served the spec
// is Superseded, once nobody serves it the spec is Orphaned, so that the
// older process can take over again. A socket outside our plugin directory
// cannot be judged: it stays Superseded.
func TestCheckOwnerGone(t *testing.T) {
	dir, sockDir := t.TempDir(), testutil.ShortDir(t)
	snap := &device.Snapshot{Devices: []device.Device{{Name: "fpga-0", HostPath: "/dev/null", ContainerPath: "/dev/fpga-0", Type: device.Char, Major: 1, Minor: 3}}}
	res := testResource(t)
	res.Socket = filepath.Join(sockDir, "old.sock")
	s := NewWriter(dir, "ns/plugin", 100).Spec(res)
	if err := s.Write(snap); err != nil {
		t.Fatal(err)
	}
	newerSock := filepath.Join(sockDir, "new.sock")
	l, err := net.Listen("unix", newerSock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	newerRes := res
	newerRes.Socket = newerSock
	if err := NewWriter(dir, "ns/plugin", 200).Write(newerRes, snap); err != nil {
		t.Fatal(err)
	}
	if st, why := s.Check(); st != Superseded {
		t.Fatalf("newer process serving its socket: %v %s", st, why)
	}
	_ = l.Close() // a Go listener removes its socket file
	if st, why := s.Check(); st != Orphaned || !strings.Contains(why, newerSock) {
		t.Fatalf("newer process gone: %v %s", st, why)
	}
	// Its socket file left behind, nobody listening: gone too.
	if err := os.WriteFile(newerSock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if st, why := s.Check(); st != Orphaned {
		t.Fatalf("newer process gone, socket file left: %v %s", st, why)
	}
	elsewhere := newerRes
	elsewhere.Socket = filepath.Join(t.TempDir(), "x.sock")
	if err := NewWriter(dir, "ns/plugin", 300).Write(elsewhere, snap); err != nil {
		t.Fatal(err)
	}
	if st, why := s.Check(); st != Superseded {
		t.Fatalf("a socket in another directory: %v %s", st, why)
	}
}

// TestWatchSignalsOnceInPlace: a spec removed between
// our write and the watch being in place is seen: Watch signals once the
// watch is added, without any later event.
func TestWatchSignalsOnceInPlace(t *testing.T) {
	dir := t.TempDir()
	snap := &device.Snapshot{Devices: []device.Device{{Name: "fpga-0", HostPath: "/dev/null", ContainerPath: "/dev/fpga-0", Type: device.Char, Major: 1, Minor: 3}}}
	s := NewWriter(dir, "ns/plugin", 100).Spec(testResource(t))
	if err := s.Write(snap); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(s.Path()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	changed := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() { done <- s.Watch(ctx, changed) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("no signal for a spec removed before the watch was in place")
	}
	if st, _ := s.Check(); st != Missing {
		t.Fatalf("check after the signal: %v", st)
	}
}

// kindForResource is KindFor of a whole resource name (a test helper).
func kindForResource(resource string) (Kind, error) {
	domain, name, ok := strings.Cut(resource, "/")
	if !ok {
		return Kind{}, fmt.Errorf("resource %q has no domain", resource)
	}
	return KindFor(domain, name)
}

// TestRoundTripSeveralNodes: a device found by its identity carries its
// own node, its other nodes and the shared ones, and its identity as
// annotations; a fresh CDI cache injects them all, a shared node once
// for two devices.
func TestRoundTripSeveralNodes(t *testing.T) {
	devRoot, cdiDir := t.TempDir(), filepath.Join(t.TempDir(), "cdi")
	testutil.NeedMknod(t)
	mk := func(rel string, major, minor uint32) device.Node {
		t.Helper()
		p := filepath.Join(devRoot, rel)
		testutil.Mknod(t, p, major, minor)
		return device.Node{HostPath: p, ContainerPath: "/dev/" + rel, Type: device.Char, Major: major, Minor: minor}
	}
	ctl, uvm := mk("nvidiactl", 195, 255), mk("nvidia-uvm", 238, 0)
	snap := &device.Snapshot{Replicas: 1}
	for i, addr := range []string{"0000:01:00.0", "0000:41:00.0"} {
		own := mk(fmt.Sprintf("nvidia%d", i), 195, uint32(i))
		render := mk(fmt.Sprintf("dri/renderD%d", 128+i), 226, uint32(128+i))
		snap.Devices = append(snap.Devices, device.Device{
			Name: fmt.Sprintf("gpu-n1-%d", i), Index: i, HostPath: own.HostPath, ContainerPath: own.ContainerPath,
			Type: device.Char, Major: 195, Minor: uint32(i), NUMANode: i, Healthy: true,
			Extra: []device.Node{render}, Shared: []device.Node{ctl, uvm},
			Identity: device.Identity{PCIAddress: addr, PCIVendor: "10de", PCIDevice: "2330", PCIClass: "030200", PCIDriver: "nvidia"},
		})
	}
	kind, err := NewKind("k8s.example.com", "gpu")
	if err != nil {
		t.Fatal(err)
	}
	res := Resource{Name: "example.com/gpu", Kind: kind, EnvPrefix: "GPU"}
	w := NewWriter(cdiDir, "test-plugin", 1)
	if err := w.Write(res, snap); err != nil {
		t.Fatal(err)
	}
	fresh := testutil.FreshCDICache(t, cdiDir)
	d := fresh.GetDevice("k8s.example.com/gpu=gpu-n1-1")
	if d == nil || d.Annotations[IdentityAnnotationPrefix+"pci-address"] != "0000:41:00.0" || d.Annotations[IdentityAnnotationPrefix+"pci-driver"] != "nvidia" {
		t.Fatalf("device annotations: %+v", d)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	unresolved, err := fresh.InjectDevices(spec, "k8s.example.com/gpu=gpu-n1-0", "k8s.example.com/gpu=gpu-n1-1")
	if err != nil || len(unresolved) != 0 {
		t.Fatalf("inject: %v %v", unresolved, err)
	}
	var paths []string
	for _, n := range spec.Linux.Devices {
		paths = append(paths, n.Path)
	}
	slices.Sort(paths)
	want := []string{"/dev/dri/renderD128", "/dev/dri/renderD129", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"}
	if !slices.Equal(paths, want) {
		t.Fatalf("injected nodes %q, want %q", paths, want)
	}
	if !slices.Contains(spec.Process.Env, "GPU_1=/dev/nvidia1") {
		t.Fatalf("env %v", spec.Process.Env)
	}
}

// TestCheckSibling: with Siblings (the two instances of the DRA driver
// during a rolling update), a spec that another process serving from our
// socket directory wrote with the same devices is ours as well: Intact,
// whichever of the two started first, so that neither yields its devices
// nor writes the file again. Other devices, or another directory, are
// what they were without Siblings; and without it a sibling's spec is
// Superseded as before.
func TestCheckSibling(t *testing.T) {
	snap := &device.Snapshot{Devices: []device.Device{{Name: "fpga-0", HostPath: "/dev/null", ContainerPath: "/dev/fpga-0", Type: device.Char, Major: 1, Minor: 3}}}
	other := &device.Snapshot{Devices: []device.Device{{Name: "fpga-1", HostPath: "/dev/null", ContainerPath: "/dev/fpga-1", Type: device.Char, Major: 1, Minor: 3}}}
	sockDir := testutil.ShortDir(t)
	for _, c := range []struct {
		name     string
		siblings bool
		started  int64
		sockDir  string
		snap     *device.Snapshot
		want     Status
	}{
		{"a newer sibling, same devices", true, 200, sockDir, snap, Intact},
		{"an older sibling, same devices", true, 50, sockDir, snap, Intact},
		{"a newer sibling, other devices", true, 200, sockDir, other, Superseded},
		{"an older sibling, other devices", true, 50, sockDir, other, Changed},
		{"a newer process elsewhere, same devices", true, 200, t.TempDir(), snap, Superseded},
		{"without siblings, a newer one of our directory", false, 200, sockDir, snap, Superseded},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			res := testResource(t)
			res.Siblings = c.siblings
			res.Socket = filepath.Join(sockDir, "dra-old.sock")
			s := NewWriter(dir, "ns/driver", 100).Spec(res)
			if err := s.Write(snap); err != nil {
				t.Fatal(err)
			}
			// The other instance serves its socket (so it is not taken
			// for gone).
			sib := res
			sib.Socket = filepath.Join(c.sockDir, "dra-new.sock")
			l, err := net.Listen("unix", sib.Socket)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if err := NewWriter(dir, "ns/driver", c.started).Write(sib, c.snap); err != nil {
				t.Fatal(err)
			}
			if st, why := s.Check(); st != c.want {
				t.Fatalf("Check: %v (%s), want %v", st, why, c.want)
			}
		})
	}
}
