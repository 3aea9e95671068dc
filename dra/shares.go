package dra

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Shared devices. A device of a resource with replicas N (Resource.Replicas
// above 1) is published once, allocatable to several claims at once, with
// the consumable capacity <driver>/shares of N (Capacity): the scheduler
// gives each allocation of it a share ID and the shares it consumes (one
// unless the request asks for more). Prepare hands the device to claims
// until their shares add up to N (holdings.take); the prestart steps run
// when the first share is prepared in this boot, not again for the later
// ones; Unprepare resets the device when the last share is released (see
// toReset: a device another claim holds is not reset). The CDI IDs of
// every share are the device's.

// holding is a claim's hold on a device: the shares it takes (0 for a
// device without replicas), and whether its preparation counts in this
// boot (live: prepared in this boot, or by this Prepare call).
type holding struct {
	uid    types.UID
	shares int
	live   bool
}

// holdings are the holds on each device (resource \x00 device ID) of the
// prepared claims and of the claims a Prepare call planned so far.
type holdings map[string][]holding

// heldShares are the holds of the prepared claims cp (not those of admin
// access); boot is the kernel's boot ID now.
func heldShares(cp map[types.UID]PreparedClaim, boot string) holdings {
	h := holdings{}
	for uid, pc := range cp {
		live := pc.BootID == boot && !pc.PrepareAgain && !pc.Unpreparing
		for _, dv := range pc.Devices {
			if !dv.AdminAccess {
				key := dv.Resource + "\x00" + dv.ID
				h[key] = append(h[key], holding{uid: uid, shares: dv.Shares, live: live})
			}
		}
	}
	return h
}

// release drops the holds of claim uid: it is being prepared anew (a
// reboot), and its allocation's holds replace them.
func (h holdings) release(uid types.UID) {
	for key, hs := range h {
		hs = slices.DeleteFunc(hs, func(x holding) bool { return x.uid == uid })
		if len(hs) == 0 {
			delete(h, key)
		} else {
			h[key] = hs
		}
	}
}

// take records that claim uid takes shares of the device key of resource
// r, and reports whether the device must be prepared: no hold on it is
// live yet (its first share in this boot, or a device without replicas).
// A device without replicas that another claim holds is refused
// (ErrHeld), as is a device of r whose shares would add up to more than
// r.Replicas; cp names the holders.
func (h holdings) take(r *running, key string, uid types.UID, shares int, cp map[types.UID]PreparedClaim) (bool, error) {
	hs := h[key]
	if r.Replicas <= 1 {
		if i := slices.IndexFunc(hs, func(x holding) bool { return x.uid != uid }); i >= 0 {
			return false, fmt.Errorf("%w by %s", ErrHeld, holderName(hs[i].uid, cp))
		}
	} else {
		taken := shares
		var who []string
		for _, x := range hs {
			if x.shares == 0 {
				// Held whole: prepared before the resource had
				// replicas. That is every share.
				taken += r.Replicas
			} else {
				taken += x.shares
			}
			if n := holderName(x.uid, cp); !slices.Contains(who, n) {
				who = append(who, n)
			}
		}
		if taken > r.Replicas {
			slices.Sort(who)
			return false, fmt.Errorf("%w by %s: %d of its %d shares taken, %d asked", ErrHeld, strings.Join(who, ", "), taken-shares, r.Replicas, shares)
		}
	}
	first := !slices.ContainsFunc(hs, func(x holding) bool { return x.live })
	h[key] = append(hs, holding{uid: uid, shares: shares, live: true})
	return first, nil
}

// holderName names the claim uid for an error: prepared (cp), or one of
// the same call.
func holderName(uid types.UID, cp map[types.UID]PreparedClaim) string {
	if pc, ok := cp[uid]; ok {
		return "claim " + pc.Namespace + "/" + pc.Name
	}
	return "another claim of this call"
}

// sharesOf is how many shares of a device of resource r the allocation
// result res takes: none for a resource without replicas; else what the
// scheduler recorded it consumes of <driver>/shares, one when it recorded
// nothing.
func sharesOf(driver string, r *running, res resourceapi.DeviceRequestAllocationResult) int {
	if r.Replicas <= 1 {
		return 0
	}
	if q, ok := res.ConsumedCapacity[SharesCapacity(driver)]; ok {
		if n, ok := q.AsInt64(); ok && n > 0 {
			// More than all shares is refused by take; capped so
			// that it cannot overflow.
			return int(min(n, int64(r.Replicas)+1))
		}
	}
	return 1
}

// shareIDOf is the allocation result's share ID ("" for none).
func shareIDOf(res resourceapi.DeviceRequestAllocationResult) string {
	if res.ShareID == nil {
		return ""
	}
	return string(*res.ShareID)
}

// shareUID is a checkpointed share ID as the kubelet gets it (nil for
// none).
func shareUID(id string) *types.UID {
	if id == "" {
		return nil
	}
	u := types.UID(id)
	return &u
}

// shareKey is the share ID as sameAllocation writes it beside the device
// ("" for none).
func shareKey(id string) string {
	if id == "" {
		return ""
	}
	return " share " + id
}
