package dra

import (
	"errors"
	"os"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// TestUnprepareAsksPodResources: Unprepare resets a
// claim's device only when PodResources says no device-plugin container
// holds it. A held device is not reset (the log names it and its holder);
// when PodResources cannot answer, no device is reset (fail closed, said
// in the log). Either way the claim is unprepared: its spec and its
// checkpoint entry go. The reset step is the built-in one, which counts
// its runs in the device's state.json.
func TestUnprepareAsksPodResources(t *testing.T) {
	for _, c := range []struct {
		name string
		// setup makes PodResources answer as the case needs.
		setup func(h *harness)
		// reset: the devices whose reset runs.
		reset map[string]bool
		log   []string
	}{
		{"a device-plugin container holds sim-n1-1", func(h *harness) {
			h.podres.Set(&podresourcesapi.PodResources{Name: "dp-pod", Namespace: "default", Containers: []*podresourcesapi.ContainerResources{{
				Name: "ctr", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: resName, DeviceIds: []string{"sim-n1-1"}}}}}})
		}, map[string]bool{"sim-n1-3": true}, []string{"sim-n1-1", "default/dp-pod/ctr", "not reset"}},
		{"PodResources cannot answer", func(h *harness) { h.podres.Stop() }, map[string]bool{},
			[]string{"PodResources cannot tell", "not reset"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.start()
			cl := h.claim("c", "sim-1", "sim-3")
			if r := h.prepare(cl)[cl.Uid]; r.Error != "" {
				t.Fatal(r.Error)
			}
			spec := h.checkpointed()[types.UID(cl.Uid)].ClaimSpec
			before := map[string]int64{}
			for _, id := range []string{"sim-n1-1", "sim-n1-3"} {
				before[id] = h.deviceState(id).ResetCount
			}
			c.setup(h)
			if r := h.unprepare(cl); r[cl.Uid].GetError() != "" {
				t.Fatalf("unprepare: %s", r[cl.Uid].GetError())
			}
			for id, n := range before {
				got := h.deviceState(id).ResetCount - n
				if want := map[bool]int64{true: 1, false: 0}[c.reset[id]]; got != want {
					t.Errorf("%s reset %d times, want %d", id, got, want)
				}
			}
			for _, s := range c.log {
				if !strings.Contains(h.logs.String(), s) {
					t.Errorf("the log does not say %q", s)
				}
			}
			if _, ok := h.checkpointed()[types.UID(cl.Uid)]; ok {
				t.Error("claim still checkpointed")
			}
			if _, err := os.Stat(spec); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("claim spec left: %v", err)
			}
		})
	}
}

// TestUnprepareCrash: a driver that crashes in the
// middle of Unprepare (after the reset, with the claim's spec removed and
// the checkpoint entry not dropped yet) does not take the missing spec for
// a reboot at its next start, and the kubelet's retried Unprepare does not
// reset the device a second time. The crash is the files as they were at
// that point: the checkpoint copied when the reset returned, put back
// after the driver stopped.
func TestUnprepareCrash(t *testing.T) {
	h := newHarness(t, nil)
	crash := h.crashAfter(afterReset)
	h.start()
	cl := h.claim("c", "sim-2")
	if r := h.prepare(cl)[cl.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	spec := h.checkpointed()[types.UID(cl.Uid)].ClaimSpec
	before := h.deviceState("sim-n1-2").ResetCount
	if r := h.unprepare(cl); r[cl.Uid].GetError() != "" {
		t.Fatal(r[cl.Uid].GetError())
	}
	if n := h.deviceState("sim-n1-2").ResetCount - before; n != 1 {
		t.Fatalf("reset %d times at unprepare, want 1", n)
	}
	h.stop()
	crash.restore()
	if _, err := os.Stat(spec); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("claim spec still there: %v", err)
	}
	h.wrap = nil
	mark := len(h.logs.String())
	h.start()
	if l := h.logs.String()[mark:]; strings.Contains(l, "reboot") {
		t.Errorf("the interrupted Unprepare is logged as a reboot:\n%s", l)
	}
	if _, err := os.Stat(spec); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the spec of a claim being unprepared was written again: %v", err)
	}
	if r := h.unprepare(cl); r[cl.Uid].GetError() != "" {
		t.Fatal(r[cl.Uid].GetError())
	}
	if n := h.deviceState("sim-n1-2").ResetCount - before; n != 1 {
		t.Errorf("reset %d times after the retried Unprepare, want 1", n)
	}
	if len(h.checkpointed()) != 0 {
		t.Errorf("checkpoint after the retried Unprepare: %+v", h.checkpointed())
	}
}
