package dra

import (
	"context"
	"sync"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The first look. Before its first publish the slice loop needs three
// answers: the node (what it reports, for the handover guards, and its
// UID, the owner of the slices the driver creates), what device-plugin
// containers hold (PodResources, for the guards too) and which of the
// driver's pools have slices in the API already (publishAtOnce). None
// depends on the driver's start, so Run asks for them as it starts, beside
// the checkpoint check, the spec writes and the kubelet plugin's start:
// asked once the driver served, they came after them, and the first
// request opens the connection to the API server. The answers go to the
// loop, which alone owns the guards; nothing is published before the
// spec is written and the driver serves.

// firstLook is the first look, asked in the background; stop ends it.
type firstLook struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// nodeDone is closed once node is set (nil when the GET failed),
	// polled once held is, listed once existing is.
	nodeDone, polled, listed chan struct{}
	node                     *corev1.Node
	held                     pollResult
	// existing is, by pool name, the pools of the driver on the node
	// that have slices; nil when the List failed.
	existing map[string]bool
}

// guardLook is what the first look tells the handover guards: the node
// (nil when the GET failed) and what PodResources answered.
type guardLook struct {
	node *corev1.Node
	held pollResult
}

// startFirstLook asks, in the background, for the node and PodResources
// side by side within primeTimeout (the guards' answers), and for the
// driver's slices on the node once the node answered (on the connection
// its GET opened).
func startFirstLook(ctx context.Context, h *handoverGuard, client kubernetes.Interface, driver, node string, log *logrus.Entry) *firstLook {
	ctx, cancel := context.WithCancel(ctx)
	f := &firstLook{cancel: cancel, nodeDone: make(chan struct{}), polled: make(chan struct{}), listed: make(chan struct{})}
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		gctx, gcancel := context.WithTimeout(ctx, primeTimeout)
		if n, err := client.CoreV1().Nodes().Get(gctx, node, metav1.GetOptions{}); err == nil {
			f.node = n
		}
		gcancel()
		close(f.nodeDone)
		f.existing = existingPools(ctx, client, driver, node, log)
		close(f.listed)
	}()
	go func() {
		defer f.wg.Done()
		pctx, pcancel := context.WithTimeout(ctx, primeTimeout)
		f.held = h.poll(pctx)
		pcancel()
		close(f.polled)
	}()
	return f
}

// guards waits for the guards' answers; false: ctx ended first.
func (f *firstLook) guards(ctx context.Context) (guardLook, bool) {
	for _, c := range []<-chan struct{}{f.nodeDone, f.polled} {
		select {
		case <-c:
		case <-ctx.Done():
			return guardLook{}, false
		}
	}
	return guardLook{node: f.node, held: f.held}, true
}

// pools waits for the List of the driver's slices on the node and
// returns which pools have slices: nil when it failed or ctx ended first.
func (f *firstLook) pools(ctx context.Context) map[string]bool {
	select {
	case <-f.listed:
		return f.existing
	case <-ctx.Done():
		return nil
	}
}

// stop cancels what is still asked and waits for it.
func (f *firstLook) stop() {
	f.cancel()
	f.wg.Wait()
}
