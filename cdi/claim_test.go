package cdi

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestClaimSpecRoundTrip: a claim's spec and the resource's
// spec resolve together with a fresh CDI cache, as containerd resolves a
// DRA container's CDI IDs: the device's own edits from the resource spec,
// the claim's variables and mounts from the claim spec. The claim spec is
// 0644, survives RemoveStale of the resource specs, and goes with
// RemoveClaimSpec or RemoveStaleClaimSpecs.
func TestClaimSpecRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cdi")
	w := NewWriter(dir, "ns/plugin", 1)
	res := testResource(t)
	snap := &device.Snapshot{Devices: []device.Device{
		{Name: "fpga-n1-0", Index: 0, HostPath: "/dev/null", ContainerPath: "/dev/fpga-0", Type: device.Char, Major: 1, Minor: 3, NUMANode: device.NoNUMA},
		{Name: "fpga-n1-1", Index: 1, HostPath: "/dev/null", ContainerPath: "/dev/fpga-1", Type: device.Char, Major: 1, Minor: 3, NUMANode: device.NoNUMA},
	}}
	if err := w.Write(res, snap); err != nil {
		t.Fatal(err)
	}
	k, err := ClaimKind("fpga.example.com")
	if err != nil {
		t.Fatal(err)
	}
	uid := "0b9f3c6e-8a57-4c1e-9d6a-2f4e1b7c9a01"
	name, path, err := w.WriteClaimSpec(k, Claim{UID: uid, Namespace: "default", Name: "c1",
		Env: []string{"FPGA_DEVICES=fpga-n1-1"}, Mounts: []Mount{{HostPath: "/opt/fpga", ContainerPath: "/usr/local/fpga", ReadOnly: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if name != "k8s.fpga.example.com/claim="+uid || path != filepath.Join(dir, "k8s.fpga.example.com-claim_"+uid+".json") {
		t.Fatalf("name %q, path %q", name, path)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("claim spec: %v %v", fi, err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := testutil.FreshCDICache(t, dir).InjectDevices(spec, "k8s.example.com/fpga=fpga-n1-1", name); err != nil || len(unresolved) > 0 {
		t.Fatalf("inject: %v %v", unresolved, err)
	}
	if !slices.Contains(spec.Process.Env, "FPGA_1=/dev/fpga-1") || !slices.Contains(spec.Process.Env, "FPGA_DEVICES=fpga-n1-1") {
		t.Fatalf("env %v", spec.Process.Env)
	}
	if len(spec.Linux.Devices) != 1 || spec.Linux.Devices[0].Path != "/dev/fpga-1" {
		t.Fatalf("devices %+v", spec.Linux.Devices)
	}
	if len(spec.Mounts) != 1 || spec.Mounts[0].Destination != "/usr/local/fpga" || !slices.Contains(spec.Mounts[0].Options, "ro") {
		t.Fatalf("mounts %+v", spec.Mounts)
	}

	// The resource specs' clean-up leaves claim specs alone.
	if removed, err := w.RemoveStale(nil); err != nil || len(removed) != 1 || removed[0] != w.Path(res.Kind) {
		t.Fatalf("RemoveStale: %v %v", removed, err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("RemoveStale removed a claim spec: %v", err)
	}
	other := "5d1c0e2a-1111-4c1e-9d6a-2f4e1b7c9a02"
	if _, _, err := w.WriteClaimSpec(k, Claim{UID: other, Namespace: "default", Name: "c2", Env: []string{"FPGA_DEVICES=fpga-n1-0"}}); err != nil {
		t.Fatal(err)
	}
	removed, err := w.RemoveStaleClaimSpecs(k, func(u string) bool { return u == uid })
	if err != nil || len(removed) != 1 || removed[0] != w.ClaimSpecPath(k, other) {
		t.Fatalf("RemoveStaleClaimSpecs: %v %v", removed, err)
	}
	for range 2 { // removing it twice is fine
		if err := w.RemoveClaimSpec(k, uid); err != nil {
			t.Fatal(err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Fatalf("left: %v", left)
	}
}

func TestClaimSpecBadInput(t *testing.T) {
	w := NewWriter(t.TempDir(), "me", 1)
	k, err := ClaimKind("sim.example.com")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		claim Claim
		is    error
	}{
		{"no edits", Claim{UID: "u1"}, ErrNoEdits},
		{"UID with a slash", Claim{UID: "../u1", Env: []string{"A=1"}}, nil},
		{"bad variable", Claim{UID: "u1", Env: []string{"=1"}}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := w.WriteClaimSpec(k, c.claim)
			if err == nil || (c.is != nil && !errors.Is(err, c.is)) {
				t.Fatalf("err %v, want one (%v)", err, c.is)
			}
			if left, _ := filepath.Glob(filepath.Join(w.dir, "*")); len(left) != 0 {
				t.Fatalf("written: %v", left)
			}
		})
	}
	if err := w.RemoveClaimSpec(k, "../x"); err == nil {
		t.Fatal("removed a spec by a UID with a slash")
	}
	if _, err := ClaimKind("Not_A_Domain!"); err == nil {
		t.Fatal("a claim kind from a bad driver name")
	}
}

// TestStaleClaimSpecTemps: a driver killed while it wrote a claim's spec
// leaves the write's temp file in the CDI dir; RemoveStaleClaimSpecs,
// which the driver runs at every start, removes it with the specs of
// claims not prepared (no other start-up sweep globs claim specs). The
// temps of another kind's claim specs are left alone (this process's own
// are atomicfile.RemoveStaleTemps's to spare, tested there).
func TestStaleClaimSpecTemps(t *testing.T) {
	dir := t.TempDir()
	w := NewWriter(dir, "ns/plugin", 1)
	k, err := ClaimKind("fpga.example.com")
	if err != nil {
		t.Fatal(err)
	}
	other, err := ClaimKind("other.example.com")
	if err != nil {
		t.Fatal(err)
	}
	uid := "0b9f3c6e-8a57-4c1e-9d6a-2f4e1b7c9a01"
	// Named as atomicfile names the temps of another process.
	killed := strings.TrimSuffix(atomicfile.TempPattern(w.ClaimSpecPath(k, uid)), "*") + "1.killed-42"
	othersTemp := strings.TrimSuffix(atomicfile.TempPattern(w.ClaimSpecPath(other, uid)), "*") + "1.killed-42"
	for _, p := range []string{killed, othersTemp} {
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := w.RemoveStaleClaimSpecs(k, func(string) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(killed); err == nil {
		t.Errorf("the temp of a killed claim spec write is left: %s (removed %v)", killed, removed)
	}
	if !slices.Contains(removed, killed) {
		t.Errorf("removed %v, want it to name %s", removed, killed)
	}
	if _, err := os.Lstat(othersTemp); err != nil {
		t.Errorf("another kind's temp removed: %v", err)
	}
}
