package fleet

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
)

// TestFleetMarkers: the fleet's tables are written between their markers
// (report.WriteBetween), once however often they are written.
func TestFleetMarkers(t *testing.T) {
	path := t.TempDir() + "/fleet.md"
	if err := report.WriteBetween(path, mdBeginFleet, mdEndFleet, "", []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	if err := report.WriteBetween(path, mdBeginFleet, mdEndFleet, "", []byte("two\n")); err != nil {
		t.Fatal(err)
	}
	b, _ := readFileString(path)
	if strings.Contains(b, "one") || strings.Count(b, "two") != 1 || strings.Count(b, mdBeginFleet) != 1 {
		t.Errorf("file after two writes:\n%s", b)
	}
}

func readFileString(p string) (string, error) {
	b, err := os.ReadFile(p)
	return string(b), err
}

// TestPodOf: the stand-in reads of a pod's event its node, the claim its
// status names now (the last one named), why it failed (evicted; its
// phase Failed above all) and its deletion; an ERROR event or another
// object is no pod.
func TestPodOf(t *testing.T) {
	ev := func(typ string, pod map[string]any) apiclient.Event {
		b, err := json.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		return apiclient.Event{Type: typ, Object: b, At: time.Now()}
	}
	pod := func(node, phase string, claims []map[string]any, conds ...map[string]any) map[string]any {
		st := map[string]any{"phase": phase, "resourceClaimStatuses": claims, "conditions": conds}
		return map[string]any{"metadata": map[string]any{"name": "p"}, "spec": map[string]any{"nodeName": node}, "status": st}
	}
	claim := func(name string) map[string]any {
		if name == "" {
			return map[string]any{"name": "dev"}
		}
		return map[string]any{"name": "dev", "resourceClaimName": name}
	}
	evicted := map[string]any{"type": "DisruptionTarget", "status": "True"}
	for _, c := range []struct {
		name string
		ev   apiclient.Event
		want kubeletsim.Pod
	}{
		{"not bound", ev(apiclient.Added, pod("", "Pending", []map[string]any{claim("c1")})), kubeletsim.Pod{Name: "p", Claim: "c1"}},
		{"bound, no claim yet", ev(apiclient.Modified, pod("n1", "Pending", []map[string]any{claim("")})), kubeletsim.Pod{Name: "p", Node: "n1"}},
		{"the last claim named", ev(apiclient.Modified, pod("n1", "Pending", []map[string]any{claim("c1"), claim("c2"), claim("")})), kubeletsim.Pod{Name: "p", Node: "n1", Claim: "c2"}},
		{"evicted", ev(apiclient.Modified, pod("n1", "Running", nil, evicted)), kubeletsim.Pod{Name: "p", Node: "n1", Failed: "DisruptionTarget (evicted)"}},
		{"phase Failed", ev(apiclient.Modified, pod("n1", "Failed", nil, evicted)), kubeletsim.Pod{Name: "p", Node: "n1", Failed: "phase Failed"}},
		{"deleted", ev(apiclient.Deleted, pod("n1", "Running", nil)), kubeletsim.Pod{Name: "p", Node: "n1", Deleted: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := podOf(c.ev)
			if !ok || got != c.want {
				t.Errorf("podOf: %+v %v, want %+v", got, ok, c.want)
			}
		})
	}
	if _, ok := podOf(apiclient.Event{Type: apiclient.Error, Object: []byte(`{"kind":"Status","code":410}`)}); ok {
		t.Error("an ERROR event read as a pod")
	}
	if _, ok := podOf(apiclient.Event{Type: apiclient.Added, Object: []byte(`"not an object"`)}); ok {
		t.Error("a string read as a pod")
	}
}

// TestTurns: the fleets take turns: each round starts with another
// fleet, so that in as many rounds as fleets each goes first once (a
// machine warming up, or slowing as the run goes on, weighs on each
// alike, not on the fleet that always went first).
func TestTurns(t *testing.T) {
	fleets := []string{"ours", "ours, no status", "peer"}
	var firsts []string
	for r := range 3 {
		got := turn(fleets, r)
		if len(got) != 3 {
			t.Fatalf("round %d: %v", r, got)
		}
		seen := map[string]bool{}
		for _, f := range got {
			seen[f] = true
		}
		if len(seen) != 3 {
			t.Errorf("round %d: %v, want each fleet once", r, got)
		}
		firsts = append(firsts, got[0])
	}
	if want := []string{"ours", "ours, no status", "peer"}; strings.Join(firsts, "|") != strings.Join(want, "|") {
		t.Errorf("first of each round %v, want %v", firsts, want)
	}
	if got := turn(fleets, 1); strings.Join(got, "|") != "ours, no status|peer|ours" {
		t.Errorf("round 2: %v, want the order rotated by one", got)
	}
	if got := turn([]string{}, 4); len(got) != 0 {
		t.Errorf("no fleet: %v", got)
	}
}

// TestMemSamples: the API server's memory is read more than once, and
// the figure says how many samples it rests on, their median and range;
// samples that failed (0: the process gone) are not in it.
func TestMemSamples(t *testing.T) {
	m := memSamples([]float64{700, 0, 900, 650, 720})
	if m.N != 4 || m.MedianMiB != 710 || m.MinMiB != 650 || m.MaxMiB != 900 {
		t.Errorf("%+v, want 4 samples, median 710, 650-900", m)
	}
	if got := m.String(); got != "710 MiB (650–900, 4 samples)" {
		t.Errorf("%q", got)
	}
	if got := memSamples(nil).String(); got != "no sample" {
		t.Errorf("no sample: %q", got)
	}
}

// TestFleetSections: each -fleet-md-section has markers of its own, so
// that one fleet's tables do not overwrite another's in the same file;
// the default section keeps the markers of before.
func TestFleetSections(t *testing.T) {
	path := t.TempDir() + "/fleet.md"
	for _, w := range []struct{ section, text string }{{"fleet", "plain\n"}, {"fleet-prebind", "prebind\n"}, {"fleet", "plain again\n"}} {
		b, e := mdMarkers(w.section)
		if err := report.WriteBetween(path, b, e, "", []byte(w.text)); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := readFileString(path)
	if !strings.Contains(got, "plain again") || !strings.Contains(got, "prebind") || strings.Contains(got, "plain\n") {
		t.Errorf("file:\n%s", got)
	}
	if b, e := mdMarkers("fleet"); b != mdBeginFleet || e != mdEndFleet {
		t.Errorf("default markers %q %q", b, e)
	}
}

// TestReplacements: a rollout's replacements as the report gives them:
// medians and maxima, and the old processes killed for not exiting.
func TestReplacements(t *testing.T) {
	s := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
	for _, tc := range []struct {
		name string
		rs   []replacement
		want string
	}{
		{"none", nil, "not measured"},
		{"three", []replacement{{registered: s(0.5), exited: s(0.1)}, {registered: s(2), exited: s(0.3)}, {registered: s(1), exited: s(4)}},
			"1.00 s (2.00); 0.30 s (4.00)"},
		{"one killed", []replacement{{registered: s(0.5), exited: s(10), killed: true}, {registered: s(0.7), exited: s(0.2)}},
			"0.60 s (0.70); 5.10 s (10.00), 1 of 2 killed, not gone within the bound"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := newReplacements(tc.rs).String(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
