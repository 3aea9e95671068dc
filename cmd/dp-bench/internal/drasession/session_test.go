package drasession

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"sigs.k8s.io/yaml"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
)

// TestBenchClaim: the claim asks for as many devices as it is allocated,
// and the allocation is the scheduler's: one result per device, of the
// driver, in the node's pool, for the claim's request, on that node. It
// is checked in k8s.io/api's types, decoded strictly from dp-bench's JSON.
func TestBenchClaim(t *testing.T) {
	b, err := json.Marshal(benchClaim("ns", "c1", "drv.example.com", "node-1", []string{"d-0", "d-3"}))
	if err != nil {
		t.Fatal(err)
	}
	var c resourceapi.ResourceClaim
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		t.Fatalf("not a ResourceClaim of k8s.io/api: %v\n%s", err, b)
	}
	if c.APIVersion != "resource.k8s.io/v1" || c.Kind != "ResourceClaim" || c.Namespace != "ns" || c.Name != "c1" {
		t.Errorf("object %s %s %s/%s", c.APIVersion, c.Kind, c.Namespace, c.Name)
	}
	reqs := c.Spec.Devices.Requests
	if len(reqs) != 1 || reqs[0].Exactly == nil || reqs[0].Exactly.Count != 2 ||
		reqs[0].Exactly.AllocationMode != resourceapi.DeviceAllocationModeExactCount || reqs[0].Exactly.DeviceClassName == "" {
		t.Fatalf("requests %+v", reqs)
	}
	a := c.Status.Allocation
	if a == nil || len(a.Devices.Results) != 2 {
		t.Fatalf("allocation %+v", a)
	}
	for i, r := range a.Devices.Results {
		want := resourceapi.DeviceRequestAllocationResult{Request: reqs[0].Name, Driver: "drv.example.com", Pool: "node-1", Device: []string{"d-0", "d-3"}[i]}
		if r.Request != want.Request || r.Driver != want.Driver || r.Pool != want.Pool || r.Device != want.Device {
			t.Errorf("result %d: %+v, want %+v", i, r, want)
		}
	}
	terms := a.NodeSelector.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchFields) != 1 || terms[0].MatchFields[0].Key != "metadata.name" ||
		terms[0].MatchFields[0].Operator != corev1.NodeSelectorOpIn || !slices.Equal(terms[0].MatchFields[0].Values, []string{"node-1"}) {
		t.Errorf("node selector %+v", a.NodeSelector)
	}
	// The API server's answer, read back.
	c.UID, c.ResourceVersion = "u-1", "7"
	b, _ = json.Marshal(&c)
	var got apiclient.ResourceClaim
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if k := kubeletClaim(&got); k.Namespace != "ns" || k.Name != "c1" || k.Uid != "u-1" || got.Metadata.ResourceVersion != "7" {
		t.Errorf("kubelet's claim %+v, metadata %+v", k, got.Metadata)
	}
}

func dev(pool, name string, reqs []string, cdi ...string) *drav1.Device {
	return &drav1.Device{PoolName: pool, DeviceName: name, RequestNames: reqs, CdiDeviceIds: cdi}
}

func answer(uid string, r *drav1.NodePrepareResourceResponse) *drav1.NodePrepareResourcesResponse {
	return &drav1.NodePrepareResourcesResponse{Claims: map[string]*drav1.NodePrepareResourceResponse{uid: r}}
}

// TestCheckPrepared: every allocated device of the driver answered once,
// with its request and a CDI ID, and nothing else.
func TestCheckPrepared(t *testing.T) {
	c := benchClaim("ns", "c1", "drv", "n1", []string{"d0", "d1"})
	c.Metadata.UID = "u1"
	// A result of another driver is not this driver's to answer.
	c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
		apiclient.DeviceRequestAllocationResult{Request: benchRequest, Driver: "other", Pool: "n1", Device: "x"})
	req := []string{benchRequest}
	ok := &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{dev("n1", "d1", req, "k/c=d1"), dev("n1", "d0", req, "k/c=d0", "k/claim=u1")}}
	if p := checkPrepared(c, "drv", answer("u1", ok)); len(p) != 0 {
		t.Fatalf("a right answer: %v", p)
	}
	for _, tc := range []struct {
		name string
		resp *drav1.NodePrepareResourcesResponse
		want string
	}{
		{"not answered", answer("u2", ok), "claim c1 not answered"},
		{"error", answer("u1", &drav1.NodePrepareResourceResponse{Error: "boom"}), `error "boom"`},
		{"missing", answer("u1", &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{dev("n1", "d0", req, "i")}}), "not answered: n1/d1"},
		{"twice", answer("u1", &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{dev("n1", "d0", req, "i"), dev("n1", "d0", req, "i"), dev("n1", "d1", req, "i")}}), "n1/d0 answered twice"},
		{"not allocated", answer("u1", &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{dev("n1", "d0", req, "i"), dev("n1", "d1", req, "i"), dev("n1", "x", req, "i")}}), "n1/x answered, not allocated"},
		{"other pool", answer("u1", &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{dev("n2", "d0", req, "i"), dev("n1", "d1", req, "i")}}), "n2/d0 answered, not allocated"},
		{"request", answer("u1", &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{dev("n1", "d0", []string{"other"}, "i"), dev("n1", "d1", req, "i")}}), `n1/d0: requests [other]`},
		{"no CDI ID", answer("u1", &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{dev("n1", "d0", req), dev("n1", "d1", req, "i")}}), "n1/d0: no CDI ID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := checkPrepared(c, "drv", tc.resp)
			if !strings.Contains(strings.Join(p, "; "), tc.want) {
				t.Fatalf("problems %q, want one with %q", p, tc.want)
			}
		})
	}
	two := answer("u1", ok)
	two.Claims["u9"] = ok
	if p := checkPrepared(c, "drv", two); !strings.Contains(strings.Join(p, ";"), "2 claims answered for 1") {
		t.Errorf("two claims answered: %v", p)
	}
}

// TestAnswerIdempotence: answers are compared whatever the order of their
// devices and requests; a change of CDI IDs, devices or an error is a
// difference, and the difference names it.
func TestAnswerIdempotence(t *testing.T) {
	req := []string{"a", "b"}
	a := &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{dev("p", "d0", req, "k/c=d0", "k/claim=u"), dev("p", "d1", req, "k/c=d1")}}
	reordered := &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{dev("p", "d1", []string{"b", "a"}, "k/c=d1"), dev("p", "d0", req, "k/c=d0", "k/claim=u")}}
	if d := diffAnswers(a, reordered); d != "" {
		t.Errorf("same answer reordered: %s", d)
	}
	for _, tc := range []struct {
		name string
		b    *drav1.NodePrepareResourceResponse
		want string
	}{
		{"CDI IDs", &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{dev("p", "d0", req, "k/c=d0"), dev("p", "d1", req, "k/c=d1")}}, "-p/d0 requests=[a b] cdi=[k/c=d0 k/claim=u]"},
		{"device", &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{dev("p", "d0", req, "k/c=d0", "k/claim=u"), dev("p", "d2", req, "k/c=d1")}}, "+p/d2"},
		{"error", &drav1.NodePrepareResourceResponse{Error: "held"}, "+error=held"},
		{"nothing", nil, "+<no answer>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := diffAnswers(a, tc.b); !strings.Contains(d, tc.want) {
				t.Fatalf("diff %q, want it to contain %q", d, tc.want)
			}
		})
	}
	if got := cdiIDs(a); !slices.Equal(got, []string{"k/c=d0", "k/claim=u", "k/c=d1"}) {
		t.Errorf("CDI IDs %v", got)
	}
}

// TestEvidence: the steps' files are told apart by content: rewritten
// with the same bytes is no change, new, changed and removed files are.
func TestEvidence(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	glob := filepath.Join(dir, "*", "state.json")
	write("d0/state.json", `{"generation":1}`)
	write("d1/state.json", `{"generation":1}`)
	write("d1/other", "not matched")
	e0, err := evidence(glob)
	if err != nil || len(e0) != 2 {
		t.Fatalf("evidence %v %v", e0, err)
	}
	write("d0/state.json", `{"generation":1}`)
	write("d1/other", "changed, not matched")
	e1, _ := evidence(glob)
	if ch := changedFiles(e0, e1); len(ch) != 0 {
		t.Errorf("same contents: changed %v", ch)
	}
	write("d0/state.json", `{"generation":2}`)
	write("d2/state.json", `{}`)
	if err := os.Remove(filepath.Join(dir, "d1", "state.json")); err != nil {
		t.Fatal(err)
	}
	e2, _ := evidence(glob)
	want := []string{filepath.Join(dir, "d0", "state.json"), filepath.Join(dir, "d1", "state.json"), filepath.Join(dir, "d2", "state.json")}
	if ch := changedFiles(e1, e2); !slices.Equal(ch, want) {
		t.Errorf("changed %v, want %v", ch, want)
	}
	if _, err := evidence("[bad"); err == nil {
		t.Error("a bad glob gave no error")
	}
}

// testSlice is a slice name of generation gen of pool, one of count, with
// devs.
func testSlice(pool, name string, gen, count int64, devs ...string) *apiclient.ResourceSlice {
	s := &apiclient.ResourceSlice{Metadata: apiclient.ObjectMeta{Name: name},
		Spec: apiclient.ResourceSliceSpec{Pool: apiclient.ResourcePool{Name: pool, Generation: gen, ResourceSliceCount: count}}}
	for _, d := range devs {
		s.Spec.Devices = append(s.Spec.Devices, apiclient.SliceDevice{Name: d})
	}
	return s
}

// TestPoolComplete: a pool is complete when all slices of its newest
// generation are there; devices in slice-name order.
func TestPoolComplete(t *testing.T) {
	sl := func(name string, gen, count int64, devs ...string) *apiclient.ResourceSlice {
		return testSlice("n", name, gen, count, devs...)
	}
	pl := pool{}
	if _, _, ok := pl.complete(); ok {
		t.Fatal("an empty pool is complete")
	}
	pl["b"] = sl("b", 1, 2, "d2", "d3")
	if _, n, ok := pl.complete(); ok || n != 1 {
		t.Fatalf("1 of 2 slices: complete %v (%d)", ok, n)
	}
	pl["a"] = sl("a", 1, 2, "d0", "d1")
	devs, n, ok := pl.complete()
	if !ok || n != 2 || !slices.Equal(devs, []string{"d0", "d1", "d2", "d3"}) {
		t.Fatalf("complete %v, %d slices, devices %v", ok, n, devs)
	}
	// A newer generation replaces the old one, slice by slice.
	pl["c"] = sl("c", 2, 1, "d9")
	if devs, _, ok := pl.complete(); !ok || !slices.Equal(devs, []string{"d9"}) {
		t.Fatalf("newer generation: complete %v, devices %v", ok, devs)
	}
}

// TestNodePools: the driver's pools of the node are
// the pool named after it and those named <node>/<resource>; they are
// complete when every one of them is, devices by pool name as
// <pool>/<device>, which a claim's allocation takes apart again.
func TestNodePools(t *testing.T) {
	for _, c := range []struct {
		name string
		want bool
	}{{"n", true}, {"n/sim", true}, {"n2/sim", false}, {"n2", false}, {"nn/sim", false}} {
		if ofNode(c.name, "n") != c.want {
			t.Errorf("ofNode(%q, n) = %v", c.name, !c.want)
		}
	}
	sl := func(pool, name string, count int64, devs ...string) *apiclient.ResourceSlice {
		return testSlice(pool, name, 1, count, devs...)
	}
	ps := nodePools{}
	if _, _, ok := ps.complete(); ok {
		t.Fatal("no pool is complete")
	}
	ps["n/sim"] = pool{"a": sl("n/sim", "a", 1, "sim-0", "sim-1")}
	ps["n/fpga"] = pool{"b": sl("n/fpga", "b", 2, "fpga-0")}
	if _, _, ok := ps.complete(); ok {
		t.Fatal("complete with a slice of n/fpga missing")
	}
	ps["n/fpga"]["c"] = sl("n/fpga", "c", 2, "fpga-1")
	devs, n, ok := ps.complete()
	if !ok || n != 3 || !slices.Equal(devs, []string{"n/fpga/fpga-0", "n/fpga/fpga-1", "n/sim/sim-0", "n/sim/sim-1"}) || ps.names() != "n/fpga,n/sim" {
		t.Fatalf("complete %v, %d slices, devices %v, pools %s", ok, n, devs, ps.names())
	}
	// A device that carries a taint is not yet published: the scheduler
	// does not allocate it.
	if got := ps.tainted(); len(got) != 0 {
		t.Fatalf("tainted %v, want none", got)
	}
	ps["n/sim"]["a"].Spec.Devices[1].Taints = append(ps["n/sim"]["a"].Spec.Devices[1].Taints, struct {
		Key string `json:"key"`
	}{"drv/handover"})
	if got := ps.tainted(); !slices.Equal(got, []string{"n/sim/sim-1 drv/handover"}) {
		t.Fatalf("tainted %v, want [n/sim/sim-1 drv/handover]", got)
	}
	c := benchClaim("ns", "c1", "drv", "n", []string{"n/sim/sim-1", "d-0"})
	r := c.Status.Allocation.Devices.Results
	if len(r) != 2 || r[0].Pool != "n/sim" || r[0].Device != "sim-1" || r[1].Pool != "n" || r[1].Device != "d-0" {
		t.Fatalf("results %+v", r)
	}
}
