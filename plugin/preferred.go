package plugin

import (
	"container/heap"
	"fmt"
	"sort"
)

// preferred chooses size devices from available: every must-include ID,
// then devices of as few NUMA nodes as possible (the node that already
// holds must-includes first, then the smallest node that fits the rest),
// spreading replicas over distinct physical devices and preferring the
// least loaded ones. The result is deterministic.
func preferred(v *view, available, must []string, size int) ([]string, error) {
	if size <= 0 {
		return nil, fmt.Errorf("allocation size %d", size)
	}
	// No answer holds more IDs than there are; the kubelet's size is
	// capped there before anything is sized by it.
	size = min(size, len(v.list))
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

	// Candidates: known, healthy, not yet chosen, marked by their list
	// position. The replicas of physical device i are the block of
	// positions [i*reps, (i+1)*reps) of the list.
	reps := max(v.snap.Replicas, 1)
	avail := make([]bool, len(v.list))
	nFree := make(map[int]int) // physical device -> free replicas
	for _, id := range available {
		i, ok := v.ids[id]
		if !ok || taken[id] || !v.snap.Devices[i].Healthy {
			continue
		}
		if pos := v.order[id]; !avail[pos] {
			avail[pos] = true
			nFree[i]++
		}
	}

	remaining := size - len(chosen)
	free := map[int]int{} // NUMA node -> candidates
	for i, n := range nFree {
		free[v.snap.Devices[i].NUMANode] += n
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

	// The best candidate is the first by: NUMA rank, fewest replicas of its
	// physical device chosen so far, most free replicas (least loaded),
	// list order. Only the chosen count changes as candidates are taken,
	// so a heap of devices, each offering its first remaining replica,
	// gives the same picks in O(n + size log n).
	h := make(devHeap, 0, len(nFree))
	for i, n := range nFree {
		d := &devCands{rank: rank[v.snap.Devices[i].NUMANode], used: physUse[i], free: n, next: i * reps, end: (i + 1) * reps}
		d.advance(avail)
		h = append(h, d)
	}
	heap.Init(&h)
	for ; remaining > 0 && h.Len() > 0; remaining-- {
		d := h[0]
		chosen = append(chosen, v.list[d.next].ID)
		d.next++
		d.used++
		if d.advance(avail) {
			heap.Fix(&h, 0)
		} else {
			heap.Pop(&h)
		}
	}
	// Fewer candidates than asked: the kubelet decides.
	return chosen, nil
}

// devCands are the candidate replicas of one physical device: next is the
// list position of the first one not taken yet, end the end of its block.
type devCands struct {
	rank, used, free int
	next, end        int
}

// advance moves next to the first candidate at or after it; false when
// none is left.
func (d *devCands) advance(avail []bool) bool {
	for ; d.next < d.end; d.next++ {
		if avail[d.next] {
			return true
		}
	}
	return false
}

type devHeap []*devCands

func (h devHeap) Len() int { return len(h) }
func (h devHeap) Less(a, b int) bool {
	x, y := h[a], h[b]
	if x.rank != y.rank {
		return x.rank < y.rank
	}
	if x.used != y.used {
		return x.used < y.used
	}
	if x.free != y.free {
		return x.free > y.free
	}
	return x.next < y.next
}
func (h devHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *devHeap) Push(x any)   { *h = append(*h, x.(*devCands)) }
func (h *devHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
