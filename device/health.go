package device

import "fmt"

// Cause says why a device is unhealthy. The zero Cause means it is not.
// Its String is the reason label of the health metrics, so logs, metrics
// and ListAndWatch read one value.
type Cause uint8

const (
	// CauseNone means the device is healthy.
	CauseNone Cause = iota
	// CauseMissing means its node (or host device) is not there.
	CauseMissing
	// CauseWrongNode means the path is no device node, or another type or
	// major:minor than the device's.
	CauseWrongNode
	// CauseNodeError means its node cannot be looked at (other than missing).
	CauseNodeError
	// CausePrepareFailed means its preparation (PreStartContainer steps) failed,
	// or its state cannot be kept (an unusable state directory or file).
	CausePrepareFailed
	// CauseNotInSpec means the CDI spec does not describe it (yet): the write
	// failed or is pending.
	CauseNotInSpec
	// CauseYielded means another process owns the resource's CDI spec.
	CauseYielded
	// CauseHeldByDRA means a claim of the DRA driver holds it (the
	// kubelet's PodResources says so): the device plugin must not hand it
	// to a second pod (a node switched back from DRA).
	CauseHeldByDRA
	// CauseIdentityChanged means a device found by its identity is there
	// with another one than it had (a PCI function rebound to another
	// driver, or of another vendor or device ID; a USB device of another
	// vendor, product or serial on its port): it keeps its old nodes.
	CauseIdentityChanged
	// CauseSharedNode means one of its host nodes (a type and
	// major:minor, whatever its path; a partition is a node of its disk)
	// is also a node of another device, of this resource or of another
	// one of the process (Owners): neither is handed out. Or it is a node
	// no device may have as its own: a sharedNodes entry, or the node of a
	// simulated device.
	CauseSharedNode
	// CauseInjected means a fault injected on purpose makes it unhealthy
	// (a simulated device's unhealthy or flapping fault; a lost one is
	// CauseMissing, as a real lost device is).
	CauseInjected
)

var causeNames = [...]string{
	CauseNone:          "",
	CauseMissing:       "missing",
	CauseWrongNode:     "wrong_node",
	CauseNodeError:     "node_error",
	CausePrepareFailed: "prestart",
	CauseNotInSpec:     "no_cdi_spec",
	CauseYielded:       "yielded",
	CauseHeldByDRA:     "dra_claim",

	CauseIdentityChanged: "identity_changed",
	CauseSharedNode:      "shared_node",
	CauseInjected:        "injected",
}

// Causes are the causes of an unhealthy device, in order.
func Causes() []Cause {
	return []Cause{CauseMissing, CauseWrongNode, CauseNodeError, CausePrepareFailed, CauseNotInSpec, CauseYielded, CauseHeldByDRA, CauseIdentityChanged, CauseSharedNode, CauseInjected}
}

// String is the cause's label value ("" for CauseNone).
func (c Cause) String() string {
	if int(c) < len(causeNames) {
		return causeNames[c]
	}
	return fmt.Sprintf("cause(%d)", uint8(c))
}

// Problem is why a device is unhealthy: a cause and what happened. The
// zero Problem is none.
type Problem struct {
	Cause Cause
	// Message says what happened, for logs and errors.
	Message string
	// Evict asks the DRA driver to taint the device NoExecute, so that
	// the pods using it are evicted (an injected lost fault with
	// noExecute); NoSchedule otherwise.
	Evict bool
}

// Problemf returns a problem of cause c.
func Problemf(c Cause, format string, args ...any) Problem {
	return Problem{Cause: c, Message: fmt.Sprintf(format, args...)}
}

// None reports whether there is no problem.
func (p Problem) None() bool { return p.Cause == CauseNone }

// String is the message, prefixed by the cause ("missing", "prestart: step
// reset: exit status 1").
func (p Problem) String() string {
	switch {
	case p.Cause == CauseNone:
		return ""
	case p.Message == "":
		return p.Cause.String()
	}
	return p.Cause.String() + ": " + p.Message
}

// SetProblem sets the device's problem and, with it, its health.
func (d *Device) SetProblem(p Problem) {
	d.Problem, d.Healthy = p, p.None()
}
