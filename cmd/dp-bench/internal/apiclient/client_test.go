package apiclient

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// TestAPITypes: dp-bench's other objects are k8s.io/api's, and it reads
// a slice and the API server's error as k8s.io/api writes them.
func TestAPITypes(t *testing.T) {
	nodeName := "n1"
	for _, c := range []struct {
		name string
		obj  any
		into any
	}{
		{"node", &Node{TypeMeta: TypeMeta{APIVersion: "v1", Kind: "Node"}, Metadata: ObjectMeta{Name: "n1", Labels: map[string]string{"a": "b"}}}, &corev1.Node{}},
		{"namespace", &Namespace{TypeMeta: TypeMeta{APIVersion: "v1", Kind: "Namespace"}, Metadata: ObjectMeta{Name: "ns"}}, &corev1.Namespace{}},
		{"slice", &ResourceSlice{TypeMeta: TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceSlice"}, Metadata: ObjectMeta{Name: "s"},
			Spec: ResourceSliceSpec{Driver: "d", Pool: ResourcePool{Name: "n1", Generation: 2, ResourceSliceCount: 1}, NodeName: &nodeName,
				Devices: []SliceDevice{{Name: "d0"}}}}, &resourceapi.ResourceSlice{}},
	} {
		b, _ := json.Marshal(c.obj)
		if err := yaml.UnmarshalStrict(b, c.into); err != nil {
			t.Errorf("%s: %v\n%s", c.name, err, b)
		}
	}
	written := resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s", UID: "u"}, Spec: resourceapi.ResourceSliceSpec{Driver: "d",
		Pool: resourceapi.ResourcePool{Name: "n1", Generation: 3, ResourceSliceCount: 2}, NodeName: &nodeName,
		Devices: []resourceapi.Device{{Name: "d0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"d/x": {StringValue: ptr("y")}}}, {Name: "d1"}}}}
	b, _ := json.Marshal(written)
	var s ResourceSlice
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if s.Metadata.Name != "s" || s.Spec.Driver != "d" || s.Spec.Pool != (ResourcePool{Name: "n1", Generation: 3, ResourceSliceCount: 2}) ||
		*s.Spec.NodeName != "n1" || len(s.Spec.Devices) != 2 || s.Spec.Devices[1].Name != "d1" {
		t.Errorf("slice read %+v", s)
	}
	tainted := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: []resourceapi.Device{{Name: "d0",
		Taints: []resourceapi.DeviceTaint{{Key: "k", Effect: resourceapi.DeviceTaintEffectNoSchedule}}}}}}
	b, _ = json.Marshal(tainted)
	if err := json.Unmarshal(b, &s); err != nil || len(s.Spec.Devices) != 1 || len(s.Spec.Devices[0].Taints) != 1 || s.Spec.Devices[0].Taints[0].Key != "k" {
		t.Errorf("tainted slice read %+v %v", s, err)
	}
	claimName := "p-dev-x7k2p"
	b, _ = json.Marshal(corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{Phase: corev1.PodPending, ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: "dev", ResourceClaimName: &claimName}},
			Conditions: []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}}}})
	var p Pod
	if err := json.Unmarshal(b, &p); err != nil || p.Metadata.Name != "p" || p.Spec.NodeName != "n1" || p.Status.Phase != "Pending" ||
		len(p.Status.ResourceClaimStatuses) != 1 || *p.Status.ResourceClaimStatuses[0].ResourceClaimName != claimName ||
		len(p.Status.Conditions) != 1 || p.Status.Conditions[0].Type != "DisruptionTarget" || p.Status.Conditions[0].Status != "True" {
		t.Errorf("pod read %+v %v", p, err)
	}
	b, _ = json.Marshal(metav1.Status{Status: metav1.StatusFailure, Reason: metav1.StatusReasonAlreadyExists, Message: "exists", Code: 409})
	var st Status
	if err := json.Unmarshal(b, &st); err != nil || st.Reason != "AlreadyExists" || st.Message != "exists" || st.Code != 409 {
		t.Errorf("status read %+v %v", st, err)
	}
}

func ptr[T any](v T) *T { return &v }
