package dra

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	testingclock "k8s.io/utils/clock/testing"
)

// sharedConfig is resName with 2 devices of 2 replicas each, reset and
// reprogram steps.
const sharedConfig = `resources:
- name: example.com/sim
  idPrefix: sim
  envPrefix: SIM
  count: 2
  replicas: 2
  prestart:
    steps:
    - type: reset
    - type: reprogram
`

// newSharedHarness is the harness with sharedConfig.
func newSharedHarness(t *testing.T) *harness {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(sharedConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	return newHarness(t, map[string]string{"CONFIG_FILE": file})
}

// share is one allocation result of a shared device: its device (DRA
// name, of simPool), its share ID and the shares it consumes (0: none
// recorded).
type share struct {
	device, id string
	shares     int64
}

// sharedClaim makes an allocated claim of the shares in the API.
func (h *harness) sharedClaim(name string, shares ...share) *drav1.Claim {
	h.t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: claimNS, UID: types.UID("uid-" + name)}}
	alloc := &resourceapi.AllocationResult{}
	for i, s := range shares {
		res := resourceapi.DeviceRequestAllocationResult{Request: "req" + strings.Repeat("x", i), Driver: testDriver, Pool: simPool, Device: s.device}
		if s.id != "" {
			id := types.UID(s.id)
			res.ShareID = &id
		}
		if s.shares > 0 {
			res.ConsumedCapacity = map[resourceapi.QualifiedName]apiresource.Quantity{SharesCapacity(testDriver): *apiresource.NewQuantity(s.shares, apiresource.DecimalSI)}
		}
		alloc.Devices.Results = append(alloc.Devices.Results, res)
	}
	c.Status.Allocation = alloc
	if _, err := h.client.ResourceV1().ResourceClaims(claimNS).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	return &drav1.Claim{Namespace: claimNS, Name: name, Uid: string(c.UID)}
}

// TestSharesPublished: a resource with replicas 2 is
// published, each device once, allocatable to several claims with the
// capacity <driver>/shares of 2 (a request takes 1 by default, 1 to 2);
// a device whose node is gone is tainted unhealthy, the one device every
// share of it is.
func TestSharesPublished(t *testing.T) {
	h := newSharedHarness(t)
	h.start()
	var p map[string]resourceapi.Device
	h.waitFor("sim-0 and sim-1 published without taints", func() bool {
		p = h.published()
		return len(p) == 2 && len(p["sim-0"].Taints)+len(p["sim-1"].Taints) == 0
	})
	for _, name := range []string{"sim-0", "sim-1"} {
		d, ok := p[name]
		if !ok {
			t.Fatalf("%s not published: %v", name, p)
		}
		if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
			t.Errorf("%s: allowMultipleAllocations %v, want true", name, d.AllowMultipleAllocations)
		}
		c, ok := d.Capacity[resourceapi.QualifiedName(testDriver+"/shares")]
		if !ok || len(d.Capacity) != 1 {
			t.Fatalf("%s: capacity %v, want %s/shares", name, d.Capacity, testDriver)
		}
		pol := c.RequestPolicy
		if c.Value.Value() != 2 || pol == nil || pol.Default == nil || pol.Default.Value() != 1 || pol.ValidRange == nil ||
			pol.ValidRange.Min.Value() != 1 || pol.ValidRange.Max.Value() != 2 || pol.ValidRange.Step.Value() != 1 {
			t.Errorf("%s: shares %+v (policy %+v), want 2, default 1, range 1..2 step 1", name, c.Value, pol)
		}
	}
	if err := os.Remove(filepath.Join(h.dev, "sim-1")); err != nil {
		t.Fatal(err)
	}
	h.waitFor("sim-1 tainted unhealthy", func() bool {
		return hasTaint(h.published()["sim-1"], TaintUnhealthy)
	})
	if p := h.published(); len(p) != 2 || hasTaint(p["sim-0"], TaintUnhealthy) {
		t.Fatalf("published %v", p)
	}
	// No share of the unhealthy device is prepared.
	a := h.sharedClaim("a", share{"sim-1", "s-a", 1})
	if r := h.prepare(a)[a.Uid]; !strings.Contains(r.Error, ErrUnhealthy.Error()) {
		t.Fatalf("a share of an unhealthy device: %q, want %q", r.Error, ErrUnhealthy)
	}
}

// TestSharedDevicePrepare: a device of a resource with
// replicas 2 is held by two claims at once, each with its share ID in the
// answer and the checkpoint, both given the device's CDI ID (the same
// node); a third is refused while both hold it, also after a driver
// restart. The steps run at the first share only (generation 1), the reset
// at the release of the last one; two claims of one call share a device
// with the steps run once; a claim asking both shares of a device another
// claim holds a share of is refused.
func TestSharedDevicePrepare(t *testing.T) {
	h := newSharedHarness(t)
	h.start()
	a, b, c := h.sharedClaim("a", share{"sim-0", "s-a", 1}), h.sharedClaim("b", share{"sim-0", "s-b", 0}), h.sharedClaim("c", share{"sim-0", "s-c", 1})
	answers := map[string]*drav1.NodePrepareResourceResponse{}
	for _, cl := range []*drav1.Claim{a, b} {
		r := h.prepare(cl)[cl.Uid]
		if r.Error != "" {
			t.Fatalf("%s: %s", cl.Name, r.Error)
		}
		answers[cl.Name] = r
	}
	for name, id := range map[string]string{"a": "s-a", "b": "s-b"} {
		r := answers[name]
		if len(r.Devices) != 1 || r.Devices[0].DeviceName != "sim-0" || r.Devices[0].GetShareId() != id ||
			r.Devices[0].CdiDeviceIds[0] != "k8s.example.com/sim=sim-n1-0" {
			t.Errorf("%s: %v, want sim-0, share %s, CDI ID k8s.example.com/sim=sim-n1-0", name, r.Devices, id)
		}
		spec := h.inject(allIDs(r))
		if len(spec.Linux.Devices) != 1 || spec.Linux.Devices[0].Path != "/dev/sim-0" {
			t.Errorf("%s: devices %+v, want /dev/sim-0", name, spec.Linux.Devices)
		}
	}
	if s := h.deviceState("sim-n1-0"); s.Generation != 1 {
		t.Fatalf("the steps ran %d times for two shares, want once", s.Generation)
	}
	if r := h.prepare(c)[c.Uid]; !strings.Contains(r.Error, "device held by claim default/a, claim default/b: 2 of its 2 shares taken, 1 asked") {
		t.Fatalf("c, a third share: %q", r.Error)
	}
	cp := h.checkpointed()
	for name, id := range map[string]string{"a": "s-a", "b": "s-b"} {
		pc := cp[types.UID("uid-"+name)]
		if len(pc.Devices) != 1 || pc.Devices[0].ShareID != id || pc.Devices[0].Shares != 1 {
			t.Errorf("%s checkpointed %+v, want share %s of 1", name, pc.Devices, id)
		}
	}
	if _, ok := cp[types.UID(c.Uid)]; ok {
		t.Fatal("c checkpointed")
	}

	h.stop()
	h.start()
	if r := h.prepare(a)[a.Uid]; r.Error != "" || len(r.Devices) != 1 || r.Devices[0].GetShareId() != "s-a" {
		t.Fatalf("a after a restart: %v", r)
	}
	if r := h.prepare(c)[c.Uid]; !strings.Contains(r.Error, "2 of its 2 shares taken") {
		t.Fatalf("c after a restart: %q", r.Error)
	}
	resets := h.deviceState("sim-n1-0").ResetCount
	if r := h.unprepare(a)[a.Uid]; r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	if s := h.deviceState("sim-n1-0"); s.ResetCount != resets {
		t.Fatalf("reset at the release of a share b still holds (%d resets)", s.ResetCount-resets)
	}
	if r := h.prepare(c)[c.Uid]; r.Error != "" {
		t.Fatalf("c once a released its share: %s", r.Error)
	}
	if s := h.deviceState("sim-n1-0"); s.Generation != 1 {
		t.Fatalf("the steps ran again for a later share: generation %d", s.Generation)
	}
	if r := h.unprepare(b)[b.Uid]; r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	if s := h.deviceState("sim-n1-0"); s.ResetCount != resets {
		t.Fatal("reset at the release of a share c still holds")
	}
	if r := h.unprepare(c)[c.Uid]; r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	if s := h.deviceState("sim-n1-0"); s.ResetCount != resets+1 {
		t.Fatalf("%d resets at the release of the last share, want 1", s.ResetCount-resets)
	}

	// Two claims of one call share sim-1: the steps run once; a claim
	// asking both shares of it then is refused.
	d, e := h.sharedClaim("d", share{"sim-1", "s-d", 1}), h.sharedClaim("e", share{"sim-1", "s-e", 1})
	for uid, r := range h.prepare(d, e) {
		if r.Error != "" {
			t.Fatalf("%s: %s", uid, r.Error)
		}
	}
	if s := h.deviceState("sim-n1-1"); s.Generation != 1 {
		t.Fatalf("the steps ran %d times for two shares of one call, want once", s.Generation)
	}
	if r := h.unprepare(d)[d.Uid]; r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	f := h.sharedClaim("f", share{"sim-1", "s-f", 2})
	if r := h.prepare(f)[f.Uid]; !strings.Contains(r.Error, "1 of its 2 shares taken, 2 asked") {
		t.Fatalf("f, both shares of a device e holds one of: %q", r.Error)
	}
}

// TestSharedDeviceStaleRelease: the stale-claim
// clean-up releases a share as Unprepare does: the device is reset when
// the last claim holding it is dropped, not before.
func TestSharedDeviceStaleRelease(t *testing.T) {
	const interval, grace = time.Minute, 5 * time.Minute
	fc := testingclock.NewFakeClock(time.Now())
	h := newSharedHarness(t)
	h.options = func(o *Options) { o.Clock, o.CleanupInterval, o.CleanupGrace = fc, interval, grace }
	h.start()
	a, b := h.sharedClaim("a", share{"sim-0", "s-a", 1}), h.sharedClaim("b", share{"sim-0", "s-b", 1})
	for uid, r := range h.prepare(a, b) {
		if r.Error != "" {
			t.Fatalf("%s: %s", uid, r.Error)
		}
	}
	resets := h.deviceState("sim-n1-0").ResetCount
	claims := h.client.ResourceV1().ResourceClaims(claimNS)
	if err := claims.Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the clean-up's ticker", fc.HasWaiters)
	fc.Step(interval)
	h.waitFor("a seen gone", func() bool { return strings.Contains(h.logs.String(), staleNotice) })
	fc.Step(grace)
	h.waitFor("a dropped", func() bool { return len(h.checkpointed()) == 1 })
	if s := h.deviceState("sim-n1-0"); s.ResetCount != resets {
		t.Fatal("reset when a stale share was dropped while b holds the device")
	}
	if err := claims.Delete(context.Background(), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fc.Step(interval)
	h.waitFor("b seen gone", func() bool {
		return slices.ContainsFunc(strings.Split(h.logs.String(), "\n"), func(l string) bool {
			return strings.Contains(l, "claim="+claimNS+"/b ") && strings.Contains(l, staleNotice)
		})
	})
	fc.Step(grace)
	h.waitFor("b dropped", func() bool { return len(h.checkpointed()) == 0 })
	if s := h.deviceState("sim-n1-0"); s.ResetCount != resets+1 {
		t.Fatalf("%d resets when the last share was dropped, want 1", s.ResetCount-resets)
	}
}
