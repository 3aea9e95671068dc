// Package report is what dp-bench reports of its device plugins and DRA
// drivers: the contract's checks and the measured figures (checks.go: the
// rows of the tables, and one run's results), a target's runs folded
// into medians (Summarize), the machine they ran on, the Go benchmarks'
// medians (gobench.go), and the tables in Markdown, written into a file
// between markers that keep the rest of it (WriteBetween, the one marker
// writer, which the fleet's tables use too).
package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/stats"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/target"
)

// Report is what dp-bench writes as JSON.
type Report struct {
	Command  string          `json:"command"`
	Machine  Machine         `json:"machine"`
	Runs     int             `json:"runs"`
	Settings target.Settings `json:"settings"`
	Targets  []TargetReport  `json:"targets"`
	// Compare is the target name the others are compared with, run by run.
	Compare string    `json:"compare,omitempty"`
	GoBench []GoBench `json:"goBenchmarks,omitempty"`
	// DRA: the targets are DRA drivers, run against the API server of
	// version APIServer.
	DRA       bool   `json:"dra,omitempty"`
	APIServer string `json:"apiServer,omitempty"`
}

// Machine describes where the numbers were taken.
type Machine struct {
	CPU       string `json:"cpu"`
	CPUs      int    `json:"cpus"`
	MemoryGiB int    `json:"memoryGiB"`
	Kernel    string `json:"kernel"`
	OS        string `json:"os"`
	Go        string `json:"go"`
	Date      string `json:"date"`
	// LoadBefore and LoadAfter are /proc/loadavg around the runs.
	LoadBefore string `json:"loadBefore"`
	LoadAfter  string `json:"loadAfter"`
}

// TargetReport is a target over all runs.
type TargetReport struct {
	Target  target.Target          `json:"target"`
	Checks  map[string]CheckResult `json:"checks"`
	Metrics map[string]Aggregate   `json:"metrics"`
	Runs    []*RunResult           `json:"runs"`
	// Err is set when the target could not be run at all.
	Err string `json:"error,omitempty"`
}

// Aggregate is a metric over the runs: medians of the value, of the
// baseline, and of the per-run ratio.
type Aggregate struct {
	N        int     `json:"n"`
	Median   float64 `json:"median"`
	Baseline float64 `json:"baselineMedian,omitempty"`
	Ratio    float64 `json:"ratioMedian,omitempty"`
	Min      float64 `json:"min"`
	Max      float64 `json:"max"`
}

// Summarize folds the runs of a target: a check fails if it failed in any
// run, passes if it passed in every run that reached it, else is skipped;
// a metric is the Median of its runs, with the Median of its baselines
// and of the per-run ratios.
func Summarize(t target.Target, runs []*RunResult) TargetReport {
	tr := TargetReport{Target: t, Checks: map[string]CheckResult{}, Metrics: map[string]Aggregate{}, Runs: runs}
	checks, metrics := defsOf(t.DRA != nil)
	for _, c := range checks {
		var res CheckResult
		for i, r := range runs {
			cr, ok := r.Checks[c.ID]
			if !ok {
				continue
			}
			switch {
			case cr.Status == Fail && res.Status != Fail:
				res = cr
				if len(runs) > 1 {
					res.Detail = fmt.Sprintf("run %d: %s", i+1, cr.Detail)
				}
			case cr.Status == Pass && res.Status != Fail:
				res = cr
			case cr.Status == Skip && res.Status == "":
				res = cr
			}
		}
		if res.Status != "" {
			tr.Checks[c.ID] = res
		}
	}
	for _, m := range metrics {
		var vs, bs, rs []float64
		for _, r := range runs {
			s, ok := r.Metrics[m.ID]
			if !ok {
				continue
			}
			vs = append(vs, s.Value)
			if s.HasBase {
				bs = append(bs, s.Baseline)
				if s.Baseline > 0 {
					rs = append(rs, s.Value/s.Baseline)
				}
			}
		}
		if len(vs) == 0 {
			continue
		}
		a := Aggregate{N: len(vs), Median: stats.Median(vs), Min: slices.Min(vs), Max: slices.Max(vs)}
		if len(bs) > 0 {
			a.Baseline = stats.Median(bs)
		}
		if len(rs) > 0 {
			a.Ratio = stats.Median(rs)
		}
		tr.Metrics[m.ID] = a
	}
	return tr
}

// DescribeMachine is the machine dp-bench runs on, now.
func DescribeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC().Format("2006-01-02 15:04 MST"), LoadBefore: Loadavg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.CPU = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if kb, err := proc.StatusField("/proc/meminfo", "MemTotal:"); err == nil {
		m.MemoryGiB = int((kb + 512<<10) >> 20)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	if out, err := exec.Command("go", "env", "GOVERSION").Output(); err == nil {
		m.Go = strings.TrimSpace(string(out))
	}
	return m
}

// Loadavg is /proc/loadavg's 1, 5 and 15 minutes ("" when unknown).
func Loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// Markdown markers: WriteInto replaces what lies between them and keeps
// the rest of the file (notes written by hand). DRA drivers' tables have
// markers of their own, so that one file holds both.
const (
	mdBegin    = "<!-- dp-bench:begin (generated by dp-bench; edit outside these markers) -->"
	mdEnd      = "<!-- dp-bench:end -->"
	mdBeginDRA = "<!-- dp-bench-dra:begin (generated by dp-bench with DRA targets; edit outside these markers) -->"
	mdEndDRA   = "<!-- dp-bench-dra:end -->"
)

// markers are the Markdown markers of rep's kind.
func markers(rep *Report) (string, string) {
	if rep.DRA {
		return mdBeginDRA, mdEndDRA
	}
	return mdBegin, mdEnd
}

// WriteMarkdown writes the tables of rep.
func WriteMarkdown(w io.Writer, rep *Report) {
	m := rep.Machine
	checks, metrics := defsOf(rep.DRA)
	fmt.Fprintf(w, "Generated %s by:\n\n```sh\n%s\n```\n\n", m.Date, rep.Command)
	fmt.Fprintf(w, "Machine: %s, %d CPUs, %d GiB, %s, Linux %s, %s. Load average (1, 5, 15 min) %s before, %s after. ",
		m.CPU, m.CPUs, m.MemoryGiB, m.OS, m.Kernel, m.Go, m.LoadBefore, m.LoadAfter)
	if rep.DRA {
		fmt.Fprintf(w, "%d runs per target, interleaved (run 1 of every target, then run 2, ...); every run is a fresh process, fresh directories, a fresh Node object and kubelet stand-in, against one etcd and kube-apiserver %s for all runs. %d claims per size and run, each call of the driver that reads a claim at least %s after the previous one. Device and CDI directories in %s, the others in %s.\n\n",
			rep.Runs, orUnknown(rep.APIServer), rep.Settings.DRACalls, rep.Settings.APIInterval, orTmp(rep.Settings.TmpfsDir), os.TempDir())
	} else {
		fmt.Fprintf(w, "%d runs per target, interleaved (run 1 of every target, then run 2, ...); every run is a fresh process, fresh directories and a fresh kubelet stand-in. Idle window %s. Device and CDI directories in %s, the others in %s.\n\n",
			rep.Runs, rep.Settings.Idle, orTmp(rep.Settings.TmpfsDir), os.TempDir())
	}

	fmt.Fprintf(w, "### Contract\n\n")
	writeHead(w, rep, "check")
	for _, c := range checks {
		fmt.Fprintf(w, "| %s |", c.Title)
		for i := range rep.Targets {
			t := &rep.Targets[i]
			cr, ok := t.Checks[c.ID]
			switch {
			case t.Err != "":
				fmt.Fprintf(w, " not run |")
			case !ok:
				fmt.Fprintf(w, " – |")
			case cr.Status == Pass:
				fmt.Fprintf(w, " pass |")
			case cr.Status == Fail:
				fmt.Fprintf(w, " **FAIL**: %s |", mdCell(cr.Detail))
			default:
				fmt.Fprintf(w, " n/a: %s |", mdCell(cr.Detail))
			}
		}
		fmt.Fprintln(w)
	}

	fmt.Fprintf(w, "\n### Measurements\n\nEach cell: median over the runs; in brackets the baseline's median and the median of the per-run ratios (value / baseline).\n\n")
	writeHead(w, rep, "metric", "baseline")
	for _, md := range metrics {
		title := md.Title
		if md.Unit != "" {
			title += " (" + md.Unit + ")"
		}
		fmt.Fprintf(w, "| %s | %s |", title, md.Baseline)
		for i := range rep.Targets {
			a, ok := rep.Targets[i].Metrics[md.ID]
			if !ok {
				fmt.Fprintf(w, " – |")
				continue
			}
			if md.Unit == "" {
				fmt.Fprintf(w, " %.0f", a.Median)
			} else {
				fmt.Fprintf(w, " %s", num(a.Median))
			}
			if md.Baseline != "" {
				fmt.Fprintf(w, " (%s", num(a.Baseline))
				if a.Ratio > 0 {
					fmt.Fprintf(w, ", ×%s", num(a.Ratio))
				}
				fmt.Fprintf(w, ")")
			}
			fmt.Fprintf(w, " |")
		}
		fmt.Fprintln(w)
	}
	var errs []string
	for i := range rep.Targets {
		t := &rep.Targets[i]
		if t.Err != "" {
			errs = append(errs, fmt.Sprintf("- %s: not run: %s", t.Target.Label(), t.Err))
		}
		for j, r := range t.Runs {
			if r.Err != "" {
				errs = append(errs, fmt.Sprintf("- %s, run %d stopped early: %s", t.Target.Label(), j+1, r.Err))
			}
		}
	}
	if len(errs) > 0 {
		fmt.Fprintf(w, "\n%s\n", strings.Join(errs, "\n"))
	}
	writeComparison(w, rep)
	writeGoBench(w, rep.GoBench)
	fmt.Fprintln(w)
}

// writeHead writes the head of a table: the columns named first, then
// one per target.
func writeHead(w io.Writer, rep *Report, first ...string) {
	fmt.Fprintf(w, "| %s |", strings.Join(first, " | "))
	for i := range rep.Targets {
		fmt.Fprintf(w, " %s |", rep.Targets[i].Target.Label())
	}
	fmt.Fprintf(w, "\n|%s%s\n", strings.Repeat(" --- |", len(first)), strings.Repeat(" --- |", len(rep.Targets)))
}

func orUnknown(s string) string {
	if s == "" {
		return "(version unknown)"
	}
	return s
}

// pair is a target compared with another of the same group.
type pair struct{ ref, other *TargetReport }

func pairs(rep *Report) []pair {
	var ps []pair
	for i := range rep.Targets {
		ref := &rep.Targets[i]
		if ref.Target.Name != rep.Compare {
			continue
		}
		for j := range rep.Targets {
			o := &rep.Targets[j]
			if o.Target.Name != rep.Compare && o.Target.CompareGroup() == ref.Target.CompareGroup() && o.Err == "" && ref.Err == "" {
				ps = append(ps, pair{ref, o})
			}
		}
	}
	return ps
}

// runRatio is the median over the runs of ref's value / other's value in
// the same run (runs of all targets are interleaved).
func runRatio(p pair, id string) (float64, bool) {
	var rs []float64
	for i := 0; i < len(p.ref.Runs) && i < len(p.other.Runs); i++ {
		a, okA := p.ref.Runs[i].Metrics[id]
		b, okB := p.other.Runs[i].Metrics[id]
		if okA && okB && b.Value > 0 {
			rs = append(rs, a.Value/b.Value)
		}
	}
	if len(rs) == 0 {
		return 0, false
	}
	return stats.Median(rs), true
}

// writeComparison writes, for the -compare target, its ratio to every
// other target of the same group.
func writeComparison(w io.Writer, rep *Report) {
	ps := pairs(rep)
	if len(ps) == 0 {
		return
	}
	_, metrics := defsOf(rep.DRA)
	fmt.Fprintf(w, "\n### %s side by side\n\nMedian over the runs of %s's value ÷ the other's value in the same round (below 1: %s is lower).\n\n| metric |", rep.Compare, rep.Compare, rep.Compare)
	for _, h := range comparisonHeads(ps) {
		fmt.Fprintf(w, " %s |", h)
	}
	fmt.Fprintf(w, "\n| --- |%s\n", strings.Repeat(" --- |", len(ps)))
	for _, md := range metrics {
		if md.Baseline == "" {
			continue // counts, and the API server's own figures
		}
		fmt.Fprintf(w, "| %s |", md.Title)
		for i := range ps {
			if r, ok := runRatio(ps[i], md.ID); ok {
				fmt.Fprintf(w, " %s |", num(r))
			} else {
				fmt.Fprintf(w, " – |")
			}
		}
		fmt.Fprintln(w)
	}
}

func orTmp(d string) string {
	if d == "" {
		return os.TempDir()
	}
	return d
}

// mdCell is s escaped for a table's cell and cut at 160 bytes.
func mdCell(s string) string {
	s = MDEscape(s)
	if len(s) > 160 {
		s = s[:157] + "..."
	}
	return s
}

// num prints a figure with about three significant digits.
func num(v float64) string {
	switch av := max(v, -v); {
	case av == 0:
		return "0"
	case av >= 100:
		return fmt.Sprintf("%.0f", v)
	case av >= 10:
		return fmt.Sprintf("%.1f", v)
	case av >= 1:
		return fmt.Sprintf("%.2f", v)
	case av >= 0.01:
		return fmt.Sprintf("%.3f", v)
	default:
		return fmt.Sprintf("%.1e", v)
	}
}

// comparisonHeads are the column heads of the comparison: "÷ other", or
// "ref ÷ other" where one other is compared with several of ours.
func comparisonHeads(ps []pair) []string {
	n := map[string]int{}
	for _, p := range ps {
		n[p.other.Target.Label()]++
	}
	var out []string
	for _, p := range ps {
		if n[p.other.Target.Label()] > 1 {
			out = append(out, p.ref.Target.Label()+" ÷ "+p.other.Target.Label())
		} else {
			out = append(out, "÷ "+p.other.Target.Label())
		}
	}
	return out
}

// MDEscape is s escaped for a Markdown table's cell: its pipes escaped,
// its lines joined.
func MDEscape(s string) string { return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s) }

// WriteInto writes the tables into path between the markers of rep's
// kind (WriteBetween); a new file gets a title.
func WriteInto(path string, rep *Report) error {
	begin, end := markers(rep)
	var gen bytes.Buffer
	WriteMarkdown(&gen, rep)
	return WriteBetween(path, begin, end, "# Benchmarks\n\n", gen.Bytes())
}

// WriteBetween writes gen into the file at path between the markers begin
// and end, and keeps what lies outside them (notes written by hand). A
// file without the markers gets them, with gen, at its end; a new or
// empty one gets title first. A file with one marker and not the other
// after it is an error: a write would leave a stray marker.
func WriteBetween(path, begin, end, title string, gen []byte) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	s := string(old)
	block := begin + "\n" + string(gen) + end
	before, rest, hasBegin := strings.Cut(s, begin)
	_, after, hasEnd := strings.Cut(rest, end)
	switch {
	case hasBegin && hasEnd:
		s = before + block + after
	case hasBegin:
		return fmt.Errorf("%s: %q without %q after it", path, begin, end)
	case strings.Contains(s, end):
		return fmt.Errorf("%s: %q without %q before it", path, end, begin)
	case s != "":
		s = strings.TrimRight(s, "\n") + "\n\n" + block + "\n"
	default:
		s = title + block + "\n"
	}
	return os.WriteFile(path, []byte(s), 0o644)
}

// WriteJSON writes v, indented, to the file path (the -json and
// -fleet-json reports).
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
