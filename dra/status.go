package dra

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/clock"
)

// Backoff of the status writes that fail.
const (
	statusRetryFirst = 200 * time.Millisecond
	statusRetryMax   = 30 * time.Second
	// statusAttempts bounds the writes of one status: with the backoff
	// above, about a minute and a half of trying.
	statusAttempts = 10
	// statusCallTimeout bounds one write.
	statusCallTimeout = 10 * time.Second
)

type statusItem struct {
	st        claimStatus
	attempt   int
	notBefore time.Time
}

// statusQueue writes the claims' status.devices in the background, off
// the kubelet's calls: PrepareResourceClaims hands each claim's outcome
// over (prepared) and returns. One goroutine (run, under the driver's Run)
// applies them one claim at a time, with server-side apply of the status
// under the driver's field manager, so that other drivers' entries and
// other fields are left alone. A newer outcome of a claim replaces one not
// written yet (coalescing); a failed write is retried with a backoff
// (statusAttempts at most); a claim gone (not found, replaced by another
// UID, its allocation changed: the API refuses the write) is given up at
// once. An outcome that equals the one last written for the claim is not
// written again (the kubelet asks again for prepared claims after it
// restarts, and again and again for a claim that fails). A failure is
// logged and never changes the answer to the kubelet.
type statusQueue struct {
	rep statusReporter
	// off: nothing is written (Options.NoDeviceStatus).
	off bool
	// metrics counts the writes by result (nil: none).
	metrics *metrics.DRA
	log     *logrus.Entry
	clock   clock.Clock

	mu      sync.Mutex
	pending map[types.UID]*statusItem
	// written: the last status written, by claim; dropped at Unprepare.
	written map[types.UID]claimStatus
	// inflight is the claim being written; forgot: it was unprepared
	// meanwhile (what the write wrote is not remembered).
	inflight types.UID
	forgot   bool
	wake     chan struct{}
}

func newStatusQueue(driver string, client resourceclient.ResourceV1Interface, devs *devices, off bool, log *logrus.Entry) *statusQueue {
	return &statusQueue{rep: statusReporter{driver: driver, client: client, devs: devs}, off: off, log: log.WithField("part", "claim status"), clock: clock.RealClock{},
		pending: map[types.UID]*statusItem{}, written: map[types.UID]claimStatus{}, wake: make(chan struct{}, 1)}
}

// prepared queues the status of each claim of a Prepare call, from the
// answer out (nothing with Options.NoDeviceStatus); it does no I/O.
func (q *statusQueue) prepared(claims []*resourceapi.ResourceClaim, out map[types.UID]kubeletplugin.PrepareResult, own map[types.UID]error) {
	if q.off {
		return
	}
	now := q.clock.Now()
	for _, c := range claims {
		st, ok := q.rep.outcome(c, out[c.UID], own[c.UID])
		if !ok {
			continue
		}
		q.put(st, now)
	}
}

// put queues st unless it is what was written last for the claim; each
// device's condition keeps its transition time while its status does not
// change.
func (q *statusQueue) put(st claimStatus, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	prev, seen := q.written[st.UID]
	if p, ok := q.pending[st.UID]; ok {
		prev, seen = p.st, true
	}
	for i := range st.Devices {
		ds := &st.Devices[i]
		ds.Since = now
		if !seen {
			continue
		}
		if j := slices.IndexFunc(prev.Devices, func(x deviceStatus) bool {
			return x.Pool == ds.Pool && x.Device == ds.Device && x.ShareID == ds.ShareID
		}); j >= 0 && prev.Devices[j].Ready == ds.Ready {
			ds.Since = prev.Devices[j].Since
		}
	}
	if w, ok := q.written[st.UID]; ok && reflect.DeepEqual(w, st) {
		delete(q.pending, st.UID) // a pending other outcome is stale now
		return
	}
	q.pending[st.UID] = &statusItem{st: st}
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// forget drops what is queued for the claim and what was written: the
// claim is unprepared (no status is written after that).
func (q *statusQueue) forget(uid types.UID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.pending, uid)
	delete(q.written, uid)
	if uid == q.inflight {
		q.forgot = true
	}
}

// next is the item to write now, or how long until one is due (0: none
// queued).
func (q *statusQueue) next(now time.Time) (*statusItem, time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var first *statusItem
	for uid, it := range q.pending {
		if !it.notBefore.After(now) {
			delete(q.pending, uid)
			q.inflight, q.forgot = uid, false
			return it, 0
		}
		if first == nil || it.notBefore.Before(first.notBefore) {
			first = it
		}
	}
	if first == nil {
		return nil, 0
	}
	return nil, first.notBefore.Sub(now)
}

// run writes the queued statuses until ctx is done.
func (q *statusQueue) run(ctx context.Context) error {
	for {
		it, wait := q.next(q.clock.Now())
		if it != nil {
			q.write(ctx, it)
			continue
		}
		var due <-chan time.Time
		stop := func() {}
		if wait > 0 {
			t := q.clock.NewTimer(wait)
			due, stop = t.C(), func() { t.Stop() }
		}
		select {
		case <-ctx.Done():
			stop()
			return nil
		case <-q.wake:
		case <-due:
		}
		stop()
	}
}

// write applies one claim's status; a failure is retried later unless the
// claim is gone or a newer outcome replaced it meanwhile.
func (q *statusQueue) write(ctx context.Context, it *statusItem) {
	log := q.log.WithField("claim", it.st.Namespace+"/"+it.st.Name)
	cctx, cancel := context.WithTimeout(ctx, statusCallTimeout)
	err := q.rep.apply(cctx, it.st)
	cancel()
	q.mu.Lock()
	defer q.mu.Unlock()
	forgot := q.forgot
	q.inflight, q.forgot = "", false
	if forgot {
		return // unprepared meanwhile
	}
	if err == nil {
		q.written[it.st.UID] = it.st
		q.metrics.StatusWritten(metrics.StatusOK)
		log.WithField("devices", len(it.st.Devices)).Debug("claim status written")
		return
	}
	if ctx.Err() != nil {
		return
	}
	if _, newer := q.pending[it.st.UID]; newer {
		return
	}
	if perm := deniedPermission(err, q.rep.driver); perm != "" {
		q.metrics.StatusWritten(metrics.StatusDenied)
		log.WithError(err).WithField("needs", perm).Warn("claim status not written: the driver's account may not write the claim's status; " +
			"grant it " + perm + " (the claim is prepared all the same; its status is written at its next preparation)")
		return
	}
	if claimGone(err) {
		q.metrics.StatusWritten(metrics.StatusGone)
		log.WithError(err).Info("claim status not written: the claim is gone or changed")
		return
	}
	it.attempt++
	if it.attempt >= statusAttempts {
		q.metrics.StatusWritten(metrics.StatusGivenUp)
		log.WithError(err).WithField("attempts", it.attempt).Warn("giving up writing the claim's status")
		return
	}
	wait := min(statusRetryFirst<<(it.attempt-1), statusRetryMax)
	it.notBefore = q.clock.Now().Add(wait)
	q.pending[it.st.UID] = it
	q.metrics.StatusWritten(metrics.StatusRetry)
	log.WithError(err).WithField("retry in", wait).Warn("writing the claim's status failed")
}

// deniedPermission is the permission whose lack made the API refuse a
// status write ("" for another refusal): the granular status
// authorization (DRAResourceClaimGranularStatusAuthorization) answers a
// 422 whose cause is Forbidden when the account lacks
// associated-node:patch on resourceclaims/driver for the driver's name;
// RBAC answers a 403 without patch on resourceclaims/status. No retry can
// succeed before an operator grants it.
func deniedPermission(err error, driver string) string {
	if apierrors.IsForbidden(err) {
		return "patch on resourceclaims/status"
	}
	var se apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &se) || se.Status().Details == nil {
		return ""
	}
	for _, c := range se.Status().Details.Causes {
		if c.Type == metav1.CauseType(field.ErrorTypeForbidden) {
			return "associated-node:patch on resourceclaims/driver (resourceNames: " + driver + ")"
		}
	}
	return ""
}

// claimGone: the API refuses a status write for good: the claim is gone,
// replaced by another of its name (a UID mismatch), or no longer
// allocated the devices.
func claimGone(err error) bool {
	return apierrors.IsNotFound(err) || apierrors.IsGone(err) || apierrors.IsConflict(err) || apierrors.IsInvalid(err)
}
