package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sync"
	"time"
)

// fleetSlice is the part of a ResourceSlice the fleet reads.
type fleetSlice struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		Driver   string  `json:"driver"`
		NodeName *string `json:"nodeName"`
		Devices  []struct {
			Name   string `json:"name"`
			Taints []struct {
				Key string `json:"key"`
			} `json:"taints"`
		} `json:"devices"`
	} `json:"spec"`
}

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
	slices  map[string]fleetSlice // by name
	nodes   map[string]*sliceState
	events  int
	changed chan struct{}
	done    <-chan struct{}
}

func trackSlices(ctx context.Context, api *apiClient, driver string, want int, logf func(string, ...any)) (*sliceTracker, error) {
	st := &sliceTracker{driver: driver, want: want, slices: map[string]fleetSlice{}, nodes: map[string]*sliceState{},
		changed: make(chan struct{}, 1), done: ctx.Done()}
	if err := watchAlways(ctx, api, pathResourceSlices, url.Values{}, st.event, logf); err != nil {
		return nil, fmt.Errorf("watching ResourceSlices: %w", err)
	}
	return st, nil
}

func (st *sliceTracker) event(ev watchEvent) {
	var s fleetSlice
	if ev.Type == watchError || json.Unmarshal(ev.Object, &s) != nil || s.Spec.Driver != st.driver || s.Spec.NodeName == nil {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.events++
	if ev.Type == watchDeleted {
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
