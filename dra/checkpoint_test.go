package dra

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// TestCheckpoint: saved claims read back after a "restart" (a
// new Checkpoint on the file), with mode 0600 and no temp file left; a
// missing file is empty; a file of another version, or not JSON, is
// refused with ErrCheckpoint rather than read as empty.
func TestCheckpoint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dra", "checkpoint.json")
	c := NewCheckpoint(path)
	if err := c.Load(); err != nil || len(c.Claims()) != 0 {
		t.Fatalf("missing file: %v %v", c.Claims(), err)
	}
	claims := map[types.UID]PreparedClaim{
		"u1": {Namespace: "ns", Name: "a", BootID: "b1", Devices: []PreparedDevice{{Resource: "example.com/sim", ID: "sim-n1-1", Device: "sim-1"}}},
		"u2": {Namespace: "ns", Name: "b", Devices: []PreparedDevice{{Resource: "example.com/sim", ID: "sim-n1-0", Device: "sim-0"}, {Resource: "example.com/gpu", ID: "gpu-0"}}},
	}
	if err := c.Save(claims); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("checkpoint file: %v %v", fi, err)
	}
	if tmps, _ := filepath.Glob(c.TempPattern()); len(tmps) != 0 {
		t.Fatalf("temp files left: %v", tmps)
	}
	again := NewCheckpoint(path)
	if err := again.Load(); err != nil {
		t.Fatal(err)
	}
	if got := again.Claims(); len(got) != 2 || got["u1"].Devices[0].ID != "sim-n1-1" || got["u1"].BootID != "b1" {
		t.Fatalf("read back %+v", got)
	}
	if got := again.Held("example.com/sim"); !slices.Equal(got, []string{"sim-n1-0", "sim-n1-1"}) {
		t.Fatalf("held %v", got)
	}
	for _, bad := range []string{`{"version": 3, "claims": {}}`, `not json`} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := NewCheckpoint(path).Load(); !errors.Is(err, ErrCheckpoint) {
			t.Fatalf("%s: err %v, want ErrCheckpoint", bad, err)
		}
	}
}

// TestCheckpointDriverName: the checkpoint records the
// driver name its claims were prepared by. A version-1 file (no name) is
// read with every entry and taken over by the driver that starts; so is a
// file of another name that holds no claim. One of another name that
// holds claims is refused with ErrOtherDriver and a message saying what
// to do; the name it records is accepted. A save writes version 2 with the
// name.
func TestCheckpointDriverName(t *testing.T) {
	const v1 = `{"version": 1, "claims": {"u1": {"namespace": "ns", "name": "a", "bootID": "b1",
		"devices": [{"resource": "example.com/sim", "id": "sim-n1-1", "pool": "n1", "device": "sim-1", "requests": ["r"], "cdiDeviceIDs": ["k8s.example.com/sim=sim-n1-1"]}]}}}`
	for _, c := range []struct {
		name, file, driver string
		// refused: the driver is refused, with these words.
		refused []string
	}{
		{"version 1 is adopted", v1, "sim.example.com", nil},
		{"same name", `{"version": 2, "driverName": "sim.example.com", "claims": {"u1": {"namespace": "ns", "name": "a", "devices": []}}}`, "sim.example.com", nil},
		{"another name, no claims", `{"version": 2, "driverName": "old.example.com", "claims": {}}`, "sim.example.com", nil},
		{"another name, claims prepared", `{"version": 2, "driverName": "old.example.com", "claims": {"u1": {"namespace": "ns", "name": "a", "devices": []}}}`,
			"sim.example.com", []string{`"old.example.com"`, `"sim.example.com"`, "ns/a", "--driver-name old.example.com", "drain"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "checkpoint.json")
			if err := os.WriteFile(path, []byte(c.file), 0o600); err != nil {
				t.Fatal(err)
			}
			cp := NewCheckpoint(path)
			if err := cp.Load(); err != nil {
				t.Fatal(err)
			}
			before := cp.Claims()
			err := cp.Adopt(c.driver)
			if c.refused != nil {
				if !errors.Is(err, ErrOtherDriver) {
					t.Fatalf("err %v, want ErrOtherDriver", err)
				}
				for _, w := range c.refused {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cp.DriverName() != c.driver {
				t.Fatalf("driver name %q after adoption", cp.DriverName())
			}
			if err := cp.Save(cp.Claims()); err != nil {
				t.Fatal(err)
			}
			again := NewCheckpoint(path)
			if err := again.Load(); err != nil {
				t.Fatal(err)
			}
			if again.DriverName() != c.driver || !reflect.DeepEqual(again.Claims(), before) {
				t.Fatalf("read back %q %+v, want %q %+v", again.DriverName(), again.Claims(), c.driver, before)
			}
			if data, _ := os.ReadFile(path); !strings.Contains(string(data), `"version": 2`) {
				t.Fatalf("saved %s", data)
			}
		})
	}
}

// TestCheckpointRefresh: two instances of the driver on one node (a
// rolling update) share the checkpoint file, so each reads what the other
// saved before it uses it: Refresh reloads a file that changed since this
// instance last read or wrote it, and leaves the claims as they are when
// it is gone.
func TestCheckpointRefresh(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	a, b := NewCheckpoint(path), NewCheckpoint(path)
	for _, c := range []*Checkpoint{a, b} {
		if err := c.Load(); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Save(map[types.UID]PreparedClaim{"u1": {Namespace: "ns", Name: "c1"}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Refresh(); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.Claims()["u1"]; !ok {
		t.Fatalf("b does not see what a saved: %v", b.Claims())
	}
	if err := b.Save(map[types.UID]PreparedClaim{"u2": {Namespace: "ns", Name: "c2"}}); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(); err != nil {
		t.Fatal(err)
	}
	if got := a.Claims(); len(got) != 1 || got["u2"].Name != "c2" {
		t.Fatalf("a after b saved: %v", got)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(); err != nil || len(a.Claims()) != 1 {
		t.Fatalf("Refresh of a file gone: %v, claims %v; want them kept", err, a.Claims())
	}
}
