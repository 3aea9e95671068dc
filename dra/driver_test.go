package dra

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
)

// TestPrepareUnprepareAcrossRestart: a claim's devices are
// prepared with the resource's steps (state.json), its CDI IDs resolve
// with a fresh CDI cache to the device nodes, the per-device variables of
// the resource's spec and the claim's SIM_DEVICES; it is checkpointed; a
// second Prepare, also after a driver restart, answers the same without
// running the steps again; Unprepare after the restart resets the device,
// removes the claim spec and the checkpoint entry; an unknown UID is
// unprepared at once.
func TestPrepareUnprepareAcrossRestart(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	c1 := h.claim("c1", "sim-1", "sim-3")
	got := h.prepare(c1)[c1.Uid]
	if got.Error != "" {
		t.Fatal(got.Error)
	}
	claimID := "k8s." + testDriver + "/claim=" + c1.Uid
	want := [][]string{{"k8s.example.com/sim=sim-n1-1", claimID}, {"k8s.example.com/sim=sim-n1-3"}}
	if len(got.Devices) != 2 {
		t.Fatalf("devices %v", got.Devices)
	}
	for i, d := range got.Devices {
		if !slices.Equal(d.CdiDeviceIds, want[i]) || d.PoolName != simPool || d.DeviceName != []string{"sim-1", "sim-3"}[i] || !slices.Equal(d.RequestNames, []string{"req"}) {
			t.Errorf("device %d: %v, want CDI IDs %v", i, d, want[i])
		}
	}
	spec := h.inject(allIDs(got))
	for _, e := range []string{"SIM_1=/dev/sim-1", "SIM_3=/dev/sim-3", "SIM_DEVICES=sim-n1-1,sim-n1-3"} {
		if !slices.Contains(spec.Process.Env, e) {
			t.Errorf("env %v lacks %s", spec.Process.Env, e)
		}
	}
	if len(spec.Linux.Devices) != 2 || spec.Linux.Devices[0].Path != "/dev/sim-1" {
		t.Errorf("devices %+v", spec.Linux.Devices)
	}
	for _, m := range spec.Mounts {
		if _, err := os.Stat(m.Source); err != nil {
			t.Errorf("mount source %s: %v", m.Source, err)
		}
	}
	if s := h.deviceState("sim-n1-1"); s.Generation != 1 || s.Firmware == nil || s.Status != prestart.StatusReady {
		t.Fatalf("sim-n1-1 state %+v", s)
	}
	if s := h.deviceState("sim-n1-0"); s.Generation != 0 {
		t.Fatalf("an unallocated device was prepared: %+v", s)
	}
	pc, ok := h.checkpointed()[types.UID(c1.Uid)]
	if !ok || pc.Namespace != claimNS || pc.Name != "c1" || pc.ClaimSpec == "" || len(pc.Devices) != 2 {
		t.Fatalf("checkpoint %+v", pc)
	}

	ckpt := filepath.Join(h.state, "dra", "checkpoint.json")
	written, err := os.Stat(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	again := h.prepare(c1)[c1.Uid]
	if again.Error != "" || fmt.Sprint(allIDs(again)) != fmt.Sprint(allIDs(got)) {
		t.Fatalf("second Prepare: %v, want %v", again, got)
	}
	// Nothing new to keep: the checkpoint is not written (and synced)
	// again (a write replaces the file).
	if fi, err := os.Stat(ckpt); err != nil || !os.SameFile(fi, written) {
		t.Fatalf("the checkpoint was written again for a claim prepared already (%v)", err)
	}
	h.stop()
	h.start()
	after := h.prepare(c1)[c1.Uid]
	if after.Error != "" || fmt.Sprint(allIDs(after)) != fmt.Sprint(allIDs(got)) {
		t.Fatalf("Prepare after a restart: %v, want %v", after, got)
	}
	if s := h.deviceState("sim-n1-1"); s.Generation != 1 {
		t.Fatalf("steps ran again for a prepared claim: generation %d", s.Generation)
	}

	before := h.deviceState("sim-n1-3").ResetCount
	unknown := &drav1.Claim{Namespace: claimNS, Name: "never", Uid: "uid-never"}
	res := h.unprepare(c1, unknown)
	if res[c1.Uid].GetError() != "" || res[unknown.Uid].GetError() != "" || len(res) != 2 {
		t.Fatalf("unprepare: %v", res)
	}
	if s := h.deviceState("sim-n1-3"); s.ResetCount != before+1 || s.Generation != 1 {
		t.Fatalf("no reset at unprepare: %+v", s)
	}
	if _, err := os.Stat(pc.ClaimSpec); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("claim spec left: %v", err)
	}
	if _, ok := h.checkpointed()[types.UID(c1.Uid)]; ok {
		t.Fatal("claim still checkpointed after unprepare")
	}
	// Unprepared twice: done already.
	if res := h.unprepare(c1); res[c1.Uid].GetError() != "" {
		t.Fatal(res[c1.Uid].GetError())
	}
}

// TestPrepareRefusesHeldDevices: a device another prepared
// claim holds, or that a container holds through the device plugin
// (PodResources), is refused with the reason; when any claim of a call
// fails, every claim of it gets an error and none is checkpointed, also
// when the failure comes from a step after the others' steps ran.
func TestPrepareRefusesHeldDevices(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	a := h.claim("a", "sim-0")
	if r := h.prepare(a)[a.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	b, c := h.claim("b", "sim-1"), h.claim("c", "sim-0")
	res := h.prepare(b, c)
	if !strings.Contains(res[c.Uid].Error, "held by claim default/a") {
		t.Errorf("c: %q, want held by claim default/a", res[c.Uid].Error)
	}
	if !strings.Contains(res[b.Uid].Error, ErrCallFailed.Error()) || !strings.Contains(res[b.Uid].Error, "default/c") {
		t.Errorf("b: %q, want failed with the call, naming c", res[b.Uid].Error)
	}
	if len(res[b.Uid].Devices)+len(res[c.Uid].Devices) != 0 {
		t.Errorf("devices returned with errors: %v", res)
	}
	h.podres.Set(&podresourcesapi.PodResources{Name: "dp-pod", Namespace: "default", Containers: []*podresourcesapi.ContainerResources{{
		Name: "ctr", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: resName, DeviceIds: []string{"sim-n1-2"}}}}}})
	d := h.claim("d", "sim-2")
	if r := h.prepare(d)[d.Uid]; !strings.Contains(r.Error, "held by a container through the device plugin") {
		t.Errorf("d: %q, want held through the device plugin", r.Error)
	}
	cp := h.checkpointed()
	for _, uid := range []string{b.Uid, c.Uid, d.Uid} {
		if _, ok := cp[types.UID(uid)]; ok {
			t.Errorf("%s checkpointed after a failed call", uid)
		}
	}
	h.podres.Set()

	// A step fails on one claim's device: sim-1's state is of another
	// version. The other claim's steps ran, but it is neither
	// checkpointed nor given a claim spec.
	bad := filepath.Join(h.state, "devices", "sim-n1-1", prestart.StateFile)
	if err := os.WriteFile(bad, []byte(`{"version": 99}`), 0o644); err != nil {
		t.Fatal(err)
	}
	e := h.claim("e", "sim-3")
	res = h.prepare(b, e)
	if !strings.Contains(res[b.Uid].Error, "sim-n1-1") || !strings.Contains(res[e.Uid].Error, ErrCallFailed.Error()) {
		t.Fatalf("a failed step: b %q, e %q", res[b.Uid].Error, res[e.Uid].Error)
	}
	if _, ok := h.checkpointed()[types.UID(e.Uid)]; ok {
		t.Fatal("e checkpointed after its call failed")
	}
	if _, err := os.Stat(filepath.Join(h.cdiDir, "k8s."+testDriver+"-claim_"+e.Uid+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("e's claim spec written: %v", err)
	}
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	res = h.prepare(b, e)
	if res[b.Uid].Error != "" || res[e.Uid].Error != "" {
		t.Fatalf("retry: %v", res)
	}
	if cp := h.checkpointed(); len(cp) != 3 {
		t.Fatalf("checkpointed %d claims, want a, b, e", len(cp))
	}
}

// TestPrepareAgainAfterReboot: after a reboot a claim is
// prepared again (its steps run, generation +1) when the kubelet asks:
// one the boot ID tells, or one only the emptied CDI dir tells (the e2e
// suite's simulated reboot). Its claim spec is written again at start, so
// that its CDI IDs resolve before that; the spec of a claim not prepared
// is removed.
func TestPrepareAgainAfterReboot(t *testing.T) {
	for _, c := range []struct {
		name string
		boot string
	}{
		{"boot ID changed", "boot-2"},
		{"same boot ID, CDI dir emptied", bootOne},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.start()
			cl := h.claim("c", "sim-2")
			if r := h.prepare(cl)[cl.Uid]; r.Error != "" {
				t.Fatal(r.Error)
			}
			h.stop()
			if err := os.RemoveAll(h.cdiDir); err != nil {
				t.Fatal(err)
			}
			// A claim spec of a claim not prepared (a driver killed between
			// the spec and the checkpoint) is removed at start.
			w := cdi.NewWriter(h.cdiDir, "x", 1)
			if _, _, err := w.WriteClaimSpec(h.driver.specs.kind, cdi.Claim{UID: "uid-stale", Env: []string{"SIM_DEVICES=sim-n1-0"}}); err != nil {
				t.Fatal(err)
			}
			h.boot = c.boot
			h.start()
			if _, err := os.Stat(w.ClaimSpecPath(h.driver.specs.kind, cl.Uid)); err != nil {
				t.Fatalf("claim spec not restored at start: %v", err)
			}
			if _, err := os.Stat(w.ClaimSpecPath(h.driver.specs.kind, "uid-stale")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("claim spec of a claim not prepared left: %v", err)
			}
			r := h.prepare(cl)[cl.Uid]
			if r.Error != "" {
				t.Fatal(r.Error)
			}
			if s := h.deviceState("sim-n1-2"); s.Generation != 2 {
				t.Fatalf("generation %d after a reboot, want 2", s.Generation)
			}
			spec := h.inject(allIDs(r))
			if !slices.Contains(spec.Process.Env, "SIM_DEVICES=sim-n1-2") {
				t.Fatalf("env %v", spec.Process.Env)
			}
			if pc := h.checkpointed()[types.UID(cl.Uid)]; pc.BootID != c.boot || pc.PrepareAgain {
				t.Fatalf("checkpoint after preparing again: %+v", pc)
			}
			// Once prepared again, a further Prepare runs nothing.
			if r := h.prepare(cl)[cl.Uid]; r.Error != "" || h.deviceState("sim-n1-2").Generation != 2 {
				t.Fatalf("prepared a third time: %v, generation %d", r.Error, h.deviceState("sim-n1-2").Generation)
			}
		})
	}
}

// slices lists the driver's ResourceSlices of the node, by device.
