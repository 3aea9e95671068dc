package dra

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// podResourcesTimeout bounds one List, as metrics' lists are bounded.
const podResourcesTimeout = 5 * time.Second

// podResources asks the kubelet's PodResources API which devices
// device-plugin containers hold, over one connection kept between calls:
// a new connection for every Prepare (a gRPC client, its HTTP/2
// handshake) cost about as much as the List itself. A List that fails on
// the kept connection is asked once more on a new one (the kubelet
// restarted: its socket is a new one, and gRPC's reconnect back-off on the
// old connection would fail calls for seconds), so that a failure says
// what a fresh connection says, as before.
type podResources struct {
	socket string

	mu   sync.Mutex
	conn *grpc.ClientConn
}

// heldByResource is metrics.HeldByResource over the kept connection: by
// resource name, the device IDs containers hold through device plugins.
// A missing socket or a failed List is an error naming the socket.
func (p *podResources) heldByResource(ctx context.Context) (map[string][]string, error) {
	if _, err := os.Stat(p.socket); err != nil {
		return nil, fmt.Errorf("PodResources socket %s: %w", p.socket, err)
	}
	ctx, cancel := context.WithTimeout(ctx, podResourcesTimeout)
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	var resp *podresourcesapi.ListPodResourcesResponse
	var err error
	for try := 0; try < 2; try++ {
		if p.conn == nil {
			if p.conn, err = grpc.NewClient("unix://"+p.socket, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
				return nil, fmt.Errorf("PodResources List on %s: %w", p.socket, err)
			}
		}
		resp, err = podresourcesapi.NewPodResourcesListerClient(p.conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
		if err == nil {
			break
		}
		_ = p.conn.Close()
		p.conn = nil
	}
	if err != nil {
		return nil, fmt.Errorf("PodResources List on %s: %w", p.socket, err)
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

// close closes the kept connection.
func (p *podResources) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		_ = p.conn.Close()
		p.conn = nil
	}
}
