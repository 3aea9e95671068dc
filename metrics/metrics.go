// Package metrics holds the plugin's Prometheus metrics and the HTTP
// server that exposes them with the liveness and readiness probes. Its
// methods are safe on a nil *Metrics (metrics off), so the packages that
// record take one the way they take a logger.
package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Namespace prefixes every metric name.
const Namespace = "cdi_device_plugin"

// Metrics records what the plugin does.
type Metrics struct {
	reg *prometheus.Registry

	devices           *prometheus.GaugeVec
	rpcDuration       *prometheus.HistogramVec
	stepFailures      *prometheus.CounterVec
	registrations     *prometheus.CounterVec
	kubeletRestarts   *prometheus.CounterVec
	streams           *prometheus.GaugeVec
	specWrites        *prometheus.CounterVec
	healthTransitions *prometheus.CounterVec
	reloads           *prometheus.CounterVec
	recoveryGivenUp   *prometheus.CounterVec
	injectedFaults    *prometheus.CounterVec
	faultControl      *prometheus.CounterVec

	// The DRA driver's series, registered at the first DRA call.
	draOnce sync.Once
	dra     *DRA
}

// New registers the plugin's metrics (and the Go runtime's and process's)
// in a registry of their own.
func New(version string) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "devices",
			Help: "Devices advertised to the kubelet, by resource and health.",
		}, []string{"resource", "health"}),
		rpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "rpc_duration_seconds",
			Help:    "Duration of the device plugin calls the kubelet makes, by resource, call and result (ok or error).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"resource", "rpc", "result"}),
		stepFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "prestart_step_failures_total",
			Help: "Failed PreStartContainer steps, by resource and step.",
		}, []string{"resource", "step"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "registrations_total",
			Help: "Registrations with the kubelet, by resource and result.",
		}, []string{"resource", "result"}),
		kubeletRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "kubelet_restarts_total",
			Help: "Kubelet restarts seen (a new kubelet.sock), by resource.",
		}, []string{"resource"}),
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "list_and_watch_streams",
			Help: "Open ListAndWatch streams, by resource.",
		}, []string{"resource"}),
		specWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "cdi_spec_writes_total",
			Help: "CDI spec writes, by resource and result.",
		}, []string{"resource", "result"}),
		healthTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "device_health_transitions_total",
			Help: "Devices that became healthy or unhealthy, by resource, new health and reason " +
				"(missing, wrong_node, node_error, prestart, no_cdi_spec, yielded, dra_claim, identity_changed, shared_node, injected).",
		}, []string{"resource", "health", "reason"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "config_reloads_total",
			Help: "Configuration reloads, by result (applied, unchanged, refused).",
		}, []string{"result"}),
		recoveryGivenUp: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "recovery_given_up_total",
			Help: "Failed devices whose background re-preparation was given up after its last attempt, by resource.",
		}, []string{"resource"}),
		injectedFaults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "injected_faults_total",
			Help: "Faults injected on purpose into simulated devices, by resource and kind (lost, unhealthy, stepFails, slowStep, flapping): " +
				"a health fault each time it starts, a step fault each step it acts on.",
		}, []string{"resource", "kind"}),
		faultControl: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "fault_control_requests_total",
			Help: "Requests to the fault control socket, by action (list, inject, clear) and result (ok, refused, error).",
		}, []string{"action", "result"}),
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help: "Always 1; the version of the plugin.", ConstLabels: prometheus.Labels{"version": version},
	})
	build.Set(1)
	m.reg.MustRegister(m.devices, m.rpcDuration, m.stepFailures, m.registrations, m.kubeletRestarts,
		m.streams, m.specWrites, m.healthTransitions, m.reloads, m.recoveryGivenUp, m.injectedFaults, m.faultControl, build,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is the registry the metrics are in.
func (m *Metrics) Registry() *prometheus.Registry {
	if m == nil {
		return nil
	}
	return m.reg
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// ObserveRPC records one call of the kubelet.
func (m *Metrics) ObserveRPC(resource, rpc string, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.rpcDuration.WithLabelValues(resource, rpc, result(err)).Observe(d.Seconds())
}

// StepFailed records a failed preparation step.
func (m *Metrics) StepFailed(resource, step string) {
	if m == nil {
		return
	}
	m.stepFailures.WithLabelValues(resource, step).Inc()
}

// RecoveryGivenUp records a failed device whose background re-preparation
// was given up.
func (m *Metrics) RecoveryGivenUp(resource string) {
	if m == nil {
		return
	}
	m.recoveryGivenUp.WithLabelValues(resource).Inc()
}

// Registered records a registration attempt's outcome.
func (m *Metrics) Registered(resource string, err error) {
	if m == nil {
		return
	}
	m.registrations.WithLabelValues(resource, result(err)).Inc()
}

// KubeletRestart records a new kubelet.sock.
func (m *Metrics) KubeletRestart(resource string) {
	if m == nil {
		return
	}
	m.kubeletRestarts.WithLabelValues(resource).Inc()
}

// Stream records a ListAndWatch stream opening (+1) or closing (-1).
func (m *Metrics) Stream(resource string, delta int) {
	if m == nil {
		return
	}
	m.streams.WithLabelValues(resource).Add(float64(delta))
}

// SpecWritten records a CDI spec write's outcome.
func (m *Metrics) SpecWritten(resource string, err error) {
	if m == nil {
		return
	}
	m.specWrites.WithLabelValues(resource, result(err)).Inc()
}

// Devices sets the number of devices advertised, by health.
func (m *Metrics) Devices(resource string, healthy, unhealthy int) {
	if m == nil {
		return
	}
	m.devices.WithLabelValues(resource, "healthy").Set(float64(healthy))
	m.devices.WithLabelValues(resource, "unhealthy").Set(float64(unhealthy))
}

// HealthTransition records a device that became healthy or unhealthy for
// cause (device.Cause's label value: missing, wrong_node, node_error,
// prestart, no_cdi_spec, yielded, dra_claim, identity_changed, shared_node, injected).
func (m *Metrics) HealthTransition(resource string, healthy bool, cause string) {
	if m == nil {
		return
	}
	health := "unhealthy"
	if healthy {
		health, cause = "healthy", ""
	}
	m.healthTransitions.WithLabelValues(resource, health, cause).Inc()
}

// Reload records a configuration reload: "applied", "unchanged" or
// "refused".
func (m *Metrics) Reload(result string) {
	if m == nil {
		return
	}
	m.reloads.WithLabelValues(result).Inc()
}

// Forget removes the series of a resource that is no longer served.
func (m *Metrics) Forget(resource string) {
	if m == nil {
		return
	}
	l := prometheus.Labels{"resource": resource}
	for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{
		m.devices, m.rpcDuration, m.stepFailures, m.registrations, m.kubeletRestarts, m.streams, m.specWrites, m.healthTransitions,
		m.recoveryGivenUp, m.injectedFaults,
	} {
		v.DeletePartialMatch(l)
	}
}
