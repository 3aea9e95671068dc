package kubeletsim

import (
	"context"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// PodResources is the kubelet's PodResources List, answering the pods
// last set (none at first), or the error last set, as drivers and plugins
// ask it which devices containers hold, and counting the calls.
type PodResources struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	mu    sync.Mutex
	pods  []*podresourcesapi.PodResources
	err   error
	calls int
	// delay: how long each List waits before it answers; gate, when
	// set: what each List waits for before it answers.
	delay time.Duration
	gate  <-chan struct{}

	srv    *grpc.Server
	served chan struct{}
}

// ServePodResources serves the PodResources API on the unix socket sock,
// answering pods, until Stop.
func ServePodResources(sock string, pods ...*podresourcesapi.PodResources) (*PodResources, error) {
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	p := &PodResources{pods: pods, srv: grpc.NewServer(), served: make(chan struct{})}
	podresourcesapi.RegisterPodResourcesListerServer(p.srv, p)
	go func() { defer close(p.served); _ = p.srv.Serve(ln) }()
	return p, nil
}

// Stop stops the server and waits for it.
func (s *PodResources) Stop() {
	s.srv.Stop()
	<-s.served
}

// Set replaces the pods List answers.
func (s *PodResources) Set(pods ...*podresourcesapi.PodResources) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods = pods
}

// SetErr has List fail with err (a kubelet that cannot answer) until it
// is set to nil.
func (s *PodResources) SetErr(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

// SetDelay has each List wait d before it answers (a loaded kubelet),
// or until the caller gives up.
func (s *PodResources) SetDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

// SetGate has each List wait, before it answers, until gate is closed
// (a kubelet that answers only once something else happened), or until
// the caller gives up; nil: no wait.
func (s *PodResources) SetGate(gate <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = gate
}

// Calls is how many List calls were answered, failed ones included.
func (s *PodResources) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// List answers the pods, or the error set.
func (s *PodResources) List(ctx context.Context, _ *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	s.mu.Lock()
	delay, gate := s.delay, s.gate
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.err != nil {
		return nil, s.err
	}
	return &podresourcesapi.ListPodResourcesResponse{PodResources: slices.Clone(s.pods)}, nil
}
