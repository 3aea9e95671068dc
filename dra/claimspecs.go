package dra

import (
	"os"
	"slices"
	"strings"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/types"
)

// claimSpecs are the per-claim CDI specs: what a claim's spec gives its
// containers (edits), written when the claim is prepared, written again
// when lost, removed when it is unprepared.
type claimSpecs struct {
	writer *cdi.Writer
	// kind is the claims' CDI kind (cdi.ClaimKind of the driver name).
	kind cdi.Kind
	devs *devices
	log  *logrus.Entry
}

// edits is what the claim's spec gives its containers, as the device
// plugin's Allocate gives a container: per resource with an env prefix,
// <prefix>_DEVICES=<its device IDs>; for devices found by identity
// PCI_RESOURCE_<RESOURCE> (their PCI addresses) or USB_RESOURCE_<RESOURCE>
// (their bus:device numbers); the resources' mounts.
func (cs *claimSpecs) edits(uid types.UID, pc PreparedClaim) cdi.Claim {
	c := cdi.Claim{UID: string(uid), Namespace: pc.Namespace, Name: pc.Name}
	for _, r := range cs.devs.res {
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

// write writes the spec of claim uid, prepared as pc, when it has
// something to give: pc records its path, and its CDI ID is added to the
// first device of each request.
func (cs *claimSpecs) write(uid types.UID, pc *PreparedClaim) error {
	c := cs.edits(uid, *pc)
	if len(c.Env)+len(c.Mounts) == 0 {
		return nil
	}
	name, path, err := cs.writer.WriteClaimSpec(cs.kind, c)
	if err != nil {
		return err
	}
	pc.ClaimSpec = path
	seen := map[string]bool{}
	for i := range pc.Devices {
		dv := &pc.Devices[i]
		if r := dv.Requests[0]; !seen[r] {
			seen[r] = true
			dv.CDIDeviceIDs = append(dv.CDIDeviceIDs, name)
		}
	}
	return nil
}

// ensure writes again the spec of claim uid, prepared before as pc, when
// it is missing (removed by someone): its CDI ID must resolve.
func (cs *claimSpecs) ensure(uid types.UID, pc PreparedClaim) {
	if pc.ClaimSpec == "" {
		return
	}
	if _, err := os.Stat(pc.ClaimSpec); err == nil {
		return
	}
	if _, _, err := cs.writer.WriteClaimSpec(cs.kind, cs.edits(uid, pc)); err != nil {
		cs.log.WithError(err).WithField("claim", pc.Namespace+"/"+pc.Name).Error("writing the missing CDI spec of a prepared claim")
	}
}

// remove removes the spec of claim uid.
func (cs *claimSpecs) remove(uid types.UID) error {
	return cs.writer.RemoveClaimSpec(cs.kind, string(uid))
}

// restore writes again the claim specs of prepared claims (cp) that
// are missing, and marks those claims to be prepared again: the CDI dir
// was emptied (a reboot empties /var/run/cdi; the kubelet may start a
// container of such a claim before it prepares the claim again, and its
// CDI IDs must resolve meanwhile). It removes the specs of claims not
// prepared (a driver killed between writing a claim's spec and its
// checkpoint). A claim whose Unprepare was under way when the driver
// stopped is left as it is: its spec is gone because Unprepare removed
// it, not because of a reboot; the retried Unprepare completes it.
func (cs *claimSpecs) restore(cp *Checkpoint) {
	claims := cp.Claims()
	removed, err := cs.writer.RemoveStaleClaimSpecs(cs.kind, func(uid string) bool {
		pc, ok := claims[types.UID(uid)]
		return ok && pc.ClaimSpec != ""
	})
	for _, p := range removed {
		cs.log.WithField("spec", p).Info("removed the CDI spec of a claim not prepared")
	}
	if err != nil {
		cs.log.WithError(err).Warn("removing the CDI specs of claims not prepared")
	}
	lost := false
	for uid, pc := range claims {
		if pc.Unpreparing {
			// Its spec may be gone: Unprepare removed it. No reboot.
			cs.log.WithField("claim", pc.Namespace+"/"+pc.Name).Info("an Unprepare of the claim was under way when the driver stopped; " +
				"it completes when the kubelet asks again (its devices reset already are not reset again)")
			continue
		}
		if pc.ClaimSpec == "" {
			continue
		}
		if _, err := os.Stat(pc.ClaimSpec); err == nil {
			continue
		}
		log := cs.log.WithField("claim", pc.Namespace+"/"+pc.Name)
		if _, _, err := cs.writer.WriteClaimSpec(cs.kind, cs.edits(uid, pc)); err != nil {
			log.WithError(err).Error("writing the CDI spec of a prepared claim again")
		}
		pc.PrepareAgain, lost = true, true
		claims[uid] = pc
		log.Info("the CDI spec of a prepared claim was gone (a reboot): written again; its devices are prepared again when the kubelet asks")
	}
	if lost {
		if err := cp.Save(claims); err != nil {
			cs.log.WithError(err).Error("recording the claims to prepare again")
		}
	}
}
