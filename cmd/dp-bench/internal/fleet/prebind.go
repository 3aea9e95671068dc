package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"strings"
	"sync"
	"text/template"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/audit"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/controlplane"
)

// What a fleet costs the API server in claim traffic: with prepare before
// binding, a controller (the bind marker) labels each claim allocated a
// device with binding conditions with the device's node, and each node's
// driver watches the claims of its node's label. The figures are counts,
// not timings: the drivers' and the controller's writes (the audit log),
// the claim watch events the API server sent to all its watchers
// (apiserver_watch_events_total), and those a node's labelled watch
// receives (dp-bench opens the same watch for every node's label at
// once: labelCount).

// controllerUser is the user the controller's kubeconfig impersonates:
// its writes are told apart from the nodes' (audit.TallyUser).
const controllerUser = "fleet-controller"

// startController starts the target's controller, if it has one, once
// for the fleet; close stops it.
func (f *fleet) startController() error {
	argv := f.t.DRA.Controller
	if len(argv) == 0 {
		return nil
	}
	kc, err := f.fc.userKubeconfig(controllerUser)
	if err != nil {
		return err
	}
	expanded := make([]string, len(argv))
	for i, a := range argv {
		tpl, err := template.New("controller").Option("missingkey=error").Funcs(template.FuncMap{"env": os.Getenv}).Parse(a)
		if err != nil {
			return fmt.Errorf("dra.controller: %w", err)
		}
		var b strings.Builder
		if err := tpl.Execute(&b, struct{ Kubeconfig string }{kc}); err != nil {
			return fmt.Errorf("dra.controller: %w", err)
		}
		expanded[i] = b.String()
	}
	p, err := controlplane.Run(expanded[0], expanded[1:]...)
	if err != nil {
		return fmt.Errorf("dra.controller: %w", err)
	}
	// Stopped with the control plane (fleetCluster.stop); alive says
	// when it ended.
	f.fc.others = append(f.fc.others, p)
	return nil
}

// watchLabelled opens dp-bench's watch of the claims that carry the
// driver's node label, counting their events by node.
func (f *fleet) watchLabelled(ctx context.Context) error {
	key := f.t.DRA.Driver + "/prepare-node"
	f.labelled = newLabelCount(key)
	w, err := f.fc.cp.Client.Watch(ctx, apiclient.PathClaims(fleetNamespace), url.Values{"labelSelector": {key}}, f.labelled.event, f.logf)
	if err != nil {
		return fmt.Errorf("watching the labelled claims: %w", err)
	}
	f.onClose(w.Wait)
	return nil
}

// labelCount counts watch events of objects by the value of one label.
type labelCount struct {
	key string
	mu  sync.Mutex
	n   map[string]int
}

func newLabelCount(key string) *labelCount { return &labelCount{key: key, n: map[string]int{}} }

func (lc *labelCount) event(ev apiclient.Event) {
	var o struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if json.Unmarshal(ev.Object, &o) != nil {
		return
	}
	v := o.Metadata.Labels[lc.key]
	if v == "" {
		return
	}
	lc.mu.Lock()
	lc.n[v]++
	lc.mu.Unlock()
}

// snapshot is the events counted so far, by label value.
func (lc *labelCount) snapshot() map[string]int {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return maps.Clone(lc.n)
}

// eventCount is a window's events of the nodes' labelled watches.
type eventCount struct {
	Total   int     `json:"total"`
	PerNode float64 `json:"perNode"`
	MaxNode int     `json:"maxNode"`
}

// nodeEvents is the events between two snapshots, over nodes.
func nodeEvents(before, after map[string]int, nodes int) eventCount {
	var c eventCount
	for k, n := range after {
		d := n - before[k]
		c.Total += d
		c.MaxNode = max(c.MaxNode, d)
	}
	if nodes > 0 {
		c.PerNode = float64(c.Total) / float64(nodes)
	}
	return c
}

// traffic is a window's claim traffic.
type traffic struct {
	// DriverWrites are every node's writes, ControllerWrites the
	// controller's (none without one).
	DriverWrites        audit.Tally `json:"driverWrites"`
	DriverWritesPerNode float64     `json:"driverWritesPerNode"`
	ControllerWrites    audit.Tally `json:"controllerWrites"`
	// ClaimWatchEvents are the claim events the API server sent to all
	// its watchers (the scheduler's, the controller-manager's, the
	// controller's and the drivers'), apiserver_watch_events_total.
	ClaimWatchEvents        float64 `json:"claimWatchEvents"`
	ClaimWatchEventsPerNode float64 `json:"claimWatchEventsPerNode"`
	// NodeWatch is what the nodes' labelled claim watches receive (nil:
	// the drivers open none).
	NodeWatch *eventCount `json:"nodeWatch,omitempty"`
}

// trafficMark is the counters at a window's start.
type trafficMark struct {
	from     time.Time
	watch    float64
	labelled map[string]int
}

// markTraffic marks a window's start.
func (f *fleet) markTraffic(ctx context.Context) (trafficMark, error) {
	m := trafficMark{from: time.Now()}
	var err error
	m.watch, err = f.claimWatchEvents(ctx)
	if f.labelled != nil {
		m.labelled = f.labelled.snapshot()
	}
	return m, err
}

// traffic is the window from m to now, with the audit log's writes ws
// (read after now).
func (f *fleet) traffic(ctx context.Context, m trafficMark, ws []audit.Write, to time.Time) (*traffic, error) {
	t := &traffic{
		DriverWrites:     audit.TallyWrites(ws, "", m.from, to),
		ControllerWrites: audit.TallyUser(ws, controllerUser, "", m.from, to),
	}
	t.DriverWritesPerNode = float64(t.DriverWrites.Total) / float64(f.c.N)
	w, err := f.claimWatchEvents(ctx)
	if err != nil {
		return nil, err
	}
	t.ClaimWatchEvents = w - m.watch
	t.ClaimWatchEventsPerNode = t.ClaimWatchEvents / float64(f.c.N)
	if f.labelled != nil {
		c := nodeEvents(m.labelled, f.labelled.snapshot(), f.c.N)
		t.NodeWatch = &c
	}
	return t, nil
}

// claimWatchEvents is apiserver_watch_events_total of ResourceClaims (the
// label is resource in newer API servers, kind in older ones).
func (f *fleet) claimWatchEvents(ctx context.Context) (float64, error) {
	cs, err := f.fc.counters(ctx, "apiserver_watch_events_total")
	if err != nil {
		return 0, err
	}
	return audit.Sum(audit.Select(cs, "resource", "resourceclaims")) + audit.Sum(audit.Select(cs, "kind", "ResourceClaim")), nil
}
