package dra

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	metav1apply "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/clock"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
)

// ConditionReady is the condition the driver writes for each of its
// devices in a claim's status.devices.
const ConditionReady = "Ready"

// ReadyReason is the reason of a device's Ready condition.
type ReadyReason string

// The reasons of the Ready condition. A failed prestart step gives
// <Step>Failed (StepReason): ResetFailed, ReprogramFailed, ExecFailed, or
// StateFailed when the device's state.json could not be read or written.
const (
	// ReasonPrepared: the claim is prepared (Ready True).
	ReasonPrepared ReadyReason = "Prepared"
	// ReasonNotPrepared: nothing is wrong with the device, but another
	// device of the claim, or another claim of the kubelet's call,
	// failed; the kubelet asks again.
	ReasonNotPrepared ReadyReason = "NotPrepared"
	// ReasonUnhealthy: a device of the claim is unhealthy (ErrUnhealthy).
	ReasonUnhealthy ReadyReason = "DeviceUnhealthy"
	// ReasonHeld: another claim, or a container through the device
	// plugin, holds a device of the claim (ErrHeld).
	ReasonHeld ReadyReason = "DeviceHeld"
	// ReasonHoldersUnknown: PodResources could not tell who holds the
	// devices (ErrCannotTell).
	ReasonHoldersUnknown ReadyReason = "HoldersUnknown"
	// ReasonUnknownDevice: the allocation names a device the driver does
	// not publish on this node (ErrUnknownDevice).
	ReasonUnknownDevice ReadyReason = "UnknownDevice"
	// ReasonAllocationChanged: the claim was prepared with other devices
	// (ErrAllocationChanged).
	ReasonAllocationChanged ReadyReason = "AllocationChanged"
	// ReasonOpaqueConfig: the claim carries configuration for the driver
	// (ErrOpaqueConfig).
	ReasonOpaqueConfig ReadyReason = "OpaqueConfigRefused"
	// ReasonPrepareFailed: any other failure (writing the claim's CDI
	// spec or the checkpoint, say).
	ReasonPrepareFailed ReadyReason = "PrepareFailed"
)

// StepReason is the reason of a device whose prestart step failed:
// the step's name, capitalised, and "Failed" ("reset": ResetFailed).
func StepReason(step string) ReadyReason {
	if step == "" {
		return ReasonPrepareFailed
	}
	return ReadyReason(strings.ToUpper(step[:1]) + step[1:] + "Failed")
}

// StatusData is the data of a device in the claim's status.devices
// (AllocatedDeviceStatus.Data), a JSON object.
type StatusData struct {
	// Resource is the extended resource name, ID the device ID (its CDI
	// device name); both empty for a device the driver does not know.
	Resource string `json:"resource,omitempty"`
	ID       string `json:"id,omitempty"`
	// PCIAddress of a PCI function.
	PCIAddress string `json:"pciAddress,omitempty"`
	// NUMANode is the device's NUMA node, -1 when it has none (or the
	// driver does not know the device).
	NUMANode int `json:"numaNode"`
	// Generation counts the device's successful preparations (the
	// prestart state, state.json); absent for a resource without steps.
	Generation *int64 `json:"generation,omitempty"`
	// CDIDeviceIDs are the CDI devices the claim's containers get for the
	// device (a prepared claim only).
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
}

// maxStatusMessage bounds a condition's message (the API allows 32768
// bytes; a Ready condition needs far less).
const maxStatusMessage = 1024

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

// deviceStatus is what the driver reports for one allocated device.
type deviceStatus struct {
	Pool, Device string
	// ShareID of the allocation ("" for none).
	ShareID      string
	CDIDeviceIDs []string
	Ready        bool
	Reason       ReadyReason
	Message      string
	// Since is when the condition took its status (LastTransitionTime).
	Since time.Time
}

// claimStatus is what the driver reports for one claim.
type claimStatus struct {
	Namespace, Name string
	UID             types.UID
	Devices         []deviceStatus
}

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
	d     *Driver
	log   *logrus.Entry
	clock clock.Clock

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

func newStatusQueue(d *Driver) *statusQueue {
	return &statusQueue{d: d, log: d.log.WithField("part", "claim status"), clock: clock.RealClock{},
		pending: map[types.UID]*statusItem{}, written: map[types.UID]claimStatus{}, wake: make(chan struct{}, 1)}
}

// prepared queues the status of each claim of a Prepare call, from the
// answer out (nothing with Options.NoDeviceStatus); it does no I/O.
func (q *statusQueue) prepared(claims []*resourceapi.ResourceClaim, out map[types.UID]kubeletplugin.PrepareResult, own map[types.UID]error) {
	if q.d.opts.NoDeviceStatus {
		return
	}
	now := q.clock.Now()
	for _, c := range claims {
		st, ok := q.d.outcome(c, out[c.UID], own[c.UID])
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
	err := q.d.applyStatus(cctx, it.st)
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
		log.WithField("devices", len(it.st.Devices)).Debug("claim status written")
		return
	}
	if ctx.Err() != nil {
		return
	}
	if _, newer := q.pending[it.st.UID]; newer {
		return
	}
	if claimGone(err) {
		log.WithError(err).Info("claim status not written: the claim is gone or changed")
		return
	}
	it.attempt++
	if it.attempt >= statusAttempts {
		log.WithError(err).WithField("attempts", it.attempt).Warn("giving up writing the claim's status")
		return
	}
	wait := min(statusRetryFirst<<(it.attempt-1), statusRetryMax)
	it.notBefore = q.clock.Now().Add(wait)
	q.pending[it.st.UID] = it
	log.WithError(err).WithField("retry in", wait).Warn("writing the claim's status failed")
}

// claimGone: the API refuses a status write for good: the claim is gone,
// replaced by another of its name (a UID mismatch), or no longer
// allocated the devices.
func claimGone(err error) bool {
	return apierrors.IsNotFound(err) || apierrors.IsGone(err) || apierrors.IsConflict(err) || apierrors.IsInvalid(err)
}

// outcome is claim c's status from its answer r (own: its own error, nil
// when only another claim of the call failed); false when the claim has no
// device of the driver.
func (d *Driver) outcome(c *resourceapi.ResourceClaim, r kubeletplugin.PrepareResult, own error) (claimStatus, bool) {
	st := claimStatus{Namespace: c.Namespace, Name: c.Name, UID: c.UID}
	if c.Status.Allocation == nil {
		return st, false
	}
	steps := stepErrors(own)
	for _, res := range c.Status.Allocation.Devices.Results {
		if res.Driver != d.opts.DriverName {
			continue
		}
		ds := deviceStatus{Pool: res.Pool, Device: res.Device}
		if res.ShareID != nil {
			ds.ShareID = string(*res.ShareID)
		}
		if slices.ContainsFunc(st.Devices, func(x deviceStatus) bool {
			return x.Pool == ds.Pool && x.Device == ds.Device && x.ShareID == ds.ShareID
		}) {
			continue
		}
		switch {
		case r.Err == nil:
			ds.Ready, ds.Reason, ds.Message = true, ReasonPrepared, "prepared"
			for _, dv := range r.Devices {
				if dv.PoolName == ds.Pool && dv.DeviceName == ds.Device && (dv.ShareID == nil || string(*dv.ShareID) == ds.ShareID) {
					ds.CDIDeviceIDs = append(ds.CDIDeviceIDs, dv.CDIDeviceIDs...)
				}
			}
		case own == nil:
			ds.Reason, ds.Message = ReasonNotPrepared, r.Err.Error()
		default:
			ds.Reason, ds.Message = d.failureReason(res, own, steps)
		}
		st.Devices = append(st.Devices, ds)
	}
	return st, len(st.Devices) > 0
}

// failureReason is the reason and message of a device of a claim that
// failed with err: its own step's failure, else the claim's cause. A
// device whose steps ran while another device's failed is NotPrepared.
func (d *Driver) failureReason(res resourceapi.DeviceRequestAllocationResult, err error, steps map[string]*prestart.StepError) (ReadyReason, string) {
	if _, dv, ok := d.devs.lookup(res.Pool, res.Device); ok {
		if se, failed := steps[dv.Name]; failed {
			return StepReason(se.Step), se.Error()
		}
	}
	reason := ReasonPrepareFailed
	for _, c := range []struct {
		err    error
		reason ReadyReason
	}{
		{ErrUnhealthy, ReasonUnhealthy}, {ErrHeld, ReasonHeld}, {ErrCannotTell, ReasonHoldersUnknown},
		{ErrUnknownDevice, ReasonUnknownDevice}, {ErrAllocationChanged, ReasonAllocationChanged}, {ErrOpaqueConfig, ReasonOpaqueConfig},
	} {
		if errors.Is(err, c.err) {
			reason = c.reason
			break
		}
	}
	if len(steps) > 0 && reason == ReasonPrepareFailed {
		reason = ReasonNotPrepared
	}
	return reason, err.Error()
}

// stepErrors are the failed steps in err, by device: every StepError in
// its tree (wrapped and joined errors alike).
func stepErrors(err error) map[string]*prestart.StepError {
	out := map[string]*prestart.StepError{}
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) { //nolint:errorlint // walking the tree
		case nil:
		case *prestart.StepError:
			out[e.Device] = e
		case interface{ Unwrap() []error }:
			for _, x := range e.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	walk(err)
	return out
}

// statusData is the data of device ds (StatusData): what the driver knows
// of it now.
func (d *Driver) statusData(ds deviceStatus) StatusData {
	out := StatusData{NUMANode: device.NoNUMA, CDIDeviceIDs: ds.CDIDeviceIDs}
	r, dv, ok := d.devs.lookup(ds.Pool, ds.Device)
	if !ok {
		return out
	}
	out.Resource, out.ID, out.PCIAddress, out.NUMANode = r.Name, dv.Name, dv.Identity.PCIAddress, dv.NUMANode
	if sd, ok := r.Runner.(stateDirs); ok && sd.HasSteps() {
		if s, err := prestart.LoadState(sd.Dir(dv.Name)); err == nil {
			out.Generation = &s.Generation
		}
	}
	return out
}

// stateDirs is a Runner with device state (prestart.Runner).
type stateDirs interface {
	HasSteps() bool
	BadState(name string) bool
	Dir(name string) string
}

// applyStatus writes the claim's status.devices entries of the driver by
// server-side apply under the driver's name as field manager: the entries
// of other drivers, and the rest of the status, are not touched.
func (d *Driver) applyStatus(ctx context.Context, st claimStatus) error {
	status := resourceapply.ResourceClaimStatus()
	for _, ds := range st.Devices {
		data, err := json.Marshal(d.statusData(ds))
		if err != nil {
			return err
		}
		cond := metav1apply.Condition().WithType(ConditionReady).WithReason(string(ds.Reason)).
			WithMessage(truncate(ds.Message, maxStatusMessage)).WithLastTransitionTime(metav1.NewTime(ds.Since))
		if ds.Ready {
			cond.WithStatus(metav1.ConditionTrue)
		} else {
			cond.WithStatus(metav1.ConditionFalse)
		}
		e := resourceapply.AllocatedDeviceStatus().WithDriver(d.opts.DriverName).WithPool(ds.Pool).WithDevice(ds.Device).
			WithConditions(cond).WithData(runtime.RawExtension{Raw: data})
		if ds.ShareID != "" {
			e.WithShareID(ds.ShareID)
		}
		status.WithDevices(e)
	}
	claim := resourceapply.ResourceClaim(st.Name, st.Namespace).WithUID(st.UID).WithStatus(status)
	_, err := d.opts.StatusClient.ResourceV1().ResourceClaims(st.Namespace).ApplyStatus(ctx, claim,
		metav1.ApplyOptions{FieldManager: d.opts.DriverName, Force: true})
	return err
}

// truncate cuts s to at most n bytes of valid UTF-8.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for s != "" && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
