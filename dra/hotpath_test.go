package dra

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/inotify"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// servePodResources serves an empty PodResources on sock, counting its
// connections, until the returned stop.
func servePodResources(t *testing.T, sock string, opts ...grpc.ServerOption) (*countingListener, func()) {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	srv := grpc.NewServer(opts...)
	podresourcesapi.RegisterPodResourcesListerServer(srv, &kubeletsim.PodResources{})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(cl) }()
	stop := func() { srv.Stop(); <-done }
	t.Cleanup(stop)
	return cl, stop
}

// TestPreparePodResourcesConnection: Prepare asks
// PodResources over one connection kept between calls, not a new one per
// call (a gRPC client and its handshake cost as much as the List); a
// kubelet that restarts (its socket served anew) is asked on a new
// connection at the next Prepare, which succeeds.
func TestPreparePodResourcesConnection(t *testing.T) {
	h := newHarness(t, map[string]string{"PRESTART_STEPS": "none"})
	sock := filepath.Join(testutil.ShortDir(t), "counted.sock")
	first, stop := servePodResources(t, sock)
	h.options = func(o *Options) { o.PodResources = sock }
	h.start()
	prepareNew := func(name string) {
		t.Helper()
		cl := h.claim(name, "sim-0")
		if r := h.prepare(cl)[cl.Uid]; r.Error != "" {
			t.Fatalf("prepare %s: %s", name, r.Error)
		}
		if r := h.unprepare(cl)[cl.Uid]; r.GetError() != "" {
			t.Fatalf("unprepare %s: %s", name, r.GetError())
		}
	}
	// The handover guard polls PodResources (a connection each) until it
	// is down: its devices published untainted.
	h.waitFor("the guard down", func() bool {
		p := h.published()
		return len(p) == 4 && !hasTaint(p["sim-0"], TaintHandover)
	})
	base := first.n.Load()
	for i := range 5 {
		prepareNew(fmt.Sprintf("c%d", i))
	}
	if n := first.n.Load() - base; n > 1 {
		t.Errorf("5 Prepares opened %d connections to PodResources, want at most 1 (kept)", n)
	}
	stop()
	if err := os.Remove(sock); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	second, _ := servePodResources(t, sock)
	prepareNew("after-restart")
	if second.n.Load() == 0 {
		t.Error("the Prepare after the restart did not ask the new PodResources")
	}
}

// TestUnprepareOneCheckpointWrite: a claim none of
// whose devices is to be reset (no reset step) is unprepared with one
// write of the checkpoint (its entry dropped, then its spec removed), not
// two (a mark that it is being unprepared first); the spec and the entry
// are gone. The writes are counted as the renames onto the checkpoint
// (inotify), each an atomic replace with its two fsyncs.
func TestUnprepareOneCheckpointWrite(t *testing.T) {
	h := newHarness(t, map[string]string{"PRESTART_STEPS": "none"})
	h.start()
	cl := h.claim("c", "sim-0", "sim-1")
	if r := h.prepare(cl)[cl.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	spec := h.checkpointed()[types.UID(cl.Uid)].ClaimSpec
	if spec == "" {
		t.Fatal("no claim spec")
	}
	dir := filepath.Join(h.state, "dra")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := inotify.Watch(ctx, unix.IN_MOVED_TO, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = st.Err() }()
	if r := h.unprepare(cl)[cl.Uid]; r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	// A rename of our own after the unprepare: every event before it has
	// arrived once it does (inotify keeps the order).
	sentinel := filepath.Join(dir, "sentinel")
	if err := os.WriteFile(sentinel+".tmp", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(sentinel+".tmp", sentinel); err != nil {
		t.Fatal(err)
	}
	writes := 0
	timeout := time.After(deadline)
	for done := false; !done; {
		select {
		case evs := <-st.Events():
			for _, e := range evs {
				switch e.Name {
				case "checkpoint.json":
					writes++
				case "sentinel":
					done = true
				}
			}
		case <-timeout:
			t.Fatal("no inotify event of the sentinel")
		}
	}
	if writes != 1 {
		t.Errorf("the unprepare wrote the checkpoint %d times, want 1", writes)
	}
	if _, err := os.Stat(spec); !os.IsNotExist(err) {
		t.Errorf("claim spec after the unprepare: %v", err)
	}
	if _, ok := h.checkpointed()[types.UID(cl.Uid)]; ok {
		t.Error("the claim is still checkpointed")
	}
}

// TestPrepareListsDuringClaimGet: the PodResources
// List of a new claim's Prepare is asked while the helper reads the claim
// from the API, not after: the test's API holds the claim's GET until
// PodResources is asked (at most 5 s), so a List made only after the GET
// fails the test. A claim prepared already is answered without a List.
func TestPrepareListsDuringClaimGet(t *testing.T) {
	h := newHarness(t, map[string]string{"PRESTART_STEPS": "none"})
	sock := filepath.Join(testutil.ShortDir(t), "counted.sock")
	listed := make(chan struct{}, 64)
	var lists atomic.Int32
	servePodResources(t, sock, grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		lists.Add(1)
		select {
		case listed <- struct{}{}:
		default:
		}
		return handler(ctx, req)
	}))
	h.options = func(o *Options) { o.PodResources = sock }
	h.start()
	h.waitFor("the guard down", func() bool {
		p := h.published()
		return len(p) == 4 && !hasTaint(p["sim-0"], TaintHandover)
	})
	cl := h.claim("c", "sim-0")
	var during atomic.Bool
	h.client.PrependReactor("get", "resourceclaims", func(clienttesting.Action) (bool, runtime.Object, error) {
		select {
		case <-listed:
			during.Store(true)
		case <-time.After(5 * time.Second):
		}
		return false, nil, nil
	})
	for len(listed) > 0 { // the guard's polls before
		<-listed
	}
	if r := h.prepare(cl)[cl.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if !during.Load() {
		t.Fatal("PodResources was not asked while the claim was read from the API (the List came after the GET)")
	}
	before := lists.Load()
	if r := h.prepare(cl)[cl.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if n := lists.Load() - before; n != 0 {
		t.Errorf("a claim prepared already: %d PodResources Lists, want 0", n)
	}
}
