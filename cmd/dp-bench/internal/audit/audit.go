// Package audit counts the fleet's API writes, two ways. The API
// server's apiserver_request_total counts every request by verb, group,
// resource and subresource, but has no label for the client (its "client"
// label was dropped upstream long ago): it gives the totals
// (ParseRequestTotals, RequestWrites). The audit log (Policy: every write
// at level Metadata, nothing else) names the user agent and the user of
// every write: it says which writes are the drivers', and each driver's
// node, as each driver's kubeconfig impersonates UserPrefix+<node> (Parse,
// TallyWrites, StormRates, NodesCreated); and when the scheduler bound
// each pod (BindTimes). The writes are told apart by that user, not by
// the user agent, which a driver sets as it likes: a mismatch would read
// as no write at all.
package audit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Policy logs every write, at level Metadata, once (when the
// answer is complete), and no read.
const Policy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: None
`

// UserPrefix is the user a driver's kubeconfig impersonates:
// fleet:<node>.
const UserPrefix = "fleet:"

// Write is one write in the audit log.
type Write struct {
	At       time.Time // stageTimestamp: when the answer was complete
	Agent    string    // the user agent's product (before the first '/')
	User     string    // the impersonated user, else ""
	Node     string    // <node> of an impersonated fleet:<node>, else ""
	Verb     string
	Resource string // resource[/subresource]
	Name     string // the object's name ("" for a collection)
	Code     int
}

// auditEvent is the part of an audit.k8s.io/v1 Event that is read.
type auditEvent struct {
	Kind  string `json:"kind"`
	Stage string `json:"stage"`
	Verb  string `json:"verb"`
	User  struct {
		Username string `json:"username"`
	} `json:"user"`
	ImpersonatedUser *struct {
		Username string `json:"username"`
	} `json:"impersonatedUser"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	StageTimestamp time.Time `json:"stageTimestamp"`
}

// Parse reads an audit log (JSON lines) and returns its completed
// writes. A line that is not an event is an error naming its number.
func Parse(r io.Reader) ([]Write, error) {
	var out []Write
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var ev auditEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			return nil, fmt.Errorf("audit log line %d: %w", n, err)
		}
		if ev.Kind != "Event" {
			return nil, fmt.Errorf("audit log line %d: kind %q, want Event", n, ev.Kind)
		}
		if ev.Stage != "ResponseComplete" || ev.ObjectRef == nil {
			continue
		}
		w := Write{At: ev.StageTimestamp, Verb: ev.Verb, Resource: ev.ObjectRef.Resource, Name: ev.ObjectRef.Name}
		if ev.ObjectRef.Subresource != "" {
			w.Resource += "/" + ev.ObjectRef.Subresource
		}
		w.Agent, _, _ = strings.Cut(ev.UserAgent, "/")
		if ev.ImpersonatedUser != nil {
			w.User = ev.ImpersonatedUser.Username
			if node, ok := strings.CutPrefix(w.User, UserPrefix); ok {
				w.Node = node
			}
		}
		if ev.ResponseStatus != nil {
			w.Code = ev.ResponseStatus.Code
		}
		out = append(out, w)
	}
	return out, sc.Err()
}

// Tally is the drivers' writes in a window.
type Tally struct {
	// Total is every driver write; ByKind counts them by "verb resource",
	// ByNode by node.
	Total  int            `json:"total"`
	ByKind map[string]int `json:"byKind,omitempty"`
	ByNode map[string]int `json:"-"`
	// MaxNode is the most writes of one node; MaxNodeSecond the most of
	// one node's writes within any one second (a sliding window).
	MaxNode       int `json:"maxNode"`
	MaxNodeSecond int `json:"maxNodeSecond"`
}

// TallyWrites counts the nodes' writes (those of a fleet:<node> user)
// done in [from, to), and only those to resource when it is not "".
func TallyWrites(ws []Write, resource string, from, to time.Time) Tally {
	return tally(ws, func(w Write) string { return w.Node }, resource, from, to)
}

// TallyUser counts the writes of user (impersonated) done in [from, to),
// and only those to resource when it is not "".
func TallyUser(ws []Write, user, resource string, from, to time.Time) Tally {
	return tally(ws, func(w Write) string {
		if w.User == user {
			return user
		}
		return ""
	}, resource, from, to)
}

// tally counts the writes that who names ("": not counted) in [from, to).
func tally(ws []Write, who func(Write) string, resource string, from, to time.Time) Tally {
	t := Tally{ByKind: map[string]int{}, ByNode: map[string]int{}}
	times := map[string][]time.Time{}
	for _, w := range ws {
		node := who(w)
		if node == "" || w.At.Before(from) || !w.At.Before(to) || (resource != "" && w.Resource != resource) {
			continue
		}
		t.Total++
		t.ByKind[w.Verb+" "+w.Resource]++
		t.ByNode[node]++
		times[node] = append(times[node], w.At)
	}
	for _, n := range t.ByNode {
		t.MaxNode = max(t.MaxNode, n)
	}
	for _, ts := range times {
		t.MaxNodeSecond = max(t.MaxNodeSecond, maxInWindow(ts, time.Second))
	}
	return t
}

// perNodePerSecond is a tally's writes per node per second of the
// window [from, to) it counted.
func perNodePerSecond(t Tally, nodes int, from, to time.Time) float64 {
	d := to.Sub(from).Seconds()
	if nodes < 1 || d <= 0 {
		return 0
	}
	return float64(t.Total) / float64(nodes) / d
}

// StormCount is the drivers' slice writes in a health storm [from, end)
// and in the storm and the second after it [from, to), each per node per
// second of the window it was counted in.
type StormCount struct {
	During, Window                 Tally
	DuringPerNodeS, WindowPerNodeS float64
}

// StormRates counts the nodes' slice writes of a health storm [from, end)
// over nodes, and of the storm and the second after it [from, to).
func StormRates(ws []Write, nodes int, from, end, to time.Time) StormCount {
	c := StormCount{
		During: TallyWrites(ws, "resourceslices", from, end),
		Window: TallyWrites(ws, "resourceslices", from, to),
	}
	c.DuringPerNodeS = perNodePerSecond(c.During, nodes, from, end)
	c.WindowPerNodeS = perNodePerSecond(c.Window, nodes, from, to)
	return c
}

// NodesCreated returns an error naming the nodes of which no successful
// create of resource (e.g. resourceslices) is in ws: a driver publishes
// its slices at its start, so a node without one is a driver whose
// writes are not told apart as its node's, and every figure of writes
// would read 0 for it.
func NodesCreated(ws []Write, resource string, nodes []string) error {
	made := map[string]bool{}
	for _, w := range ws {
		if w.Verb == "create" && w.Resource == resource && w.Code/100 == 2 && w.Node != "" {
			made[w.Node] = true
		}
	}
	var missing []string
	for _, n := range nodes {
		if !made[n] {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("no create %s by the user %s<node> of %d of %d nodes in the audit log: %s", resource, UserPrefix, len(missing), len(nodes), strings.Join(missing, ", "))
	}
	return nil
}

// BindTimes are when the API server answered each successful binding of
// the pods named (the scheduler's create pods/binding, stamped by the
// API server: no watch's delay or gap is in it).
func BindTimes(ws []Write, names []string) map[string]time.Time {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	out := map[string]time.Time{}
	for _, w := range ws {
		if w.Verb != "create" || w.Resource != "pods/binding" || w.Code/100 != 2 || !want[w.Name] {
			continue
		}
		if t, ok := out[w.Name]; !ok || w.At.Before(t) {
			out[w.Name] = w.At
		}
	}
	return out
}

// maxInWindow is the most of ts within any window of length d (half
// open: two times exactly d apart are in different windows).
func maxInWindow(ts []time.Time, d time.Duration) int {
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	best, lo := 0, 0
	for hi := range ts {
		for ts[hi].Sub(ts[lo]) >= d {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// RequestCount is one apiserver_request_total series.
type RequestCount struct {
	Verb, Resource string // resource[/subresource], with its group: resourceslices.resource.k8s.io
	Code           string
	Value          float64
}

// Counter is one series of a counter in /metrics.
type Counter struct {
	Labels map[string]string
	Value  float64
}

// ParseCounters reads the series of the metric name (with labels) from
// the API server's /metrics (the Prometheus text format).
func ParseCounters(r io.Reader, name string) ([]Counter, error) {
	var out []Counter
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		end := strings.LastIndex(rest, "}")
		if end < 0 {
			return nil, fmt.Errorf("/metrics line %d: no closing brace: %q", n, line)
		}
		labels, err := parseLabels(rest[:end])
		if err != nil {
			return nil, fmt.Errorf("/metrics line %d: %w", n, err)
		}
		fields := strings.Fields(rest[end+1:])
		if len(fields) == 0 {
			return nil, fmt.Errorf("/metrics line %d: no value: %q", n, line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("/metrics line %d: value %q: %w", n, fields[0], err)
		}
		out = append(out, Counter{Labels: labels, Value: v})
	}
	return out, sc.Err()
}

// Sum is the sum of the series.
func Sum(cs []Counter) float64 {
	var s float64
	for _, c := range cs {
		s += c.Value
	}
	return s
}

// Select is the series whose label is value.
func Select(cs []Counter, label, value string) []Counter {
	var out []Counter
	for _, c := range cs {
		if c.Labels[label] == value {
			out = append(out, c)
		}
	}
	return out
}

// ParseRequestTotals reads apiserver_request_total from the API server's
// /metrics (the Prometheus text format).
func ParseRequestTotals(r io.Reader) ([]RequestCount, error) {
	cs, err := ParseCounters(r, "apiserver_request_total")
	if err != nil {
		return nil, err
	}
	out := make([]RequestCount, 0, len(cs))
	for _, c := range cs {
		labels, v := c.Labels, c.Value
		res := labels["resource"]
		if g := labels["group"]; g != "" {
			res += "." + g
		}
		if s := labels["subresource"]; s != "" {
			res += "/" + s
		}
		out = append(out, RequestCount{Verb: labels["verb"], Resource: res, Code: labels["code"], Value: v})
	}
	return out, nil
}

// parseLabels parses name="value",... with the format's escapes (\\, \",
// \n).
func parseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for s != "" {
		name, rest, ok := strings.Cut(s, "=")
		if !ok || !strings.HasPrefix(rest, `"`) {
			return nil, fmt.Errorf("label %q: want name=\"value\"", s)
		}
		rest = rest[1:]
		var v strings.Builder
		i := 0
		for ; i < len(rest) && rest[i] != '"'; i++ {
			if rest[i] == '\\' && i+1 < len(rest) {
				i++
				switch rest[i] {
				case 'n':
					v.WriteByte('\n')
				default:
					v.WriteByte(rest[i])
				}
				continue
			}
			v.WriteByte(rest[i])
		}
		if i == len(rest) {
			return nil, fmt.Errorf("label %s: unterminated value", name)
		}
		out[strings.TrimSpace(name)] = v.String()
		s = strings.TrimPrefix(rest[i+1:], ",")
	}
	return out, nil
}

// writeVerbs are apiserver_request_total's verbs of writes.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "DELETECOLLECTION": true, "APPLY": true}

// RequestWrites sums the writes between two scrapes, by "VERB resource".
func RequestWrites(before, after []RequestCount) map[string]float64 {
	key := func(c RequestCount) string { return c.Verb + " " + c.Resource + " " + c.Code }
	base := map[string]float64{}
	for _, c := range before {
		base[key(c)] = c.Value
	}
	out := map[string]float64{}
	for _, c := range after {
		if !writeVerbs[c.Verb] {
			continue
		}
		if d := c.Value - base[key(c)]; d > 0 {
			out[c.Verb+" "+c.Resource] += d
		}
	}
	return out
}
