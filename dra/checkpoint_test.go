package dra

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// TestCheckpoint (issue 21): saved claims read back after a "restart" (a
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
	for _, bad := range []string{`{"version": 2, "claims": {}}`, `not json`} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := NewCheckpoint(path).Load(); !errors.Is(err, ErrCheckpoint) {
			t.Fatalf("%s: err %v, want ErrCheckpoint", bad, err)
		}
	}
}
