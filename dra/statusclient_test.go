package dra

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// TestClaimStatusDenied: a status write refused for want of permission is
// a misconfiguration, not a claim gone: the API server's granular status
// authorization refuses it with a 422 whose cause is Forbidden (the
// driver's account lacks associated-node:patch on resourceclaims/driver),
// RBAC with a 403 (no patch on resourceclaims/status). Each is logged as a
// warning that names the permission the driver needs, tried once (no
// retry can succeed until an operator grants it), and the claim stays
// prepared.
func TestClaimStatusDenied(t *testing.T) {
	h := newHarness(t, nil)
	gr := schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}
	var mu syncCounter
	h.client.PrependReactor("patch", "resourceclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "status" {
			return false, nil, nil
		}
		switch name := a.(clienttesting.PatchAction).GetName(); name {
		case "granular":
			mu.add(name)
			return true, nil, apierrors.NewInvalid(schema.GroupKind{Group: "resource.k8s.io", Kind: "ResourceClaim"}, name, field.ErrorList{
				field.Forbidden(field.NewPath("status", "devices"),
					`changing status.devices requires resource="resourceclaims/driver", verb="associated-node:patch" permission for driver "`+testDriver+`"`)})
		case "rbac":
			mu.add(name)
			return true, nil, apierrors.NewForbidden(gr, name, nil)
		}
		return false, nil, nil
	})
	h.start()
	for _, name := range []string{"granular", "rbac"} {
		c := h.claim(name, map[string]string{"granular": "sim-0", "rbac": "sim-1"}[name])
		if r := h.prepare(c)[c.Uid]; r.Error != "" {
			t.Fatalf("%s: %s", name, r.Error)
		}
	}
	want := map[string]string{
		"granular": `associated-node:patch on resourceclaims/driver (resourceNames: ` + testDriver + `)`,
		"rbac":     "patch on resourceclaims/status",
	}
	h.waitFor("both refusals logged", func() bool {
		return strings.Count(h.logs.String(), "the driver's account may not write the claim's status") == 2
	})
	for name, perm := range want {
		var line string
		for _, l := range strings.Split(h.logs.String(), "\n") {
			if strings.Contains(l, "claim="+claimNS+"/"+name+" ") && strings.Contains(l, "may not write the claim's status") {
				line = l
			}
		}
		if !strings.Contains(line, "level=warning") || !strings.Contains(line, perm) {
			t.Errorf("%s: logged %q, want a warning naming %s", name, line, perm)
		}
		if n := mu.get(name); n != 1 {
			t.Errorf("%s: written %d times, want 1", name, n)
		}
	}
	if strings.Contains(h.logs.String(), "the claim is gone or changed") {
		t.Error("a refusal for want of permission was logged as a claim gone")
	}
	if len(h.checkpointed()) != 2 {
		t.Errorf("checkpoint: %+v", h.checkpointed())
	}
}

// TestClaimStatusOwnClient: the status writes go through
// Options.StatusClient, not the client the kubelet plugin helper reads
// claims with in NodePrepareResources: a client's requests share one
// client-side rate limit (client-go's 5 a second, 10 in a burst), so status
// writes on the same client made the next claim's GET wait (bench-dra: a
// prepared-already call of 8 devices took 172 ms instead of 4).
func TestClaimStatusOwnClient(t *testing.T) {
	h := newHarness(t, nil)
	sc := fake.NewClientset()
	statusOfExisting(sc)
	h.options = func(o *Options) { o.StatusClient = sc.ResourceV1() }
	h.start()
	c1 := h.claim("c1", "sim-1")
	rc, err := h.client.ResourceV1().ResourceClaims(claimNS).Get(context.Background(), "c1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.Tracker().Add(rc); err != nil {
		t.Fatal(err)
	}
	if r := h.prepare(c1)[c1.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	for end := time.Now().Add(deadline); ; time.Sleep(10 * time.Millisecond) {
		c, err := sc.ResourceV1().ResourceClaims(claimNS).Get(context.Background(), "c1", metav1.GetOptions{})
		if err == nil && len(c.Status.Devices) == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the claim's status not written through the status client within %v (%v)", deadline, err)
		}
	}
	for _, a := range h.client.Actions() {
		if a.GetResource().Resource == "resourceclaims" && a.GetSubresource() == "status" {
			t.Errorf("a status write went through the helper's client: %s %s/%s", a.GetVerb(), a.GetResource().Resource, a.GetSubresource())
		}
	}
}

// TestClaimStatusOff: with NoDeviceStatus (--device-status=
// false) a prepared claim's status is not queued, so the driver makes no
// API write for it: the one write per prepared claim the fleet measures.
func TestClaimStatusOff(t *testing.T) {
	h := newHarness(t, nil)
	h.options = func(o *Options) { o.NoDeviceStatus = true }
	h.start()
	c1 := h.claim("c1", "sim-1")
	if r := h.prepare(c1)[c1.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	q := h.driver.status
	q.mu.Lock()
	pending, inflight, written := len(q.pending), q.inflight, len(q.written)
	q.mu.Unlock()
	if pending != 0 || inflight != "" || written != 0 {
		t.Errorf("NoDeviceStatus: after a Prepare %d claims queued, %q being written, %d written; want none", pending, inflight, written)
	}
	for _, a := range h.client.Actions() {
		if a.GetSubresource() == "status" && a.GetResource().Resource == "resourceclaims" && a.GetVerb() == "patch" {
			t.Errorf("NoDeviceStatus: the claim's status was written: %v", a)
		}
	}
}
