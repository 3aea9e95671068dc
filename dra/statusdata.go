package dra

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	metav1apply "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

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
	// Binding is the binding condition the device reports, for a device
	// allocated with the driver's binding conditions: bindingPrepared
	// (<driver>/prepared True) or bindingFailed (<driver>/prepareFailed
	// True, with Reason and Message); bindingNone writes neither.
	Binding binding
}

// binding is which binding condition a device reports.
type binding int

const (
	bindingNone binding = iota
	bindingPrepared
	bindingFailed
)

// claimStatus is what the driver reports for one claim.
type claimStatus struct {
	Namespace, Name string
	UID             types.UID
	Devices         []deviceStatus
}

// statusReporter is what the status writer knows of the claims' devices
// and how it writes their status: the driver's name (the entries'
// driver, the field manager), the client it writes with
// (Options.StatusClient) and the devices their data comes from.
type statusReporter struct {
	driver string
	client resourceclient.ResourceV1Interface
	devs   *devices
}

// outcome is claim c's status from its answer r (own: its own error, nil
// when only another claim of the call failed); false when the claim has no
// device of the driver.
func (q statusReporter) outcome(c *resourceapi.ResourceClaim, r kubeletplugin.PrepareResult, own error) (claimStatus, bool) {
	st := claimStatus{Namespace: c.Namespace, Name: c.Name, UID: c.UID}
	if c.Status.Allocation == nil {
		return st, false
	}
	steps := stepErrors(own)
	for _, res := range c.Status.Allocation.Devices.Results {
		if res.Driver != q.driver {
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
			// Its binding condition stays True (the kubelet's Prepare of
			// a claim prepared before binding writes the status again).
			if slices.Contains(res.BindingConditions, q.driver+"/"+ConditionPrepared) {
				ds.Binding = bindingPrepared
			}
		case own == nil:
			ds.Reason, ds.Message = ReasonNotPrepared, r.Err.Error()
		default:
			ds.Reason, ds.Message = q.failureReason(res, own, steps)
		}
		st.Devices = append(st.Devices, ds)
	}
	return st, len(st.Devices) > 0
}

// failureReason is the reason and message of a device of a claim that
// failed with err: its own step's failure, else the claim's cause. A
// device whose steps ran while another device's failed is NotPrepared.
func (q statusReporter) failureReason(res resourceapi.DeviceRequestAllocationResult, err error, steps map[string]*prestart.StepError) (ReadyReason, string) {
	if _, dv, ok := q.devs.lookup(res.Pool, res.Device); ok {
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
func (q statusReporter) statusData(ds deviceStatus) StatusData {
	out := StatusData{NUMANode: device.NoNUMA, CDIDeviceIDs: ds.CDIDeviceIDs}
	r, dv, ok := q.devs.lookup(ds.Pool, ds.Device)
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

// apply writes the claim's status.devices entries of the driver by
// server-side apply under the driver's name as field manager: the entries
// of other drivers, and the rest of the status, are not touched.
func (q statusReporter) apply(ctx context.Context, st claimStatus) error {
	status := resourceapply.ResourceClaimStatus()
	for _, ds := range st.Devices {
		data, err := json.Marshal(q.statusData(ds))
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
		e := resourceapply.AllocatedDeviceStatus().WithDriver(q.driver).WithPool(ds.Pool).WithDevice(ds.Device).
			WithConditions(cond).WithData(runtime.RawExtension{Raw: data})
		switch ds.Binding {
		case bindingPrepared:
			e.WithConditions(metav1apply.Condition().WithType(q.driver + "/" + ConditionPrepared).WithStatus(metav1.ConditionTrue).
				WithReason(string(ReasonPrepared)).WithMessage("prepared before binding").WithLastTransitionTime(metav1.NewTime(ds.Since)))
		case bindingFailed:
			e.WithConditions(metav1apply.Condition().WithType(q.driver + "/" + ConditionPrepareFailed).WithStatus(metav1.ConditionTrue).
				WithReason(string(ds.Reason)).WithMessage(truncate(ds.Message, maxStatusMessage)).WithLastTransitionTime(metav1.NewTime(ds.Since)))
		}
		if ds.ShareID != "" {
			e.WithShareID(ds.ShareID)
		}
		status.WithDevices(e)
	}
	claim := resourceapply.ResourceClaim(st.Name, st.Namespace).WithUID(st.UID).WithStatus(status)
	_, err := q.client.ResourceClaims(st.Namespace).ApplyStatus(ctx, claim,
		metav1.ApplyOptions{FieldManager: q.driver, Force: true})
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
