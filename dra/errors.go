package dra

import "errors"

// Why a claim is not prepared.
var (
	// ErrUnknownDevice: the allocation names a device this driver does not
	// publish on this node.
	ErrUnknownDevice = errors.New("not a device of this driver on this node")
	// ErrUnhealthy: the device is not healthy.
	ErrUnhealthy = errors.New("device unhealthy")
	// ErrHeld: another prepared claim, or a container through the device
	// plugin, holds the device.
	ErrHeld = errors.New("device held")
	// ErrCannotTell: the kubelet's PodResources cannot tell whether a
	// device-plugin container holds the device.
	ErrCannotTell = errors.New("cannot tell whether a device-plugin container holds the device")
	// ErrCallFailed: another claim of the same call failed; none of the
	// call's claims is prepared.
	ErrCallFailed = errors.New("another claim of the same call failed")
	// ErrPreBinding: the claim's devices are being prepared before its pod
	// is bound (PrepareBeforeBind); the kubelet asks again.
	ErrPreBinding = errors.New("the claim's devices are being prepared before binding")
	// ErrStillHeld: the kubelet's PodResources lists the claim on a
	// container: the stale-claim clean-up keeps it.
	ErrStillHeld = errors.New("a container still holds the claim")
	// ErrAllocationChanged: the checkpoint knows the claim's UID, prepared
	// with other devices than its allocation names now.
	ErrAllocationChanged = errors.New("the claim's allocation differs from the one prepared")
)

// ErrOpaqueConfig is why a claim is not prepared whose allocation carries
// opaque configuration addressed to this driver, which takes none.
var ErrOpaqueConfig = errors.New("the driver takes no opaque configuration")
