package dra

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// resourcesOf are the resources of a slice's devices (their resource
// attribute).
func resourcesOf(s *resourceapi.ResourceSlice) []string {
	var out []string
	for _, d := range s.Spec.Devices {
		if a := d.Attributes[resourceapi.QualifiedName(testDriver+"/"+AttrResource)]; a.StringValue != nil && !slices.Contains(out, *a.StringValue) {
			out = append(out, *a.StringValue)
		}
	}
	return out
}

// slicesOf lists the ResourceSlices that hold devices of resource res.
func (h *harness) slicesOf(res string) []resourceapi.ResourceSlice {
	h.t.Helper()
	list, err := h.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	var out []resourceapi.ResourceSlice
	for _, s := range list.Items {
		if slices.Contains(resourcesOf(&s), res) {
			out = append(out, s)
		}
	}
	return out
}

func deviceCount(sl []resourceapi.ResourceSlice) int {
	n := 0
	for _, s := range sl {
		n += len(s.Spec.Devices)
	}
	return n
}

// TestSlicesPerResource: each resource has a pool of
// its own (<node>/<idPrefix>), so that a device added to the first
// resource rewrites only that resource's slices: the ResourceSlice
// controller (the real one, on client-go's fake clientset) makes no
// create, update or delete of the second resource's slices, which keep
// their resource version and pool generation.
func TestSlicesPerResource(t *testing.T) {
	const ser, sim = "example.com/ser", "example.com/sim"
	h := newHarness(t, nil)
	conf := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(conf, []byte("resources:\n- name: "+ser+"\n  idPrefix: ser\n  hostDevices: [ser*]\n- name: "+sim+"\n  idPrefix: sim\n  count: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.extraEnv = map[string]string{"CONFIG_FILE": conf}
	testutil.Mknod(t, filepath.Join(h.dev, "ser0"), 1, 3)
	h.start()
	// Published, and the handover guards down (no taints): nothing more
	// to change.
	h.waitFor("ser-0, sim-0 and sim-1 published without taints", func() bool {
		p := h.published()
		for _, d := range p {
			if len(d.Taints) > 0 {
				return false
			}
		}
		return len(p) == 3 && p["ser-0"].Name != "" && p["sim-1"].Name != ""
	})
	before := h.slicesOf(sim)
	h.client.ClearActions()

	testutil.Mknod(t, filepath.Join(h.dev, "ser1"), 1, 5) // a node of its own: one node is one device
	h.waitFor("ser-1 published", func() bool { _, ok := h.published()["ser-1"]; return ok })

	simSlices := map[string]bool{}
	for _, s := range before {
		simSlices[s.Name] = true
	}
	for _, a := range h.client.Actions() {
		if a.GetResource().Resource != "resourceslices" {
			continue
		}
		switch a.GetVerb() {
		case "create", "update":
			// An update names the slice it rewrites; a create, not yet
			// (a generated name).
			if s, ok := a.(clienttesting.CreateAction).GetObject().(*resourceapi.ResourceSlice); ok && (simSlices[s.Name] || slices.Contains(resourcesOf(s), sim)) {
				t.Errorf("a device of %s rewrote a slice of %s: %s %s (devices of %v)", ser, sim, a.GetVerb(), s.Name, resourcesOf(s))
			}
		case "delete":
			if name := a.(clienttesting.DeleteAction).GetName(); simSlices[name] {
				t.Errorf("a device of %s deleted slice %s of %s", ser, name, sim)
			}
		}
	}
	after := h.slicesOf(sim)
	if len(after) != len(before) || deviceCount(after) != 2 {
		t.Fatalf("%s: %d slices with %d devices, %d before", sim, len(after), deviceCount(after), len(before))
	}
	for i := range after {
		b, a := before[i], after[i]
		if a.Name != b.Name || a.ResourceVersion != b.ResourceVersion || a.Spec.Pool.Generation != b.Spec.Pool.Generation {
			t.Errorf("%s: slice %s (version %s, pool generation %d) is now %s (version %s, pool generation %d)", sim,
				b.Name, b.ResourceVersion, b.Spec.Pool.Generation, a.Name, a.ResourceVersion, a.Spec.Pool.Generation)
		}
	}
	// One pool per resource, named after the node and the ID prefix; the
	// devices of one resource only in each.
	for res, pool := range map[string]string{ser: node + "/ser", sim: node + "/sim"} {
		for _, s := range h.slicesOf(res) {
			if s.Spec.Pool.Name != pool || !slices.Equal(resourcesOf(&s), []string{res}) {
				t.Errorf("slice %s: pool %q with devices of %v, want pool %q with devices of %s only", s.Name, s.Spec.Pool.Name, resourcesOf(&s), pool, res)
			}
		}
	}
}

// TestPreparePools: an allocation names a device by
// its resource's pool; the node's name, the one pool of the driver's
// versions before, is taken too, for claims allocated before an upgrade;
// another node's pool or a pool no resource has is not the driver's.
func TestPreparePools(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	claim := func(name, pool string) *drav1.Claim {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: claimNS, UID: types.UID("uid-" + name)}}
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "req", Driver: testDriver, Pool: pool, Device: "sim-1"}}}}
		if _, err := h.client.ResourceV1().ResourceClaims(claimNS).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return &drav1.Claim{Namespace: claimNS, Name: name, Uid: string(c.UID)}
	}
	for _, c := range []struct{ name, pool, want string }{
		{"another-node", "n2/sim", "device n2/sim/sim-1: " + ErrUnknownDevice.Error()},
		{"no-such-pool", node + "/fpga", "device n1/fpga/sim-1: " + ErrUnknownDevice.Error()},
		{"the-pool", simPool, ""},
		{"before-the-upgrade", node, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := claim(c.name, c.pool)
			got := h.prepare(cl)[cl.Uid]
			if c.want != "" {
				if !strings.Contains(got.Error, c.want) {
					t.Fatalf("error %q, want %q", got.Error, c.want)
				}
				return
			}
			if got.Error != "" || len(got.Devices) != 1 || got.Devices[0].PoolName != c.pool || got.Devices[0].DeviceName != "sim-1" {
				t.Fatalf("%q %v: want sim-1 of pool %s", got.Error, got.Devices, c.pool)
			}
			if r := h.unprepare(cl)[cl.Uid]; r.Error != "" {
				t.Fatal(r.Error)
			}
		})
	}
}
