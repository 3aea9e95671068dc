package drasession

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
)

// pool is the driver's slices of one pool of the node, as the watch shows
// them.
type pool map[string]*apiclient.ResourceSlice

// current returns the slices of the pool's newest generation, by name,
// and their number; ok is false while some are missing.
func (pl pool) current() (cur []*apiclient.ResourceSlice, ok bool) {
	var gen int64 = -1
	for _, s := range pl {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	for _, s := range pl {
		if s.Spec.Pool.Generation == gen {
			cur = append(cur, s)
		}
	}
	if len(cur) == 0 || int64(len(cur)) != cur[0].Spec.Pool.ResourceSliceCount {
		return cur, false
	}
	sort.Slice(cur, func(i, j int) bool { return cur[i].Metadata.Name < cur[j].Metadata.Name })
	return cur, true
}

// complete returns the devices of the pool's newest generation, in slice
// order, and the number of its slices; ok is false while some are
// missing.
func (pl pool) complete() (devices []string, n int, ok bool) {
	cur, ok := pl.current()
	if !ok {
		return nil, len(cur), false
	}
	for _, s := range cur {
		for _, d := range s.Spec.Devices {
			devices = append(devices, d.Name)
		}
	}
	return devices, len(cur), true
}

// tainted returns the devices of the pool's newest generation that carry
// a taint, each with its taints' keys: the scheduler does not allocate
// them (the driver's taints are NoSchedule or NoExecute).
func (pl pool) tainted() []string {
	cur, _ := pl.current()
	var out []string
	for _, s := range cur {
		for _, d := range s.Spec.Devices {
			for _, t := range d.Taints {
				out = append(out, d.Name+" "+t.Key)
			}
		}
	}
	return out
}

// nodePools are the driver's pools of the node by name: the pool named
// after the node (dra-example-driver's), or one per resource named
// <node>/<resource> (cdi-dra-driver's).
type nodePools map[string]pool

// ofNode reports whether pool name is one of node's.
func ofNode(name, node string) bool { return name == node || strings.HasPrefix(name, node+"/") }

// complete returns the devices of every pool's newest generation, each
// as <pool>/<device> (benchClaim's form), pools by name, and the number of
// their slices; ok is false while some are missing.
func (ps nodePools) complete() (devices []string, n int, ok bool) {
	if len(ps) == 0 {
		return nil, 0, false
	}
	names := make([]string, 0, len(ps))
	for name := range ps {
		names = append(names, name)
	}
	sort.Strings(names)
	ok = true
	for _, name := range names {
		devs, k, done := ps[name].complete()
		for _, d := range devs {
			devices = append(devices, name+"/"+d)
		}
		n, ok = n+k, ok && done
	}
	return devices, n, ok
}

// tainted returns the tainted devices of every pool's newest generation,
// each as <pool>/<device> <taint key>.
func (ps nodePools) tainted() []string {
	var out []string
	for name, pl := range ps {
		for _, d := range pl.tainted() {
			out = append(out, name+"/"+d)
		}
	}
	sort.Strings(out)
	return out
}

// names are the pools' names, sorted.
func (ps nodePools) names() string {
	names := make([]string, 0, len(ps))
	for name := range ps {
		names = append(names, name)
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

// slices waits for the driver's ResourceSlices of the node's pools with
// all their devices, none of them tainted: a device is published when the
// scheduler may allocate it.
func (x *draSession) slices(ctx context.Context) error {
	pl := nodePools{}
	var others []string // pools of the driver not of the node
	timeout := time.NewTimer(x.s.Register)
	defer timeout.Stop()
	for {
		select {
		case ev := <-x.events:
			s := &apiclient.ResourceSlice{}
			if ev.Type == apiclient.Error || json.Unmarshal(ev.Object, s) != nil || s.Spec.Driver != x.t.DRA.Driver {
				continue
			}
			if !ofNode(s.Spec.Pool.Name, x.node) {
				others = append(others, s.Spec.Pool.Name)
				continue
			}
			if pl[s.Spec.Pool.Name] == nil {
				pl[s.Spec.Pool.Name] = pool{}
			}
			if ev.Type == apiclient.Deleted {
				delete(pl[s.Spec.Pool.Name], s.Metadata.Name)
			} else {
				pl[s.Spec.Pool.Name][s.Metadata.Name] = s
			}
			devs, n, ok := pl.complete()
			if !ok || (x.t.DRA.Devices > 0 && len(devs) < x.t.DRA.Devices) || len(pl.tainted()) > 0 {
				continue
			}
			x.res.Measure("start-sliced", report.Ms(ev.At.Sub(x.p.Start)), report.Ms(x.apiBase))
			x.res.Count("dra-devices", float64(len(devs)))
			x.devices = devs
			if x.t.DRA.Devices > 0 && len(devs) != x.t.DRA.Devices {
				x.res.Fail("dra-slices", "%d devices, want %d", len(devs), x.t.DRA.Devices)
			} else {
				x.res.Pass("dra-slices", "%d devices in %d slice(s) of pool(s) %s", len(devs), n, pl.names())
			}
			if len(devs) == 0 {
				return errors.New("no device published")
			}
			return nil
		case <-x.p.Done():
			x.res.Fail("dra-slices", "exited: %v", x.p.Err())
			return fmt.Errorf("the driver exited: %w", x.p.Err())
		case <-timeout.C:
			devs, n, _ := pl.complete()
			x.res.Fail("dra-slices", "within %s: %d devices in %d slices of pool(s) %s of node %s, tainted %v (other pools: %v)", x.s.Register, len(devs), n, pl.names(), x.node, pl.tainted(), others)
			return errors.New("its devices were not published")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
