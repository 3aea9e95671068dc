package dra

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	testingclock "k8s.io/utils/clock/testing"
)

// TestPrepareChecksAllocation: a Prepare of a claim
// the checkpoint knows compares the claim's allocation now (pool, device
// and request of each result for this driver) with the checkpoint's: when
// they differ, the claim gets an error naming it, not the old answer, and
// nothing is prepared or checkpointed.
func TestPrepareChecksAllocation(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(a *resourceapi.AllocationResult)
	}{
		{"another device", func(a *resourceapi.AllocationResult) { a.Devices.Results[0].Device = "sim-2" }},
		{"another request", func(a *resourceapi.AllocationResult) { a.Devices.Results[0].Request = "other-req" }},
		{"one more device", func(a *resourceapi.AllocationResult) {
			a.Devices.Results = append(a.Devices.Results, resourceapi.DeviceRequestAllocationResult{Request: "req", Driver: testDriver, Pool: node, Device: "sim-3"})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.start()
			cl := h.claim("c", "sim-1")
			if r := h.prepare(cl)[cl.Uid]; r.Error != "" {
				t.Fatal(r.Error)
			}
			was := h.checkpointed()[types.UID(cl.Uid)]
			claims := h.client.ResourceV1().ResourceClaims(claimNS)
			obj, err := claims.Get(context.Background(), "c", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c.edit(obj.Status.Allocation)
			if _, err := claims.UpdateStatus(context.Background(), obj, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			r := h.prepare(cl)[cl.Uid]
			if !strings.Contains(r.Error, "default/c") || !strings.Contains(r.Error, ErrAllocationChanged.Error()) || len(r.Devices) != 0 {
				t.Fatalf("prepare of a changed allocation: error %q, devices %v; want %q naming default/c", r.Error, r.Devices, ErrAllocationChanged)
			}
			for _, id := range []string{"sim-n1-2", "sim-n1-3"} {
				if g := h.deviceState(id).Generation; g != 0 {
					t.Errorf("%s prepared (generation %d)", id, g)
				}
			}
			if now := h.checkpointed()[types.UID(cl.Uid)]; len(now.Devices) != 1 || now.Devices[0].Device != was.Devices[0].Device {
				t.Errorf("checkpoint changed: %+v", now)
			}
		})
	}
}

// TestStaleClaimsDropped: a checkpointed claim whose
// ResourceClaim is gone from the API (deleted, or replaced by one of
// another UID) is dropped after the grace period, its spec removed and its
// devices reset as Unprepare would: not one a device-plugin container
// holds. Within the grace nothing is dropped; a claim back in the API
// (same UID) is kept, and so is one that never left. The clock is a fake
// one: each step is one pass of the clean-up.
func TestStaleClaimsDropped(t *testing.T) {
	const interval, grace = time.Minute, 5 * time.Minute
	fc := testingclock.NewFakeClock(time.Now())
	h := newHarness(t, map[string]string{"NUMBER_DEVICES": "5"})
	h.options = func(o *Options) {
		o.Clock, o.CleanupInterval, o.CleanupGrace = fc, interval, grace
		o.DeviceMetadata = true
	}
	h.start()
	c, d := h.claim("c", "sim-2"), h.claim("d", "sim-4")
	for uid, r := range h.prepare(h.claim("a", "sim-0"), h.claim("b", "sim-1"), c, d, h.claim("e", "sim-3")) {
		if r.Error != "" {
			t.Fatalf("%s: %s", uid, r.Error)
		}
	}
	specs := map[string]string{}
	resets := map[string]int64{}
	for _, pc := range h.checkpointed() {
		specs[pc.Name] = pc.ClaimSpec
		resets[pc.Devices[0].ID] = h.deviceState(pc.Devices[0].ID).ResetCount
	}
	claims := h.client.ResourceV1().ResourceClaims(claimNS)
	for _, name := range []string{"a", "b", "d", "e"} {
		if err := claims.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := claims.Create(context.Background(), &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: claimNS, UID: "uid-b2"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// e's device is held by a device-plugin container now.
	h.podres.Set(&podresourcesapi.PodResources{Name: "dp-pod", Namespace: "default", Containers: []*podresourcesapi.ContainerResources{{
		Name: "ctr", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: resName, DeviceIds: []string{"sim-n1-3"}}}}}})

	h.waitFor("the clean-up's ticker", fc.HasWaiters)
	fc.Step(interval)
	h.waitFor("a, b, d and e seen gone", func() bool {
		lines := strings.Split(h.logs.String(), "\n")
		for _, n := range []string{"a", "b", "d", "e"} {
			if !slices.ContainsFunc(lines, func(l string) bool {
				return strings.Contains(l, "claim="+claimNS+"/"+n+" ") && strings.Contains(l, staleNotice)
			}) {
				return false
			}
		}
		return true
	})
	if n := len(h.checkpointed()); n != 5 {
		t.Fatalf("%d claims checkpointed within the grace, want 5", n)
	}
	// d is back (its UID unchanged): kept.
	if _, err := claims.Create(context.Background(), &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: claimNS, UID: types.UID(d.Uid)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fc.Step(grace)
	h.waitFor("a, b and e dropped", func() bool { return len(h.checkpointed()) == 2 })
	cp := h.checkpointed()
	for _, kept := range []string{c.Uid, d.Uid} {
		if _, ok := cp[types.UID(kept)]; !ok {
			t.Errorf("%s dropped", kept)
		}
	}
	for _, gone := range []string{"a", "b", "e"} {
		if _, err := os.Stat(specs[gone]); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s's claim spec left: %v", gone, err)
		}
	}
	// The device metadata of the claims dropped is removed with them (the
	// kubelet, which would have the helper remove it, never unprepares
	// them); the kept claims' stays.
	for name, kept := range map[string]bool{"a": false, "b": false, "e": false, "c": true, "d": true} {
		_, err := os.Stat(filepath.Join(h.plugins, testDriver, "dra-device-metadata", claimNS+"_"+name))
		specs, _ := filepath.Glob(filepath.Join(h.cdiDir, testDriver+"_metadata_uid-"+name+"_*.json"))
		if kept != (err == nil) || kept != (len(specs) == 1) {
			t.Errorf("claim %s (kept %v): metadata dir: %v, specs %v", name, kept, err, specs)
		}
	}
	for id, want := range map[string]int64{"sim-n1-0": 1, "sim-n1-1": 1, "sim-n1-2": 0, "sim-n1-3": 0, "sim-n1-4": 0} {
		if got := h.deviceState(id).ResetCount - resets[id]; got != want {
			t.Errorf("%s reset %d times, want %d", id, got, want)
		}
	}
}

// TestStaleClaimHeldByContainer: a claim gone from the API past the grace
// is dropped only when the kubelet's PodResources lists no container
// holding it. A claim leaves the API while its pod runs when an operator
// strips the finalizer of a claim stuck terminating, or when pods are
// force-deleted while the kubelet is down: releasing it would reset the
// device under the running container and give it to another claim. While
// PodResources cannot answer, nothing is dropped either.
func TestStaleClaimHeldByContainer(t *testing.T) {
	const interval, grace = time.Minute, 5 * time.Minute
	fc := testingclock.NewFakeClock(time.Now())
	h := newHarness(t, nil)
	m := metrics.New("test")
	h.options = func(o *Options) { o.Clock, o.CleanupInterval, o.CleanupGrace, o.Metrics = fc, interval, grace, m }
	h.start()
	for uid, r := range h.prepare(h.claim("a", "sim-0"), h.claim("b", "sim-1")) {
		if r.Error != "" {
			t.Fatalf("%s: %s", uid, r.Error)
		}
	}
	resets := map[string]int64{"sim-n1-0": h.deviceState("sim-n1-0").ResetCount, "sim-n1-1": h.deviceState("sim-n1-1").ResetCount}
	held := &podresourcesapi.PodResources{Name: "p", Namespace: claimNS, Containers: []*podresourcesapi.ContainerResources{{
		Name: "ctr", DynamicResources: []*podresourcesapi.DynamicResource{{ClaimName: "a", ClaimNamespace: claimNS,
			ClaimResources: []*podresourcesapi.ClaimResource{{DriverName: testDriver, PoolName: simPool, DeviceName: "sim-0"}}}}}}}
	h.podres.Set(held)
	claims := h.client.ResourceV1().ResourceClaims(claimNS)
	for _, name := range []string{"a", "b"} {
		if err := claims.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.waitFor("the clean-up's ticker", fc.HasWaiters)
	fc.Step(interval)
	h.waitFor("a and b seen gone", func() bool { return strings.Count(h.logs.String(), staleNotice) == 2 })
	fc.Step(grace)
	h.waitFor("b dropped", func() bool { return len(h.checkpointed()) == 1 })
	if _, ok := h.checkpointed()[types.UID("uid-a")]; !ok {
		t.Fatalf("a, held by a running container, dropped: %v", h.checkpointed())
	}
	h.waitFor("a kept, logged", func() bool { return strings.Contains(h.logs.String(), "a container still holds the claim") })

	// PodResources cannot answer: a stays.
	h.podres.Set()
	h.podres.SetErr(errors.New("kubelet restarting"))
	n := h.podres.Calls()
	fc.Step(interval)
	h.waitFor("PodResources asked again", func() bool { return h.podres.Calls() > n })
	h.waitFor("a kept while PodResources cannot tell, logged", func() bool {
		return strings.Contains(h.logs.String(), "PodResources cannot tell whether a container still holds the claim")
	})
	if len(h.checkpointed()) != 1 {
		t.Fatalf("a dropped while PodResources could not tell")
	}
	// No container holds it any more: dropped at the next pass.
	h.podres.SetErr(nil)
	fc.Step(interval)
	// The count follows the release, which saves the checkpoint without a:
	// wait for both, not for the checkpoint alone.
	h.waitFor("a dropped and counted", func() bool {
		return len(h.checkpointed()) == 0 && metricValue(t, m, "cdi_device_plugin_dra_stale_claims_dropped_total", nil) == 2
	})
	for id, want := range map[string]int64{"sim-n1-0": 1, "sim-n1-1": 1} {
		if got := h.deviceState(id).ResetCount - resets[id]; got != want {
			t.Errorf("%s reset %d times, want %d", id, got, want)
		}
	}
	if got := metricValue(t, m, "cdi_device_plugin_dra_stale_claims_dropped_total", nil); got != 2 {
		t.Errorf("stale claims dropped: %v, want 2", got)
	}
	for _, reason := range []string{"held", "unknown"} {
		if got := metricValue(t, m, "cdi_device_plugin_dra_stale_claims_kept_total", map[string]string{"reason": reason}); got < 1 {
			t.Errorf("stale claims kept (%s): %v, want at least 1", reason, got)
		}
	}
}

// TestStaleClaimMetadataByUID: the clean-up removes only what is the
// stale claim's. The helper keeps a claim's device metadata in a directory
// named by the claim's namespace and name, not its UID: when a new claim
// takes the name of a claim gone from the API and is prepared, dropping
// the old one must leave the new one's metadata file, which its CDI spec
// mounts into its containers.
func TestStaleClaimMetadataByUID(t *testing.T) {
	const interval, grace = time.Minute, 5 * time.Minute
	fc := testingclock.NewFakeClock(time.Now())
	h := newHarness(t, nil)
	h.options = func(o *Options) {
		o.Clock, o.CleanupInterval, o.CleanupGrace = fc, interval, grace
		o.DeviceMetadata = true
	}
	h.start()
	old := h.claim("b", "sim-1")
	if r := h.prepare(old)[old.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if err := h.client.ResourceV1().ResourceClaims(claimNS).Delete(context.Background(), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	renewed := h.claimUID("b", "uid-b2", "sim-2")
	if r := h.prepare(renewed)[renewed.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	file := filepath.Join(h.plugins, testDriver, "dra-device-metadata", claimNS+"_b", "req", "metadata.json")
	h.waitFor("the clean-up's ticker", fc.HasWaiters)
	fc.Step(interval)
	h.waitFor("b (uid-b) seen gone", func() bool { return strings.Contains(h.logs.String(), staleNotice) })
	fc.Step(grace)
	h.waitFor("uid-b dropped", func() bool { _, ok := h.checkpointed()["uid-b"]; return !ok })
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("the renewed claim's metadata file is gone with the stale claim: %v", err)
	}
	if !strings.Contains(string(data), `"uid":"uid-b2"`) && !strings.Contains(string(data), `"uid": "uid-b2"`) {
		t.Errorf("the metadata file is not the renewed claim's: %s", data)
	}
	for uid, want := range map[string]bool{"uid-b": false, "uid-b2": true} {
		specs, _ := filepath.Glob(filepath.Join(h.cdiDir, testDriver+"_metadata_"+uid+"_*.json"))
		if (len(specs) == 1) != want {
			t.Errorf("%s: metadata specs %v, want there %v", uid, specs, want)
		}
	}
}
