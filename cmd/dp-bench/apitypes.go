package main

// The API objects dp-bench reads and writes, with only the fields it uses
// and k8s.io/api's JSON names (dra_test.go decodes them strictly into
// k8s.io/api's types). See apiclient.go for why they are not k8s.io/api's.

// objectMeta is metav1.ObjectMeta's part dp-bench uses.
type objectMeta struct {
	Name            string            `json:"name,omitempty"`
	Namespace       string            `json:"namespace,omitempty"`
	UID             string            `json:"uid,omitempty"`
	ResourceVersion string            `json:"resourceVersion,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
}

// typeMeta is metav1.TypeMeta.
type typeMeta struct {
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
}

// apiStatus is metav1.Status, the API server's error answer.
type apiStatus struct {
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	Code    int    `json:"code,omitempty"`
}

// apiVersion is /version's answer.
type apiVersion struct {
	GitVersion string `json:"gitVersion"`
}

// namespace is a corev1.Namespace.
type namespace struct {
	typeMeta `json:",inline"`
	Metadata objectMeta `json:"metadata"`
}

// node is a corev1.Node.
type node struct {
	typeMeta `json:",inline"`
	Metadata objectMeta `json:"metadata"`
}

// resourceClaim is a resourceapi.ResourceClaim.
type resourceClaim struct {
	typeMeta `json:",inline"`
	Metadata objectMeta  `json:"metadata"`
	Spec     claimSpec   `json:"spec"`
	Status   claimStatus `json:"status,omitzero"`
}

type claimSpec struct {
	Devices deviceClaim `json:"devices"`
}

type deviceClaim struct {
	Requests []deviceRequest `json:"requests"`
}

type deviceRequest struct {
	Name    string              `json:"name"`
	Exactly *exactDeviceRequest `json:"exactly,omitempty"`
}

type exactDeviceRequest struct {
	DeviceClassName string `json:"deviceClassName"`
	AllocationMode  string `json:"allocationMode,omitempty"`
	Count           int64  `json:"count,omitempty"`
}

type claimStatus struct {
	Allocation *allocationResult `json:"allocation,omitempty"`
}

type allocationResult struct {
	Devices      deviceAllocationResult `json:"devices"`
	NodeSelector *nodeSelector          `json:"nodeSelector,omitempty"`
}

type deviceAllocationResult struct {
	Results []deviceRequestAllocationResult `json:"results"`
}

type deviceRequestAllocationResult struct {
	Request string `json:"request"`
	Driver  string `json:"driver"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
}

type nodeSelector struct {
	NodeSelectorTerms []nodeSelectorTerm `json:"nodeSelectorTerms"`
}

type nodeSelectorTerm struct {
	MatchFields []nodeSelectorRequirement `json:"matchFields,omitempty"`
}

type nodeSelectorRequirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// resourceSlice is a resourceapi.ResourceSlice.
type resourceSlice struct {
	typeMeta `json:",inline"`
	Metadata objectMeta        `json:"metadata"`
	Spec     resourceSliceSpec `json:"spec"`
}

type resourceSliceSpec struct {
	Driver   string        `json:"driver"`
	Pool     resourcePool  `json:"pool"`
	NodeName *string       `json:"nodeName,omitempty"`
	Devices  []sliceDevice `json:"devices,omitempty"`
}

type resourcePool struct {
	Name               string `json:"name"`
	Generation         int64  `json:"generation"`
	ResourceSliceCount int64  `json:"resourceSliceCount"`
}

type sliceDevice struct {
	Name string `json:"name"`
}

// API paths.
const (
	pathNodes          = "/api/v1/nodes"
	pathNamespaces     = "/api/v1/namespaces"
	pathResourceSlices = "/apis/resource.k8s.io/v1/resourceslices"
)

func pathClaims(ns string) string {
	return "/apis/resource.k8s.io/v1/namespaces/" + ns + "/resourceclaims"
}
