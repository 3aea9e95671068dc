package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
)

// Why a claim is not prepared.
var (
	// ErrUnknownDevice: the allocation names a device this driver does not
	// publish on this node.
	ErrUnknownDevice = errors.New("not a device of this driver on this node")
	// ErrUnhealthy: the device is not healthy.
	ErrUnhealthy = errors.New("device unhealthy")
	// ErrHeld: another prepared claim, or a container through the device
	// plugin, holds the device.
	ErrHeld = errors.New("device held")
	// ErrCannotTell: the kubelet's PodResources cannot tell whether a
	// device-plugin container holds the device.
	ErrCannotTell = errors.New("cannot tell whether a device-plugin container holds the device")
	// ErrCallFailed: another claim of the same call failed; none of the
	// call's claims is prepared.
	ErrCallFailed = errors.New("another claim of the same call failed")
	// ErrAllocationChanged: the checkpoint knows the claim's UID, prepared
	// with other devices than its allocation names now.
	ErrAllocationChanged = errors.New("the claim's allocation differs from the one prepared")
)

// PrepareResourceClaims prepares the devices of the claims of one kubelet
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
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.prepMu.Lock()
	defer d.prepMu.Unlock()
	start := time.Now()
	devs, errs := d.prepare(ctx, claims)
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
	d.addMetadata(out)
	d.status.prepared(claims, out, errs)
	log := d.log.WithField("claims", names(claims)).WithField("took", time.Since(start))
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
	// access).
	devs map[*running][]device.Device
}

// prepare prepares claims, all or none; errs holds the claims that
// failed, each with its cause (the others are not prepared either).
func (d *Driver) prepare(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID][]kubeletplugin.Device, map[types.UID]error) {
	cp := d.opts.Checkpoint.Claims()
	holders := heldShares(cp, d.opts.BootID)
	errs := map[types.UID]error{}
	var plans []*planned
	for _, c := range claims {
		if pc, ok := cp[c.UID]; ok && !pc.Unpreparing {
			if err := d.sameAllocation(c, pc); err != nil {
				errs[c.UID] = fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
				continue
			}
			if pc.BootID == d.opts.BootID && !pc.PrepareAgain {
				plans = append(plans, &planned{claim: c, entry: pc, again: true})
				continue
			}
		}
		p, err := d.plan(c, cp, holders)
		if err != nil {
			errs[c.UID] = fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
			continue
		}
		plans = append(plans, p)
	}
	if len(errs) == 0 {
		d.refuseDevicePluginHeld(ctx, plans, errs)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	// The steps, per resource, on the devices of every claim prepared now.
	for _, r := range d.res {
		var devs []device.Device
		for _, p := range plans {
			devs = append(devs, p.devs[r]...)
		}
		if len(devs) == 0 {
			continue
		}
		if err := r.Runner.Prepare(ctx, devs); err != nil {
			// Each claim gets the failures of its own devices (all of
			// them when the error does not say which device failed).
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
	if len(errs) > 0 {
		return nil, errs
	}
	// The claims' specs, then the checkpoint; a failure undoes the specs
	// written here.
	var written []types.UID
	undo := func() {
		for _, uid := range written {
			if err := d.opts.Writer.RemoveClaimSpec(d.claimKind, string(uid)); err != nil {
				d.log.WithError(err).Warn("removing the CDI spec of a claim not prepared")
			}
		}
	}
	next := cp
	added := false
	for _, p := range plans {
		if p.again {
			d.ensureClaimSpec(p)
			continue
		}
		added = true
		if err := d.writeClaimSpec(p); err != nil {
			errs[p.claim.UID] = fmt.Errorf("claim %s/%s: %w", p.claim.Namespace, p.claim.Name, err)
			undo()
			return nil, errs
		}
		if p.entry.ClaimSpec != "" {
			written = append(written, p.claim.UID)
		}
		next[p.claim.UID] = p.entry
	}
	// Claims all prepared already (the kubelet asks again after it
	// restarts): the checkpoint on disk holds them; no write, no fsync.
	if !added {
		return answer(plans), nil
	}
	if err := d.opts.Checkpoint.Save(next); err != nil {
		undo()
		for _, p := range plans {
			errs[p.claim.UID] = fmt.Errorf("claim %s/%s: %w", p.claim.Namespace, p.claim.Name, err)
		}
		return nil, errs
	}
	return answer(plans), nil
}

// sameAllocation checks that claim c's allocation now names the devices
// that pc was prepared with: for each result of this driver its pool,
// device and request.
func (d *Driver) sameAllocation(c *resourceapi.ResourceClaim, pc PreparedClaim) error {
	var now, was []string
	if c.Status.Allocation != nil {
		for _, res := range c.Status.Allocation.Devices.Results {
			if res.Driver == d.opts.DriverName {
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
func (d *Driver) plan(c *resourceapi.ResourceClaim, cp map[types.UID]PreparedClaim, holders holdings) (*planned, error) {
	if c.Status.Allocation == nil {
		return nil, errors.New("not allocated")
	}
	if err := d.checkOpaqueConfig(c); err != nil {
		return nil, err
	}
	p := &planned{claim: c, devs: map[*running][]device.Device{},
		entry: PreparedClaim{Namespace: c.Namespace, Name: c.Name, BootID: d.opts.BootID}}
	// Prepared before (another boot): its allocation's holds replace
	// those it has.
	holders.release(c.UID)
	for _, res := range c.Status.Allocation.Devices.Results {
		if res.Driver != d.opts.DriverName {
			continue
		}
		r, dv, ok := d.lookup(res.Pool, res.Device)
		if !ok {
			return nil, fmt.Errorf("device %s/%s: %w", res.Pool, res.Device, ErrUnknownDevice)
		}
		admin := res.AdminAccess != nil && *res.AdminAccess
		shares := d.sharesOf(r, res)
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
func (d *Driver) refuseDevicePluginHeld(ctx context.Context, plans []*planned, errs map[types.UID]error) {
	need := false
	for _, p := range plans {
		need = need || len(p.devs) > 0
	}
	if !need {
		return
	}
	held, err := d.heldByResource(ctx)
	for _, p := range plans {
		for r, devs := range p.devs {
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

// claimEdits is what the claim's spec gives its containers, as the device
// plugin's Allocate gives a container: per resource with an env prefix,
// <prefix>_DEVICES=<its device IDs>; for devices found by identity
// PCI_RESOURCE_<RESOURCE> (their PCI addresses) or USB_RESOURCE_<RESOURCE>
// (their bus:device numbers); the resources' mounts.
func (d *Driver) claimEdits(uid types.UID, pc PreparedClaim) cdi.Claim {
	c := cdi.Claim{UID: string(uid), Namespace: pc.Namespace, Name: pc.Name}
	for _, r := range d.res {
		var ids []string
		for _, dv := range pc.Devices {
			if dv.Resource == r.Name && !slices.Contains(ids, dv.ID) {
				ids = append(ids, dv.ID)
			}
		}
		if len(ids) == 0 {
			continue
		}
		if r.EnvPrefix != "" {
			c.Env = append(c.Env, r.EnvPrefix+"_DEVICES="+strings.Join(ids, ","))
		}
		if k, v := r.identityEnv(ids); k != "" {
			c.Env = append(c.Env, k+"="+v)
		}
		for _, m := range r.Mounts {
			if !slices.ContainsFunc(c.Mounts, func(x cdi.Mount) bool { return x.ContainerPath == m.ContainerPath }) {
				c.Mounts = append(c.Mounts, m)
			}
		}
	}
	return c
}

// identityEnv is the variable that tells a container which bus devices
// of the resource it got (device.IdentityEnv, as Allocate gives it), for
// the devices ids.
func (r *running) identityEnv(ids []string) (string, string) {
	s := r.snap.Load()
	if s == nil {
		return "", ""
	}
	var idts []device.Identity
	for _, id := range ids {
		if i := slices.IndexFunc(s.Devices, func(x device.Device) bool { return x.Name == id }); i >= 0 {
			idts = append(idts, s.Devices[i].Identity)
		}
	}
	return device.IdentityEnv(r.Name, idts)
}

// writeClaimSpec writes the claim's spec, when it has something to give,
// and adds its CDI ID to the first device of each request.
func (d *Driver) writeClaimSpec(p *planned) error {
	c := d.claimEdits(p.claim.UID, p.entry)
	if len(c.Env)+len(c.Mounts) == 0 {
		return nil
	}
	name, path, err := d.opts.Writer.WriteClaimSpec(d.claimKind, c)
	if err != nil {
		return err
	}
	p.entry.ClaimSpec = path
	seen := map[string]bool{}
	for i := range p.entry.Devices {
		dv := &p.entry.Devices[i]
		if r := dv.Requests[0]; !seen[r] {
			seen[r] = true
			dv.CDIDeviceIDs = append(dv.CDIDeviceIDs, name)
		}
	}
	return nil
}

// ensureClaimSpec writes again the spec of a claim prepared before when it
// is missing (removed by someone): its CDI ID must resolve.
func (d *Driver) ensureClaimSpec(p *planned) {
	if p.entry.ClaimSpec == "" {
		return
	}
	if _, err := os.Stat(p.entry.ClaimSpec); err == nil {
		return
	}
	if _, _, err := d.opts.Writer.WriteClaimSpec(d.claimKind, d.claimEdits(p.claim.UID, p.entry)); err != nil {
		d.log.WithError(err).WithField("claim", p.entry.Namespace+"/"+p.entry.Name).Error("writing the missing CDI spec of a prepared claim")
	}
}

// UnprepareResourceClaims undoes Prepare for each claim (unprepare): a
// claim not prepared (unknown UID) is done already.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.prepMu.Lock()
	defer d.prepMu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = d.unprepare(ctx, c.UID)
		d.status.forget(c.UID)
	}
	return out, nil
}

// unprepare undoes Prepare for the claim uid, with prepMu held: the reset
// step, when the resource has one, on its devices that no other prepared
// claim holds, no device-plugin container holds (PodResources: none when
// it cannot tell), and that an earlier, interrupted Unprepare did not
// reset already; its spec removed; its checkpoint entry dropped. Before a
// device is reset or the spec removed, the entry records, durably, that
// the claim is being unprepared and which devices are reset: a driver that
// stops in between neither takes the missing spec for a reboot at its
// next start nor resets a device twice. A claim with no device to reset
// needs no such mark: one checkpoint write (dropClaim). A reset that fails makes the
// device unhealthy (as a failed preparation does) but does not keep the
// claim: the kubelet could never release it.
func (d *Driver) unprepare(ctx context.Context, uid types.UID) error {
	cp := d.opts.Checkpoint.Claims()
	pc, ok := cp[uid]
	if !ok {
		return nil
	}
	name := pc.Namespace + "/" + pc.Name
	log := d.log.WithField("claim", name)
	delete(cp, uid)
	byRes := d.toReset(log, pc, cp)
	byRes = d.spareDevicePluginHeld(ctx, log, byRes)
	if len(byRes) == 0 {
		return d.dropClaim(log, uid, pc, cp)
	}
	mark := pc
	mark.Unpreparing = true
	mark.Devices = slices.Clone(pc.Devices)
	for i := range mark.Devices {
		dv := &mark.Devices[i]
		if r := d.byName(dv.Resource); r != nil && slices.ContainsFunc(byRes[r], func(x device.Device) bool { return x.Name == dv.ID }) {
			dv.Reset = true
		}
	}
	cp[uid] = mark
	if err := d.opts.Checkpoint.Save(cp); err != nil {
		return fmt.Errorf("claim %s: recording its unprepare: %w", name, err)
	}
	pc = mark
	for r, devs := range byRes {
		if err := r.Runner.Reset(ctx, devs); err != nil {
			log.WithError(err).WithField("resource", r.Name).Warn("resetting the devices of an unprepared claim failed")
		}
	}
	if pc.ClaimSpec != "" {
		if err := d.opts.Writer.RemoveClaimSpec(d.claimKind, string(uid)); err != nil {
			return fmt.Errorf("claim %s: %w", name, err)
		}
	}
	delete(cp, uid)
	if err := d.opts.Checkpoint.Save(cp); err != nil {
		return fmt.Errorf("claim %s: %w", name, err)
	}
	log.Info("claim unprepared")
	return nil
}

// dropClaim unprepares claim uid (pc) when none of its devices is to be
// reset: its entry dropped from the checkpoint (others, without it),
// durably, then its spec removed: one checkpoint write. No mark is needed
// first: a driver stopped between the two finds at its next start the
// spec of a claim it does not hold and removes it (restoreClaimSpecs), and
// there is no reset to keep from running twice. A spec that cannot be
// removed is logged: the claim is unprepared all the same, and the next
// start removes it.
func (d *Driver) dropClaim(log *logrus.Entry, uid types.UID, pc PreparedClaim, others map[types.UID]PreparedClaim) error {
	if err := d.opts.Checkpoint.Save(others); err != nil {
		return fmt.Errorf("claim %s/%s: %w", pc.Namespace, pc.Name, err)
	}
	if pc.ClaimSpec != "" {
		if err := d.opts.Writer.RemoveClaimSpec(d.claimKind, string(uid)); err != nil {
			log.WithError(err).Warn("the claim is unprepared, but its CDI spec could not be removed; the driver's next start removes it")
		}
	}
	log.Info("claim unprepared")
	return nil
}

// toReset is the devices of pc to reset, by resource: those of a resource
// with a reset step, without admin access, that the claims in others do
// not hold and that an interrupted Unprepare of pc did not reset already.
func (d *Driver) toReset(log *logrus.Entry, pc PreparedClaim, others map[types.UID]PreparedClaim) map[*running][]device.Device {
	held := map[string]bool{}
	for _, o := range others {
		for _, dv := range o.Devices {
			if !dv.AdminAccess {
				held[dv.Resource+"\x00"+dv.ID] = true
			}
		}
	}
	byRes := map[*running][]device.Device{}
	for _, dv := range pc.Devices {
		r := d.byName(dv.Resource)
		if dv.AdminAccess || r == nil || !r.Runner.HasReset() || held[dv.Resource+"\x00"+dv.ID] {
			continue
		}
		if dv.Reset {
			log.WithField("device", dv.ID).Info("the device was reset by an Unprepare of the claim that the driver's stop interrupted: not reset again")
			continue
		}
		s := r.snap.Load()
		if s == nil {
			continue
		}
		if i := slices.IndexFunc(s.Devices, func(x device.Device) bool { return x.Name == dv.ID }); i >= 0 &&
			!slices.ContainsFunc(byRes[r], func(x device.Device) bool { return x.Name == dv.ID }) {
			byRes[r] = append(byRes[r], s.Devices[i])
		}
	}
	return byRes
}

// spareDevicePluginHeld is byRes without the devices that a container
// holds through the device plugin (the kubelet's PodResources): during a
// switch of the node between the APIs, such a container may hold a
// device that a claim held until now. When PodResources cannot tell, no
// device of the resource is left (fail closed). Each device spared is
// logged, with its holders. One List answers for every resource.
func (d *Driver) spareDevicePluginHeld(ctx context.Context, log *logrus.Entry, byRes map[*running][]device.Device) map[*running][]device.Device {
	out := map[*running][]device.Device{}
	if len(byRes) == 0 {
		return out
	}
	res, err := d.podres.List(ctx)
	for r, devs := range byRes {
		if err != nil {
			var ids []string
			for _, dv := range devs {
				ids = append(ids, dv.Name)
			}
			log.WithError(err).WithField("resource", r.Name).WithField("devices", strings.Join(ids, ",")).
				Warn("PodResources cannot tell whether device-plugin containers hold the devices: not reset (the claim is unprepared all the same)")
			continue
		}
		held := res.Holders(r.Name)
		for _, dv := range devs {
			var holders []string
			for id, hs := range held {
				if device.HeldBy(dv.Name, []string{id}) {
					holders = append(holders, hs...)
				}
			}
			if len(holders) > 0 {
				slices.Sort(holders)
				log.WithField("resource", r.Name).WithField("device", dv.Name).WithField("holder", strings.Join(holders, ",")).
					Warn("a device-plugin container holds the device: not reset")
				continue
			}
			out[r] = append(out[r], dv)
		}
	}
	return out
}
