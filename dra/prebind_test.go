package dra

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/bindmarker"
)

// pbbConfig is resName with 3 devices prepared before binding: a step
// that fails on device 0 (an exec of /bin/sh), then reset and reprogram.
const pbbConfig = `resources:
- name: example.com/sim
  idPrefix: sim
  envPrefix: SIM
  count: 3
  prepareBeforeBind: true
  prestart:
    steps:
    - type: exec
      command: ["/bin/sh", "-c", "if [ {{.Index}} = 0 ]; then echo device 0 refuses >&2; exit 1; fi"]
    - type: reset
    - type: reprogram
`

// newPBBHarness is the harness with pbbConfig.
func newPBBHarness(t *testing.T) *harness {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(pbbConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	return newHarness(t, map[string]string{"CONFIG_FILE": file})
}

// pbbClaim makes a claim allocated the devices with the driver's binding
// conditions, labelled for this node as the bindmarker labels it.
func (h *harness) pbbClaim(name string, devices ...string) *drav1.Claim {
	h.t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: claimNS, UID: types.UID("uid-" + name),
		Labels: map[string]string{bindmarker.NodeLabel(testDriver): bindmarker.NodeValue(node)}}}
	alloc := &resourceapi.AllocationResult{}
	for _, d := range devices {
		alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{Request: "req", Driver: testDriver, Pool: simPool, Device: d,
			BindingConditions: []string{testDriver + "/" + ConditionPrepared}, BindingFailureConditions: []string{testDriver + "/" + ConditionPrepareFailed}})
	}
	c.Status.Allocation = alloc
	if _, err := h.client.ResourceV1().ResourceClaims(claimNS).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	return &drav1.Claim{Namespace: claimNS, Name: name, Uid: string(c.UID)}
}

// waitBinding waits until the claim's status of the driver's device has
// condition cond True, and returns that condition.
func (h *harness) waitBinding(name, dev, cond string) *metav1.Condition {
	h.t.Helper()
	var seen []metav1.Condition
	for end := time.Now().Add(deadline); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		st, ok := h.claimStatusOf(name, testDriver)[dev]
		if !ok {
			continue
		}
		seen = st.Conditions
		if c := apimeta.FindStatusCondition(st.Conditions, testDriver+"/"+cond); c != nil && c.Status == metav1.ConditionTrue {
			return c
		}
	}
	h.t.Fatalf("claim %s, device %s: no %s/%s True within %v: %+v", name, dev, testDriver, cond, deadline, seen)
	return nil
}

// TestPrepareBeforeBind: a claim allocated devices of a resource with
// prepareBeforeBind is prepared with no call of the kubelet: its steps
// run, it is checkpointed, and its status tells the scheduler
// <driver>/prepared True (and Ready). The kubelet's Prepare then answers
// at once with what it prepared, the steps not run again, and the claim
// is the kubelet's: the driver no longer releases it.
func TestPrepareBeforeBind(t *testing.T) {
	h := newPBBHarness(t)
	h.start()
	c := h.pbbClaim("c", "sim-1")
	h.waitBinding("c", "sim-1", ConditionPrepared)
	if g := h.deviceState("sim-n1-1").Generation; g != 1 {
		t.Fatalf("sim-n1-1 prepared %d times before binding, want 1", g)
	}
	pc, ok := h.checkpointed()[types.UID(c.Uid)]
	if !ok || !pc.PreBind || pc.PreBinding {
		t.Fatalf("checkpoint entry %+v (there %v), want prepared before binding", pc, ok)
	}
	r := h.prepare(c)[c.Uid]
	if r.Error != "" || len(r.Devices) != 1 || r.Devices[0].DeviceName != "sim-1" {
		t.Fatalf("the kubelet's Prepare: %+v", r)
	}
	if g := h.deviceState("sim-n1-1").Generation; g != 1 {
		t.Fatalf("sim-n1-1 prepared again by the kubelet's Prepare (generation %d)", g)
	}
	if pc := h.checkpointed()[types.UID(c.Uid)]; pc.PreBind {
		t.Fatal("still marked prepared before binding once the kubelet has it")
	}
}

// TestPrepareBeforeBindFails: a step that fails before binding reports
// <driver>/prepareFailed True with the step's message, so that the
// scheduler sends the pod elsewhere; the device is Unhealthy (tainted) as
// after a failed Prepare, and the claim holds nothing.
func TestPrepareBeforeBindFails(t *testing.T) {
	h := newPBBHarness(t)
	h.start()
	c := h.pbbClaim("c", "sim-0")
	cond := h.waitBinding("c", "sim-0", ConditionPrepareFailed)
	if !strings.Contains(cond.Message, "device 0 refuses") || cond.Reason != string(StepReason("exec")) {
		t.Errorf("failure condition: reason %q message %q, want ExecFailed and the step's output", cond.Reason, cond.Message)
	}
	if _, ok := h.checkpointed()[types.UID(c.Uid)]; ok {
		t.Error("a claim whose preparation failed is checkpointed")
	}
	h.waitFor("sim-0 tainted unhealthy", func() bool { return hasTaint(h.published()["sim-0"], TaintUnhealthy) })
}

// TestPrepareBeforeBindFailedOnce: a claim whose failure is reported is
// not prepared again when it changes before the scheduler deallocates it
// (our own status write, the scheduler's reservation): a second try
// would find the device Unhealthy and replace the step's reason with
// DeviceUnhealthy, so the pod's events would no longer say which step
// failed.
func TestPrepareBeforeBindFailedOnce(t *testing.T) {
	h := newPBBHarness(t)
	h.start()
	h.pbbClaim("c", "sim-0")
	h.waitBinding("c", "sim-0", ConditionPrepareFailed)
	claims := h.client.ResourceV1().ResourceClaims(claimNS)
	obj, err := claims.Get(context.Background(), "c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The fake API keeps the version it is given: it names this change.
	obj.Annotations, obj.ResourceVersion = map[string]string{"touched": "yes"}, "touched"
	if obj, err = claims.Update(context.Background(), obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the changed claim looked at", func() bool {
		return strings.Contains(h.logs.String(), "resourceVersion="+obj.ResourceVersion)
	})
	cond := h.waitBinding("c", "sim-0", ConditionPrepareFailed)
	if cond.Reason != string(StepReason("exec")) {
		t.Errorf("failure condition reason %q after the claim changed, want %q (the step's)", cond.Reason, StepReason("exec"))
	}
}

// TestPrepareBeforeBindReleased: a claim prepared before binding that
// loses its allocation before its pod is bound here (the scheduler gave
// up waiting, or the pod was deleted) is released as Unprepare releases a
// claim: its device reset, its spec and entry gone.
func TestPrepareBeforeBindReleased(t *testing.T) {
	for _, how := range []string{"deallocated", "deleted"} {
		t.Run(how, func(t *testing.T) {
			h := newPBBHarness(t)
			h.start()
			c := h.pbbClaim("c", "sim-2")
			h.waitBinding("c", "sim-2", ConditionPrepared)
			spec := h.checkpointed()[types.UID(c.Uid)].ClaimSpec
			resets := h.deviceState("sim-n1-2").ResetCount
			claims := h.client.ResourceV1().ResourceClaims(claimNS)
			if how == "deleted" {
				if err := claims.Delete(context.Background(), "c", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			} else {
				obj, err := claims.Get(context.Background(), "c", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				obj.Status.Allocation = nil
				if _, err := claims.UpdateStatus(context.Background(), obj, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			h.waitFor("the claim released", func() bool { _, ok := h.checkpointed()[types.UID(c.Uid)]; return !ok })
			if n := h.deviceState("sim-n1-2").ResetCount - resets; n != 1 {
				t.Errorf("sim-n1-2 reset %d times at the release, want 1", n)
			}
			if spec != "" {
				if _, err := os.Stat(spec); !os.IsNotExist(err) {
					t.Errorf("claim spec left: %v", err)
				}
			}
		})
	}
}

// TestPrepareBeforeBindNotInTheWay: steps that take long before binding
// run outside the preparer's lock: the kubelet's Prepare of another claim
// meanwhile is answered at once, not after them.
func TestPrepareBeforeBindNotInTheWay(t *testing.T) {
	h := newPBBHarness(t)
	g := &gate{entered: make(chan struct{}), release: make(chan struct{}), armed: true}
	h.wrap = func(r Runner) Runner { g.Runner = r; return g }
	h.start()
	h.pbbClaim("slow", "sim-1")
	select {
	case <-g.entered:
	case <-time.After(deadline):
		t.Fatal("the steps before binding did not start")
	}
	k := h.claim("k", "sim-2")
	done := make(chan string, 1)
	go func() { done <- h.prepare(k)[k.Uid].Error }()
	select {
	case err := <-done:
		if err != "" {
			t.Fatalf("the kubelet's Prepare while steps before binding run: %s", err)
		}
	case <-time.After(deadline):
		t.Fatal("the kubelet's Prepare waited for the steps of another claim before binding")
	}
	close(g.release)
	h.waitBinding("slow", "sim-1", ConditionPrepared)
}

// TestPrepareBeforeBindCrash: the claim is in the checkpoint before its
// steps run; a driver that stops in the middle of a preparation before
// binding completes it at its next start: steps that completed are not
// run again, and the claim's condition is written (here it was never
// written before the stop).
func TestPrepareBeforeBindCrash(t *testing.T) {
	h := newPBBHarness(t)
	crash := h.crashAfter(afterPrepare)
	h.start()
	c := h.pbbClaim("c", "sim-1")
	h.waitBinding("c", "sim-1", ConditionPrepared)
	h.stop()
	crash.restore()
	if pc := h.checkpointed()[types.UID(c.Uid)]; !pc.PreBinding {
		t.Fatalf("the checkpoint at the crash: %+v, want the steps under way", pc)
	}
	// The status as if never written.
	claims := h.client.ResourceV1().ResourceClaims(claimNS)
	obj, err := claims.Get(context.Background(), "c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	obj.Status.Devices = nil
	if _, err := claims.UpdateStatus(context.Background(), obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.wrap = nil
	h.start()
	h.waitBinding("c", "sim-1", ConditionPrepared)
	if g := h.deviceState("sim-n1-1").Generation; g != 1 {
		t.Errorf("sim-n1-1 prepared %d times across the crash, want 1", g)
	}
	if pc := h.checkpointed()[types.UID(c.Uid)]; pc.PreBinding || !pc.PreBind || pc.ClaimSpec == "" {
		t.Errorf("the checkpoint after the restart: %+v, want prepared before binding, with its spec", pc)
	}
}
