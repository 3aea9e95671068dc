package dpsession

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/cdiresolve"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/stats"
)

// items are the parts of an Allocate answer that belong to devices: CDI
// names, device specs and mounts (env and annotations may name the whole
// set, so they are not compared).
func items(r *pluginapi.ContainerAllocateResponse) []string {
	var out []string
	for _, d := range r.CdiDevices {
		out = append(out, "CDI device "+d.Name)
	}
	for _, d := range r.Devices {
		out = append(out, "device "+d.HostPath+" at "+d.ContainerPath)
	}
	for _, m := range r.Mounts {
		out = append(out, "mount "+m.HostPath+" at "+m.ContainerPath)
	}
	names, _, _ := cdiapi.ParseAnnotations(r.Annotations)
	for _, n := range names {
		out = append(out, "CDI device "+n)
	}
	return out
}

func empty(r *pluginapi.ContainerAllocateResponse) bool {
	return len(r.CdiDevices) == 0 && len(r.Devices) == 0 && len(r.Mounts) == 0 && len(r.Envs) == 0 && len(r.Annotations) == 0
}

func allocReq(containers ...[]string) *pluginapi.AllocateRequest {
	req := &pluginapi.AllocateRequest{}
	for _, ids := range containers {
		req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
	}
	return req
}

// allocate checks Allocate: each ID alone gets an answer, and all of them
// together get an answer that holds every single answer's devices; two
// containers get two answers; unknown IDs are refused. Then the CDI names
// are resolved and Allocate is timed against an empty RPC.
func (x *session) allocate(ctx context.Context, ids []string) error {
	var problems []string
	var want []string
	for _, id := range ids {
		resp, err := x.c.Allocate(ctx, allocReq([]string{id}))
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s alone: %v", id, err))
		case len(resp.ContainerResponses) != 1:
			problems = append(problems, fmt.Sprintf("%s alone: %d container answers", id, len(resp.ContainerResponses)))
		case empty(resp.ContainerResponses[0]):
			problems = append(problems, fmt.Sprintf("%s alone: empty answer", id))
		default:
			want = append(want, items(resp.ContainerResponses[0])...)
		}
	}
	all, err := x.c.Allocate(ctx, allocReq(ids))
	var got *pluginapi.ContainerAllocateResponse
	switch {
	case err != nil:
		problems = append(problems, fmt.Sprintf("%d IDs: %v", len(ids), err))
	case len(all.ContainerResponses) != 1:
		problems = append(problems, fmt.Sprintf("%d IDs: %d container answers for 1 container", len(ids), len(all.ContainerResponses)))
	default:
		got = all.ContainerResponses[0]
		have := map[string]bool{}
		for _, it := range items(got) {
			have[it] = true
		}
		for _, w := range want {
			if !have[w] {
				problems = append(problems, fmt.Sprintf("%d IDs together: %s missing (given for its ID alone)", len(ids), w))
				break
			}
		}
	}
	if len(ids) >= 2 {
		two, err := x.c.Allocate(ctx, allocReq(ids[:1], ids[1:2]))
		if err != nil {
			problems = append(problems, fmt.Sprintf("2 containers: %v", err))
		} else if len(two.ContainerResponses) != 2 || empty(two.ContainerResponses[0]) || empty(two.ContainerResponses[1]) {
			problems = append(problems, fmt.Sprintf("2 containers: %d container answers", len(two.ContainerResponses)))
		}
	}
	if len(problems) > 0 {
		x.res.Fail("allocate", "%s", strings.Join(problems, "; "))
	} else {
		x.res.Pass("allocate", "%d IDs alone and together, 2 containers", len(ids))
	}

	const unknown = "dp-bench-no-such-device"
	var accepted []string
	for _, req := range [][]string{{unknown}, {ids[0], unknown}} {
		if _, err := x.c.Allocate(ctx, allocReq(req)); err == nil {
			accepted = append(accepted, strings.Join(req, ","))
		}
	}
	if len(accepted) > 0 {
		x.res.Fail("allocate-unknown", "accepted %s", strings.Join(accepted, " and "))
	} else {
		_, err := x.c.Allocate(ctx, allocReq([]string{unknown}))
		x.res.Pass("allocate-unknown", "refused: %s", status.Code(err))
	}

	if got != nil {
		x.resolve(got)
	} else {
		x.res.Skip("cdi-resolve", "no Allocate answer")
	}

	req := allocReq(ids)
	a, b, err := x.timed(ctx, func() error { _, err := x.c.Allocate(ctx, req); return err })
	if err != nil {
		return fmt.Errorf("the Allocate call: %w", err)
	}
	x.res.Measure("allocate", report.Us(a), report.Us(b))
	return nil
}

// timed calls f and an empty RPC alternately and returns both p50s.
func (x *session) timed(ctx context.Context, f func() error) (time.Duration, time.Duration, error) {
	var ds, bs []time.Duration
	for i := 0; i < x.s.Calls; i++ {
		t := time.Now()
		if _, err := x.c.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
			return 0, 0, err
		}
		bs = append(bs, time.Since(t))
		t = time.Now()
		if err := f(); err != nil {
			return 0, 0, err
		}
		ds = append(ds, time.Since(t))
	}
	return stats.Quantile(ds, 0.5), stats.Quantile(bs, 0.5), nil
}

// resolve injects the answer's CDI names the way containerd does: a fresh
// cache over the CDI directory, InjectDevices into an empty OCI spec.
func (x *session) resolve(r *pluginapi.ContainerAllocateResponse) {
	var names []string
	for _, d := range r.CdiDevices {
		names = append(names, d.Name)
	}
	ann, _, err := cdiapi.ParseAnnotations(r.Annotations)
	if err != nil {
		x.res.Fail("cdi-resolve", "CDI annotations: %v", err)
		return
	}
	names = append(names, ann...)
	if len(names) == 0 {
		x.res.Skip("cdi-resolve", "no CDI names returned")
		return
	}
	cdiresolve.Check(x.res, "cdi-resolve", x.r.Host.CDIDir, names, "names")
}

// preferred checks GetPreferredAllocation, when advertised, on all IDs and
// on every other ID, and times it.
func (x *session) preferred(ctx context.Context) error {
	if !x.reg.Options.GetPreferredAllocationAvailable {
		x.res.Skip("preferred-allocation", "not advertised")
		return nil
	}
	if len(x.healthy) < 2 {
		x.res.Skip("preferred-allocation", "fewer than 2 healthy devices")
		return nil
	}
	var alternate []string
	for i := 0; i < len(x.healthy); i += 2 {
		alternate = append(alternate, x.healthy[i])
	}
	cases := []struct {
		name            string
		available, must []string
		size            int
	}{
		// Sizes below the number available, so that "all of them" is wrong.
		{"all IDs, must-include the last", x.healthy, x.healthy[len(x.healthy)-1:], min(4, len(x.healthy)-1)},
		{"every other ID", alternate, nil, max(1, min(2, len(alternate)-1))},
	}
	var problems []string
	for _, c := range cases {
		req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: c.available, MustIncludeDeviceIDs: c.must, AllocationSize: int32(c.size)}}}
		resp, err := x.c.GetPreferredAllocation(ctx, req)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", c.name, err))
			continue
		}
		if len(resp.ContainerResponses) != 1 {
			problems = append(problems, fmt.Sprintf("%s: %d container answers", c.name, len(resp.ContainerResponses)))
			continue
		}
		if p := checkPreferred(resp.ContainerResponses[0].DeviceIDs, c.available, c.must, c.size); p != "" {
			problems = append(problems, c.name+": "+p)
		}
	}
	if len(problems) > 0 {
		x.res.Fail("preferred-allocation", "%s", strings.Join(problems, "; "))
	} else {
		x.res.Pass("preferred-allocation", "%d cases", len(cases))
	}
	req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: x.healthy, AllocationSize: int32(min(4, len(x.healthy)))}}}
	a, b, err := x.timed(ctx, func() error { _, err := x.c.GetPreferredAllocation(ctx, req); return err })
	if err != nil {
		return fmt.Errorf("GetPreferredAllocation: %w", err)
	}
	x.res.Measure("preferred", report.Us(a), report.Us(b))
	return nil
}

// checkPreferred returns what is wrong with a preferred allocation.
func checkPreferred(got, available, must []string, size int) string {
	avail := map[string]bool{}
	for _, id := range available {
		avail[id] = true
	}
	seen := map[string]bool{}
	for _, id := range got {
		if !avail[id] {
			return fmt.Sprintf("returned %q, not available", id)
		}
		if seen[id] {
			return fmt.Sprintf("returned %q twice", id)
		}
		seen[id] = true
	}
	for _, id := range must {
		if !seen[id] {
			return fmt.Sprintf("must-include %q left out", id)
		}
	}
	if len(got) != size {
		return fmt.Sprintf("%d IDs, size %d", len(got), size)
	}
	return ""
}

func (x *session) prestart(ctx context.Context, ids []string) error {
	if !x.reg.Options.PreStartRequired {
		x.res.Skip("prestart", "not advertised")
		return nil
	}
	req := &pluginapi.PreStartContainerRequest{DevicesIds: ids}
	if _, err := x.c.PreStartContainer(ctx, req); err != nil {
		x.res.Fail("prestart", "%d IDs: %v", len(ids), err)
		return nil
	}
	x.res.Pass("prestart", "%d IDs", len(ids))
	a, b, err := x.timed(ctx, func() error { _, err := x.c.PreStartContainer(ctx, req); return err })
	if err != nil {
		return fmt.Errorf("PreStartContainer: %w", err)
	}
	x.res.Measure("prestart", report.Us(a), report.Us(b))
	return nil
}
