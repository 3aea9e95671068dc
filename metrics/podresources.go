package metrics

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdi-device-plugin/cdi-device-plugin/podresources"
)

// scrapeTimeout bounds the PodResources List of one scrape.
const scrapeTimeout = 2 * time.Second

// podResources reports which container holds which device, from the
// kubelet's PodResources API, asked at every scrape (nothing runs between
// scrapes).
type podResources struct {
	client    *podresources.Client
	resources func() []string
	desc      *prometheus.Desc
	errors    prometheus.Counter
}

// WatchPodResources adds cdi_device_plugin_pod_device_assignment (1 for
// every device of the served resources that a container holds, labelled
// namespace, pod, container, resource, device), read from the kubelet's
// PodResources API through client at each scrape (the caller closes it).
// resources returns the resources served now.
func (m *Metrics) WatchPodResources(client *podresources.Client, resources func() []string) {
	if m == nil {
		return
	}
	p := newPodResources(client, resources)
	m.reg.MustRegister(p, p.errors)
}

func newPodResources(client *podresources.Client, resources func() []string) *podResources {
	return &podResources{
		client: client, resources: resources,
		desc: prometheus.NewDesc(Namespace+"_pod_device_assignment",
			"1 for each device a container holds, from the kubelet's PodResources API.",
			[]string{"namespace", "pod", "container", "resource", "device"}, nil),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "pod_resources_errors_total",
			Help: "Failed reads of the kubelet's PodResources API.",
		}),
	}
}

func (p *podResources) Describe(ch chan<- *prometheus.Desc) { ch <- p.desc }

func (p *podResources) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	res, err := p.client.List(ctx)
	if errors.Is(err, podresources.ErrNoSocket) {
		return // no kubelet (yet), or the API is not mounted: no series
	}
	if err != nil {
		p.errors.Inc()
		return
	}
	served := p.resources()
	for _, d := range res.Devices() {
		if slices.Contains(served, d.Resource) {
			ch <- prometheus.MustNewConstMetric(p.desc, prometheus.GaugeValue, 1, d.Namespace, d.Pod, d.Container, d.Resource, d.ID)
		}
	}
}
