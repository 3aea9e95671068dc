package drasession

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/cdiresolve"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/stats"
)

// createClaim makes a claim allocated to devs, as the scheduler leaves
// it: created, then its status written.
func (x *draSession) createClaim(ctx context.Context, devs []string) (*apiclient.ResourceClaim, error) {
	want := benchClaim(benchNamespace, fmt.Sprintf("claim-%d", x.cl.claims.Add(1)), x.t.DRA.Driver, x.node, devs)
	path := apiclient.PathClaims(benchNamespace)
	c := &apiclient.ResourceClaim{}
	if err := x.api.Do(ctx, http.MethodPost, path, &apiclient.ResourceClaim{TypeMeta: want.TypeMeta, Metadata: want.Metadata, Spec: want.Spec}, c); err != nil {
		return nil, fmt.Errorf("creating claim %s: %w", want.Metadata.Name, err)
	}
	c.Status = want.Status
	if err := x.api.Do(ctx, http.MethodPut, path+"/"+c.Metadata.Name+"/status", c, c); err != nil {
		return nil, fmt.Errorf("allocating claim %s: %w", want.Metadata.Name, err)
	}
	if c.Metadata.UID == "" || c.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s: the API server's answer has no UID or allocation", want.Metadata.Name)
	}
	return c, nil
}

func (x *draSession) deleteClaim(ctx context.Context, c *apiclient.ResourceClaim) {
	_ = x.api.Do(ctx, http.MethodDelete, apiclient.PathClaims(c.Metadata.Namespace)+"/"+c.Metadata.Name, nil, nil)
}

// pace waits until the API interval has passed since the last call that
// made the driver read a claim: the driver's client-side limiter (5
// requests a second in client-go's default) must not be what is timed.
func (x *draSession) pace(ctx context.Context) error {
	if d := time.Until(x.lastGET.Add(x.s.APIInterval)); d > 0 {
		return proc.Sleep(ctx, d)
	}
	return nil
}

// timed times call right after an empty RPC, timed too (as the device
// plugins' calls alternate with one): each call finds the driver as warm
// as its baseline did. A call that makes the driver read a claim (get)
// is paced (pace) and sets lastGET.
func (x *draSession) timed(ctx context.Context, st *sizeTimes, get bool, call func(context.Context) error) (time.Duration, error) {
	if get {
		if err := x.pace(ctx); err != nil {
			return 0, err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, x.s.Register)
	defer cancel()
	t0 := time.Now()
	if _, err := x.dra.Unprepare(cctx); err != nil {
		return 0, fmt.Errorf("the empty NodeUnprepareResources: %w", err)
	}
	st.empty = append(st.empty, time.Since(t0))
	t0 = time.Now()
	err := call(cctx)
	d := time.Since(t0)
	if get {
		x.lastGET = time.Now()
	}
	return d, err
}

// prepare calls NodePrepareResources for c (the driver reads c from the
// API server), timed after an empty RPC.
func (x *draSession) prepare(ctx context.Context, st *sizeTimes, c *apiclient.ResourceClaim) (*drav1.NodePrepareResourcesResponse, time.Duration, error) {
	var resp *drav1.NodePrepareResourcesResponse
	d, err := x.timed(ctx, st, true, func(ctx context.Context) (err error) {
		resp, err = x.dra.Prepare(ctx, kubeletClaim(c))
		return err
	})
	return resp, d, err
}

// unprepare calls NodeUnprepareResources for claims, timed after an
// empty RPC.
func (x *draSession) unprepare(ctx context.Context, st *sizeTimes, claims ...*drav1.Claim) (*drav1.NodeUnprepareResourcesResponse, time.Duration, error) {
	var resp *drav1.NodeUnprepareResourcesResponse
	d, err := x.timed(ctx, st, false, func(ctx context.Context) (err error) {
		resp, err = x.dra.Unprepare(ctx, claims...)
		return err
	})
	return resp, d, err
}

// unprepareErr is the error of an unprepare call for claim uid, if any.
func unprepareErr(resp *drav1.NodeUnprepareResourcesResponse, err error, uid string) error {
	if err != nil {
		return err
	}
	r, ok := resp.GetClaims()[uid]
	switch {
	case !ok:
		return errors.New("claim not answered")
	case r.GetError() != "":
		return errors.New(r.GetError())
	}
	return nil
}

// sizeTimes are one claim size's timed calls: the empty RPCs before
// each call, the calls, and dp-bench's own GETs of the claims.
type sizeTimes struct{ empty, prepare, again, unprepare, get []time.Duration }

// calls times prepare, prepare again and unprepare of fresh claims of 1
// and 8 devices (as many as published, up to 8), each call next to an
// empty RPC, and checks the answers.
func (x *draSession) calls(ctx context.Context) error {
	var sizes []int
	for _, n := range draSizes {
		if n <= len(x.devices) {
			sizes = append(sizes, n)
		}
	}
	var gets []time.Duration
	failed := map[string]bool{}
	fail := func(id, format string, args ...any) {
		failed[id] = true
		x.res.Fail(id, format, args...)
	}
	for _, n := range sizes {
		var st sizeTimes
		for i := 0; i < x.s.DRACalls && !failed["dra-prepare"]; i++ {
			if err := x.cycle(ctx, n, i == 0, &st, fail); err != nil {
				return err
			}
		}
		base := report.Us(stats.Quantile(st.empty, 0.5))
		for id, ds := range map[string][]time.Duration{"prepare": st.prepare, "prepare-again": st.again, "unprepare": st.unprepare} {
			if len(ds) > 0 {
				x.res.Measure(fmt.Sprintf("%s-%d", id, n), report.Us(stats.Quantile(ds, 0.5)), base)
			}
		}
		gets = append(gets, st.get...)
	}
	if len(gets) > 0 {
		x.res.Metrics["claim-get"] = report.Sample{Value: report.Us(stats.Quantile(gets, 0.5))}
	}
	desc := fmt.Sprintf("claims of %v devices, %d each", sizes, x.s.DRACalls)
	for _, id := range []string{"dra-prepare", "dra-idempotent", "dra-unprepare"} {
		if !failed[id] {
			x.res.Pass(id, "%s", desc)
		}
	}
	return nil
}

// cycle is one claim of n devices: allocated, prepared, prepared again,
// unprepared twice, deleted. The first cycle of a size also resolves the
// CDI IDs and looks at the steps' files.
func (x *draSession) cycle(ctx context.Context, n int, first bool, st *sizeTimes, fail func(id, format string, args ...any)) error {
	c, err := x.createClaim(ctx, x.devices[:n])
	if err != nil {
		return err
	}
	defer x.deleteClaim(ctx, c)
	uid := c.Metadata.UID
	var ev0 map[string]string
	if first && x.r.Evidence != "" {
		if ev0, err = evidence(x.r.Evidence); err != nil {
			return err
		}
	}
	resp, d, err := x.prepare(ctx, st, c)
	if err != nil {
		fail("dra-prepare", "%d devices: %v", n, err)
		return nil
	}
	if p := checkPrepared(c, x.t.DRA.Driver, resp); len(p) > 0 {
		fail("dra-prepare", "%d devices: %s", n, strings.Join(p, "; "))
		_, _, _ = x.unprepare(ctx, st, kubeletClaim(c))
		return nil
	}
	st.prepare = append(st.prepare, d)
	answer := resp.GetClaims()[uid]
	var ev1 map[string]string
	if first {
		x.resolve(cdiIDs(answer))
		if x.r.Evidence != "" {
			if ev1, err = evidence(x.r.Evidence); err != nil {
				return err
			}
		}
	}
	again, d, err := x.prepare(ctx, st, c)
	switch {
	case err != nil:
		fail("dra-idempotent", "%d devices: %v", n, err)
	case diffAnswers(answer, again.GetClaims()[uid]) != "":
		fail("dra-idempotent", "%d devices: %s", n, diffAnswers(answer, again.GetClaims()[uid]))
	default:
		st.again = append(st.again, d)
	}
	if first {
		if err := x.stepsOnce(n, ev0, ev1); err != nil {
			return err
		}
	}
	ur, d, err := x.unprepare(ctx, st, kubeletClaim(c))
	if err := unprepareErr(ur, err, uid); err != nil {
		fail("dra-unprepare", "%d devices: %v", n, err)
		return nil
	}
	st.unprepare = append(st.unprepare, d)
	ur, err = x.dra.Unprepare(ctx, kubeletClaim(c))
	if err := unprepareErr(ur, err, uid); err != nil {
		fail("dra-unprepare", "%d devices, unprepared already: %v", n, err)
	}
	// What every NodePrepareResources costs before the driver's own
	// work: the helper reads the claim from the API server.
	t0 := time.Now()
	if err := x.api.Do(ctx, http.MethodGet, apiclient.PathClaims(c.Metadata.Namespace)+"/"+c.Metadata.Name, nil, &apiclient.ResourceClaim{}); err != nil {
		return fmt.Errorf("reading claim %s: %w", c.Metadata.Name, err)
	}
	st.get = append(st.get, time.Since(t0))
	return nil
}

// stepsOnce checks that the second prepare left the steps' files as the
// first one did (ev1), when the first one changed them (from ev0).
func (x *draSession) stepsOnce(n int, ev0, ev1 map[string]string) error {
	if x.r.Evidence == "" {
		x.res.Skip("dra-steps-once", "no steps' files given")
		return nil
	}
	if len(changedFiles(ev0, ev1)) == 0 {
		if _, ok := x.res.Checks["dra-steps-once"]; !ok {
			x.res.Skip("dra-steps-once", "the first preparation changed none of %s", x.t.DRA.StepsEvidence)
		}
		return nil
	}
	ev2, err := evidence(x.r.Evidence)
	if err != nil {
		return err
	}
	if ch := changedFiles(ev1, ev2); len(ch) > 0 {
		x.res.Fail("dra-steps-once", "%d devices: %d file(s) written again: %s", n, len(ch), strings.Join(ch, ", "))
		return nil
	}
	x.res.Pass("dra-steps-once", "%d file(s) written by the first preparation, none by the second", len(changedFiles(ev0, ev1)))
	return nil
}

// resolve injects the CDI IDs as containerd does.
func (x *draSession) resolve(ids []string) {
	if _, ok := x.res.Checks["dra-cdi-resolve"]; ok && x.res.Checks["dra-cdi-resolve"].Status == report.Fail {
		return
	}
	cdiresolve.Check(x.res, "dra-cdi-resolve", x.r.Host.CDIDir, ids, "IDs")
}

// unknown checks that an unknown claim is unprepared without an error and
// that a claim allocated to a device the driver does not publish is
// refused.
func (x *draSession) unknown(ctx context.Context) error {
	uid, err := apiclient.NewUID()
	if err != nil {
		return err
	}
	ur, err := x.dra.Unprepare(ctx, &drav1.Claim{Namespace: benchNamespace, Name: "dp-bench-never-prepared", Uid: uid})
	if err := unprepareErr(ur, err, uid); err != nil {
		x.res.Fail("dra-unprepare-unknown", "%v", err)
	} else {
		x.res.Pass("dra-unprepare-unknown", "answered without an error")
	}
	c, err := x.createClaim(ctx, []string{"dp-bench-no-such-device"})
	if err != nil {
		return err
	}
	defer x.deleteClaim(ctx, c)
	resp, _, err := x.prepare(ctx, &sizeTimes{}, c)
	var got *drav1.NodePrepareResourceResponse
	if err == nil {
		got = resp.GetClaims()[c.Metadata.UID]
	}
	switch {
	case err != nil:
		x.res.Pass("dra-refuse-unknown", "call failed: %v", err)
	case got == nil:
		x.res.Fail("dra-refuse-unknown", "claim not answered")
	case got.GetError() != "":
		x.res.Pass("dra-refuse-unknown", "%s", got.GetError())
	default:
		x.res.Fail("dra-refuse-unknown", "prepared: %s", answerKey(got))
	}
	_, _ = x.dra.Unprepare(ctx, kubeletClaim(c))
	return nil
}
