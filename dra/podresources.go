package dra

import (
	"context"
	"sync/atomic"

	"github.com/cdi-device-plugin/cdi-device-plugin/podresources"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

// holdersView is the driver's view of the kubelet's PodResources: which
// devices device-plugin containers hold, asked over the driver's one
// client (a connection kept between calls: a new connection for every
// Prepare cost about as much as the List itself), with the List of a
// NodePrepareResources call started as the call arrives (intercept).
type holdersView struct {
	client *podresources.Client
	// checkpoint and boot tell which claims are prepared in this boot:
	// a call of those only needs no List.
	checkpoint *Checkpoint
	boot       string
	// turns counts the takes and releases of the preparer's lock (by
	// Prepare, Unprepare, a stale claim's release): a List that a call's
	// interceptor started is used only if the call's own take is the one
	// turn since, so no call ran, or was running, in between.
	turns atomic.Uint64
}

// turn records a take or a release of the preparer's lock.
func (v *holdersView) turn() { v.turns.Add(1) }

// list is one List: the devices containers hold, with their holders. A
// missing socket or a failed List is an error naming the socket.
func (v *holdersView) list(ctx context.Context) (*podresources.Resources, error) {
	return v.client.List(ctx)
}

// heldNow is, by resource name, the device IDs device-plugin containers
// hold, from a List made now.
func (v *holdersView) heldNow(ctx context.Context) (map[string][]string, error) {
	res, err := v.client.List(ctx)
	if err != nil {
		return nil, err
	}
	return res.HeldByResource(), nil
}

// The PodResources List of a Prepare starts when the kubelet's
// NodePrepareResources call arrives, beside the helper's GET of the
// claims from the API (milliseconds), instead of after it: Prepare then
// finds its answer waiting. The answer is as fresh as the call: a
// container that a device plugin gives a device after it is not seen,
// as one given a device after a List made later would not be either (the
// kubelet allocates device-plugin devices without asking the driver).

// heldPrefetch is a List started for one call; done is closed when held
// and err are set; turns is holdersView.turns when it started.
type heldPrefetch struct {
	done  chan struct{}
	held  map[string][]string
	err   error
	turns uint64
}

type prefetchKey struct{}

// intercept is the helper's gRPC interceptor (kubeletplugin.GRPCInterceptor):
// for a NodePrepareResources call with a claim not prepared in this boot it
// starts the PodResources List that Prepare will need, hands it to the
// call in its context, and, once the call is answered, stops it if the
// call did not wait for it, and waits for its end.
func (v *holdersView) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	r, ok := req.(*drav1.NodePrepareResourcesRequest)
	if !ok || !v.mayPrepareNew(r) {
		return handler(ctx, req)
	}
	lctx, cancel := context.WithCancel(ctx)
	f := &heldPrefetch{done: make(chan struct{}), turns: v.turns.Load()}
	go func() {
		defer close(f.done)
		f.held, f.err = v.heldNow(lctx)
	}()
	defer func() {
		cancel()
		<-f.done
	}()
	return handler(context.WithValue(ctx, prefetchKey{}, f), req)
}

// mayPrepareNew reports whether a claim of r is not prepared in this
// boot (Prepare asks PodResources for such claims only).
func (v *holdersView) mayPrepareNew(r *drav1.NodePrepareResourcesRequest) bool {
	cp := v.checkpoint.Claims()
	for _, c := range r.Claims {
		pc, ok := cp[types.UID(c.Uid)]
		if !ok || pc.Unpreparing || pc.PrepareAgain || pc.BootID != v.boot {
			return true
		}
	}
	return false
}

// heldByResource is what PodResources says device-plugin containers
// hold: the List the call's interceptor started (intercept), or one made
// now when there is none, when it failed, or when another call of the
// preparer ran while this one waited for the lock: a device a
// device-plugin container got meanwhile would not be in it, however long
// the wait.
func (v *holdersView) heldByResource(ctx context.Context) (map[string][]string, error) {
	if f, ok := ctx.Value(prefetchKey{}).(*heldPrefetch); ok && v.turns.Load() == f.turns+1 {
		select {
		case <-f.done:
			if f.err == nil {
				return f.held, nil
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return v.heldNow(ctx)
}
