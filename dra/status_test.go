package dra

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
)

// statusOfExisting makes client's patches of a status (the driver's
// claim status writes) fail as the API server's status subresource does
// and the fake does not: with NotFound for an object that does not exist
// (the fake's apply would create it), with Conflict when the patch names
// another UID (the fake's apply would take it).
func statusOfExisting(client *fake.Clientset) {
	client.PrependReactor("patch", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		p := a.(clienttesting.PatchAction)
		if a.GetSubresource() != "status" {
			return false, nil, nil
		}
		o, err := client.Tracker().Get(a.GetResource(), a.GetNamespace(), p.GetName())
		if err != nil {
			return true, nil, err
		}
		var patch struct {
			Metadata struct {
				UID types.UID `json:"uid"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(p.GetPatch(), &patch); err == nil && patch.Metadata.UID != "" {
			if m, ok := o.(metav1.Object); ok && m.GetUID() != patch.Metadata.UID {
				return true, nil, apierrors.NewConflict(a.GetResource().GroupResource(), p.GetName(),
					fmt.Errorf("uid mismatch: the patch names %s, the object is %s", patch.Metadata.UID, m.GetUID()))
			}
		}
		return false, nil, nil
	})
}

// claimStatusOf is the claim's status.devices of driver, by device name,
// as the API has it now.
func (h *harness) claimStatusOf(name, driver string) map[string]resourceapi.AllocatedDeviceStatus {
	h.t.Helper()
	c, err := h.client.ResourceV1().ResourceClaims(claimNS).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]resourceapi.AllocatedDeviceStatus{}
	for _, d := range c.Status.Devices {
		if d.Driver == driver {
			out[d.Device] = d
		}
	}
	return out
}

// waitStatus waits until the claim's status.devices of the driver holds
// the devices, each with a Ready condition of the reasons given (device
// name -> reason), and returns them.
func (h *harness) waitStatus(name string, want map[string]ReadyReason) map[string]resourceapi.AllocatedDeviceStatus {
	h.t.Helper()
	var got map[string]resourceapi.AllocatedDeviceStatus
	seen := ""
	end := time.Now().Add(deadline)
	for {
		got = h.claimStatusOf(name, testDriver)
		ok := len(got) == len(want)
		var s []string
		for dev, st := range got {
			c := readyCond(st)
			if c == nil {
				ok = false
				s = append(s, dev+": no Ready condition")
				continue
			}
			s = append(s, fmt.Sprintf("%s: %s %s %q", dev, c.Status, c.Reason, c.Message))
			if want[dev] != ReadyReason(c.Reason) {
				ok = false
			}
		}
		slices.Sort(s)
		seen = strings.Join(s, "; ")
		if ok {
			return got
		}
		if time.Now().After(end) {
			h.t.Fatalf("claim %s: status.devices of %s not %v within %v: %s", name, testDriver, want, deadline, seen)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func readyCond(st resourceapi.AllocatedDeviceStatus) *metav1.Condition {
	for i := range st.Conditions {
		if st.Conditions[i].Type == ConditionReady {
			return &st.Conditions[i]
		}
	}
	return nil
}

func dataOf(t *testing.T, st resourceapi.AllocatedDeviceStatus) StatusData {
	t.Helper()
	if st.Data == nil {
		t.Fatalf("%s: no data", st.Device)
	}
	var d StatusData
	if err := json.Unmarshal(st.Data.Raw, &d); err != nil {
		t.Fatalf("%s: data %s: %v", st.Device, st.Data.Raw, err)
	}
	return d
}

// TestClaimStatusPrepared: after Prepare the claim's
// status.devices holds, for each of the driver's devices, its driver,
// pool and device, Ready True with reason Prepared, and the data: the
// resource, device ID, NUMA node, state generation and CDI IDs. Another
// driver's entry is left as it was (server-side apply under the driver's
// field manager).
func TestClaimStatusPrepared(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	c1 := h.claim("c1", "sim-1", "sim-3")
	claims := h.client.ResourceV1().ResourceClaims(claimNS)
	rc, err := claims.Get(context.Background(), "c1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other := resourceapi.AllocatedDeviceStatus{Driver: "gpu.other.com", Pool: node, Device: "gpu-0",
		Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Mine", LastTransitionTime: metav1.Now()}}}
	rc.Status.Devices = []resourceapi.AllocatedDeviceStatus{other}
	if _, err := claims.UpdateStatus(context.Background(), rc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := h.prepare(c1)[c1.Uid]
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	got := h.waitStatus("c1", map[string]ReadyReason{"sim-1": ReasonPrepared, "sim-3": ReasonPrepared})
	for _, dev := range []string{"sim-1", "sim-3"} {
		st := got[dev]
		id := "sim-n1-" + dev[len(dev)-1:]
		if st.Pool != simPool || st.ShareID != nil {
			t.Errorf("%s: pool %q share %v", dev, st.Pool, st.ShareID)
		}
		if c := readyCond(st); c.Status != metav1.ConditionTrue || c.LastTransitionTime.IsZero() {
			t.Errorf("%s: Ready %+v", dev, c)
		}
		d := dataOf(t, st)
		wantIDs := []string{"k8s.example.com/sim=" + id}
		if dev == "sim-1" {
			wantIDs = append(wantIDs, "k8s."+testDriver+"/claim="+c1.Uid)
		}
		if d.Resource != resName || d.ID != id || d.NUMANode != -1 || d.Generation == nil || *d.Generation != 1 || !slices.Equal(d.CDIDeviceIDs, wantIDs) {
			t.Errorf("%s: data %s, want resource %s, id %s, NUMA node -1, generation 1, CDI IDs %v", dev, st.Data.Raw, resName, id, wantIDs)
		}
	}
	if o := h.claimStatusOf("c1", "gpu.other.com"); len(o) != 1 || o["gpu-0"].Conditions[0].Reason != "Mine" {
		t.Errorf("the other driver's entry changed: %+v", o)
	}
}

// TestClaimStatusStepFailed: a prestart step that
// fails on a device writes Ready False with the step's reason and its
// message for that device; the claim's other device, whose steps ran, is
// NotPrepared.
func TestClaimStatusStepFailed(t *testing.T) {
	for _, c := range []struct {
		name   string
		reason ReadyReason
		step   string
		// breaks sim-n1-1 (its state directory) after the driver started.
		breaks func(dir string) error
	}{
		// The firmware cannot be loaded: a directory is in its place.
		{"reprogram", "ReprogramFailed", "step reprogram", func(dir string) error {
			return os.MkdirAll(filepath.Join(dir, prestart.FirmwareFile, "in-the-way"), 0o755)
		}},
		// The device's state.json is of another version.
		{"state", "StateFailed", "step state", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, prestart.StateFile), []byte(`{"version": 99}`), 0o644)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.start()
			if err := c.breaks(filepath.Join(h.state, "devices", "sim-n1-1")); err != nil {
				t.Fatal(err)
			}
			c1 := h.claim("c1", "sim-0", "sim-1")
			if r := h.prepare(c1)[c1.Uid]; !strings.Contains(r.Error, c.step) {
				t.Fatalf("prepare: %q, want a failed %s", r.Error, c.step)
			}
			got := h.waitStatus("c1", map[string]ReadyReason{"sim-0": ReasonNotPrepared, "sim-1": c.reason})
			for dev, st := range got {
				cond := readyCond(st)
				if cond.Status != metav1.ConditionFalse {
					t.Errorf("%s: Ready %s", dev, cond.Status)
				}
				if dev == "sim-1" && (!strings.Contains(cond.Message, "device sim-n1-1: "+c.step) || len(cond.Message) > maxStatusMessage) {
					t.Errorf("%s: message %q, want the step's error", dev, cond.Message)
				}
				if d := dataOf(t, st); len(d.CDIDeviceIDs) != 0 || d.ID == "" {
					t.Errorf("%s: data %s: want the device, no CDI IDs", dev, st.Data.Raw)
				}
			}
		})
	}
}

// TestClaimStatusOffTheCall: the status is written
// off the kubelet's call: Prepare answers while the API hangs on the
// write, and with success while writes fail; a failed write is retried
// and lands; a claim gone from the API is given up after one try; a claim
// unprepared while its write fails is not written again.
func TestClaimStatusOffTheCall(t *testing.T) {
	h := newHarness(t, nil)
	release := make(chan struct{})
	var mu syncCounter
	h.client.PrependReactor("patch", "resourceclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "status" {
			return false, nil, nil
		}
		name := a.(clienttesting.PatchAction).GetName()
		switch n := mu.add(name); {
		case name == "slow" && n == 1:
			<-release
			return true, nil, apierrors.NewServiceUnavailable("hung")
		case name == "flaky" && n <= 2:
			return true, nil, apierrors.NewServiceUnavailable("try again")
		case name == "failing":
			return true, nil, apierrors.NewServiceUnavailable("always")
		}
		return false, nil, nil
	})
	h.start()
	slow := h.claim("slow", "sim-0")
	done := make(chan string, 1)
	go func() { done <- h.prepare(slow)[slow.Uid].Error }()
	select {
	case e := <-done:
		if e != "" {
			t.Fatal(e)
		}
	case <-time.After(deadline):
		t.Fatal("Prepare waited for the status write")
	}
	close(release)
	h.waitStatus("slow", map[string]ReadyReason{"sim-0": ReasonPrepared})

	flaky := h.claim("flaky", "sim-1")
	if r := h.prepare(flaky)[flaky.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	h.waitStatus("flaky", map[string]ReadyReason{"sim-1": ReasonPrepared})
	if n := mu.get("flaky"); n != 3 {
		t.Errorf("flaky written in %d tries, want 3", n)
	}

	gone := h.claim("gone", "sim-2")
	h.client.PrependReactor("patch", "resourceclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" && a.(clienttesting.PatchAction).GetName() == "gone" {
			mu.add("gone")
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "gone")
		}
		return false, nil, nil
	})
	if r := h.prepare(gone)[gone.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	h.waitFor("the status write of a claim gone given up", func() bool {
		return strings.Contains(h.logs.String(), "the claim is gone or changed")
	})
	if n := mu.get("gone"); n != 1 {
		t.Errorf("a claim gone was tried %d times, want 1", n)
	}

	failing := h.claim("failing", "sim-3")
	if r := h.prepare(failing)[failing.Uid]; r.Error != "" {
		t.Fatalf("a failing status write failed Prepare: %s", r.Error)
	}
	h.waitFor("a failed write of failing", func() bool { return mu.get("failing") >= 1 })
	if r := h.unprepare(failing)[failing.Uid]; r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	n := mu.get("failing")
	h.stop()
	if after := mu.get("failing"); after > n+1 {
		t.Errorf("an unprepared claim's status was tried %d more times", after-n)
	}
	q := h.driver.status
	q.mu.Lock()
	_, queued := q.pending[types.UID(failing.Uid)]
	q.mu.Unlock()
	if queued {
		t.Error("an unprepared claim's status is still queued")
	}
}

// syncCounter counts calls by name.
type syncCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *syncCounter) add(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[name]++
	return c.n[name]
}

func (c *syncCounter) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}
