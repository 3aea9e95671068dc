package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
)

// sliceState is what one node's slices of the driver show: devices and
// how many carry a taint; clean is since when all expected devices are
// published untainted (zero while not).
type sliceState struct {
	devices, tainted int
	clean            time.Time
}

// sliceTracker follows the driver's ResourceSlices through one watch.
type sliceTracker struct {
	driver string
	want   int // devices per node

	mu      sync.Mutex
	slices  map[string]apiclient.ResourceSlice // by name
	nodes   map[string]*sliceState
	events  int
	changed chan struct{}
	done    <-chan struct{}
	w       *apiclient.Watcher
}

func trackSlices(ctx context.Context, api *apiclient.Client, driver string, want int, logf func(string, ...any)) (*sliceTracker, error) {
	st := &sliceTracker{driver: driver, want: want, slices: map[string]apiclient.ResourceSlice{}, nodes: map[string]*sliceState{},
		changed: make(chan struct{}, 1), done: ctx.Done()}
	w, err := api.Watch(ctx, apiclient.PathResourceSlices, url.Values{}, st.event, logf)
	if err != nil {
		return nil, fmt.Errorf("watching ResourceSlices: %w", err)
	}
	st.w = w
	return st, nil
}

// wait joins the watch (after its context is done).
func (st *sliceTracker) wait() { st.w.Wait() }

func (st *sliceTracker) event(ev apiclient.Event) {
	var s apiclient.ResourceSlice
	if ev.Type == apiclient.Error || json.Unmarshal(ev.Object, &s) != nil || s.Spec.Driver != st.driver || s.Spec.NodeName == nil {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.events++
	if ev.Type == apiclient.Deleted {
		delete(st.slices, s.Metadata.Name)
	} else {
		st.slices[s.Metadata.Name] = s
	}
	node := *s.Spec.NodeName
	ns := &sliceState{}
	for _, o := range st.slices {
		if o.Spec.NodeName == nil || *o.Spec.NodeName != node {
			continue
		}
		for _, d := range o.Spec.Devices {
			ns.devices++
			if len(d.Taints) > 0 {
				ns.tainted++
			}
		}
	}
	old := st.nodes[node]
	if ns.devices == st.want && ns.tainted == 0 {
		ns.clean = ev.At
		if old != nil && !old.clean.IsZero() {
			ns.clean = old.clean
		}
	}
	st.nodes[node] = ns
	select {
	case st.changed <- struct{}{}:
	default:
	}
}

// waitClean waits until every node of nodes shows its devices untainted
// and returns the latest time a node became so.
func (st *sliceTracker) waitClean(ctx context.Context, nodes []string, timeout time.Duration) (time.Time, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		st.mu.Lock()
		var last time.Time
		clean := 0
		for _, n := range nodes {
			if s := st.nodes[n]; s != nil && !s.clean.IsZero() {
				clean++
				if s.clean.After(last) {
					last = s.clean
				}
			}
		}
		st.mu.Unlock()
		if clean == len(nodes) {
			return last, nil
		}
		select {
		case <-st.changed:
		case <-deadline.C:
			return time.Time{}, fmt.Errorf("%d of %d nodes publish their %d devices untainted after %s", clean, len(nodes), st.want, timeout)
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-st.done:
			return time.Time{}, fmt.Errorf("the ResourceSlice watch ended")
		}
	}
}

// taintedEvents is the number of the driver's slice events seen so far.
func (st *sliceTracker) eventCount() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.events
}
