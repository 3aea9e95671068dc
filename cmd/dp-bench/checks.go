package main

import "slices"

// Status of a contract check in one run.
type Status string

// Check statuses.
const (
	Pass Status = "pass"
	Fail Status = "fail"
	Skip Status = "skip"
)

// checkDef is a contract check: what the kubelet relies on.
type checkDef struct {
	ID, Title string
}

// The kubelet's contract, in the order the checks run.
var checkDefs = []checkDef{
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

// metricDef is a measured figure and the baseline it is compared with.
type metricDef struct {
	ID, Title, Unit, Baseline string
}

// What is measured in every run. A baseline is measured in the same run.
var metricDefs = []metricDef{
	{"start-registered", "process start → Register call", "ms", "start → exit of a Go binary that exits at once"},
	{"start-listed", "process start → first ListAndWatch list", "ms", "start → exit of a Go binary that exits at once"},
	{"ids", "device IDs listed", "", ""},
	{"rss", "resident memory (after the idle window)", "MiB", "an idle Go process"},
	{"allocate", "Allocate p50 (up to 8 IDs)", "µs", "GetDevicePluginOptions p50 (empty RPC)"},
	{"preferred", "GetPreferredAllocation p50 (all IDs available, size 4)", "µs", "GetDevicePluginOptions p50 (empty RPC)"},
	{"prestart", "PreStartContainer p50 (repeated, up to 8 IDs)", "µs", "GetDevicePluginOptions p50 (empty RPC)"},
	{"restart-registered", "kubelet restart → registered", "ms", "raw inotify event of kubelet.sock"},
	{"removed-update", "device file removed → ListAndWatch update", "ms", "raw inotify event of the removal"},
	{"uevent-update", "kernel uevent → ListAndWatch update", "ms", "the uevent as a listener receives it"},
	{"idle-cpu", "CPU while idle", "ms/min", "an idle Go process, same window"},
	{"idle-wakeups", "wake-ups while idle (voluntary context switches)", "/min", "an idle Go process, same window"},
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

func newRunResult() *RunResult {
	return &RunResult{Checks: map[string]CheckResult{}, Metrics: map[string]Sample{}}
}

func (r *RunResult) pass(id, format string, args ...any) { r.set(id, Pass, format, args...) }
func (r *RunResult) fail(id, format string, args ...any) { r.set(id, Fail, format, args...) }
func (r *RunResult) skip(id, format string, args ...any) { r.set(id, Skip, format, args...) }

func (r *RunResult) set(id string, s Status, format string, args ...any) {
	if _, ok := r.Checks[id]; ok && r.Checks[id].Status == Fail {
		return // the first failure stands
	}
	r.Checks[id] = CheckResult{Status: s, Detail: sprintf(format, args...)}
}

func (r *RunResult) measure(id string, v, base float64) {
	r.Metrics[id] = Sample{Value: v, Baseline: base, HasBase: true}
}

func (r *RunResult) count(id string, v float64) { r.Metrics[id] = Sample{Value: v} }

// Failed lists the IDs of failed checks, in check order.
func (r *RunResult) Failed() []string {
	var ids []string
	for _, c := range slices.Concat(checkDefs, draCheckDefs) {
		if r.Checks[c.ID].Status == Fail {
			ids = append(ids, c.ID)
		}
	}
	return ids
}
