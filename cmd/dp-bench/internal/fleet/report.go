package fleet

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/audit"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/stats"
)

// Report is what -fleet measured.
type Report struct {
	Command   string         `json:"command"`
	Machine   report.Machine `json:"machine"`
	N         int            `json:"nodes"`
	APIServer string         `json:"apiServer"`
	Steady    string         `json:"steady"`
	Storm     string         `json:"storm"`
	Rollout   RolloutMode    `json:"rollout"`
	Targets   []TargetReport `json:"targets"`
}

// TargetReport is one driver's figures on the fleet.
type TargetReport struct {
	Name   string `json:"name"`
	Driver string `json:"driver"`
	Agent  string `json:"agent"`
	Err    string `json:"error,omitempty"`

	Devices      int     `json:"devices"`
	StartSlicesS float64 `json:"startSlicesS"`
	// StartDriverCPUMs, StartControlPlaneS: CPU spent from the start to
	// all devices published: a driver's (the drivers' sum over the
	// nodes) and the control plane's.
	StartDriverCPUMs   float64      `json:"startDriverCPUMs"`
	StartControlPlaneS float64      `json:"startControlPlaneS"`
	Pods               int          `json:"pods"`
	BoundPerS          float64      `json:"boundPerS"`    // the rounds' median
	PreparedPerS       float64      `json:"preparedPerS"` // the rounds' median
	Rounds             []schedRound `json:"rounds"`
	PrepareErrors      int64        `json:"prepareErrors"`
	SteadyPerNodeMin   float64      `json:"steadyWritesPerNodeMin"`
	Steady             audit.Tally  `json:"steadyWrites"`
	// SteadyCPUMsPerNodeMin is each driver's on-CPU time in the steady
	// window, milliseconds per minute (the mean over the nodes).
	SteadyCPUMsPerNodeMin float64 `json:"steadyDriverCPUMsPerNodeMin"`
	// SteadyAll is apiserver_request_total's writes in the steady window,
	// all clients (the control plane's own included).
	SteadyAll map[string]float64 `json:"steadyAllClients,omitempty"`
	// SteadyTraffic is the steady window's claim traffic.
	SteadyTraffic *traffic `json:"steadyTraffic,omitempty"`

	StormNA    string `json:"stormNA,omitempty"`
	StormFlips int    `json:"stormFlips"`
	// StormPerNodeS counts the storm and the second after it (the last
	// state's publish); StormDuringPerNodeS the storm alone.
	StormPerNodeS       float64     `json:"stormSliceWritesPerNodeS"`
	Storm               audit.Tally `json:"stormSliceWrites"`
	StormDuringPerNodeS float64     `json:"stormDuringSliceWritesPerNodeS"`
	StormDuring         int         `json:"stormDuringSliceWrites"`
	StormLastS          float64     `json:"stormLastPublishedS"`
	RolloutPerNode      float64     `json:"rolloutSliceWritesPerNode"`
	Rollout             audit.Tally `json:"rolloutSliceWrites"`
	// RolloutPreparedS: the rollout's start → the last of the pods
	// created during it prepared. RolloutS: → that, every driver replaced
	// (the old processes gone) and the slices clean, all at once.
	RolloutPreparedS float64 `json:"rolloutPreparedS"`
	RolloutS         float64 `json:"rolloutS"`
	// RolloutNodes is how each node's driver was replaced.
	RolloutNodes replacements `json:"rolloutNodes"`
	// RolloutDriverCPUMs is a new driver's CPU by the rollout's end (all
	// of its life; the mean), RolloutControlPlaneCPUS the control plane's
	// over the rollout.
	RolloutDriverCPUMs      float64  `json:"rolloutDriverCPUMs"`
	RolloutControlPlaneCPUS float64  `json:"rolloutControlPlaneCPUS"`
	RolloutPods             int      `json:"rolloutPods"`
	RolloutFailed           []string `json:"rolloutFailed,omitempty"`
	// Health is what the stand-in's health streams (NodeWatchResources,
	// one per registered driver, as the kubelet opens) read.
	Health          string  `json:"healthStreams"`
	DriverRSSMiB    float64 `json:"driverRSSMiB"`
	DriverRSSMaxMiB float64 `json:"driverRSSMaxMiB"`
	// APIServerRSS is the API server's memory sampled once a second
	// through the steady window (the last round's pods and claims held).
	APIServerRSS memStats `json:"apiServerRSS"`
}

// memStats sums up memory samples, MiB.
type memStats struct {
	N         int     `json:"samples"`
	MedianMiB float64 `json:"medianMiB,omitempty"`
	MinMiB    float64 `json:"minMiB,omitempty"`
	MaxMiB    float64 `json:"maxMiB,omitempty"`
}

// replacements sums up the nodes' replacements in a rollout: medians and
// maxima in seconds, and how many old processes were killed.
type replacements struct {
	N             int     `json:"nodes"`
	RegisteredS   float64 `json:"registeredMedianS"`
	RegisteredMax float64 `json:"registeredMaxS"`
	ExitedS       float64 `json:"exitedMedianS"`
	ExitedMax     float64 `json:"exitedMaxS"`
	Killed        int     `json:"killed"`
}

func newReplacements(rs []replacement) replacements {
	out := replacements{N: len(rs)}
	var reg, ex []float64
	for _, r := range rs {
		reg = append(reg, r.registered.Seconds())
		ex = append(ex, r.exited.Seconds())
		if r.killed {
			out.Killed++
		}
	}
	out.RegisteredS, out.ExitedS = stats.Median(reg), stats.Median(ex)
	if len(rs) > 0 {
		out.RegisteredMax, out.ExitedMax = slices.Max(reg), slices.Max(ex)
	}
	return out
}

func (r replacements) String() string {
	if r.N == 0 {
		return "not measured"
	}
	s := fmt.Sprintf("%.2f s (%.2f); %.2f s (%.2f)", r.RegisteredS, r.RegisteredMax, r.ExitedS, r.ExitedMax)
	if r.Killed > 0 {
		s += fmt.Sprintf(", %d of %d killed, not gone within the bound", r.Killed, r.N)
	}
	return s
}

// memSamples sums up samples (MiB); 0 is a failed sample, left out.
func memSamples(samples []float64) memStats {
	var v []float64
	for _, s := range samples {
		if s > 0 {
			v = append(v, s)
		}
	}
	if len(v) == 0 {
		return memStats{}
	}
	return memStats{N: len(v), MedianMiB: stats.Median(v), MinMiB: slices.Min(v), MaxMiB: slices.Max(v)}
}

func (m memStats) String() string {
	if m.N == 0 {
		return "no sample"
	}
	return fmt.Sprintf("%.0f MiB (%.0f–%.0f, %d samples)", m.MedianMiB, m.MinMiB, m.MaxMiB, m.N)
}

// schedRound is one scheduling round's rates, pods per second from the
// first pod's creation to the last binding (the API server's stamp in the
// audit log) and to the last NodePrepareResources answered.
type schedRound struct {
	BoundPerS    float64 `json:"boundPerS"`
	PreparedPerS float64 `json:"preparedPerS"`
	// Per pod: from its binding to its preparation (the stand-in's
	// queue, the claim GET and the call), and the NodePrepareResources
	// call alone; milliseconds.
	BindToPreparedP50Ms float64 `json:"bindToPreparedP50Ms"`
	BindToPreparedP99Ms float64 `json:"bindToPreparedP99Ms"`
	// Of binding → prepared, the stand-in's pod watch: from the binding
	// to the watch's event that showed it.
	WatchDelayP50Ms  float64 `json:"watchDelayP50Ms"`
	WatchDelayP99Ms  float64 `json:"watchDelayP99Ms"`
	PrepareCallP50Ms float64 `json:"prepareCallP50Ms"`
	PrepareCallP99Ms float64 `json:"prepareCallP99Ms"`
	// On-CPU time from the first pod's creation to the last pod prepared
	// (fleetcpu.go): all the drivers', per pod; the control plane's and
	// the stand-in's (dp-bench), seconds.
	DriverCPUPerPodMs float64 `json:"driverCPUPerPodMs"`
	ControlPlaneCPUS  float64 `json:"controlPlaneCPUS"`
	StandInCPUS       float64 `json:"standInCPUS"`
	// Traffic is the round's claim traffic, from the first pod's creation
	// to the last pod prepared.
	Traffic *traffic `json:"traffic,omitempty"`
}

// Markers of the fleet's tables in -fleet-md.
const (
	mdBeginFleet = "<!-- dp-bench-fleet:begin (generated by dp-bench -fleet; edit outside these markers) -->"
	mdEndFleet   = "<!-- dp-bench-fleet:end -->"
)

// mdMarkers are the markers of a section of -fleet-md (-fleet-md-section):
// "fleet" has mdBeginFleet and mdEndFleet.
func mdMarkers(section string) (begin, end string) {
	return "<!-- dp-bench-" + section + ":begin (generated by dp-bench -fleet; edit outside these markers) -->", "<!-- dp-bench-" + section + ":end -->"
}

// writeMarkdown writes the fleet's tables, the targets side by side.
func writeMarkdown(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "Generated by `%s` on %s (%s, %d CPUs, %d GiB; load %s before, %s after), kube-apiserver %s, %d nodes of 8 simulated devices per driver, each driver on a fresh control plane.\n\n",
		rep.Command, rep.Machine.Date, rep.Machine.CPU, rep.Machine.CPUs, rep.Machine.MemoryGiB, rep.Machine.LoadBefore, rep.Machine.LoadAfter, rep.APIServer, rep.N)
	fmt.Fprintf(w, "| figure | goal |")
	for i := range rep.Targets {
		fmt.Fprintf(w, " %s |", rep.Targets[i].Name)
	}
	fmt.Fprintf(w, "\n| --- | --- |%s\n", strings.Repeat(" ---: |", len(rep.Targets)))
	row := func(name, goal string, cell func(t *TargetReport) string) {
		fmt.Fprintf(w, "| %s | %s |", name, goal)
		for i := range rep.Targets {
			t := &rep.Targets[i]
			if t.Err != "" && t.Pods == 0 {
				fmt.Fprintf(w, " not run: %s |", report.MDEscape(proc.Tail(t.Err, 120)))
				continue
			}
			fmt.Fprintf(w, " %s |", cell(t))
		}
		fmt.Fprintln(w)
	}
	row("start: every driver at once → all devices in ResourceSlices", "", func(t *TargetReport) string { return fmt.Sprintf("%.1f s", t.StartSlicesS) })
	row("start: CPU by then, a driver's (the drivers' sum over the nodes); the control plane's", "reported", func(t *TargetReport) string {
		return fmt.Sprintf("%.0f ms; %.1f s", t.StartDriverCPUMs, t.StartControlPlaneS)
	})
	row("claim pods (1 device each), created at once", "", func(t *TargetReport) string { return fmt.Sprintf("%d of %d devices", t.Pods, t.Devices) })
	row("scheduling: pods/s, creation → bound", "≥ the peer's", func(t *TargetReport) string { return fmt.Sprintf("%.1f", t.BoundPerS) })
	row("scheduling: pods/s, creation → prepared (the stand-in's pod watch delay included, below)", "≥ the peer's", func(t *TargetReport) string { return fmt.Sprintf("%.1f", t.PreparedPerS) })
	row("per pod: binding → prepared, p50 / p99 (median of the rounds)", "", func(t *TargetReport) string {
		return fmt.Sprintf("%.0f / %.0f ms", roundsMedian(t.Rounds, func(r schedRound) float64 { return r.BindToPreparedP50Ms }),
			roundsMedian(t.Rounds, func(r schedRound) float64 { return r.BindToPreparedP99Ms }))
	})
	row("of it, the stand-in's pod watch (binding → the watch's event), p50 / p99", "", func(t *TargetReport) string {
		return fmt.Sprintf("%.0f / %.0f ms", roundsMedian(t.Rounds, func(r schedRound) float64 { return r.WatchDelayP50Ms }),
			roundsMedian(t.Rounds, func(r schedRound) float64 { return r.WatchDelayP99Ms }))
	})
	row("per pod: the NodePrepareResources call, p50 / p99 (median of the rounds)", "", func(t *TargetReport) string {
		return fmt.Sprintf("%.1f / %.1f ms", roundsMedian(t.Rounds, func(r schedRound) float64 { return r.PrepareCallP50Ms }),
			roundsMedian(t.Rounds, func(r schedRound) float64 { return r.PrepareCallP99Ms }))
	})
	row("scheduling, CPU a round (median): all drivers per pod prepared; control plane (etcd, kube-apiserver, -scheduler, -controller-manager); dp-bench (the stand-in)", "reported", func(t *TargetReport) string {
		return fmt.Sprintf("%.1f ms; %.1f s; %.1f s", roundsMedian(t.Rounds, func(r schedRound) float64 { return r.DriverCPUPerPodMs }),
			roundsMedian(t.Rounds, func(r schedRound) float64 { return r.ControlPlaneCPUS }), roundsMedian(t.Rounds, func(r schedRound) float64 { return r.StandInCPUS }))
	})
	row(fmt.Sprintf("steady state (%s): driver API writes per node per minute", rep.Steady), "0", func(t *TargetReport) string {
		return fmt.Sprintf("%.2f (%d)%s", t.SteadyPerNodeMin, t.Steady.Total, kinds(t.Steady.ByKind))
	})
	row("steady state: driver CPU per node per minute", "reported", func(t *TargetReport) string { return fmt.Sprintf("%.2f ms", t.SteadyCPUMsPerNodeMin) })
	row(fmt.Sprintf("health storm (%s): slice writes per node per second", rep.Storm), "≤ 1", func(t *TargetReport) string {
		if t.StormNA != "" {
			return t.StormNA
		}
		return fmt.Sprintf("%.2f, with the second after it (%.2f in the storm alone; at most %d of a node in any 1 s)", t.StormPerNodeS, t.StormDuringPerNodeS, t.Storm.MaxNodeSecond)
	})
	row("health storm: last state published after its end", "≤ 1 s", func(t *TargetReport) string {
		if t.StormNA != "" {
			return "n/a"
		}
		return fmt.Sprintf("%.2f s", t.StormLastS)
	})
	mode := rep.Rollout
	if mode == "" {
		mode = RolloutSurge
	}
	row("rollout ("+mode.what()+"): slice writes per node", "≤ 2", func(t *TargetReport) string {
		return fmt.Sprintf("%.2f (at most %d)%s", t.RolloutPerNode, t.Rollout.MaxNode, kinds(t.Rollout.ByKind))
	})
	row("rollout: pods failed (of those prepared, and those created during it)", "0", func(t *TargetReport) string {
		return fmt.Sprintf("%d (%d created during it; all prepared %.1f s after the rollout began; every driver replaced and that done at %.1f s)",
			len(t.RolloutFailed), t.RolloutPods, t.RolloutPreparedS, t.RolloutS)
	})
	row("rollout: each node's replacement: the new driver's start → registered; the old one's SIGTERM → exit: median (max)", "reported", func(t *TargetReport) string {
		return t.RolloutNodes.String()
	})
	row("rollout: CPU by its end: a new driver's (all its life, the mean); the control plane's over the rollout", "reported", func(t *TargetReport) string {
		return fmt.Sprintf("%.0f ms; %.1f s", t.RolloutDriverCPUMs, t.RolloutControlPlaneCPUS)
	})
	row("claim traffic while claims are allocated (a round, from the first pod's creation to the last prepared; the median round): driver writes per node; controller writes; claim watch events per node, to every watcher; of a node's labelled-claim watch per node (max)", "reported", func(t *TargetReport) string {
		return roundTraffic(t.Rounds)
	})
	row("claim traffic at rest (the steady window): the same", "reported", func(t *TargetReport) string { return t.SteadyTraffic.String() })
	row("health streams (NodeWatchResources, opened on each registration as the kubelet does)", "reported", func(t *TargetReport) string { return t.Health })
	row("driver resident memory per node, median (max)", "reported", func(t *TargetReport) string {
		return fmt.Sprintf("%.1f MiB (%.1f)", t.DriverRSSMiB, t.DriverRSSMaxMiB)
	})
	row("kube-apiserver resident memory in the steady window (the last round's pods held), once a second: median (range)", "reported", func(t *TargetReport) string { return t.APIServerRSS.String() })
	for i := range rep.Targets {
		if t := &rep.Targets[i]; t.Err != "" {
			fmt.Fprintf(w, "\n%s stopped: %s\n", t.Name, report.MDEscape(t.Err))
		}
	}
}

// roundsMedian is the median of a figure over the rounds (0 for none).
func roundsMedian(rs []schedRound, f func(schedRound) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	return stats.Median(v)
}

// kinds is " — verb resource n, ..." for a tally's kinds.
func kinds(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return ": " + strings.Join(parts, ", ")
}

func (t *traffic) String() string {
	if t == nil {
		return "not measured"
	}
	node := "no labelled-claim watch"
	if t.NodeWatch != nil {
		node = fmt.Sprintf("%.2f (%d)", t.NodeWatch.PerNode, t.NodeWatch.MaxNode)
	}
	return fmt.Sprintf("%.2f%s; %d%s; %.1f; %s", t.DriverWritesPerNode, kinds(t.DriverWrites.ByKind), t.ControllerWrites.Total, kinds(t.ControllerWrites.ByKind), t.ClaimWatchEventsPerNode, node)
}

// roundTraffic is the traffic of the round whose driver writes are the
// median (the rounds are alike: each the same pods on the same devices).
func roundTraffic(rs []schedRound) string {
	var ts []*traffic
	for _, r := range rs {
		if r.Traffic != nil {
			ts = append(ts, r.Traffic)
		}
	}
	if len(ts) == 0 {
		return "not measured"
	}
	sort.SliceStable(ts, func(i, j int) bool { return ts[i].DriverWrites.Total < ts[j].DriverWrites.Total })
	return ts[(len(ts)-1)/2].String() + fmt.Sprintf(" (of %d rounds)", len(ts))
}
