package dra

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
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
