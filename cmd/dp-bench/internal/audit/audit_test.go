package audit

import (
	"io"
	"strings"
	"testing"
	"time"
)

// Two audit events as kube-apiserver v1.36 writes them (--audit-log-format
// json, level Metadata): a driver's slice update, impersonating its node,
// and the scheduler's binding; a RequestReceived stage is skipped.
const auditText = `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"5b0d7c1e-6a0f-4a65-9d1f-0c6f2d1b7a11","stage":"ResponseComplete","requestURI":"/apis/resource.k8s.io/v1/resourceslices/fleet-node-3-bench.example.com-x7k2p","verb":"update","user":{"username":"dp-bench","groups":["system:masters","system:authenticated"]},"impersonatedUser":{"username":"fleet:fleet-node-3","groups":["system:masters"]},"sourceIPs":["127.0.0.1"],"userAgent":"cdi-dra-driver/v0.0.0 (linux/amd64) kubernetes/$Format","objectRef":{"resource":"resourceslices","name":"fleet-node-3-bench.example.com-x7k2p","apiGroup":"resource.k8s.io","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-11-27T08:00:01.100000Z","stageTimestamp":"2026-11-27T08:00:01.104512Z","annotations":{"authorization.k8s.io/decision":"allow","authorization.k8s.io/reason":""}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"0f7e","stage":"RequestReceived","requestURI":"/apis/resource.k8s.io/v1/resourceslices","verb":"create","user":{"username":"dp-bench"},"userAgent":"cdi-dra-driver/v0.0.0 (linux/amd64) kubernetes/$Format","objectRef":{"resource":"resourceslices","apiGroup":"resource.k8s.io","apiVersion":"v1"},"requestReceivedTimestamp":"2026-11-27T08:00:01.200000Z","stageTimestamp":"2026-11-27T08:00:01.200000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"9a1c","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/fleet/pods/sched-0/binding","verb":"create","user":{"username":"dp-bench","groups":["system:masters","system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"kube-scheduler/v1.36.3 (linux/amd64) kubernetes/8a4e3c1/scheduler","objectRef":{"resource":"pods","namespace":"fleet","name":"sched-0","apiVersion":"v1","subresource":"binding"},"responseStatus":{"metadata":{},"code":201},"requestReceivedTimestamp":"2026-11-27T08:00:01.300000Z","stageTimestamp":"2026-11-27T08:00:01.310000Z"}
`

// controllerEvent is a write impersonating a user that is no node's.
const controllerEvent = `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"77","stage":"ResponseComplete","verb":"patch","user":{"username":"dp-bench"},"impersonatedUser":{"username":"fleet-controller"},"userAgent":"cdi-dra-controller/dev","objectRef":{"resource":"resourceclaims","namespace":"fleet","name":"c"},"responseStatus":{"code":200},"stageTimestamp":"2026-11-27T08:00:02Z"}
`

// mustParse is what parse reads of text: n things (what they are), or the
// test fails.
func mustParse[T any](t *testing.T, parse func(io.Reader) ([]T, error), text string, n int, what string) []T {
	t.Helper()
	got, err := parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("%d %s, want %d: %+v", len(got), what, n, got)
	}
	return got
}

func TestParseAudit(t *testing.T) {
	ws := mustParse(t, Parse, auditText+controllerEvent, 3, "writes (the RequestReceived stage skipped)")
	want := []Write{
		{Agent: "cdi-dra-driver", User: "fleet:fleet-node-3", Node: "fleet-node-3", Verb: "update", Resource: "resourceslices", Name: "fleet-node-3-bench.example.com-x7k2p", Code: 200},
		{Agent: "kube-scheduler", Node: "", Verb: "create", Resource: "pods/binding", Name: "sched-0", Code: 201},
		{Agent: "cdi-dra-controller", User: "fleet-controller", Node: "", Verb: "patch", Resource: "resourceclaims", Name: "c", Code: 200},
	}
	for i, w := range want {
		got := ws[i]
		got.At = time.Time{}
		if got != w {
			t.Errorf("write %d: %+v, want %+v", i, got, w)
		}
	}
	if _, err := Parse(strings.NewReader("{\"kind\":\"Event\"}\nnot json\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("bad line: error %v, want one naming line 2", err)
	}
}

func TestTallyWrites(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ws := []Write{
		{At: at(0), Agent: "cdi-dra-driver", Node: "n1", Verb: "update", Resource: "resourceslices"},
		{At: at(400), Agent: "cdi-dra-driver", Node: "n1", Verb: "update", Resource: "resourceslices"},
		{At: at(1400), Agent: "cdi-dra-driver", Node: "n1", Verb: "update", Resource: "resourceslices"},
		{At: at(500), Agent: "cdi-dra-driver", Node: "n2", Verb: "create", Resource: "resourceslices"},
		{At: at(600), Agent: "kube-scheduler", Verb: "create", Resource: "pods/binding"},
		{At: at(700), Agent: "cdi-dra-driver", Node: "n2", Verb: "patch", Resource: "resourceclaims/status"},
		{At: at(5000), Agent: "cdi-dra-driver", Node: "n2", Verb: "update", Resource: "resourceslices"}, // after the window
		// A driver whose user agent is not its binary's name is still
		// the node's: its user says so.
		{At: at(2800), Agent: "kubelet-plugin", Node: "n2", Verb: "update", Resource: "resourceslices"},
		// The driver's user agent without the node's user is not a
		// driver's write (another client of the same library).
		{At: at(900), Agent: "cdi-dra-driver", Verb: "update", Resource: "resourceslices"},
	}
	for _, tc := range []struct {
		name, resource string
		total, maxNode int
		maxSecond      int
		kinds          map[string]int
	}{
		{"every resource", "", 6, 3, 2, map[string]int{"update resourceslices": 4, "create resourceslices": 1, "patch resourceclaims/status": 1}},
		{"slices", "resourceslices", 5, 3, 2, map[string]int{"update resourceslices": 4, "create resourceslices": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := TallyWrites(ws, tc.resource, t0, at(5000))
			if got.Total != tc.total || got.MaxNode != tc.maxNode || got.MaxNodeSecond != tc.maxSecond {
				t.Errorf("total %d, max of a node %d, max in a second %d; want %d, %d, %d", got.Total, got.MaxNode, got.MaxNodeSecond, tc.total, tc.maxNode, tc.maxSecond)
			}
			for k, n := range tc.kinds {
				if got.ByKind[k] != n {
					t.Errorf("%s: %d, want %d (%v)", k, got.ByKind[k], n, got.ByKind)
				}
			}
		})
	}
}

// TestStormRates: a driver that publishes at once on the storm's first
// flip, then once a second, and once after the storm's end with its last
// state (what dra/coalesce.go does) writes one slice a second: counted
// over the storm alone, and over the storm and the second after it, each
// divided by the window it was counted in. The trailing write counted
// over the storm plus a second but divided by the storm alone made it
// 31 / 30 s = 1.03.
func TestStormRates(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)
	storm, nodes := 30*time.Second, 3
	end, to := t0.Add(storm), t0.Add(storm+time.Second)
	var ws []Write
	for _, node := range []string{"n1", "n2", "n3"} {
		for s := range 30 { // 50 ms after each second's start (the leading one after the first flip)
			ws = append(ws, Write{At: t0.Add(time.Duration(s)*time.Second + 50*time.Millisecond), Agent: "cdi-dra-driver", Node: node, Verb: "update", Resource: "resourceslices"})
		}
		ws = append(ws, Write{At: end.Add(400 * time.Millisecond), Agent: "cdi-dra-driver", Node: node, Verb: "update", Resource: "resourceslices"})
	}
	// Another client's write and a driver's claim status are not counted.
	ws = append(ws, Write{At: t0.Add(time.Second), Agent: "kube-scheduler", Verb: "create", Resource: "pods/binding"},
		Write{At: t0.Add(time.Second), Agent: "kube-scheduler", User: "fleet-controller", Verb: "update", Resource: "resourceslices"},
		Write{At: t0.Add(time.Second), Agent: "cdi-dra-driver", Node: "n1", Verb: "patch", Resource: "resourceclaims/status"})
	r := StormRates(ws, nodes, t0, end, to)
	if r.During.Total != 90 || r.Window.Total != 93 {
		t.Errorf("writes: %d during the storm, %d with the second after it; want 90, 93", r.During.Total, r.Window.Total)
	}
	if r.DuringPerNodeS != 1 || r.WindowPerNodeS != 1 {
		t.Errorf("per node per second: %.3f during the storm, %.3f with the second after it; want 1, 1", r.DuringPerNodeS, r.WindowPerNodeS)
	}
	if r.Window.MaxNodeSecond != 1 {
		t.Errorf("at most %d of a node in any second, want 1", r.Window.MaxNodeSecond)
	}
}

func TestBindTimes(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)
	ws := []Write{
		{At: t0.Add(time.Second), Agent: "kube-scheduler", Verb: "create", Resource: "pods/binding", Name: "sched-0", Code: 201},
		{At: t0.Add(2 * time.Second), Agent: "kube-scheduler", Verb: "create", Resource: "pods/binding", Name: "sched-1", Code: 409}, // refused
		{At: t0.Add(3 * time.Second), Agent: "kube-scheduler", Verb: "create", Resource: "pods/binding", Name: "sched-1", Code: 201},
		{At: t0.Add(4 * time.Second), Agent: "dp-bench", Verb: "create", Resource: "pods", Name: "sched-2", Code: 201},
		{At: t0.Add(5 * time.Second), Agent: "kube-scheduler", Verb: "create", Resource: "pods/binding", Name: "other-0", Code: 201},
	}
	got := BindTimes(ws, []string{"sched-0", "sched-1", "sched-2"})
	want := map[string]time.Time{"sched-0": t0.Add(time.Second), "sched-1": t0.Add(3 * time.Second)}
	if len(got) != len(want) {
		t.Fatalf("bind times %v, want %v", got, want)
	}
	for k, v := range want {
		if !got[k].Equal(v) {
			t.Errorf("%s bound at %v, want %v", k, got[k], v)
		}
	}
}

// metricsText is a part of kube-apiserver v1.36's /metrics.
const metricsText = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="resource.k8s.io",resource="resourceslices",scope="cluster",subresource="",verb="PUT",version="v1"} 12
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 640
apiserver_request_total{code="200",component="apiserver",dry_run="",group="resource.k8s.io",resource="resourceslices",scope="cluster",subresource="",verb="WATCH",version="v1"} 3
apiserver_request_total{code="409",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 1
# HELP apiserver_request_duration_seconds [STABLE] Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component.
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1",le="0.005"} 600
`

func TestRequestTotals(t *testing.T) {
	after := mustParse(t, ParseRequestTotals, metricsText, 4, "series")
	before := []RequestCount{{Verb: "PUT", Resource: "resourceslices.resource.k8s.io", Code: "200", Value: 10}}
	got := RequestWrites(before, after)
	want := map[string]float64{"PUT resourceslices.resource.k8s.io": 2, "POST pods/binding": 640, "PUT leases.coordination.k8s.io": 1}
	if len(got) != len(want) {
		t.Errorf("writes %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %g, want %g (%v)", k, got[k], v, got)
		}
	}
	for _, bad := range []string{
		`apiserver_request_total{code="200",verb="PUT" 1`,
		`apiserver_request_total{code="200",verb="PUT"} x`,
		`apiserver_request_total{code=200} 1`,
	} {
		if _, err := ParseRequestTotals(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%q: error %v, want one naming line 1", bad, err)
		}
	}
}

// TestNodesCreated: every node's driver created at least one slice at
// its start, by its node's user; a node with none is named (its writes
// would be missing from every figure, not counted as 0).
func TestNodesCreated(t *testing.T) {
	ws := []Write{
		{Node: "n1", Verb: "create", Resource: "resourceslices", Code: 201},
		{Node: "n2", Verb: "update", Resource: "resourceslices", Code: 200},
		{Node: "n3", Verb: "create", Resource: "resourceslices", Code: 409},              // refused
		{Agent: "cdi-dra-driver", Verb: "create", Resource: "resourceslices", Code: 201}, // no node's user
	}
	if err := NodesCreated(ws, "resourceslices", []string{"n1"}); err != nil {
		t.Errorf("n1: %v", err)
	}
	err := NodesCreated(ws, "resourceslices", []string{"n1", "n2", "n3", "n4"})
	if err == nil || !strings.Contains(err.Error(), "3 of 4 nodes") || !strings.Contains(err.Error(), "n2, n3, n4") {
		t.Errorf("error %v, want one naming n2, n3, n4", err)
	}
}

// TestCounters: a counter's series are read with their labels and
// summed; an audit error or a dropped event shows in
// apiserver_audit_error_total.
func TestCounters(t *testing.T) {
	text := metricsText + `# HELP apiserver_audit_error_total [ALPHA] Counter of audit events that failed to be audited properly.
# TYPE apiserver_audit_error_total counter
apiserver_audit_error_total{plugin="log"} 3
apiserver_audit_error_total{plugin="webhook"} 1
apiserver_watch_events_total{group="resource.k8s.io",resource="resourceclaims",version="v1"} 40
apiserver_watch_events_total{group="",resource="pods",version="v1"} 7
`
	cs, err := ParseCounters(strings.NewReader(text), "apiserver_audit_error_total")
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || Sum(cs) != 4 || cs[0].Labels["plugin"] != "log" {
		t.Errorf("audit errors %+v, want 2 series of 4 in all", cs)
	}
	w, err := ParseCounters(strings.NewReader(text), "apiserver_watch_events_total")
	if err != nil {
		t.Fatal(err)
	}
	if got := Sum(Select(w, "resource", "resourceclaims")); got != 40 {
		t.Errorf("claim watch events %g, want 40", got)
	}
	if cs, err := ParseCounters(strings.NewReader(metricsText), "apiserver_audit_error_total"); err != nil || len(cs) != 0 {
		t.Errorf("no audit error series: %v, %v", cs, err)
	}
	if _, err := ParseCounters(strings.NewReader("apiserver_audit_error_total{plugin=\"log\"} x\n"), "apiserver_audit_error_total"); err == nil {
		t.Error("a bad value read")
	}
}
