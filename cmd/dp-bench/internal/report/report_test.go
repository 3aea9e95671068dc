package report

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/target"
)

// measured is a run that measured metric id: v next to base.
func measured(id string, v, base float64) *RunResult {
	r := NewRunResult()
	r.Measure(id, v, base)
	return r
}

// written is what write writes.
func written(write func(io.Writer)) string {
	var b bytes.Buffer
	write(&b)
	return b.String()
}

// TestSummarize: a check failed in any run fails; medians of values,
// baselines and per-run ratios.
func TestSummarize(t *testing.T) {
	mk := func(s Status, v, b float64) *RunResult {
		r := NewRunResult()
		r.Set("allocate", s, "run")
		r.Measure("allocate", v, b)
		return r
	}
	tr := Summarize(target.Target{Name: "x"}, []*RunResult{mk(Pass, 10, 5), mk(Fail, 30, 10), mk(Pass, 20, 5)})
	if c := tr.Checks["allocate"]; c.Status != Fail || c.Detail != "run 2: run" {
		t.Errorf("check %+v", c)
	}
	a := tr.Metrics["allocate"]
	if a.N != 3 || a.Median != 20 || a.Baseline != 5 || a.Ratio != 3 || a.Min != 10 || a.Max != 30 {
		t.Errorf("aggregate %+v", a)
	}
}

// TestWriteMarkdownInto keeps what lies outside the markers.
func TestWriteMarkdownInto(t *testing.T) {
	p := filepath.Join(t.TempDir(), "b.md")
	rep := &Report{Command: "dp-bench -runs 1", Runs: 1, Targets: []TargetReport{Summarize(target.Target{Name: "x"}, []*RunResult{NewRunResult()})}}
	if err := os.WriteFile(p, []byte("# Title\n\nintro\n\n"+mdBegin+"\nold\n"+mdEnd+"\n\n## Notes\nkept\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteInto(p, rep); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	s := string(b)
	for _, want := range []string{"# Title\n\nintro\n\n" + mdBegin + "\n", "dp-bench -runs 1", "| check | x |", mdEnd + "\n\n## Notes\nkept\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("missing %q in:\n%s", want, s)
		}
	}
	if strings.Contains(s, "\nold\n") {
		t.Errorf("old block kept:\n%s", s)
	}
}

func TestReadGoBench(t *testing.T) {
	out := `goos: linux
pkg: example.com/m/plugin
BenchmarkAllocate8-2   	  200	      4000 ns/op	    3528 B/op	      41 allocs/op
BenchmarkAllocate8-2   	  200	      5000 ns/op	    3528 B/op	      41 allocs/op
BenchmarkAllocate8-2   	  200	      9000 ns/op	    3528 B/op	      41 allocs/op
BenchmarkPreferredAllocation/8dev-2   	  200	      2902 ns/op
PASS
pkg: example.com/m/cdi
BenchmarkBuildSpec10000-2   	  20	   8712491 ns/op	 6799467 B/op	  119905 allocs/op
`
	got, err := readGoBench(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	want := []GoBench{
		{Package: "example.com/m/plugin", Name: "BenchmarkAllocate8", N: 3, NsPerOp: 5000, BPerOp: 3528, AllocsOp: 41},
		{Package: "example.com/m/plugin", Name: "BenchmarkPreferredAllocation/8dev", N: 1, NsPerOp: 2902},
		{Package: "example.com/m/cdi", Name: "BenchmarkBuildSpec10000", N: 1, NsPerOp: 8712491, BPerOp: 6799467, AllocsOp: 119905},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if s := written(func(w io.Writer) { writeGoBench(w, got) }); !strings.Contains(s, "| BuildSpec10000 | cdi | 8.71ms | 6799467 | 119905 | 1 |") {
		t.Errorf("table:\n%s", s)
	}
}

// TestComparison: the ratio of the compared target to a peer is taken run
// by run, only between targets of the same scenario.
func TestComparison(t *testing.T) {
	run := func(v float64) *RunResult { return measured("start-registered", v, 1) }
	rep := &Report{Compare: "ours", Targets: []TargetReport{
		Summarize(target.Target{Name: "ours", Scenario: "8"}, []*RunResult{run(10), run(40), run(12)}),
		Summarize(target.Target{Name: "peer", Scenario: "8"}, []*RunResult{run(20), run(20), run(12)}),
		Summarize(target.Target{Name: "other", Scenario: "2"}, []*RunResult{run(1), run(1), run(1)}),
	}}
	ps := pairs(rep)
	if len(ps) != 1 || ps[0].other.Target.Name != "peer" {
		t.Fatalf("pairs %+v", ps)
	}
	if r, ok := runRatio(ps[0], "start-registered"); !ok || r != 1 {
		t.Fatalf("ratio %v %v, want the median of 0.5, 2, 1", r, ok)
	}
	if s := written(func(w io.Writer) { writeComparison(w, rep) }); !strings.Contains(s, "| process start → Register call | 1.00 |") {
		t.Errorf("table:\n%s", s)
	}
}

// TestDRAReport: DRA targets get their own checks, metrics and markers,
// so that one file holds both kinds of tables; the comparison pairs by
// group and names both sides where one peer meets several of ours.
func TestDRAReport(t *testing.T) {
	run := func(v float64) *RunResult {
		r := measured("prepare-8", v, 100)
		r.Pass("dra-register", "ok")
		r.Fail("dra-idempotent", "changed")
		r.Metrics["claim-get"] = Sample{Value: 7}
		return r
	}
	dra := &target.DRATarget{Driver: "d"}
	rep := &Report{DRA: true, Compare: "ours", Runs: 1, Targets: []TargetReport{
		Summarize(target.Target{Name: "ours", Scenario: "8, steps", Group: "8", DRA: dra}, []*RunResult{run(300)}),
		Summarize(target.Target{Name: "ours", Scenario: "8, no steps", Group: "8", DRA: dra}, []*RunResult{run(200)}),
		Summarize(target.Target{Name: "peer", Scenario: "8", DRA: dra}, []*RunResult{run(100)}),
	}}
	if f := rep.Targets[0].Runs[0].Failed(); !slices.Equal(f, []string{"dra-idempotent"}) {
		t.Errorf("failed %v", f)
	}
	var b bytes.Buffer
	WriteMarkdown(&b, rep)
	s := b.String()
	for _, want := range []string{
		"| registers through the registration socket as a DRA plugin",
		"| a second NodePrepareResources of a prepared claim gives the same answer | **FAIL**: changed |",
		"| NodePrepareResources p50, new claim, 8 devices (µs) | NodeUnprepareResources p50, no claims (empty RPC) | 300 (100, ×3.00) | 200 (100, ×2.00) | 100 (100, ×1.00) |",
		"| GET of a claim by dp-bench, p50 (what every NodePrepareResources does first, in the helper) (µs) |  | 7.00 | 7.00 | 7.00 |",
		"| metric | ours (8, steps) ÷ peer (8) | ours (8, no steps) ÷ peer (8) |",
		"| NodePrepareResources p50, new claim, 8 devices | 3.00 | 2.00 |",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("missing %q in:\n%s", want, s)
		}
	}
	for _, absent := range []string{"Allocate", "| GET of a claim by dp-bench, p50 (what every NodePrepareResources does first, in the helper) | 1.00"} {
		if strings.Contains(s, absent) {
			t.Errorf("%q in:\n%s", absent, s)
		}
	}
	// Both kinds of tables in one file, each between its markers.
	p := filepath.Join(t.TempDir(), "b.md")
	if err := os.WriteFile(p, []byte("intro\n"+mdBegin+"\nplugins\n"+mdEnd+"\nmiddle\n"+mdBeginDRA+"\nold\n"+mdEndDRA+"\nend\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteInto(p, rep); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(p)
	if !strings.HasPrefix(string(got), "intro\n"+mdBegin+"\nplugins\n"+mdEnd+"\nmiddle\n"+mdBeginDRA+"\nGenerated") ||
		!strings.HasSuffix(string(got), mdEndDRA+"\nend\n") || strings.Contains(string(got), "\nold\n") {
		t.Errorf("file:\n%s", got)
	}
}

// TestWriteBetween: a file without the markers gets them at its end, a
// new one gets the title first; a marker without the other is an error
// and the file is left as it was (writeMarkdownInto appended a second
// block after a lone begin marker, leaving it stray).
func TestWriteBetween(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "new.md")
	if err := WriteBetween(p, "<!-- b -->", "<!-- e -->", "# T\n\n", []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "# T\n\n<!-- b -->\none\n<!-- e -->\n" {
		t.Errorf("new file:\n%q", b)
	}
	p = filepath.Join(dir, "notes.md")
	if err := os.WriteFile(p, []byte("notes\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteBetween(p, "<!-- b -->", "<!-- e -->", "# T\n\n", []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "notes\n\n<!-- b -->\none\n<!-- e -->\n" {
		t.Errorf("file without markers:\n%q", b)
	}
	for name, body := range map[string]string{"begin only": "a\n<!-- b -->\nold\n", "end only": "a\n<!-- e -->\n", "end first": "<!-- e -->\n<!-- b -->\n"} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".md")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := WriteBetween(p, "<!-- b -->", "<!-- e -->", "", []byte("new\n")); err == nil || !strings.Contains(err.Error(), "without") {
			t.Errorf("%s: error %v, want one naming the marker without the other", name, err)
		}
		if b, _ := os.ReadFile(p); string(b) != body {
			t.Errorf("%s: file changed:\n%q", name, b)
		}
	}
}
