package metrics

// FaultInjected records a fault injected on purpose into a device of
// resource: kind is the fault's kind.
func (m *Metrics) FaultInjected(resource, kind string) {
	if m == nil {
		return
	}
	m.injectedFaults.WithLabelValues(resource, kind).Inc()
}

// FaultControl records a request to the fault control socket.
func (m *Metrics) FaultControl(action, result string) {
	if m == nil {
		return
	}
	m.faultControl.WithLabelValues(action, result).Inc()
}
