package dra

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
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
		if err == nil || ctx.Err() != nil {
			break // done, or our caller gave up: the connection is fine
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

// The PodResources List of a Prepare starts when the kubelet's
// NodePrepareResources call arrives, beside the helper's GET of the
// claims from the API (milliseconds), instead of after it: Prepare then
// finds its answer waiting. The answer is as fresh as the call: a
// container that a device plugin gives a device after it is not seen,
// as one given a device after a List made later would not be either (the
// kubelet allocates device-plugin devices without asking the driver).

// heldPrefetch is a List started for one call; done is closed when held
// and err are set.
type heldPrefetch struct {
	done chan struct{}
	held map[string][]string
	err  error
}

type prefetchKey struct{}

// prefetchHeld is the helper's gRPC interceptor (kubeletplugin.GRPCInterceptor):
// for a NodePrepareResources call with a claim not prepared in this boot it
// starts the PodResources List that Prepare will need, hands it to the
// call in its context, and, once the call is answered, stops it if the
// call did not wait for it, and waits for its end.
func (d *Driver) prefetchHeld(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	r, ok := req.(*drav1.NodePrepareResourcesRequest)
	if !ok || !d.mayPrepareNew(r) {
		return handler(ctx, req)
	}
	lctx, cancel := context.WithCancel(ctx)
	f := &heldPrefetch{done: make(chan struct{})}
	go func() {
		defer close(f.done)
		f.held, f.err = d.podres.heldByResource(lctx)
	}()
	defer func() {
		cancel()
		<-f.done
	}()
	return handler(context.WithValue(ctx, prefetchKey{}, f), req)
}

// mayPrepareNew reports whether a claim of r is not prepared in this
// boot (Prepare asks PodResources for such claims only).
func (d *Driver) mayPrepareNew(r *drav1.NodePrepareResourcesRequest) bool {
	cp := d.opts.Checkpoint.Claims()
	for _, c := range r.Claims {
		pc, ok := cp[types.UID(c.Uid)]
		if !ok || pc.Unpreparing || pc.PrepareAgain || pc.BootID != d.opts.BootID {
			return true
		}
	}
	return false
}

// heldByResource is what PodResources says device-plugin containers
// hold: the List the call's interceptor started (prefetchHeld), or, without
// one or when it failed, one made now.
func (d *Driver) heldByResource(ctx context.Context) (map[string][]string, error) {
	if f, ok := ctx.Value(prefetchKey{}).(*heldPrefetch); ok {
		select {
		case <-f.done:
			if f.err == nil {
				return f.held, nil
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return d.podres.heldByResource(ctx)
}
