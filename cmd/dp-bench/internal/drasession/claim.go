package drasession

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
)

// benchRequest is the name of the one request of the claims dp-bench makes,
// benchClass the device class it names (the API server does not look it
// up; the scheduler would).
const (
	benchRequest = "devices"
	benchClass   = "dp-bench.example.com"
)

// benchClaim is a ResourceClaim of one request for len(devices) devices,
// and the allocation the scheduler would write into its status: one
// result per device, of driver in pool, for the request, and the node
// selector of the node whose pool it is. The API server gives the claim
// its UID when it is created; the status is written afterwards.
func benchClaim(namespace, name, driver, node string, devices []string) *apiclient.ResourceClaim {
	c := &apiclient.ResourceClaim{
		TypeMeta: apiclient.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
		Metadata: apiclient.ObjectMeta{Namespace: namespace, Name: name},
		Spec: apiclient.ClaimSpec{Devices: apiclient.DeviceClaim{Requests: []apiclient.DeviceRequest{{
			Name:    benchRequest,
			Exactly: &apiclient.ExactDeviceRequest{DeviceClassName: benchClass, AllocationMode: "ExactCount", Count: int64(len(devices))},
		}}}},
	}
	alloc := &apiclient.AllocationResult{NodeSelector: &apiclient.NodeSelector{NodeSelectorTerms: []apiclient.NodeSelectorTerm{{
		MatchFields: []apiclient.NodeSelectorRequirement{{Key: "metadata.name", Operator: "In", Values: []string{node}}},
	}}}}
	for _, d := range devices {
		// <pool>/<device>, or a device of the pool named after the node
		// (a device name has no '/').
		pool, dev := node, d
		if i := strings.LastIndex(d, "/"); i >= 0 {
			pool, dev = d[:i], d[i+1:]
		}
		alloc.Devices.Results = append(alloc.Devices.Results, apiclient.DeviceRequestAllocationResult{
			Request: benchRequest, Driver: driver, Pool: pool, Device: dev})
	}
	c.Status.Allocation = alloc
	return c
}

// kubeletClaim is the claim as the kubelet names it in its calls.
func kubeletClaim(c *apiclient.ResourceClaim) *drav1.Claim {
	return &drav1.Claim{Namespace: c.Metadata.Namespace, Name: c.Metadata.Name, Uid: c.Metadata.UID}
}

// checkPrepared returns what is wrong with the answer for claim c of a
// NodePrepareResources call: the claim must be answered without an
// error, every device of driver that c's allocation names exactly once,
// with the allocation's pool, its request and at least one CDI ID, and
// no other device.
func checkPrepared(c *apiclient.ResourceClaim, driver string, resp *drav1.NodePrepareResourcesResponse) []string {
	got, ok := resp.GetClaims()[c.Metadata.UID]
	switch {
	case !ok:
		return []string{fmt.Sprintf("claim %s not answered", c.Metadata.Name)}
	case got.GetError() != "":
		return []string{fmt.Sprintf("claim %s: error %q", c.Metadata.Name, got.GetError())}
	}
	var problems []string
	if n := len(resp.GetClaims()); n != 1 {
		problems = append(problems, fmt.Sprintf("%d claims answered for 1", n))
	}
	want := map[string]string{} // pool/device -> request
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == driver {
			want[r.Pool+"/"+r.Device] = r.Request
		}
	}
	seen := map[string]bool{}
	for _, d := range got.GetDevices() {
		key := d.GetPoolName() + "/" + d.GetDeviceName()
		req, allocated := want[key]
		switch {
		case !allocated:
			problems = append(problems, fmt.Sprintf("device %s answered, not allocated", key))
			continue
		case seen[key]:
			problems = append(problems, fmt.Sprintf("device %s answered twice", key))
			continue
		}
		seen[key] = true
		if !slices.Contains(d.GetRequestNames(), req) {
			problems = append(problems, fmt.Sprintf("device %s: requests %v, allocated for %q", key, d.GetRequestNames(), req))
		}
		if len(d.GetCdiDeviceIds()) == 0 {
			problems = append(problems, fmt.Sprintf("device %s: no CDI ID", key))
		}
	}
	var missing []string
	for key := range want {
		if !seen[key] {
			missing = append(missing, key)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		problems = append(problems, fmt.Sprintf("allocated devices not answered: %s", strings.Join(missing, ", ")))
	}
	return problems
}

// cdiIDs are the CDI IDs of an answer, each once, in order.
func cdiIDs(r *drav1.NodePrepareResourceResponse) []string {
	var out []string
	for _, d := range r.GetDevices() {
		for _, id := range d.GetCdiDeviceIds() {
			if !slices.Contains(out, id) {
				out = append(out, id)
			}
		}
	}
	return out
}

// answerKey is an answer in a canonical form: two answers for one claim
// are the same when their keys are equal, whatever the order of devices
// and of their requests.
func answerKey(r *drav1.NodePrepareResourceResponse) string {
	if r == nil {
		return "<no answer>"
	}
	var lines []string
	for _, d := range r.GetDevices() {
		reqs := slices.Clone(d.GetRequestNames())
		sort.Strings(reqs)
		lines = append(lines, fmt.Sprintf("%s/%s requests=%v cdi=%v share=%q", d.GetPoolName(), d.GetDeviceName(), reqs, d.GetCdiDeviceIds(), d.GetShareId()))
	}
	sort.Strings(lines)
	if e := r.GetError(); e != "" {
		lines = append(lines, "error="+e)
	}
	return strings.Join(lines, "\n")
}

// diffAnswers says how answer b differs from a ("" when they are the same).
func diffAnswers(a, b *drav1.NodePrepareResourceResponse) string {
	ka, kb := answerKey(a), answerKey(b)
	if ka == kb {
		return ""
	}
	la, lb := strings.Split(ka, "\n"), strings.Split(kb, "\n")
	var d []string
	for _, l := range la {
		if !slices.Contains(lb, l) {
			d = append(d, "-"+l)
		}
	}
	for _, l := range lb {
		if !slices.Contains(la, l) {
			d = append(d, "+"+l)
		}
	}
	return strings.Join(d, "; ")
}

// evidence is, for the files matching glob, a digest of each one's
// content: what a preparation step leaves behind (a device's state.json).
func evidence(glob string) (map[string]string, error) {
	paths, err := filepath.Glob(glob)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			if os.IsNotExist(err) {
				continue // replaced right now; the next read sees it
			}
			return nil, err
		}
		out[p] = fmt.Sprintf("%x", sha256.Sum256(b))
	}
	return out, nil
}

// changedFiles are the files of after that are new or differ from before,
// and those of before that are gone, sorted.
func changedFiles(before, after map[string]string) []string {
	var out []string
	for p, h := range after {
		if before[p] != h {
			out = append(out, p)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}
