package dra

import (
	"fmt"
	"os"
	"sync"

	"github.com/sirupsen/logrus"
	"go.etcd.io/etcd/client/pkg/v3/fileutil"

	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
)

// preparer prepares and unprepares the claims of the kubelet's calls, and
// releases those the stale-claim clean-up drops: one at a time (mu),
// through the claim checkpoint, the resources' runners, the claims' CDI
// specs and device metadata, the status writer and the PodResources view.
type preparer struct {
	// driver names the driver, boot is the kernel's boot ID.
	driver, boot string
	devs         *devices
	checkpoint   *Checkpoint
	specs        *claimSpecs
	metadata     *metadataFiles
	status       *statusQueue
	holders      *holdersView
	log          *logrus.Entry
	// metrics counts the calls, the claims and the stale claims dropped
	// (nil: none).
	metrics *metrics.DRA
	// serializeLock, during a rolling update (Options.RollingUpdateUID),
	// is the file the helper locks around every call of the kubelet to
	// either instance; the release of a stale claim, which the helper
	// does not call, locks it too.
	serializeLock string

	// mu serialises Prepare, Unprepare and the release of stale claims
	// (the helper serialises the kubelet's calls too, but the checkpoint
	// must not depend on that).
	mu sync.Mutex
}

// lock takes mu, and unlock lets it go, each telling the PodResources
// view (holdersView.turn): a List started while another call held the lock,
// or before another took it, is stale for the call that waited. With mu
// held it reads the checkpoint again if another instance of the driver
// saved it meanwhile (a rolling update: Checkpoint.Refresh); a checkpoint
// that cannot be read fails the call.
func (pr *preparer) lock() error {
	pr.mu.Lock()
	pr.holders.turn()
	return pr.checkpoint.Refresh()
}

func (pr *preparer) unlock() {
	pr.holders.turn()
	pr.mu.Unlock()
}

// lockAlone takes the locks of work the kubelet does not call (the release
// of a stale claim, a preparation before binding): during a rolling update
// the helper's cross-instance lock first (it serialises the kubelet's calls
// to either instance, and this work must not run beside one of them), then
// lock. The returned func lets both go.
func (pr *preparer) lockAlone() (func(), error) {
	release := func() {}
	if pr.serializeLock != "" {
		l, err := fileutil.LockFile(pr.serializeLock, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("lock %s: %w", pr.serializeLock, err)
		}
		release = func() { _ = l.Close() }
	}
	if err := pr.lock(); err != nil {
		pr.unlock()
		release()
		return nil, err
	}
	return func() {
		pr.unlock()
		release()
	}, nil
}
