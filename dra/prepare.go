package dra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
)

// prepareClaims prepares the devices of the claims of one kubelet
// call: all claims, or none. A claim already prepared (in this boot, and
// its spec not lost since) gets what it got then, and its steps do not run
// again, once its allocation now is found the one it was prepared with
// (ErrAllocationChanged otherwise). For the others,
// each allocated device of this driver must be healthy and held by no
// other prepared claim and no device-plugin container; then the
// resource's prestart steps run on them (same state directories and
// state.json as the device plugin's), each claim's CDI spec is written
// (<envPrefix>_DEVICES, mounts), and the claims are checkpointed, durably,
// before success is returned. Each device's CDI IDs are its name in the
// resource's spec, the very spec the device plugin writes, and on the
// first device of each request the claim's spec. If any claim fails,
// every claim of the call gets an error and none that this call prepared
// is checkpointed: the kubelet asks again for all of them. Each device of
// a prepared claim carries its metadata when Options.DeviceMetadata is
// set (metadata.go), and each claim's outcome is handed to the status
// queue (status.go), which writes it to the claim's status.devices after
// the call: the answer never waits for, or depends on, that write.
func (pr *preparer) prepareClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	err := pr.lock()
	defer pr.unlock()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	devs, errs := pr.prepare(ctx, claims)
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	var failed []string
	for _, c := range claims {
		if len(errs) == 0 {
			out[c.UID] = kubeletplugin.PrepareResult{Devices: devs[c.UID]}
			continue
		}
		err, own := errs[c.UID]
		if !own {
			err = fmt.Errorf("claim %s/%s: not prepared: %w: %w", c.Namespace, c.Name, ErrCallFailed, joined(errs, claims))
		} else {
			failed = append(failed, c.Namespace+"/"+c.Name)
		}
		out[c.UID] = kubeletplugin.PrepareResult{Err: err}
	}
	pr.metadata.add(out)
	pr.status.prepared(claims, out, errs)
	took := time.Since(start)
	if len(errs) > 0 {
		// Every claim of a failed call is failed (none is prepared).
		pr.metrics.Request(metrics.OpPrepare, took, 0, len(claims))
	} else {
		pr.metrics.Request(metrics.OpPrepare, took, len(claims), 0)
	}
	log := pr.log.WithField("claims", names(claims)).WithField("took", took)
	if len(errs) > 0 {
		log.WithError(joined(errs, claims)).WithField("failed", strings.Join(failed, ",")).Warn("claims not prepared")
	} else {
		log.Info("claims prepared")
	}
	return out, nil
}

func names(claims []*resourceapi.ResourceClaim) string {
	var out []string
	for _, c := range claims {
		out = append(out, c.Namespace+"/"+c.Name)
	}
	return strings.Join(out, ",")
}

// joined is the claims' errors, in the call's order.
func joined(errs map[types.UID]error, claims []*resourceapi.ResourceClaim) error {
	var out []error
	for _, c := range claims {
		if err := errs[c.UID]; err != nil {
			out = append(out, err)
		}
	}
	return errors.Join(out...)
}

// planned is one claim of a Prepare call.
type planned struct {
	claim *resourceapi.ResourceClaim
	entry PreparedClaim
	// again: already prepared (in this boot); nothing runs.
	again bool
	// devs are the devices to prepare, by resource (not those of admin
	// access, nor a shared device another claim holds a share of in this
	// boot: its steps ran for the first share).
	devs map[*running][]device.Device
	// held are all the devices the claim is to hold, by resource (not
	// those of admin access): every one, each share included, is checked
	// against the device plugin's containers (refuseDevicePluginHeld).
	held map[*running][]device.Device
}

// prepare prepares claims, all or none; errs holds the claims that
// failed, each with its cause (the others are not prepared either).
func (pr *preparer) prepare(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID][]kubeletplugin.Device, map[types.UID]error) {
	cp := pr.checkpoint.Claims()
	holders := heldShares(cp, pr.boot)
	errs := map[types.UID]error{}
	var plans []*planned
	for _, c := range claims {
		if pc, ok := cp[c.UID]; ok && !pc.Unpreparing {
			if err := pr.sameAllocation(c, pc); err != nil {
				errs[c.UID] = fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
				continue
			}
			if pc.PreBinding {
				errs[c.UID] = fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, ErrPreBinding)
				continue
			}
			if pc.BootID == pr.boot && !pc.PrepareAgain {
				plans = append(plans, &planned{claim: c, entry: pc, again: true})
				continue
			}
		}
		p, err := pr.plan(c, cp, holders)
		if err != nil {
			errs[c.UID] = fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
			continue
		}
		plans = append(plans, p)
	}
	if len(errs) == 0 {
		pr.refuseDevicePluginHeld(ctx, plans, errs)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	pr.runSteps(ctx, plans, errs)
	if len(errs) > 0 {
		return nil, errs
	}
	if err := pr.commit(plans, cp, errs); err != nil {
		return nil, errs
	}
	return answer(plans), nil
}

// runSteps runs the steps, per resource, on the devices of every claim
// of plans prepared now; errs gets each claim the failures of its own
// devices (all of them when the runner's error does not say which device
// failed).
func (pr *preparer) runSteps(ctx context.Context, plans []*planned, errs map[types.UID]error) {
	for _, r := range pr.devs.res {
		var devs []device.Device
		for _, p := range plans {
			devs = append(devs, p.devs[r]...)
		}
		if len(devs) == 0 {
			continue
		}
		if err := r.Runner.Prepare(ctx, devs); err != nil {
			failed := stepFailures(err)
			for _, p := range plans {
				var own []error
				for _, dv := range p.devs[r] {
					if e, ok := failed[dv.Name]; ok {
						own = append(own, e)
					}
				}
				if len(failed) == 0 && len(p.devs[r]) > 0 {
					own = append(own, err)
				}
				if len(own) > 0 {
					errs[p.claim.UID] = fmt.Errorf("claim %s/%s: %s: %w", p.claim.Namespace, p.claim.Name, r.Name, errors.Join(own...))
				}
			}
		}
	}
}

// commit writes the claims' specs, then the checkpoint (cp with the
// claims of plans prepared now, and those prepared before binding handed
// to the kubelet); a failure undoes the specs written here, and errs gets
// every claim of plans the error.
func (pr *preparer) commit(plans []*planned, cp map[types.UID]PreparedClaim, errs map[types.UID]error) error {
	var written []types.UID
	undo := func() {
		for _, uid := range written {
			if err := pr.specs.remove(uid); err != nil {
				pr.log.WithError(err).Warn("removing the CDI spec of a claim not prepared")
			}
		}
	}
	next := cp
	added := false
	for _, p := range plans {
		if p.again {
			pr.specs.ensure(p.claim.UID, p.entry)
			if p.entry.PreBind {
				// Prepared before binding: the kubelet has it now, and
				// releases it (the driver no longer does).
				p.entry.PreBind = false
				next[p.claim.UID] = p.entry
				added = true
			}
			continue
		}
		added = true
		if err := pr.specs.write(p.claim.UID, &p.entry); err != nil {
			errs[p.claim.UID] = fmt.Errorf("claim %s/%s: %w", p.claim.Namespace, p.claim.Name, err)
			undo()
			return errs[p.claim.UID]
		}
		if p.entry.ClaimSpec != "" {
			written = append(written, p.claim.UID)
		}
		next[p.claim.UID] = p.entry
	}
	// Claims all prepared already (the kubelet asks again after it
	// restarts): the checkpoint on disk holds them; no write, no fsync.
	if !added {
		return nil
	}
	if err := pr.checkpoint.Save(next); err != nil {
		undo()
		for _, p := range plans {
			errs[p.claim.UID] = fmt.Errorf("claim %s/%s: %w", p.claim.Namespace, p.claim.Name, err)
		}
		return err
	}
	return nil
}

// sameAllocation checks that claim c's allocation now names the devices
// that pc was prepared with: for each result of this driver its pool,
// device and request.
func (pr *preparer) sameAllocation(c *resourceapi.ResourceClaim, pc PreparedClaim) error {
	var now, was []string
	if c.Status.Allocation != nil {
		for _, res := range c.Status.Allocation.Devices.Results {
			if res.Driver == pr.driver {
				now = append(now, res.Pool+"/"+res.Device+shareKey(shareIDOf(res))+" (request "+res.Request+")")
			}
		}
	}
	for _, dv := range pc.Devices {
		for _, r := range dv.Requests {
			was = append(was, dv.Pool+"/"+dv.Device+shareKey(dv.ShareID)+" (request "+r+")")
		}
	}
	slices.Sort(now)
	slices.Sort(was)
	if slices.Equal(now, was) {
		return nil
	}
	return fmt.Errorf("%w: allocated now [%s], prepared [%s] (the claim checkpoint); the kubelet must unprepare it first",
		ErrAllocationChanged, strings.Join(now, ", "), strings.Join(was, ", "))
}

// answer is the kubelet's answer for prepared claims: their devices.
func answer(plans []*planned) map[types.UID][]kubeletplugin.Device {
	out := map[types.UID][]kubeletplugin.Device{}
	for _, p := range plans {
		for _, dv := range p.entry.Devices {
			out[p.claim.UID] = append(out[p.claim.UID], kubeletplugin.Device{
				Requests: dv.Requests, PoolName: dv.Pool, DeviceName: dv.Device, CDIDeviceIDs: dv.CDIDeviceIDs,
				ShareID: shareUID(dv.ShareID),
			})
		}
	}
	return out
}

// stepFailures are the failed devices of a runner's error, by name.
func stepFailures(err error) map[string]error {
	out := map[string]error{}
	var walk func(error)
	walk = func(err error) {
		var se *prestart.StepError
		if j, ok := err.(interface{ Unwrap() []error }); ok { //nolint:errorlint // walking a join
			for _, e := range j.Unwrap() {
				walk(e)
			}
		} else if errors.As(err, &se) {
			out[se.Device] = se
		}
	}
	walk(err)
	return out
}

// plan resolves the devices of claim c's allocation that are this
// driver's and checks each can be handed to it; holders are the holds of
// the prepared claims and of the call's claims planned before (a device
// the call gives two claims is refused for the second, unless it has
// shares for both: holdings.take). Only the devices no other claim holds
// in this boot are to be prepared (the first share of a shared device).
func (pr *preparer) plan(c *resourceapi.ResourceClaim, cp map[types.UID]PreparedClaim, holders holdings) (*planned, error) {
	if c.Status.Allocation == nil {
		return nil, errors.New("not allocated")
	}
	if err := checkOpaqueConfig(pr.driver, c); err != nil {
		return nil, err
	}
	p := &planned{claim: c, devs: map[*running][]device.Device{}, held: map[*running][]device.Device{},
		entry: PreparedClaim{Namespace: c.Namespace, Name: c.Name, BootID: pr.boot}}
	// Prepared before (another boot): its allocation's holds replace
	// those it has.
	holders.release(c.UID)
	for _, res := range c.Status.Allocation.Devices.Results {
		if res.Driver != pr.driver {
			continue
		}
		r, dv, ok := pr.devs.lookup(res.Pool, res.Device)
		if !ok {
			return nil, fmt.Errorf("device %s/%s: %w", res.Pool, res.Device, ErrUnknownDevice)
		}
		admin := res.AdminAccess != nil && *res.AdminAccess
		shares := sharesOf(pr.driver, r, res)
		if !admin {
			if !dv.Healthy {
				return nil, fmt.Errorf("device %s (%s): %w: %s", res.Device, dv.Name, ErrUnhealthy, dv.Problem)
			}
			first, err := holders.take(r, r.Name+"\x00"+dv.Name, c.UID, shares, cp)
			if err != nil {
				return nil, fmt.Errorf("device %s (%s): %w", res.Device, dv.Name, err)
			}
			if first && !slices.ContainsFunc(p.devs[r], func(x device.Device) bool { return x.Name == dv.Name }) {
				p.devs[r] = append(p.devs[r], dv)
			}
			if !slices.ContainsFunc(p.held[r], func(x device.Device) bool { return x.Name == dv.Name }) {
				p.held[r] = append(p.held[r], dv)
			}
		}
		id, err := r.Kind.QualifiedName(dv.Name)
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", res.Device, err)
		}
		p.entry.Devices = append(p.entry.Devices, PreparedDevice{Resource: r.Name, ID: dv.Name, Pool: res.Pool, Device: res.Device,
			Requests: []string{res.Request}, CDIDeviceIDs: []string{id}, AdminAccess: admin, ShareID: shareIDOf(res), Shares: shares})
	}
	return p, nil
}

// refuseDevicePluginHeld fails the claims whose devices a container holds
// through the device plugin (PodResources), or all of those to be
// prepared when PodResources cannot tell.
func (pr *preparer) refuseDevicePluginHeld(ctx context.Context, plans []*planned, errs map[types.UID]error) {
	need := false
	for _, p := range plans {
		need = need || len(p.held) > 0
	}
	if !need {
		return
	}
	held, err := pr.holders.heldByResource(ctx)
	for _, p := range plans {
		for r, devs := range p.held {
			for _, dv := range devs {
				switch {
				case err != nil:
					errs[p.claim.UID] = fmt.Errorf("claim %s/%s: %w: %w", p.claim.Namespace, p.claim.Name, ErrCannotTell, err)
				case device.HeldBy(dv.Name, held[r.Name]):
					errs[p.claim.UID] = fmt.Errorf("claim %s/%s: device %s (%s): %w by a container through the device plugin",
						p.claim.Namespace, p.claim.Name, DeviceName(r.IDPrefix, dv.Index), dv.Name, ErrHeld)
				}
			}
		}
	}
}
