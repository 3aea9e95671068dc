package fleet

import (
	"encoding/json"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
)

// TestLabelCount: the claim events a node's driver receives through its
// watch of the claims labelled for its node are counted by the label's
// value: a claim's ADDED, MODIFIED and DELETED of that node count for it,
// a claim without the label for none.
func TestLabelCount(t *testing.T) {
	const key = "bench.example.com/prepare-node"
	ev := func(typ string, labels map[string]string) apiclient.Event {
		b, err := json.Marshal(map[string]any{"metadata": map[string]any{"name": "c", "labels": labels}})
		if err != nil {
			t.Fatal(err)
		}
		return apiclient.Event{Type: typ, Object: b}
	}
	lc := newLabelCount(key)
	lc.event(ev(apiclient.Added, map[string]string{key: "n1"}))
	lc.event(ev(apiclient.Modified, map[string]string{key: "n1"}))
	lc.event(ev(apiclient.Deleted, map[string]string{key: "n1"}))
	lc.event(ev(apiclient.Added, map[string]string{key: "n2"}))
	lc.event(ev(apiclient.Added, map[string]string{"other": "n2"}))
	lc.event(apiclient.Event{Type: apiclient.Added, Object: []byte(`"not an object"`)})
	got := lc.snapshot()
	if got["n1"] != 3 || got["n2"] != 1 || len(got) != 2 {
		t.Errorf("events by node %v, want n1 3, n2 1", got)
	}
	// A window's events are those after its first snapshot.
	lc.event(ev(apiclient.Modified, map[string]string{key: "n2"}))
	w := nodeEvents(got, lc.snapshot(), 4)
	if w.Total != 1 || w.PerNode != 0.25 || w.MaxNode != 1 {
		t.Errorf("window %+v, want 1 event, 0.25 per node of 4, at most 1", w)
	}
}
