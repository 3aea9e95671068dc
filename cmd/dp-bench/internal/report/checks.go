package report

import (
	"fmt"
	"slices"
	"time"
)

// Status of a contract check in one run.
type Status string

// Check statuses.
const (
	Pass Status = "pass"
	Fail Status = "fail"
	Skip Status = "skip"
)

// CheckDef is a contract check: what the kubelet relies on. Its title is
// its row in the contract's table.
type CheckDef struct {
	ID, Title string
}

// PluginChecks are a device plugin's contract with the kubelet, in the
// order the checks run.
var PluginChecks = []CheckDef{
	{"serves-before-register", "serves its socket before it registers (the kubelet dials it during Register)"},
	{"register-version", "registers a supported API version (v1beta1)"},
	{"register-resource", "registers a valid extended resource name (the expected one)"},
	{"register-options", "Register options match GetDevicePluginOptions"},
	{"listandwatch-initial", "ListAndWatch sends the full list at once"},
	{"allocate", "Allocate answers every requested ID and every container"},
	{"allocate-unknown", "Allocate refuses unknown IDs with an error"},
	{"cdi-resolve", "returned CDI names resolve (fresh CDI cache + InjectDevices, as containerd)"},
	{"preferred-allocation", "GetPreferredAllocation keeps must-includes and the size, returns only available IDs"},
	{"prestart", "PreStartContainer answers when advertised"},
	{"listandwatch-change", "ListAndWatch reports a removed device file, and its return"},
	{"uevent-change", "ListAndWatch reports a change that only a kernel uevent shows"},
	{"kubelet-restart", "kubelet restart (directory wiped, kubelet.sock served again): exactly one registration"},
	{"sigterm-socket", "its socket is gone after SIGTERM"},
}

// CheckResult is one check in one run.
type CheckResult struct {
	Status Status `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// MetricDef is a measured figure and the baseline it is compared with
// (none for a count): its row in the measurements' table.
type MetricDef struct {
	ID, Title, Unit, Baseline string
}

// The device plugins' baselines.
const (
	exitGo       = "start → exit of a Go binary that exits at once"
	idleGo       = "an idle Go process"
	idleGoWindow = "an idle Go process, same window"
	optionsRPC   = "GetDevicePluginOptions p50 (empty RPC)"
)

// PluginMetrics are what is measured in every run of a device plugin. A
// baseline is measured in the same run.
var PluginMetrics = []MetricDef{
	{"start-registered", "process start → Register call", "ms", exitGo},
	{"start-listed", "process start → first ListAndWatch list", "ms", exitGo},
	{"ids", "device IDs listed", "", ""},
	{"rss", "resident memory (after the idle window)", "MiB", idleGo},
	{"allocate", "Allocate p50 (up to 8 IDs)", "µs", optionsRPC},
	{"preferred", "GetPreferredAllocation p50 (all IDs available, size 4)", "µs", optionsRPC},
	{"prestart", "PreStartContainer p50 (repeated, up to 8 IDs)", "µs", optionsRPC},
	{"restart-registered", "kubelet restart → registered", "ms", "raw inotify event of kubelet.sock"},
	{"removed-update", "device file removed → ListAndWatch update", "ms", "raw inotify event of the removal"},
	{"uevent-update", "kernel uevent → ListAndWatch update", "ms", "the uevent as a listener receives it"},
	{"idle-cpu", "CPU while idle", "ms/min", idleGoWindow},
	{"idle-wakeups", "wake-ups while idle (voluntary context switches)", "/min", idleGoWindow},
}

// DRAChecks are a DRA driver's contract with the kubelet, in the order
// the checks run.
var DRAChecks = []CheckDef{
	{"dra-register", "registers through the registration socket as a DRA plugin (GetInfo: type, v1 service, endpoint; the expected name)"},
	{"dra-slices", "publishes its devices in ResourceSlices of the node's pools"},
	{"dra-prepare", "NodePrepareResources answers every allocated device with its request and CDI IDs (1 and 8 devices)"},
	{"dra-cdi-resolve", "returned CDI IDs resolve (fresh CDI cache + InjectDevices, as containerd)"},
	{"dra-idempotent", "a second NodePrepareResources of a prepared claim gives the same answer"},
	{"dra-steps-once", "a second NodePrepareResources of a prepared claim runs no step again (the steps' files unchanged)"},
	{"dra-unprepare", "NodeUnprepareResources succeeds, and again for the same claim"},
	{"dra-unprepare-unknown", "NodeUnprepareResources of a claim it never prepared succeeds"},
	{"dra-refuse-unknown", "NodePrepareResources of a claim allocated to a device it does not publish answers an error"},
}

// emptyRPC is the baseline of a DRA driver's calls.
const emptyRPC = "NodeUnprepareResources p50, no claims (empty RPC)"

// DRAMetrics are what is measured in every run of a DRA driver.
var DRAMetrics = []MetricDef{
	{"start-registered", "process start → registered (GetInfo, NotifyRegistrationStatus answered)", "ms", exitGo},
	{"start-sliced", "process start → all its devices schedulable in ResourceSlices (published untainted; watch event)", "ms", "dp-bench's own ResourceSlice: create → watch event"},
	{"dra-devices", "devices published", "", ""},
	{"prepare-1", "NodePrepareResources p50, new claim, 1 device", "µs", emptyRPC},
	{"prepare-8", "NodePrepareResources p50, new claim, 8 devices", "µs", emptyRPC},
	{"prepare-again-1", "NodePrepareResources p50, claim prepared already, 1 device", "µs", emptyRPC},
	{"prepare-again-8", "NodePrepareResources p50, claim prepared already, 8 devices", "µs", emptyRPC},
	{"unprepare-1", "NodeUnprepareResources p50, 1 device", "µs", emptyRPC},
	{"unprepare-8", "NodeUnprepareResources p50, 8 devices", "µs", emptyRPC},
	{"dra-rss", "resident memory (after the calls)", "MiB", idleGo},
	{"claim-get", "GET of a claim by dp-bench, p50 (what every NodePrepareResources does first, in the helper)", "µs", ""},
}

// defsOf are the checks and metrics of a report's kind.
func defsOf(dra bool) ([]CheckDef, []MetricDef) {
	if dra {
		return DRAChecks, DRAMetrics
	}
	return PluginChecks, PluginMetrics
}

// Sample is one measurement and its baseline in the same run.
type Sample struct {
	Value    float64 `json:"value"`
	Baseline float64 `json:"baseline"`
	// HasBase is false where the metric has no baseline.
	HasBase bool `json:"hasBaseline"`
}

// RunResult is one run of one target.
type RunResult struct {
	Checks  map[string]CheckResult `json:"checks"`
	Metrics map[string]Sample      `json:"metrics"`
	// Err is why the run stopped early, if it did.
	Err string `json:"error,omitempty"`
	// Log is the tail of the plugin's output when something failed.
	Log string `json:"log,omitempty"`
}

// NewRunResult is an empty result.
func NewRunResult() *RunResult {
	return &RunResult{Checks: map[string]CheckResult{}, Metrics: map[string]Sample{}}
}

// Pass sets check id's result to a pass, with a detail made as
// fmt.Sprintf makes it (format alone when there are no args); a failure
// already set stands (Set).
func (r *RunResult) Pass(id, format string, args ...any) { r.Set(id, Pass, format, args...) }

// Fail is Pass for a failure.
func (r *RunResult) Fail(id, format string, args ...any) { r.Set(id, Fail, format, args...) }

// Skip is Pass for a check not run.
func (r *RunResult) Skip(id, format string, args ...any) { r.Set(id, Skip, format, args...) }

// Set sets check id to s, unless it failed already: the first failure
// stands.
func (r *RunResult) Set(id string, s Status, format string, args ...any) {
	if _, ok := r.Checks[id]; ok && r.Checks[id].Status == Fail {
		return
	}
	detail := format
	if len(args) > 0 {
		detail = fmt.Sprintf(format, args...)
	}
	r.Checks[id] = CheckResult{Status: s, Detail: detail}
}

// Measure records metric id and its baseline.
func (r *RunResult) Measure(id string, v, base float64) {
	r.Metrics[id] = Sample{Value: v, Baseline: base, HasBase: true}
}

// Count records metric id, a figure without a baseline.
func (r *RunResult) Count(id string, v float64) { r.Metrics[id] = Sample{Value: v} }

// SkipRest skips every check of checks not set yet, for why.
func (r *RunResult) SkipRest(checks []CheckDef, why error) {
	for _, c := range checks {
		if _, ok := r.Checks[c.ID]; !ok {
			r.Skip(c.ID, "not reached: %v", why)
		}
	}
}

// End records why the run stopped early (err, if not nil) and, when it
// did or a check failed, log: the tail of the plugin's output.
func (r *RunResult) End(err error, log string) {
	if err != nil {
		r.Err = err.Error()
	}
	if r.Err != "" || len(r.Failed()) > 0 {
		r.Log = log
	}
}

// Failed lists the IDs of failed checks, in check order.
func (r *RunResult) Failed() []string {
	var ids []string
	for _, c := range slices.Concat(PluginChecks, DRAChecks) {
		if r.Checks[c.ID].Status == Fail {
			ids = append(ids, c.ID)
		}
	}
	return ids
}

// The tables' units.

// Ms is d in milliseconds.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Us is d in microseconds.
func Us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// MiB is b bytes in MiB.
func MiB(b int64) float64 { return float64(b) / (1 << 20) }
