package metrics

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// podResources reports which container holds which device, from the
// kubelet's PodResources API, asked at every scrape (nothing runs between
// scrapes).
type podResources struct {
	socket    string
	resources func() []string
	desc      *prometheus.Desc
	errors    prometheus.Counter
}

// WatchPodResources adds cdi_device_plugin_pod_device_assignment (1 for
// every device of the served resources that a container holds, labelled
// namespace, pod, container, resource, device), read from the kubelet's
// PodResources API on socket at each scrape. resources returns the
// resources served now.
func (m *Metrics) WatchPodResources(socket string, resources func() []string) {
	if m == nil {
		return
	}
	p := newPodResources(socket, resources)
	m.reg.MustRegister(p, p.errors)
}

func newPodResources(socket string, resources func() []string) *podResources {
	return &podResources{
		socket: socket, resources: resources,
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
	if _, err := os.Stat(p.socket); err != nil {
		return // no kubelet (yet), or the API is not mounted: no series
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := listPodResources(ctx, p.socket)
	if err != nil {
		p.errors.Inc()
		return
	}
	served := p.resources()
	for _, pod := range resp.PodResources {
		for _, c := range pod.Containers {
			for _, d := range c.Devices {
				if !slices.Contains(served, d.ResourceName) {
					continue
				}
				for _, id := range d.DeviceIds {
					ch <- prometheus.MustNewConstMetric(p.desc, prometheus.GaugeValue, 1, pod.Namespace, pod.Name, c.Name, d.ResourceName, id)
				}
			}
		}
	}
}

// listPodResources asks the kubelet's PodResources API on socket which
// container holds which device.
func listPodResources(ctx context.Context, socket string) (*podresourcesapi.ListPodResourcesResponse, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
}

// list is one List of the PodResources API on socket, given 5 s. A missing
// socket or a failed List is an error naming the socket.
func list(ctx context.Context, socket string) (*podresourcesapi.ListPodResourcesResponse, error) {
	if _, err := os.Stat(socket); err != nil {
		return nil, fmt.Errorf("PodResources socket %s: %w", socket, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := listPodResources(ctx, socket)
	if err != nil {
		return nil, fmt.Errorf("PodResources List on %s: %w", socket, err)
	}
	return resp, nil
}

// HeldDevices returns the device IDs (as advertised to the kubelet,
// replica IDs included) of resource that containers hold, from the
// kubelet's PodResources API on socket. A missing socket or a failed List
// is an error naming the socket: nobody can tell then.
func HeldDevices(ctx context.Context, socket, resource string) ([]string, error) {
	held, err := HeldByResource(ctx, socket)
	return held[resource], err
}

// DeviceHolders returns the device IDs of resource that the kubelet's
// PodResources API on socket says containers hold, each with the
// containers holding it ("namespace/pod/container"). ok is false when
// there is no socket (no kubelet, or the API is not mounted): nothing is
// known then.
func DeviceHolders(ctx context.Context, socket, resource string) (held map[string][]string, ok bool, err error) {
	if _, err := os.Stat(socket); err != nil {
		return nil, false, nil
	}
	resp, err := list(ctx, socket)
	if err != nil {
		return nil, false, err
	}
	held = map[string][]string{}
	for _, pod := range resp.PodResources {
		for _, c := range pod.Containers {
			for _, d := range c.Devices {
				if d.ResourceName != resource {
					continue
				}
				for _, id := range d.DeviceIds {
					held[id] = append(held[id], pod.Namespace+"/"+pod.Name+"/"+c.Name)
				}
			}
		}
	}
	return held, true, nil
}

// HeldByResource returns, by resource name, the device IDs that
// containers hold through device plugins (the containers' devices in the
// kubelet's PodResources API on socket; DRA devices are not among them),
// from one List. A missing socket or a failed List is an error naming the
// socket: nobody can tell then.
func HeldByResource(ctx context.Context, socket string) (map[string][]string, error) {
	resp, err := list(ctx, socket)
	if err != nil {
		return nil, err
	}
	held := map[string][]string{}
	for _, pod := range resp.PodResources {
		for _, c := range pod.Containers {
			for _, d := range c.Devices {
				held[d.ResourceName] = append(held[d.ResourceName], d.DeviceIds...)
			}
		}
	}
	return held, nil
}

// ClaimDevice is a device that a DRA claim of a container holds, as the
// kubelet's PodResources API lists it.
type ClaimDevice struct {
	// Claim is the claim's namespace/name.
	Claim string
	// Driver, Pool and Device name the device as the driver published it.
	Driver, Pool, Device string
	// CDIDevices are the qualified CDI device names the driver gave for
	// the device.
	CDIDevices []string
}

// ClaimDevices returns the devices that DRA claims of containers hold,
// once per claim and device (a claim that several containers share
// counts once), in the order List gives them, from one List of the
// kubelet's PodResources API on socket. A missing socket or a failed List
// is an error naming the socket: nobody can tell then.
func ClaimDevices(ctx context.Context, socket string) ([]ClaimDevice, error) {
	resp, err := list(ctx, socket)
	if err != nil {
		return nil, err
	}
	// A kubelet before 1.31 names no driver, pool or device: the CDI
	// names tell its devices apart.
	type key struct{ claim, driver, pool, device, cdi string }
	seen := map[key]bool{}
	var out []ClaimDevice
	for _, pod := range resp.PodResources {
		for _, c := range pod.Containers {
			for _, dr := range c.DynamicResources {
				claim := dr.ClaimNamespace + "/" + dr.ClaimName
				for _, cr := range dr.ClaimResources {
					d := ClaimDevice{Claim: claim, Driver: cr.DriverName, Pool: cr.PoolName, Device: cr.DeviceName}
					for _, n := range cr.CdiDevices {
						d.CDIDevices = append(d.CDIDevices, n.Name)
					}
					k := key{claim, cr.DriverName, cr.PoolName, cr.DeviceName, strings.Join(d.CDIDevices, ",")}
					if seen[k] {
						continue
					}
					seen[k] = true
					out = append(out, d)
				}
			}
		}
	}
	return out, nil
}
