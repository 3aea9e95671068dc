package plugin

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// TestPreferredMatchesReference: the heap-based preferred allocation picks
// exactly what the straightforward O(size x candidates) one picks (kept
// here as the reference), on random device sets, NUMA layouts, replicas,
// health, available sets, must-includes and sizes.
func TestPreferredMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := range 2000 {
		devs, numa, reps := 1+rng.IntN(24), rng.IntN(4), 1+rng.IntN(4)
		if numa > devs {
			numa = devs
		}
		s := snapshot(devs, numa, reps)
		for i := range s.Devices {
			s.Devices[i].Healthy = rng.IntN(6) != 0
		}
		p := newPlugin(t, t.TempDir(), s, nil)
		v := p.state.Load()
		var all []string
		for _, d := range v.list {
			all = append(all, d.ID)
		}
		var avail, must []string
		for _, id := range all {
			if rng.IntN(3) != 0 {
				avail = append(avail, id)
			}
		}
		rng.Shuffle(len(avail), func(a, b int) { avail[a], avail[b] = avail[b], avail[a] })
		if len(avail) > 0 && rng.IntN(3) == 0 {
			must = append(must, avail[rng.IntN(len(avail))])
		}
		size := 1 + rng.IntN(len(all)+1)
		got, err1 := preferred(v, avail, must, size)
		want, err2 := preferredReference(v, avail, must, size)
		if (err1 == nil) != (err2 == nil) || !slices.Equal(got, want) {
			t.Fatalf("case %d (%d devices, %d NUMA, %d replicas, size %d, must %v, available %v):\n got %v (%v)\nwant %v (%v)",
				n, devs, numa, reps, size, must, avail, got, err1, want, err2)
		}
	}
}

// preferredReference is the preferred allocation as it was before the
// heap: for every pick, a scan of all candidates.
func preferredReference(v *view, available, must []string, size int) ([]string, error) {
	if size <= 0 {
		return nil, fmt.Errorf("allocation size %d", size)
	}
	chosen := make([]string, 0, size)
	taken := make(map[string]bool, size)
	physUse := map[int]int{}
	numaMust := map[int]int{}
	for _, id := range must {
		i, ok := v.ids[id]
		if !ok {
			return nil, fmt.Errorf("unknown must-include device ID %q", id)
		}
		if taken[id] {
			continue
		}
		taken[id] = true
		chosen = append(chosen, id)
		physUse[i]++
		numaMust[v.snap.Devices[i].NUMANode]++
	}
	if len(chosen) >= size {
		return chosen, nil
	}

	// Candidates: known, healthy, not yet chosen; in list order.
	cands := make([]string, 0, len(available))
	seen := make(map[string]bool, len(available))
	for _, id := range available {
		i, ok := v.ids[id]
		if !ok || taken[id] || seen[id] || !v.snap.Devices[i].Healthy {
			continue
		}
		seen[id] = true
		cands = append(cands, id)
	}
	sort.Slice(cands, func(a, b int) bool { return v.order[cands[a]] < v.order[cands[b]] })

	remaining := size - len(chosen)
	free := map[int]int{}    // NUMA node -> candidates
	freeRep := map[int]int{} // physical device -> free replicas
	for _, id := range cands {
		i := v.ids[id]
		free[v.snap.Devices[i].NUMANode]++
		freeRep[i]++
	}
	nodes := make([]int, 0, len(free))
	for n := range free {
		nodes = append(nodes, n)
	}
	sort.Slice(nodes, func(a, b int) bool {
		x, y := nodes[a], nodes[b]
		if numaMust[x] != numaMust[y] {
			return numaMust[x] > numaMust[y]
		}
		fx, fy := free[x] >= remaining, free[y] >= remaining
		if fx != fy {
			return fx
		}
		if free[x] != free[y] {
			if fx { // both fit: best fit keeps big nodes whole
				return free[x] < free[y]
			}
			return free[x] > free[y]
		}
		return x < y
	})
	rank := make(map[int]int, len(nodes))
	for r, n := range nodes {
		rank[n] = r
	}

	used := make([]bool, len(cands))
	for ; remaining > 0; remaining-- {
		best := -1
		for k, id := range cands {
			if used[k] {
				continue
			}
			if best < 0 || betterReference(v, id, cands[best], rank, physUse, freeRep) {
				best = k
			}
		}
		if best < 0 {
			break // fewer candidates than asked: the kubelet decides
		}
		used[best] = true
		id := cands[best]
		chosen = append(chosen, id)
		physUse[v.ids[id]]++
	}
	return chosen, nil
}

// better orders candidates: NUMA rank, fewest chosen replicas of the same
// physical device, most free replicas (least loaded), then list order.
func betterReference(v *view, a, b string, rank, physUse, freeRep map[int]int) bool {
	ia, ib := v.ids[a], v.ids[b]
	if ra, rb := rank[v.snap.Devices[ia].NUMANode], rank[v.snap.Devices[ib].NUMANode]; ra != rb {
		return ra < rb
	}
	if physUse[ia] != physUse[ib] {
		return physUse[ia] < physUse[ib]
	}
	if freeRep[ia] != freeRep[ib] {
		return freeRep[ia] > freeRep[ib]
	}
	return v.order[a] < v.order[b]
}
