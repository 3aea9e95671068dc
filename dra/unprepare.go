package dra

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
	"github.com/cdi-device-plugin/cdi-device-plugin/podresources"
)

// unprepareClaims undoes Prepare for each claim (unprepare): a
// claim not prepared (unknown UID) is done already.
func (pr *preparer) unprepareClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	err := pr.lock()
	defer pr.unlock()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	out := make(map[types.UID]error, len(claims))
	failed := 0
	for _, c := range claims {
		out[c.UID] = pr.unprepare(ctx, c.UID)
		if out[c.UID] != nil {
			failed++
		}
		pr.status.forget(c.UID)
	}
	pr.metrics.Request(metrics.OpUnprepare, time.Since(start), len(claims)-failed, failed)
	return out, nil
}

// unprepare undoes Prepare for the claim uid, with mu held: the reset
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
func (pr *preparer) unprepare(ctx context.Context, uid types.UID) error {
	cp := pr.checkpoint.Claims()
	pc, ok := cp[uid]
	if !ok {
		return nil
	}
	name := pc.Namespace + "/" + pc.Name
	log := pr.log.WithField("claim", name)
	delete(cp, uid)
	byRes := pr.toReset(log, pc, cp)
	byRes = pr.spareDevicePluginHeld(ctx, log, byRes)
	if len(byRes) == 0 {
		return pr.dropClaim(log, uid, pc, cp)
	}
	mark := pc
	mark.Unpreparing = true
	mark.Devices = slices.Clone(pc.Devices)
	for i := range mark.Devices {
		dv := &mark.Devices[i]
		if r := pr.devs.byName(dv.Resource); r != nil && slices.ContainsFunc(byRes[r], func(x device.Device) bool { return x.Name == dv.ID }) {
			dv.Reset = true
		}
	}
	cp[uid] = mark
	if err := pr.checkpoint.Save(cp); err != nil {
		return fmt.Errorf("claim %s: recording its unprepare: %w", name, err)
	}
	pc = mark
	for r, devs := range byRes {
		if err := r.Runner.Reset(ctx, devs); err != nil {
			log.WithError(err).WithField("resource", r.Name).Warn("resetting the devices of an unprepared claim failed")
		}
	}
	if pc.ClaimSpec != "" {
		if err := pr.specs.remove(uid); err != nil {
			return fmt.Errorf("claim %s: %w", name, err)
		}
	}
	delete(cp, uid)
	if err := pr.checkpoint.Save(cp); err != nil {
		return fmt.Errorf("claim %s: %w", name, err)
	}
	log.Info("claim unprepared")
	return nil
}

// dropClaim unprepares claim uid (pc) when none of its devices is to be
// reset: its entry dropped from the checkpoint (others, without it),
// durably, then its spec removed: one checkpoint write. No mark is needed
// first: a driver stopped between the two finds at its next start the
// spec of a claim it does not hold and removes it (claimSpecs.restore), and
// there is no reset to keep from running twice. A spec that cannot be
// removed is logged: the claim is unprepared all the same, and the next
// start removes it.
func (pr *preparer) dropClaim(log *logrus.Entry, uid types.UID, pc PreparedClaim, others map[types.UID]PreparedClaim) error {
	if err := pr.checkpoint.Save(others); err != nil {
		return fmt.Errorf("claim %s/%s: %w", pc.Namespace, pc.Name, err)
	}
	if pc.ClaimSpec != "" {
		if err := pr.specs.remove(uid); err != nil {
			log.WithError(err).Warn("the claim is unprepared, but its CDI spec could not be removed; the driver's next start removes it")
		}
	}
	log.Info("claim unprepared")
	return nil
}

// toReset is the devices of pc to reset, by resource: those of a resource
// with a reset step, without admin access, that the claims in others do
// not hold and that an interrupted Unprepare of pc did not reset already.
func (pr *preparer) toReset(log *logrus.Entry, pc PreparedClaim, others map[types.UID]PreparedClaim) map[*running][]device.Device {
	held := map[string]bool{}
	for _, o := range others {
		if o.Unpreparing {
			// Released already (the kubelet unprepares a claim once its
			// containers are gone), its Unprepare interrupted: it holds
			// nothing, and its retry does not reset a device it marked.
			continue
		}
		for _, dv := range o.Devices {
			if !dv.AdminAccess {
				held[dv.Resource+"\x00"+dv.ID] = true
			}
		}
	}
	byRes := map[*running][]device.Device{}
	for _, dv := range pc.Devices {
		r := pr.devs.byName(dv.Resource)
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
func (pr *preparer) spareDevicePluginHeld(ctx context.Context, log *logrus.Entry, byRes map[*running][]device.Device) map[*running][]device.Device {
	out := map[*running][]device.Device{}
	if len(byRes) == 0 {
		return out
	}
	res, err := pr.holders.list(ctx)
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

// dropStale unprepares the claim uid, gone from the API for longer than
// the grace, unless the kubelet did meanwhile, or a container still holds
// it: a claim leaves the API while its pod runs when an operator strips
// the finalizer of a claim stuck terminating, or when pods are deleted by
// force while the kubelet is down, and releasing it would reset the device
// under the running container and prepare it for another claim. The
// kubelet's PodResources is asked under the lock, so that no Prepare or
// Unprepare runs between its answer and the release; a claim it lists on a
// container is kept (ErrStillHeld), and so is every claim while it cannot
// answer (ErrCannotTell). Kept claims are asked about again at the next
// pass.
func (pr *preparer) dropStale(ctx context.Context, uid types.UID, log *logrus.Entry) error {
	unlock, err := pr.lockAlone()
	if err != nil {
		return err
	}
	defer unlock()
	pc, ok := pr.checkpoint.Claims()[uid]
	if !ok {
		return nil
	}
	res, err := pr.holders.list(ctx)
	if err != nil {
		pr.metrics.StaleKept(false)
		return fmt.Errorf("%w: %w", ErrCannotTell, err)
	}
	if holders := claimHolders(res, pr.driver, pc); len(holders) > 0 {
		pr.metrics.StaleKept(true)
		return fmt.Errorf("%w: PodResources lists it on %s", ErrStillHeld, strings.Join(holders, ", "))
	}
	log.Warn("dropping a prepared claim gone from the API for longer than the grace period; its devices are released as Unprepare releases them")
	// Its queued status and its device metadata go first, while the
	// checkpoint still holds the claim: a driver stopped in between finds
	// the claim again at its next start and drops it then, so nothing is
	// left behind for good (the other way round, metadata left after the
	// checkpoint let go of the claim would never be removed).
	pr.status.forget(uid)
	if err := pr.metadata.remove(pc.Namespace, pc.Name, uid); err != nil {
		log.WithError(err).Warn("removing the device metadata of a dropped claim")
	}
	if err := pr.unprepare(ctx, uid); err != nil {
		log.WithError(err).Error("dropping a prepared claim gone from the API")
	}
	pr.metrics.StaleDropped()
	return nil
}

// claimHolders are the devices of claim pc of driver that PodResources
// lists on containers: entries of its namespace and name whose device is
// one of pc's, or that name no device (a kubelet before 1.31 lists only
// CDI names: fail closed). A claim of pc's name but another UID that a
// container holds on other devices does not keep pc.
func claimHolders(res *podresources.Resources, driver string, pc PreparedClaim) []string {
	var out []string
	for _, cd := range res.Claims() {
		if cd.Claim != pc.Namespace+"/"+pc.Name || (cd.Driver != "" && cd.Driver != driver) {
			continue
		}
		if cd.Device != "" && !slices.ContainsFunc(pc.Devices, func(d PreparedDevice) bool { return d.Pool == cd.Pool && d.Device == cd.Device }) {
			continue
		}
		out = append(out, cd.Claim+" ("+cd.Pool+"/"+cd.Device+")")
	}
	return out
}
