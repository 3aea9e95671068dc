package plugin

import (
	"maps"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// withHealth returns a copy of snap with device i's health set.
func withHealth(snap *device.Snapshot, i int, healthy bool, reason string) *device.Snapshot {
	out := &device.Snapshot{Replicas: snap.Replicas, Devices: slices.Clone(snap.Devices)}
	if healthy {
		out.Devices[i].SetProblem(device.Problem{})
	} else {
		out.Devices[i].SetProblem(device.Problem{Cause: device.CauseWrongNode, Message: reason})
	}
	return out
}

// listOf is what a view sends on ListAndWatch, as plain values.
func listOf(t *testing.T, v *view) []string {
	t.Helper()
	out := make([]string, len(v.list))
	for i, d := range v.list {
		b, err := proto.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = string(b)
	}
	return out
}

// TestUpdateViewMatchesRebuilt: whatever changes between two snapshots
// (health, reason, the device set, replicas), the view Update publishes
// is the one built from scratch, and the view it replaces is untouched
// (streams may still be sending it) and told of the change.
func TestUpdateViewMatchesRebuilt(t *testing.T) {
	base := snapshot(40, 2, 4)
	grown := snapshot(41, 2, 4)
	steps := []struct {
		name string
		snap *device.Snapshot
	}{
		{"one device unhealthy", withHealth(base, 3, false, "missing")},
		{"reason changes only", withHealth(base, 3, false, "wrong node")},
		{"two unhealthy", withHealth(withHealth(base, 3, false, "missing"), 39, false, "missing")},
		{"all healthy again", base},
		{"same snapshot again", base},
		{"a device more", grown},
		{"unhealthy in the grown set", withHealth(grown, 40, false, "missing")},
		{"fewer replicas", snapshot(41, 2, 2)},
		{"no replicas", snapshot(41, 2, 1)},
		{"unhealthy without replicas", withHealth(snapshot(41, 2, 1), 0, false, "missing")},
		{"back to the start", base},
	}
	// With per-device annotations: their keys are part of the view too
	// (Allocate indexes them by device).
	p := newPlugin(t, t.TempDir(), base, func(o *Options) { o.AnnotationPrefix = "example.com/dev" })
	for _, s := range steps {
		old := p.state.Load()
		oldList := listOf(t, old)
		if err := p.Update(s.snap); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		got := p.state.Load()
		want, err := p.newView(s.snap)
		if err != nil {
			t.Fatal(err)
		}
		if got.snap != s.snap {
			t.Errorf("%s: the view holds another snapshot", s.name)
		}
		if g, w := listOf(t, got), listOf(t, want); !slices.Equal(g, w) {
			t.Errorf("%s: list differs from the rebuilt view's:\n got %q\nwant %q", s.name, g, w)
		}
		if !maps.Equal(got.ids, want.ids) || !maps.Equal(got.order, want.order) || !slices.Equal(got.cdiNames, want.cdiNames) {
			t.Errorf("%s: ids, order or CDI names differ from the rebuilt view's", s.name)
		}
		if !slices.Equal(got.annotKeys, want.annotKeys) {
			t.Errorf("%s: annotation keys %q, the rebuilt view's %q", s.name, got.annotKeys, want.annotKeys)
		}
		if !slices.Equal(listOf(t, old), oldList) {
			t.Errorf("%s: the replaced view's list was changed", s.name)
		}
		select {
		case <-old.changed:
		default:
			t.Errorf("%s: the replaced view's changed channel is open", s.name)
		}
	}
}

// TestUpdateHealthChangeIsIncremental: at 10,000 IDs a health change of
// one device costs a handful of allocations, not a rebuild of the view
// (over 20,000 allocations: an ID, a device and map entries per ID).
func TestUpdateHealthChangeIsIncremental(t *testing.T) {
	healthy := snapshot(2500, 4, 4)
	sick := withHealth(healthy, 3, false, "missing")
	p := newPlugin(t, t.TempDir(), healthy, nil)
	next := sick
	allocs := testing.AllocsPerRun(20, func() {
		if err := p.Update(next); err != nil {
			t.Fatal(err)
		}
		if next == sick {
			next = healthy
		} else {
			next = sick
		}
	})
	if allocs > 20 {
		t.Errorf("Update of one device's health at 10,000 IDs: %.0f allocations, want at most 20", allocs)
	}
	v := p.state.Load()
	want := "Healthy"
	if !v.snap.Devices[3].Healthy {
		want = "Unhealthy"
	}
	for r := 0; r < 4; r++ {
		if d := v.list[3*4+r]; d.Health != want {
			t.Errorf("%s: %s, want %s", d.ID, d.Health, want)
		}
	}
}
