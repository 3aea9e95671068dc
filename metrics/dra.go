package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DRA are the DRA driver's own series, beside the device source's that
// it shares with the plugin (devices, cdi_spec_writes_total, health
// transitions): what a platform team watches of the kubelet's calls, the
// claims' status writes, the stale-claim clean-up, the handover guard and
// the ResourceSlice publishes. All are named cdi_device_plugin_dra_*.
type DRA struct {
	requests     *prometheus.HistogramVec
	claims       *prometheus.CounterVec
	statusWrites *prometheus.CounterVec
	staleDropped prometheus.Counter
	staleKept    *prometheus.CounterVec
	guard        *prometheus.GaugeVec
	publishes    *prometheus.CounterVec
}

// DRA operations (the operation label).
const (
	OpPrepare   = "prepare"
	OpUnprepare = "unprepare"
	// OpPrepareBeforeBind is a claim prepared before the scheduler binds
	// its pod (a resource with prepareBeforeBind), not a kubelet call.
	OpPrepareBeforeBind = "prepare_before_bind"
)

// Results of a claim status write (StatusWritten).
const (
	StatusOK      = "ok"       // written
	StatusRetry   = "retry"    // failed, to be tried again
	StatusGone    = "gone"     // the claim is gone or changed: given up
	StatusDenied  = "denied"   // the driver's account may not write it: given up
	StatusGivenUp = "given_up" // failed its last attempt
)

// DRA returns the DRA driver's series, registered with m's at the first
// call; nil when m is nil (no metrics), and every method of a nil *DRA
// does nothing.
func (m *Metrics) DRA() *DRA {
	if m == nil {
		return nil
	}
	m.draOnce.Do(func() { m.dra = newDRA(m.reg) })
	return m.dra
}

func newDRA(reg *prometheus.Registry) *DRA {
	d := &DRA{
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "dra_request_duration_seconds",
			Help:    "Duration of the kubelet's NodePrepareResources and NodeUnprepareResources calls as the driver serves them, and of the preparations of claims before binding, by operation (prepare, unprepare, prepare_before_bind) and result (ok, or error when a claim failed).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 45},
		}, []string{"operation", "result"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "dra_claims_total",
			Help: "Claims the kubelet asked the driver to prepare or unprepare, by operation and result (ok, error).",
		}, []string{"operation", "result"}),
		statusWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "dra_claim_status_writes_total",
			Help: "Writes of the claims' status.devices, by result (ok, retry, gone, denied, given_up).",
		}, []string{"result"}),
		staleDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "dra_stale_claims_dropped_total",
			Help: "Prepared claims dropped by the stale-claim clean-up (gone from the API past the grace, held by no container).",
		}),
		staleKept: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "dra_stale_claims_kept_total",
			Help: "Passes of the stale-claim clean-up that kept a claim gone from the API past the grace, by reason (held: a container holds it; unknown: PodResources could not tell).",
		}, []string{"reason"}),
		guard: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "dra_handover_guard",
			Help: "1 while the handover guard of a resource is up (its devices carry the handover taint), else 0.",
		}, []string{"resource"}),
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "dra_slice_publishes_total",
			Help: "Publishes of the node's ResourceSlices handed to the ResourceSlice controller, by result.",
		}, []string{"result"}),
	}
	reg.MustRegister(d.requests, d.claims, d.statusWrites, d.staleDropped, d.staleKept, d.guard, d.publishes)
	return d
}

// Request records one kubelet call of operation op (OpPrepare,
// OpUnprepare) that took took, with ok and failed claims.
func (d *DRA) Request(op string, took time.Duration, ok, failed int) {
	if d == nil {
		return
	}
	res := "ok"
	if failed > 0 {
		res = "error"
	}
	d.requests.WithLabelValues(op, res).Observe(took.Seconds())
	if ok > 0 {
		d.claims.WithLabelValues(op, "ok").Add(float64(ok))
	}
	if failed > 0 {
		d.claims.WithLabelValues(op, "error").Add(float64(failed))
	}
}

// StatusWritten records a claim status write's result (Status*).
func (d *DRA) StatusWritten(result string) {
	if d == nil {
		return
	}
	d.statusWrites.WithLabelValues(result).Inc()
}

// StaleDropped records a claim the stale-claim clean-up dropped.
func (d *DRA) StaleDropped() {
	if d == nil {
		return
	}
	d.staleDropped.Inc()
}

// StaleKept records a pass that kept a stale claim: held (a container
// holds it) or not (PodResources could not tell).
func (d *DRA) StaleKept(held bool) {
	if d == nil {
		return
	}
	reason := "unknown"
	if held {
		reason = "held"
	}
	d.staleKept.WithLabelValues(reason).Inc()
}

// HandoverGuard records whether the handover guard of resource is up.
func (d *DRA) HandoverGuard(resource string, up bool) {
	if d == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	d.guard.WithLabelValues(resource).Set(v)
}

// SlicesPublished records a publish handed to the ResourceSlice
// controller.
func (d *DRA) SlicesPublished(err error) {
	if d == nil {
		return
	}
	d.publishes.WithLabelValues(result(err)).Inc()
}
