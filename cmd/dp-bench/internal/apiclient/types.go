package apiclient

// The API objects dp-bench reads and writes, with only the fields it uses
// and k8s.io/api's JSON names (TestAPITypes decodes them strictly into
// k8s.io/api's types).

// ObjectMeta is metav1.ObjectMeta's part dp-bench uses.
type ObjectMeta struct {
	Name            string            `json:"name,omitempty"`
	Namespace       string            `json:"namespace,omitempty"`
	UID             string            `json:"uid,omitempty"`
	ResourceVersion string            `json:"resourceVersion,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
}

// TypeMeta is metav1.TypeMeta.
type TypeMeta struct {
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
}

// Status is metav1.Status, the API server's error answer.
type Status struct {
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	Code    int    `json:"code,omitempty"`
}

// Version is /version's answer.
type Version struct {
	GitVersion string `json:"gitVersion"`
}

// Namespace is a corev1.Namespace.
type Namespace struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta `json:"metadata"`
}

// Node is a corev1.Node.
type Node struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta `json:"metadata"`
}

// ResourceClaim is a resourceapi.ResourceClaim.
type ResourceClaim struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta  `json:"metadata"`
	Spec     ClaimSpec   `json:"spec"`
	Status   ClaimStatus `json:"status,omitzero"`
}

// ClaimSpec is a ResourceClaimSpec.
type ClaimSpec struct {
	Devices DeviceClaim `json:"devices"`
}

// DeviceClaim is a claim's device requests.
type DeviceClaim struct {
	Requests []DeviceRequest `json:"requests"`
}

// DeviceRequest is one request of a claim.
type DeviceRequest struct {
	Name    string              `json:"name"`
	Exactly *ExactDeviceRequest `json:"exactly,omitempty"`
}

// ExactDeviceRequest is a request for an exact count of devices of a
// class.
type ExactDeviceRequest struct {
	DeviceClassName string `json:"deviceClassName"`
	AllocationMode  string `json:"allocationMode,omitempty"`
	Count           int64  `json:"count,omitempty"`
}

// ClaimStatus is a ResourceClaimStatus: the scheduler's allocation.
type ClaimStatus struct {
	Allocation *AllocationResult `json:"allocation,omitempty"`
}

// AllocationResult is the devices allocated and the nodes they are on.
type AllocationResult struct {
	Devices      DeviceAllocationResult `json:"devices"`
	NodeSelector *NodeSelector          `json:"nodeSelector,omitempty"`
}

// DeviceAllocationResult is the allocation's devices.
type DeviceAllocationResult struct {
	Results []DeviceRequestAllocationResult `json:"results"`
}

// DeviceRequestAllocationResult is one device allocated for a request.
type DeviceRequestAllocationResult struct {
	Request string `json:"request"`
	Driver  string `json:"driver"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
}

// NodeSelector is a corev1.NodeSelector.
type NodeSelector struct {
	NodeSelectorTerms []NodeSelectorTerm `json:"nodeSelectorTerms"`
}

// NodeSelectorTerm is one term of a NodeSelector.
type NodeSelectorTerm struct {
	MatchFields []NodeSelectorRequirement `json:"matchFields,omitempty"`
}

// NodeSelectorRequirement is one requirement of a term.
type NodeSelectorRequirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// ResourceSlice is a resourceapi.ResourceSlice.
type ResourceSlice struct {
	TypeMeta `json:",inline"`
	Metadata ObjectMeta        `json:"metadata"`
	Spec     ResourceSliceSpec `json:"spec"`
}

// ResourceSliceSpec is a slice's driver, pool, node and devices.
type ResourceSliceSpec struct {
	Driver   string        `json:"driver"`
	Pool     ResourcePool  `json:"pool"`
	NodeName *string       `json:"nodeName,omitempty"`
	Devices  []SliceDevice `json:"devices,omitempty"`
}

// ResourcePool is the pool a slice belongs to.
type ResourcePool struct {
	Name               string `json:"name"`
	Generation         int64  `json:"generation"`
	ResourceSliceCount int64  `json:"resourceSliceCount"`
}

// SliceDevice is a device of a slice, and its taints' keys.
type SliceDevice struct {
	Name   string `json:"name"`
	Taints []struct {
		Key string `json:"key"`
	} `json:"taints,omitempty"`
}

// Pod is a corev1.Pod as a kubelet reads it: the node it is bound to,
// its phase, its claims' names and its conditions.
type Pod struct {
	Metadata ObjectMeta `json:"metadata"`
	Spec     struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Status struct {
		Phase                 string `json:"phase"`
		ResourceClaimStatuses []struct {
			Name              string  `json:"name"`
			ResourceClaimName *string `json:"resourceClaimName"`
		} `json:"resourceClaimStatuses"`
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
	} `json:"status"`
}

// API paths.
const (
	PathNodes          = "/api/v1/nodes"
	PathNamespaces     = "/api/v1/namespaces"
	PathResourceSlices = "/apis/resource.k8s.io/v1/resourceslices"
)

// PathPods is the Pods of the namespace ns.
func PathPods(ns string) string { return PathNamespaces + "/" + ns + "/pods" }

// PathClaims is the ResourceClaims of the namespace ns.
func PathClaims(ns string) string {
	return "/apis/resource.k8s.io/v1/namespaces/" + ns + "/resourceclaims"
}
