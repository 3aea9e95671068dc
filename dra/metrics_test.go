package dra

import (
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
)

// metricValue is the value of the series name{labels} in m's registry (a
// counter's or gauge's value, a histogram's count); -1 when absent.
func metricValue(t *testing.T, m *metrics.Metrics, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, s := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range s.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				return s.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				return s.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				return float64(s.GetHistogram().GetSampleCount())
			}
		}
	}
	return -1
}

// TestDRAMetrics: the driver's own series count what a platform team
// watches: the kubelet's Prepare and Unprepare calls (a histogram by
// operation and result) and their claims, the claims' status writes by
// result, the handover guard's state by resource and the slice publishes.
func TestDRAMetrics(t *testing.T) {
	h := newHarness(t, nil)
	m := metrics.New("test")
	h.options = func(o *Options) { o.Metrics = m }
	h.start()
	good, bad := h.claim("good", "sim-0"), h.claim("bad", "sim-9")
	if r := h.prepare(good)[good.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if r := h.prepare(bad)[bad.Uid]; !strings.Contains(r.Error, ErrUnknownDevice.Error()) {
		t.Fatalf("bad: %q", r.Error)
	}
	if r := h.unprepare(good)[good.Uid]; r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	h.waitFor("the status write of good", func() bool {
		return metricValue(t, m, "cdi_device_plugin_dra_claim_status_writes_total", map[string]string{"result": "ok"}) >= 1
	})
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"cdi_device_plugin_dra_request_duration_seconds", map[string]string{"operation": "prepare", "result": "ok"}, 1},
		{"cdi_device_plugin_dra_request_duration_seconds", map[string]string{"operation": "prepare", "result": "error"}, 1},
		{"cdi_device_plugin_dra_request_duration_seconds", map[string]string{"operation": "unprepare", "result": "ok"}, 1},
		{"cdi_device_plugin_dra_claims_total", map[string]string{"operation": "prepare", "result": "ok"}, 1},
		{"cdi_device_plugin_dra_claims_total", map[string]string{"operation": "prepare", "result": "error"}, 1},
		{"cdi_device_plugin_dra_claims_total", map[string]string{"operation": "unprepare", "result": "ok"}, 1},
		{"cdi_device_plugin_dra_handover_guard", map[string]string{"resource": resName}, 0},
	} {
		if got := metricValue(t, m, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := metricValue(t, m, "cdi_device_plugin_dra_slice_publishes_total", map[string]string{"result": "ok"}); got < 1 {
		t.Errorf("slice publishes: %v, want at least 1", got)
	}
}
