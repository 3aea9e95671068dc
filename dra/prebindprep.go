package dra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
)

// Preparation before binding (the preparer's side; prebind.go watches the
// claims). A claim allocated devices of a resource with PrepareBeforeBind
// is prepared as soon as the driver hears of it, while the scheduler waits
// to bind its pod: the same checks as Prepare (health, holds, the device
// plugin's containers), then the steps, then its CDI spec, each recorded in
// the checkpoint first. Its outcome goes into the claim's status.devices:
// <driver>/prepared True, or <driver>/prepareFailed True with the reason,
// which sends the pod elsewhere. The kubelet's Prepare of the claim later
// finds it prepared and answers at once. The steps run outside the
// preparer's lock, bounded by the resource's own budget, not by a kubelet
// call: the kubelet's calls for other claims go on meanwhile; the claim's
// entry keeps its devices from other claims.

// prebindPrepare prepares claim c before binding, or, prepared already,
// reports it so again; its outcome goes to the status writer. An error is
// one to try again on (the checkpoint could not be written); a failure of
// the claim is reported, not returned.
func (pr *preparer) prebindPrepare(ctx context.Context, c *resourceapi.ResourceClaim) error {
	start := time.Now()
	p, resume, err := pr.prebindStart(ctx, c)
	if errors.Is(err, errPrepared) {
		pr.prebindReport(c, p.entry, nil)
		return nil
	}
	if err != nil {
		if errors.Is(err, errRetry) {
			return err
		}
		pr.prebindReport(c, PreparedClaim{}, err)
		pr.metrics.Request(metrics.OpPrepareBeforeBind, time.Since(start), 0, 1)
		return nil
	}
	stepErr := pr.prebindSteps(ctx, p, resume)
	entry, err := pr.prebindFinish(c, stepErr)
	if err != nil {
		return err
	}
	pr.prebindReport(c, entry, stepErr)
	if stepErr != nil {
		pr.metrics.Request(metrics.OpPrepareBeforeBind, time.Since(start), 0, 1)
		pr.log.WithField("claim", c.Namespace+"/"+c.Name).WithError(stepErr).Warn("claim not prepared before binding: the scheduler is told to send its pod elsewhere")
	} else {
		pr.metrics.Request(metrics.OpPrepareBeforeBind, time.Since(start), 1, 0)
		pr.log.WithField("claim", c.Namespace+"/"+c.Name).WithField("took", time.Since(start)).Info("claim prepared before binding")
	}
	return nil
}

var (
	// errPrepared: the claim is prepared already (prebindStart).
	errPrepared = errors.New("prepared already")
	// errRetry wraps what fails for now, not for the claim.
	errRetry = errors.New("to be tried again")
)

// prebindStart, under the locks, checks claim c as Prepare would and
// records it in the checkpoint, its steps under way (PreBinding), with
// each device's preparation count (GenBefore), before a step runs. A claim
// the checkpoint has prepared gives errPrepared; one whose steps a stopped
// driver left under way is resumed (resume: on the devices whose count did
// not grow since).
func (pr *preparer) prebindStart(ctx context.Context, c *resourceapi.ResourceClaim) (p *planned, resume bool, err error) {
	unlock, err := pr.lockAlone()
	if err != nil {
		return nil, false, fmt.Errorf("%w: %w", errRetry, err)
	}
	defer unlock()
	cp := pr.checkpoint.Claims()
	if pc, ok := cp[c.UID]; ok && !pc.Unpreparing {
		if err := pr.sameAllocation(c, pc); err != nil {
			return nil, false, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
		}
		p := &planned{claim: c, entry: pc, devs: pr.entryDevices(pc)}
		if pc.PreBinding {
			return p, true, nil
		}
		if pc.BootID == pr.boot && !pc.PrepareAgain {
			return p, false, errPrepared
		}
	}
	p, err = pr.plan(c, cp, heldShares(cp, pr.boot))
	if err != nil {
		return nil, false, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	errs := map[types.UID]error{}
	pr.refuseDevicePluginHeld(ctx, []*planned{p}, errs)
	if err := errs[c.UID]; err != nil {
		return nil, false, err
	}
	p.entry.PreBind, p.entry.PreBinding = true, true
	for i := range p.entry.Devices {
		dv := &p.entry.Devices[i]
		dv.GenBefore = pr.generation(dv.Resource, dv.ID)
	}
	cp[c.UID] = p.entry
	if err := pr.checkpoint.Save(cp); err != nil {
		return nil, false, fmt.Errorf("%w: claim %s/%s: %w", errRetry, c.Namespace, c.Name, err)
	}
	return p, false, nil
}

// entryDevices are the devices of entry pc to prepare, by resource (those
// without admin access that the driver still knows).
func (pr *preparer) entryDevices(pc PreparedClaim) map[*running][]device.Device {
	out := map[*running][]device.Device{}
	for _, dv := range pc.Devices {
		if dv.AdminAccess {
			continue
		}
		r := pr.devs.byName(dv.Resource)
		if r == nil {
			continue
		}
		if s := r.snap.Load(); s != nil {
			if i := slices.IndexFunc(s.Devices, func(x device.Device) bool { return x.Name == dv.ID }); i >= 0 &&
				!slices.ContainsFunc(out[r], func(x device.Device) bool { return x.Name == dv.ID }) {
				out[r] = append(out[r], s.Devices[i])
			}
		}
	}
	return out
}

// generation is the preparation count of device id of resource (its
// state's generation; 0 without steps or state).
func (pr *preparer) generation(resource, id string) int64 {
	r := pr.devs.byName(resource)
	if r == nil {
		return 0
	}
	sd, ok := r.Runner.(stateDirs)
	if !ok || !sd.HasSteps() {
		return 0
	}
	s, err := prestart.LoadState(sd.Dir(id))
	if err != nil {
		return 0
	}
	return s.Generation
}

// prebindSteps runs the steps of p's devices, without the preparer's
// lock (the entry keeps the devices from other claims; the runner locks
// each device while it runs steps on it), bounded by each resource's
// budget, not by a call of the kubelet. Resuming, a device whose
// preparation count grew past GenBefore is done already.
func (pr *preparer) prebindSteps(ctx context.Context, p *planned, resume bool) error {
	var errs []error
	for r, devs := range p.devs {
		if resume {
			devs = slices.DeleteFunc(slices.Clone(devs), func(d device.Device) bool {
				i := slices.IndexFunc(p.entry.Devices, func(x PreparedDevice) bool { return x.Resource == r.Name && x.ID == d.Name })
				return i >= 0 && pr.generation(r.Name, d.Name) > p.entry.Devices[i].GenBefore
			})
		}
		if len(devs) == 0 {
			continue
		}
		if err := r.Runner.Prepare(ctx, devs); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.Name, err))
		}
	}
	return errors.Join(errs...)
}

// prebindFinish, under the locks, records the steps' outcome: the claim's
// spec written and the entry prepared, or, when they failed, the entry
// dropped (its devices failed their preparation are Unhealthy, as the
// runner marks them; no reset runs for a claim never prepared). It returns
// the entry as recorded.
func (pr *preparer) prebindFinish(c *resourceapi.ResourceClaim, stepErr error) (PreparedClaim, error) {
	unlock, err := pr.lockAlone()
	if err != nil {
		return PreparedClaim{}, fmt.Errorf("%w: %w", errRetry, err)
	}
	defer unlock()
	cp := pr.checkpoint.Claims()
	entry, ok := cp[c.UID]
	if !ok {
		return PreparedClaim{}, nil // released meanwhile
	}
	if stepErr != nil {
		delete(cp, c.UID)
		if err := pr.checkpoint.Save(cp); err != nil {
			return PreparedClaim{}, fmt.Errorf("%w: claim %s/%s: %w", errRetry, c.Namespace, c.Name, err)
		}
		return PreparedClaim{}, nil
	}
	if err := pr.specs.write(c.UID, &entry); err != nil {
		return PreparedClaim{}, fmt.Errorf("%w: claim %s/%s: %w", errRetry, c.Namespace, c.Name, err)
	}
	entry.PreBinding, entry.BootID, entry.PrepareAgain = false, pr.boot, false
	cp[c.UID] = entry
	if err := pr.checkpoint.Save(cp); err != nil {
		return PreparedClaim{}, fmt.Errorf("%w: claim %s/%s: %w", errRetry, c.Namespace, c.Name, err)
	}
	return entry, nil
}

// prebindReport hands claim c's outcome to the status writer: each of its
// devices of the driver Ready, <driver>/prepared True, with the CDI IDs of
// entry; or, failed with err, not Ready and <driver>/prepareFailed True
// with the reason (the step's, or the claim's cause).
func (pr *preparer) prebindReport(c *resourceapi.ResourceClaim, entry PreparedClaim, err error) {
	if c.Status.Allocation == nil {
		return
	}
	st := claimStatus{Namespace: c.Namespace, Name: c.Name, UID: c.UID}
	steps := stepErrors(err)
	for _, res := range c.Status.Allocation.Devices.Results {
		if res.Driver != pr.driver {
			continue
		}
		ds := deviceStatus{Pool: res.Pool, Device: res.Device, ShareID: shareIDOf(res)}
		if err == nil {
			ds.Ready, ds.Reason, ds.Message, ds.Binding = true, ReasonPrepared, "prepared before binding", bindingPrepared
			for _, dv := range entry.Devices {
				if dv.Pool == res.Pool && dv.Device == res.Device && dv.ShareID == ds.ShareID {
					ds.CDIDeviceIDs = append(ds.CDIDeviceIDs, dv.CDIDeviceIDs...)
				}
			}
		} else {
			ds.Reason, ds.Message = pr.status.rep.failureReason(res, err, steps)
			ds.Binding = bindingFailed
		}
		st.Devices = append(st.Devices, ds)
	}
	if len(st.Devices) > 0 {
		pr.status.put(st, time.Now())
	}
}

// prebindRelease releases claim uid, prepared before binding and not
// handed to the kubelet, whose allocation is gone (the scheduler gave up
// waiting, or sent the pod elsewhere, or the pod was deleted), as
// Unprepare releases a claim: its devices reset, its spec removed, its
// entry dropped. A claim the kubelet has prepared is the kubelet's to
// unprepare: left alone.
func (pr *preparer) prebindRelease(ctx context.Context, uid types.UID) error {
	unlock, err := pr.lockAlone()
	if err != nil {
		return fmt.Errorf("%w: %w", errRetry, err)
	}
	defer unlock()
	pc, ok := pr.checkpoint.Claims()[uid]
	if !ok || !pc.PreBind {
		return nil
	}
	pr.log.WithField("claim", pc.Namespace+"/"+pc.Name).Info("releasing a claim prepared before binding: its allocation is gone, its pod was not bound here")
	pr.status.forget(uid)
	if err := pr.unprepare(ctx, uid); err != nil {
		return fmt.Errorf("%w: %w", errRetry, err)
	}
	return nil
}
