//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

// The DRA scenarios' deployment: the same simulated devices,
// served by cmd/cdi-dra-driver (deploy.sh MODE=dra), with the default
// reset and reprogram steps. A resource of its own, so that it never
// meets the device plugin's e2e.cdi.dev/sim.
const (
	draNS       = "cdi-e2e-dra"
	draResource = "e2e.cdi.dev/dra"
	// The driver name and the DeviceClass: <class>.<domain>.
	draDriver   = "dra.e2e.cdi.dev"
	draClass    = "dra.e2e.cdi.dev"
	draIDPrefix = "e2e-dra"
	draEnv      = "DRA"
	draSpecFile = "/var/run/cdi/k8s.e2e.cdi.dev-dra.json"
	draStateDir = "/var/lib/cdi-device-plugin/devices"
	draCkpt     = "/var/lib/cdi-device-plugin/dra/checkpoint.json"
	// The claim in every claim pod's spec.
	draClaim = "dev"
	// The shared resource of scenario D7: one device of
	// replicas 2, published by the same driver, its DeviceClass
	// <class>.<domain>.
	draSharedResource = "e2e.cdi.dev/dra-shared"
	draSharedClass    = "dra-shared.e2e.cdi.dev"
	draSharedPrefix   = "e2e-dra-shared"
)

// draConfig is the driver's configuration file: the DRA resource as the
// environment variables of draVars give it (4 devices, the default reset
// and reprogram steps), the shared resource of scenario D7 and the
// resources prepared before binding of scenario D10.
const draConfig = `resources:
- name: ` + draResource + `
  count: 4
  idPrefix: ` + draIDPrefix + `
  deviceFilePrefix: ` + draIDPrefix + `
  envPrefix: ` + draEnv + `
  prestart:
    steps:
    - type: reset
    - type: reprogram
- name: ` + draSharedResource + `
  count: 1
  replicas: 2
  idPrefix: ` + draSharedPrefix + `
  deviceFilePrefix: ` + draSharedPrefix + `
  envPrefix: DRA_SHARED
  prestart:
    steps:
    - type: reset
` + pbbConfig

var draConfigOnce = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "cdi-e2e-dra-")
	if err != nil {
		return "", err
	}
	file := filepath.Join(dir, "config.yaml")
	return file, os.WriteFile(file, []byte(draConfig), 0o644)
})

// draConfigFile is draConfig written to a file (once per run).
func draConfigFile() string {
	file, err := draConfigOnce()
	if err != nil {
		panic(fmt.Sprintf("writing the DRA configuration: %v", err))
	}
	return file
}

func init() { suiteNamespaces = append(suiteNamespaces, draNS) }

// TestDRA runs the DRA scenarios in order on one deployment; each builds
// on what the previous one left.
func TestDRA(t *testing.T) {
	c := newCluster(t)
	start := time.Now()
	defer func() {
		if t.Failed() {
			c.saveArtifacts(t, suiteNamespaces...)
			c.draDriverLog(t)
			c.recap(t, start)
		}
		c.draTeardown(t)
		t.Logf("DRA suite wall time %v", time.Since(start).Round(time.Second))
	}()
	c.draTeardown(t)
	var node string
	steps := []struct {
		name string
		f    func(t *testing.T)
	}{
		{"D1-driver-slice-class", func(t *testing.T) { node = c.scenarioDRASlice(t) }},
		{"D2-claim-template-pod", func(t *testing.T) { c.scenarioDRAClaimPod(t) }},
		{"D3-shared-claim", func(t *testing.T) { c.scenarioDRASharedClaim(t) }},
		{"D4-extended-resource", func(t *testing.T) { c.scenarioDRAExtended(t) }},
		{"D5-restarts", func(t *testing.T) { c.scenarioDRARestarts(t) }},
		{"D6-health", func(t *testing.T) { c.scenarioDRAHealth(t, node) }},
		{"D6b-fault-lost-evicts", func(t *testing.T) { c.scenarioDRAFaultLost(t, node) }},
		{"D7-replicas-shares", func(t *testing.T) { c.scenarioDRAShares(t, node) }},
		{"D8-examples", func(t *testing.T) { c.scenarioDRAExamples(t, node) }},
		{"D9-rolling-update", func(t *testing.T) { c.scenarioDRARoll(t, node) }},
		{"D10-prepare-before-bind", func(t *testing.T) { c.scenarioDRAPrepareBeforeBind(t, node) }},
		{"M-switch-node", func(t *testing.T) { c.scenarioSwitch(t, node) }},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.f) {
			t.Fatalf("scenario %s failed; later scenarios skipped", s.name)
		}
	}
}

func (c *cluster) draVars() map[string]string {
	return map[string]string{
		"MODE":               "dra",
		"NAMESPACE":          draNS,
		"PLUGIN_NAME":        draNS,
		"RESOURCE_NAME":      draResource,
		"NUMBER_DEVICES":     fmt.Sprint(numDevices),
		"DEVICE_ID_PREFIX":   draIDPrefix,
		"DEVICE_FILE_PREFIX": draIDPrefix,
		"ENV_PREFIX":         draEnv,
		"LOG_LEVEL":          "debug",
		// The fault control socket, for D6b.
		"FAULT_CONTROL": "true",
		// Every resource of draConfig (its resource variables above
		// are then ignored), a DeviceClass each.
		"PLUGIN_CONFIG": draConfigFile(),
		"DRA_RESOURCES": draResource + "," + draSharedResource + "," + pbbResources(),
		// Where pods reach the API server on the local node (no
		// kube-proxy there); empty on kind.
		"API_SERVER_HOST": os.Getenv("E2E_API_SERVER_HOST"),
		"API_SERVER_PORT": os.Getenv("E2E_API_SERVER_PORT"),
	}
}

// draTeardown removes the DRA deployment, its pods and claims (before the
// driver, so that it unprepares them), and its files on the node.
func (c *cluster) draTeardown(t *testing.T) {
	ctx := context.Background()
	// The driver unprepares the claims of the pods deleted below: it runs
	// on every node while they go (scenario M's per-node deployment runs
	// it on nodes labelled dra only).
	c.labelMode(t, "", "dra")
	defer c.labelMode(t, "", "")
	_ = c.cs.CoreV1().Pods(podNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "app=cdi-e2e-dra"})
	eventually(t, 2*time.Minute, "DRA pods gone", func() (bool, string) {
		l, err := c.cs.CoreV1().Pods(podNS).List(ctx, metav1.ListOptions{LabelSelector: "app=cdi-e2e-dra"})
		if err != nil {
			return apierrors.IsNotFound(err), err.Error()
		}
		return len(l.Items) == 0, fmt.Sprintf("%d pods", len(l.Items))
	})
	_ = c.cs.ResourceV1().ResourceClaims(podNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	_ = c.cs.ResourceV1().ResourceClaimTemplates(podNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	vars := c.draVars()
	vars["MODE"] = "per-node" // both DaemonSets and the driver's objects
	c.deployQuiet(t, "delete", vars)
	_ = c.cs.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "spec.driver=" + draDriver})
	if _, err := c.nodeSh("rm -rf /dev/" + draIDPrefix + "-* " + draSpecFile + " /var/run/cdi/k8s.e2e.cdi.dev-dra-* " +
		draStateDir + "/" + draIDPrefix + "-* " + draCkpt + " /var/run/cdi/" + draDriver + "_metadata_* " +
		"/var/lib/kubelet/plugins/" + draDriver + "/dra-device-metadata " + filepath.Dir(pbbBusybox) + " " +
		filepath.Join(filepath.Dir(draStateDir), "locks", draIDPrefix+"-*.lock")); err != nil {
		t.Errorf("node cleanup: %v", err)
	}
}

// deployQuiet is deploy that logs a failure instead of failing (teardown).
func (c *cluster) deployQuiet(t *testing.T, cmd string, vars map[string]string) {
	if out, err := c.deployOut(cmd, vars); err != nil {
		t.Logf("deploy.sh %s: %v\n%s", cmd, err, out)
	}
}

// draDriverLog logs the driver pod's log (on failure).
func (c *cluster) draDriverLog(t *testing.T) {
	l, err := c.cs.CoreV1().Pods(draNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return
	}
	for i := range l.Items {
		p := &l.Items[i]
		for _, prev := range []bool{true, false} {
			if out, err := c.logs(context.Background(), draNS, p.Name, prev); err == nil && out != "" {
				t.Logf("driver pod %s (previous %v) log:\n%s", p.Name, prev, out)
			}
		}
	}
}

// driverPod returns the running DRA driver pod.
func (c *cluster) driverPod(ctx context.Context) (*corev1.Pod, error) {
	return c.runningPod(ctx, draNS, "cdi-dra-driver")
}

// draPool is the driver's pool of the resource on node: one per
// resource, <node>/<idPrefix>.
func draPool(node string) string { return node + "/" + draIDPrefix }

// draSlices returns the driver's ResourceSlices of node of the DRA
// resource (its pool, draPool).
func (c *cluster) draSlices(ctx context.Context, node string) ([]resourceapi.ResourceSlice, error) {
	return c.poolSlices(ctx, draPool(node))
}

// poolSlices returns the driver's ResourceSlices of the pool.
func (c *cluster) poolSlices(ctx context.Context, pool string) ([]resourceapi.ResourceSlice, error) {
	l, err := c.cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + draDriver})
	if err != nil {
		return nil, err
	}
	var out []resourceapi.ResourceSlice
	for _, sl := range l.Items {
		if sl.Spec.Pool.Name == pool {
			out = append(out, sl)
		}
	}
	return out, nil
}

// attr reads a string or int attribute of a slice device, qualified by the
// driver or not.
func attr(d *resourceapi.Device, name string) string {
	for _, k := range []string{name, draDriver + "/" + name} {
		a, ok := d.Attributes[resourceapi.QualifiedName(k)]
		if !ok {
			continue
		}
		switch {
		case a.StringValue != nil:
			return *a.StringValue
		case a.IntValue != nil:
			return fmt.Sprint(*a.IntValue)
		}
	}
	return ""
}

// draDevices maps the slice devices of node (by name) to their id
// attribute (the device ID, the name in the CDI spec).
func (c *cluster) draDevices(t *testing.T, node string) map[string]string {
	t.Helper()
	sl, err := c.draSlices(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for i := range sl {
		for j := range sl[i].Spec.Devices {
			d := &sl[i].Spec.Devices[j]
			out[d.Name] = strings.TrimPrefix(attr(d, "id"), draKind+"=")
		}
	}
	return out
}

// Scenario D1: the driver registers and publishes one ResourceSlice for the
// node with the 4 devices whose ids are the spec's device names; the
// DeviceClass maps the extended resource.
func (c *cluster) scenarioDRASlice(t *testing.T) string {
	c.requireFeatureGates(t, draFeatureGates...)
	if _, err := c.cs.CoreV1().Namespaces().Get(context.Background(), podNS, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		if _, err := c.cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: podNS}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c.deploy(t, "apply", c.draVars())
	var pod *corev1.Pod
	d := eventually(t, 3*time.Minute, "driver pod running", func() (bool, string) {
		p, err := c.driverPod(context.Background())
		if err != nil {
			return false, err.Error()
		}
		pod = p
		return true, ""
	})
	node := pod.Spec.NodeName
	t.Logf("driver pod %s running on %s after %v", pod.Name, node, d.Round(time.Millisecond))
	var got []resourceapi.ResourceSlice
	d = eventually(t, 2*time.Minute, "one ResourceSlice with 4 devices", func() (bool, string) {
		sl, err := c.draSlices(context.Background(), node)
		if err != nil {
			return false, err.Error()
		}
		got = sl
		return len(sl) == 1 && len(sl[0].Spec.Devices) == numDevices, fmt.Sprintf("%d slices", len(sl))
	})
	t.Logf("ResourceSlice %s published %v after the driver ran", got[0].Name, d.Round(time.Millisecond))
	// A node that served the resource through the device plugin in the
	// last 5 minutes (an earlier run's scenario M) still reports it: the
	// handover taint stays until the kubelet drops it.
	d = eventually(t, 6*time.Minute, "no taint on the devices", func() (bool, string) {
		sl, err := c.draSlices(context.Background(), node)
		if err != nil || len(sl) != 1 {
			return false, fmt.Sprint(len(sl), " slices ", err)
		}
		got = sl
		for _, dv := range sl[0].Spec.Devices {
			if len(dv.Taints) != 0 {
				return false, fmt.Sprintf("%s: taints %+v", dv.Name, dv.Taints)
			}
		}
		return true, ""
	})
	t.Logf("devices untainted after %v", d.Round(time.Millisecond))
	s := got[0].Spec
	if s.Pool.Name != draPool(node) || s.NodeName == nil || *s.NodeName != node {
		t.Errorf("slice pool %q node %v, want pool %s of node %s", s.Pool.Name, s.NodeName, draPool(node), node)
	}
	var ids []string
	for i := range s.Devices {
		d := &s.Devices[i]
		ids = append(ids, strings.TrimPrefix(attr(d, "id"), draKind+"="))
		if r := attr(d, "resource"); r != draResource {
			t.Errorf("device %s: resource %q, want %s", d.Name, r, draResource)
		}
		if idx := attr(d, "index"); d.Name != draIDPrefix+"-"+idx {
			t.Errorf("device %s: index %q", d.Name, idx)
		}
		if len(d.Taints) != 0 {
			t.Errorf("device %s: taints %+v on a healthy device", d.Name, d.Taints)
		}
	}
	sort.Strings(ids)
	if spec := c.draSpecDevices(t); !slices.Equal(ids, spec) {
		t.Errorf("slice ids %v, spec devices %v", ids, spec)
	}
	dc, err := c.cs.ResourceV1().DeviceClasses().Get(context.Background(), draClass, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if dc.Spec.ExtendedResourceName == nil || *dc.Spec.ExtendedResourceName != draResource {
		t.Errorf("DeviceClass %s extendedResourceName %v, want %s", draClass, dc.Spec.ExtendedResourceName, draResource)
	}
	c.checkSliceAdmission(t, pod)
	return node
}

// checkSliceAdmission: the ValidatingAdmissionPolicy lets the driver's
// service account write the ResourceSlices of its pod's node and no other,
// and only under its own driver name.
// Each write is a dry run as the account (a token from the TokenRequest
// API, bound to the driver pod as its projected token is, or to nothing),
// which admission judges as a real write but never stores.
func (c *cluster) checkSliceAdmission(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	const other, otherDriver = "cdi-e2e-other-node", "other.e2e.cdi.dev"
	as := func(boundToPod bool) *kubernetes.Clientset {
		expiry := int64(600) // the API's minimum
		req := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &expiry}}
		if boundToPod {
			req.Spec.BoundObjectRef = &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
		}
		tok, err := c.cs.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, req, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token of %s/%s: %v", pod.Namespace, pod.Spec.ServiceAccountName, err)
		}
		cfg := rest.AnonymousClientConfig(c.cfg)
		cfg.BearerToken = tok.Status.Token
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	slice := func(node, driver string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "cdi-e2e-admission-"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   driver,
				Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
				NodeName: &node,
			},
		}
	}
	podToken, podlessToken := as(true), as(false)
	for _, tc := range []struct {
		name   string
		cs     *kubernetes.Clientset
		node   string
		driver string
		refuse string // "" when the write is allowed
	}{
		{"own node", podToken, pod.Spec.NodeName, draDriver, ""},
		{"another node", podToken, other, draDriver, "may write only the ResourceSlices of that node, not one of node " + other},
		{"own node, token bound to no pod", podlessToken, pod.Spec.NodeName, draDriver, "this token names no node"},
		{"own node, another driver's name", podToken, pod.Spec.NodeName, otherDriver,
			"the DRA driver " + draDriver + " may write only its own ResourceSlices, not one of driver " + otherDriver},
	} {
		_, err := tc.cs.ResourceV1().ResourceSlices().Create(ctx, slice(tc.node, tc.driver), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case tc.refuse == "" && err != nil:
			t.Errorf("slice admission, %s: the driver's account was refused: %v", tc.name, err)
		case tc.refuse != "" && err == nil:
			t.Errorf("slice admission, %s: the driver's account wrote a slice of node %s, driver %s", tc.name, tc.node, tc.driver)
		case tc.refuse != "" && (!apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.refuse)):
			t.Errorf("slice admission, %s: %v, want a refusal saying %q", tc.name, err, tc.refuse)
		case tc.refuse != "":
			t.Logf("slice admission, %s: refused: %v", tc.name, err)
		}
	}
}

// draSpecDevices returns the device names of the DRA resource's spec.
func (c *cluster) draSpecDevices(t *testing.T) []string {
	t.Helper()
	var spec cdiSpec
	if err := json.Unmarshal([]byte(c.mustNodeSh(t, "cat "+draSpecFile)), &spec); err != nil {
		t.Fatalf("%s: %v", draSpecFile, err)
	}
	var ids []string
	for _, d := range spec.Devices {
		ids = append(ids, d.Name)
	}
	sort.Strings(ids)
	return ids
}

// claimPod is a test pod whose containers use the pod claim draClaim, from
// the template or the claim named.
func (c *cluster) claimPod(name, template, claim string, containers ...string) *corev1.Pod {
	p := c.testPodOf(name, draResource, 0)
	p.Labels["app"] = "cdi-e2e-dra"
	base := p.Spec.Containers[0]
	base.Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: draClaim}}}
	p.Spec.Containers = nil
	if len(containers) == 0 {
		containers = []string{"c"}
	}
	for _, n := range containers {
		ct := base
		ct.Name = n
		p.Spec.Containers = append(p.Spec.Containers, ct)
	}
	rc := corev1.PodResourceClaim{Name: draClaim}
	if template != "" {
		rc.ResourceClaimTemplateName = &template
	} else {
		rc.ResourceClaimName = &claim
	}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{rc}
	return p
}

// extendedPod asks for n devices the device-plugin way (limits only).
func (c *cluster) extendedPod(name string, n int) *corev1.Pod {
	p := c.testPodOf(name, draResource, n)
	p.Labels["app"] = "cdi-e2e-dra"
	return p
}

func draRequest(count int64) resourceapi.DeviceClaim {
	return resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "devs",
		Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: draClass,
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           count,
		},
	}}}
}

func (c *cluster) createClaimTemplate(t *testing.T, name string, count int64) {
	t.Helper()
	_, err := c.cs.ResourceV1().ResourceClaimTemplates(podNS).Create(context.Background(), &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: draRequest(count)}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// claimOf returns the ResourceClaim of the pod: its pod claim's, or the
// one made for its extended resource.
func (c *cluster) claimOf(t *testing.T, name string) *resourceapi.ResourceClaim {
	t.Helper()
	p, err := c.getPod(name)
	if err != nil {
		t.Fatal(err)
	}
	var claim string
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			claim = *s.ResourceClaimName
		}
	}
	if p.Status.ExtendedResourceClaimStatus != nil {
		claim = p.Status.ExtendedResourceClaimStatus.ResourceClaimName
	}
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			claim = *rc.ResourceClaimName
		}
	}
	if claim == "" {
		t.Fatalf("pod %s has no claim in its status: %+v", name, p.Status)
	}
	rc, err := c.cs.ResourceV1().ResourceClaims(podNS).Get(context.Background(), claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// allocatedIDs are the device IDs the claim was allocated (slice names
// mapped through the slice's id attribute), sorted.
func (c *cluster) allocatedIDs(t *testing.T, node string, rc *resourceapi.ResourceClaim) []string {
	t.Helper()
	if rc.Status.Allocation == nil {
		t.Fatalf("claim %s not allocated", rc.Name)
	}
	byName := c.draDevices(t, node)
	var ids []string
	for _, r := range rc.Status.Allocation.Devices.Results {
		if r.Driver != draDriver {
			t.Fatalf("claim %s: device %s of driver %s", rc.Name, r.Device, r.Driver)
		}
		ids = append(ids, byName[r.Device])
	}
	sort.Strings(ids)
	return ids
}

// draStates reads the node's state.json of every DRA device.
func (c *cluster) draStates(t *testing.T) map[string]deviceState {
	t.Helper()
	return parseStates(t, c.mustNodeSh(t, "cat "+draStateDir+"/"+draIDPrefix+"-*/state.json 2>/dev/null || true"))
}

// devNodes lists the DRA device nodes a container sees, sorted.
func (c *cluster) devNodes(t *testing.T, pod, container string) []string {
	t.Helper()
	out, err := c.execIn(pod, container, "sh", "-c", "ls /dev | grep '^"+draIDPrefix+"-' || true")
	if err != nil {
		t.Fatal(err)
	}
	nodes := strings.Fields(out)
	sort.Strings(nodes)
	return nodes
}

// envDevices returns DRA_DEVICES in the container, sorted.
func (c *cluster) envDevices(t *testing.T, pod, container string) []string {
	t.Helper()
	out, err := c.execIn(pod, container, "sh", "-c", "echo $"+draEnv+"_DEVICES")
	if err != nil {
		t.Fatal(err)
	}
	out = strings.TrimSpace(out)
	if out == "" {
		t.Fatalf("%s/%s: %s_DEVICES empty", pod, container, draEnv)
	}
	ids := strings.Split(out, ",")
	sort.Strings(ids)
	return ids
}

func draNodes(ids []string) []string {
	var out []string
	for _, id := range ids {
		out = append(out, draIDPrefix+"-"+indexOf(id))
	}
	sort.Strings(out)
	return out
}

// waitReady waits until every container of the pod runs and is ready.
func (c *cluster) waitReady(t *testing.T, name string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, timeout, "pod "+name+" ready", func() (bool, string) {
		p, err := c.getPod(name)
		if err != nil {
			return false, err.Error()
		}
		pod = p
		if len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
			return false, fmt.Sprintf("phase %s, conditions %+v", p.Status.Phase, p.Status.Conditions)
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Running == nil || !s.Ready {
				return false, fmt.Sprintf("%s: state %+v", s.Name, s.State)
			}
		}
		return true, ""
	})
	return pod
}

// claimHealth returns the health of each device of the pod's claim in its
// containers' allocatedResourcesStatus, by resource ID, and all it saw.
func (c *cluster) claimHealth(name string) (map[string]string, string) {
	p, err := c.getPod(name)
	if err != nil {
		return nil, err.Error()
	}
	got := map[string]string{}
	var seen []string
	for _, cs := range p.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			for _, r := range rs.Resources {
				seen = append(seen, fmt.Sprintf("%s:%s/%s=%s", cs.Name, rs.Name, r.ResourceID, r.Health))
				if strings.HasPrefix(string(rs.Name), "claim:") {
					got[string(r.ResourceID)] = string(r.Health)
				}
			}
		}
	}
	return got, strings.Join(seen, " ")
}

// checkStartState checks the state a container saw at its start: exactly
// the devices ids, each prepared (a newer generation than before, a reset,
// the firmware loaded) before the container started.
func (c *cluster) checkStartState(t *testing.T, pod *corev1.Pod, container string, ids []string, before map[string]deviceState) map[string]deviceState {
	t.Helper()
	out, err := c.execIn(pod.Name, container, "cat", "/tmp/state-at-start")
	if err != nil {
		t.Fatal(err)
	}
	states := parseStates(t, out)
	var seen []string
	for id := range states {
		seen = append(seen, id)
	}
	sort.Strings(seen)
	if !slices.Equal(seen, ids) {
		t.Fatalf("%s/%s saw the state of %v, want %v", pod.Name, container, seen, ids)
	}
	var started time.Time
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == container && s.State.Running != nil {
			started = s.State.Running.StartedAt.Time
		}
	}
	for _, id := range ids {
		st := states[id]
		if st.Generation <= before[id].Generation || st.ResetCount <= before[id].ResetCount || st.Firmware == nil {
			t.Errorf("%s: state at start %+v, before %+v: want a newer generation, a reset and firmware", id, st, before[id])
		}
		if !started.IsZero() && st.PreparedAt.After(started.Add(time.Second)) {
			t.Errorf("%s prepared at %v, after the container started at %v", id, st.PreparedAt, started)
		}
	}
	return states
}

// Scenario D2: a pod with a claim from a template (count 2) runs; its /dev
// nodes and DRA_DEVICES are the allocated devices, prepared before the
// container started; allocatedResourcesStatus lists both Healthy.
func (c *cluster) scenarioDRAClaimPod(t *testing.T) {
	before := c.draStates(t)
	c.createClaimTemplate(t, "two", 2)
	c.createPod(t, c.claimPod("d2", "two", ""))
	pod := c.waitReady(t, "d2", 3*time.Minute)
	node := pod.Spec.NodeName
	ids := c.allocatedIDs(t, node, c.claimOf(t, "d2"))
	if len(ids) != 2 {
		t.Fatalf("claim of d2 allocated %v, want 2 devices", ids)
	}
	if env := c.envDevices(t, "d2", "c"); !slices.Equal(env, ids) {
		t.Errorf("d2: %s_DEVICES %v, allocated %v", draEnv, env, ids)
	}
	if nodes := c.devNodes(t, "d2", "c"); !slices.Equal(nodes, draNodes(ids)) {
		t.Errorf("d2 sees /dev %v, want %v", nodes, draNodes(ids))
	}
	c.checkStartState(t, pod, "c", ids, before)
	c.checkClaimStatus(t, "d2", node)
	c.checkDeviceMetadata(t, "d2", "c", node)
	c.checkDRAMetrics(t)
	d := eventually(t, time.Minute, "d2's allocatedResourcesStatus to list both devices Healthy", func() (bool, string) {
		h, seen := c.claimHealth("d2")
		n := 0
		for _, v := range h {
			if v == "Healthy" {
				n++
			}
		}
		return n == 2 && len(h) == 2, seen
	})
	t.Logf("d2 runs with %v; both Healthy in its status after %v", ids, d.Round(time.Millisecond))
}

// checkDRAMetrics: the driver pod's /metrics count the Prepare of d2's
// claim (a call and a claim, ok), its status written, the slices
// published and the handover guard down; /healthz and /readyz answer ok.
func (c *cluster) checkDRAMetrics(t *testing.T) {
	t.Helper()
	p, err := c.driverPod(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + p.Status.PodIP + ":" + metricPort
	var text string
	eventually(t, 30*time.Second, "the driver's status write of d2's claim counted", func() (bool, string) {
		text = c.mustNodeSh(t, "curl -fsS --max-time 10 "+url+"/metrics")
		v := metricValue(text, "cdi_device_plugin_dra_claim_status_writes_total", `result="ok"`)
		return v >= 1, fmt.Sprintf("status writes ok %v", v)
	})
	for _, m := range []struct {
		name   string
		labels []string
		least  float64
	}{
		{"cdi_device_plugin_dra_request_duration_seconds_count", []string{`operation="prepare"`, `result="ok"`}, 1},
		{"cdi_device_plugin_dra_claims_total", []string{`operation="prepare"`, `result="ok"`}, 1},
		{"cdi_device_plugin_dra_slice_publishes_total", []string{`result="ok"`}, 1},
	} {
		if v := metricValue(text, m.name, m.labels...); v < m.least {
			t.Errorf("%s%v = %v, want at least %v", m.name, m.labels, v, m.least)
		}
	}
	if v := metricValue(text, "cdi_device_plugin_dra_handover_guard", `resource="`+draResource+`"`); v != 0 {
		t.Errorf("cdi_device_plugin_dra_handover_guard of %s = %v, want 0", draResource, v)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if got := strings.TrimSpace(c.mustNodeSh(t, "curl -sS --max-time 5 "+url+path)); got != "ok" {
			t.Errorf("driver %s: %q, want ok", path, got)
		}
	}
	var ours []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "cdi_device_plugin_dra_") && !strings.Contains(l, "_bucket{") {
			ours = append(ours, l)
		}
	}
	t.Logf("curl %s/metrics | grep ^cdi_device_plugin_dra_ | grep -v _bucket:\n%s", url, strings.Join(ours, "\n"))
}

// checkClaimStatus: the status.devices of the pod's
// claim, as the API has it, holds each allocated device of the driver
// with Ready True (Prepared) and data whose device ID, NUMA node (the
// slice's, -1 without one) and generation (the device's state.json) are
// the device's.
func (c *cluster) checkClaimStatus(t *testing.T, pod, node string) {
	t.Helper()
	byName := c.draDevices(t, node)
	sl, err := c.draSlices(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	numa := map[string]int{}
	for i := range sl {
		for j := range sl[i].Spec.Devices {
			d := &sl[i].Spec.Devices[j]
			numa[d.Name] = -1
			if n, err := strconv.Atoi(attr(d, "numaNode")); err == nil {
				numa[d.Name] = n
			}
		}
	}
	states := c.draStates(t)
	type data struct {
		ID         string `json:"id"`
		NUMANode   *int   `json:"numaNode"`
		Generation *int64 `json:"generation"`
	}
	took := eventually(t, time.Minute, pod+"'s claim status.devices to say each device is Ready (Prepared)", func() (bool, string) {
		rc := c.claimOf(t, pod)
		if rc.Status.Allocation == nil {
			return false, "not allocated"
		}
		var seen []string
		ok := true
		for _, r := range rc.Status.Allocation.Devices.Results {
			i := slices.IndexFunc(rc.Status.Devices, func(s resourceapi.AllocatedDeviceStatus) bool {
				return s.Driver == r.Driver && s.Pool == r.Pool && s.Device == r.Device
			})
			if i < 0 {
				ok = false
				seen = append(seen, r.Device+": no status")
				continue
			}
			st := rc.Status.Devices[i]
			var ready *metav1.Condition
			for k := range st.Conditions {
				if st.Conditions[k].Type == "Ready" {
					ready = &st.Conditions[k]
				}
			}
			var dt data
			if st.Data != nil {
				_ = json.Unmarshal(st.Data.Raw, &dt)
			}
			seen = append(seen, fmt.Sprintf("%s: %+v data %s", r.Device, ready, dataString(st)))
			id := byName[r.Device]
			if ready == nil || ready.Status != metav1.ConditionTrue || ready.Reason != "Prepared" || dt.ID != id ||
				dt.NUMANode == nil || *dt.NUMANode != numa[r.Device] || dt.Generation == nil || *dt.Generation != states[id].Generation {
				ok = false
			}
		}
		return ok, strings.Join(seen, "; ")
	})
	t.Logf("%s's claim status.devices: every device Ready (Prepared), with its ID, NUMA node and generation, %v after the check began", pod, took.Round(time.Millisecond))
}

func dataString(st resourceapi.AllocatedDeviceStatus) string {
	if st.Data == nil {
		return "none"
	}
	return string(st.Data.Raw)
}

// checkDeviceMetadata: the container reads its
// devices' metadata from the file the kubelet plugin helper mounts
// (KEP-5304: a claim from a template, by the pod's claim name and the
// request); each allocated device is listed with its ID, index, resource
// and the container path of its state directory, which the container
// sees with its state.json.
func (c *cluster) checkDeviceMetadata(t *testing.T, pod, container, node string) {
	t.Helper()
	path := metadata.ResourceClaimTemplateFilePath(draDriver, draClaim, "devs")
	out, err := c.execIn(pod, container, "cat", path)
	if err != nil {
		t.Fatalf("%s/%s: reading %s: %v", pod, container, path, err)
	}
	var md metadata.DeviceMetadata
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(strings.NewReader(out)), &md); err != nil {
		t.Fatalf("%s: %v\n%s", path, err, out)
	}
	rc := c.claimOf(t, pod)
	if md.Name != rc.Name || md.UID != rc.UID || len(md.Requests) != 1 || md.Requests[0].Name != "devs" {
		t.Fatalf("%s: claim %s/%s, requests %+v; want claim %s, request devs", path, md.Name, md.UID, md.Requests, rc.Name)
	}
	byName := c.draDevices(t, node)
	var got, want []string
	for _, r := range rc.Status.Allocation.Devices.Results {
		want = append(want, r.Device)
	}
	for _, d := range md.Requests[0].Devices {
		got = append(got, d.Name)
		s := func(n string) string {
			if a, ok := d.Attributes[resourceapi.QualifiedName(draDriver+"/"+n)]; ok && a.StringValue != nil {
				return *a.StringValue
			}
			return ""
		}
		id := byName[d.Name]
		state := "/run/cdi-device-plugin/" + id
		if d.Driver != draDriver || d.Pool != draPool(node) || s("id") != draResourceID(id) || s("resource") != draResource || s("stateDir") != state {
			t.Errorf("%s: device %+v; want pool %s, id %s, resource %s, stateDir %s", path, d, draPool(node), draResourceID(id), draResource, state)
			continue
		}
		if _, err := c.execIn(pod, container, "sh", "-c", "test -f "+state+"/state.json"); err != nil {
			t.Errorf("%s/%s: no %s/state.json, which the metadata names: %v", pod, container, state, err)
		}
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s lists devices %v, allocated %v", path, got, want)
	}
	t.Logf("%s/%s reads its devices %v from %s", pod, container, got, path)
}

// Scenario D3: one ResourceClaim shared by two containers: both see the
// same device, whose steps ran once.
func (c *cluster) scenarioDRASharedClaim(t *testing.T) {
	before := c.draStates(t)
	_, err := c.cs.ResourceV1().ResourceClaims(podNS).Create(context.Background(), &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "shared"},
		Spec:       resourceapi.ResourceClaimSpec{Devices: draRequest(1)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.createPod(t, c.claimPod("d3", "", "shared", "c", "c2"))
	pod := c.waitReady(t, "d3", 3*time.Minute)
	ids := c.allocatedIDs(t, pod.Spec.NodeName, c.claimOf(t, "d3"))
	if len(ids) != 1 {
		t.Fatalf("shared claim allocated %v", ids)
	}
	for _, ct := range []string{"c", "c2"} {
		if env := c.envDevices(t, "d3", ct); !slices.Equal(env, ids) {
			t.Errorf("d3/%s: %s_DEVICES %v, allocated %v", ct, draEnv, env, ids)
		}
		if nodes := c.devNodes(t, "d3", ct); !slices.Equal(nodes, draNodes(ids)) {
			t.Errorf("d3/%s sees /dev %v, want %v", ct, nodes, draNodes(ids))
		}
	}
	after := c.draStates(t)
	if g, b := after[ids[0]].Generation, before[ids[0]].Generation; g != b+1 {
		t.Errorf("%s: generation %d after, %d before: the steps ran %d times for one claim, want once", ids[0], g, b, g-b)
	}
	t.Logf("d3's two containers share %v, prepared once", ids)
}

// claimSpecFile returns the CDI spec file on the node that names the
// claim's UID (the per-claim spec, k8s.<driver>-claim_<UID>.json), or "";
// not the device metadata's spec (<driver>_metadata_<UID>_<request>.json),
// which names it too.
func (c *cluster) claimSpecFile(t *testing.T, uid string) string {
	t.Helper()
	out, _ := c.nodeSh("grep -l '" + uid + "' /var/run/cdi/k8s.*.json 2>/dev/null || true")
	return strings.TrimSpace(out)
}

// Scenario D4: a pod with only limits {e2e.cdi.dev/dra: 2} runs through
// DRA (status.extendedResourceClaimStatus), sees 2 devices; deleting it
// runs the reset and removes its claim's spec.
func (c *cluster) scenarioDRAExtended(t *testing.T) {
	c.deletePod(t, "d3") // 2 devices free
	c.createPod(t, c.extendedPod("d4", 2))
	pod := c.waitRunning(t, "d4", 0, 3*time.Minute)
	if pod.Status.ExtendedResourceClaimStatus == nil {
		t.Fatalf("d4 has no extendedResourceClaimStatus: %+v", pod.Status)
	}
	rc := c.claimOf(t, "d4")
	ids := c.allocatedIDs(t, pod.Spec.NodeName, rc)
	if env := c.envDevices(t, "d4", "c"); len(ids) != 2 || !slices.Equal(env, ids) {
		t.Fatalf("d4: %s_DEVICES %v, claim %s allocated %v", draEnv, env, rc.Name, ids)
	}
	if nodes := c.devNodes(t, "d4", "c"); !slices.Equal(nodes, draNodes(ids)) {
		t.Errorf("d4 sees /dev %v, want %v", nodes, draNodes(ids))
	}
	file := c.claimSpecFile(t, string(rc.UID))
	if file == "" {
		t.Fatalf("no CDI spec on the node names claim %s (%s)", rc.Name, rc.UID)
	}
	before := c.draStates(t)
	c.deletePod(t, "d4")
	d := eventually(t, time.Minute, "the reset of d4's devices and its claim spec removed", func() (bool, string) {
		after := c.draStates(t)
		for _, id := range ids {
			if after[id].ResetCount <= before[id].ResetCount {
				return false, fmt.Sprintf("%s reset count %d", id, after[id].ResetCount)
			}
		}
		if out, _ := c.nodeSh("ls " + file + " 2>/dev/null || true"); strings.TrimSpace(out) != "" {
			return false, file + " still there"
		}
		return true, ""
	})
	t.Logf("d4 (claim %s) ran with %v through DRA; deleted: reset and %s removed after %v", rc.Name, ids, file, d.Round(time.Millisecond))
}

// Scenario D5: the driver killed: running pods keep their containers and
// a pod the old instance prepared is deleted cleanly; a kubelet restart:
// a new claim pod starts; a simulated reboot (DaemonSet mode): a bare
// claim pod runs again with the same devices, prepared again, specs
// written again.
func (c *cluster) scenarioDRARestarts(t *testing.T) {
	cid, restarts := containerOf(t, c, "d2")
	rc := c.claimOf(t, "d2")
	file := c.claimSpecFile(t, string(rc.UID))
	old, err := c.driverPod(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var zero int64
	if err := c.cs.CoreV1().Pods(draNS).Delete(context.Background(), old.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "a new driver pod running", func() (bool, string) {
		p, err := c.driverPod(context.Background())
		if err != nil {
			return false, err.Error()
		}
		return p.Name != old.Name, "still " + p.Name
	})
	if cid2, r2 := containerOf(t, c, "d2"); cid2 != cid || r2 != restarts {
		t.Fatalf("d2's container %s (restarts %d) became %s (%d) when the driver was killed", cid, restarts, cid2, r2)
	}
	c.deletePod(t, "d2")
	eventually(t, time.Minute, "d2's claim unprepared by the new driver", func() (bool, string) {
		out, _ := c.nodeSh("cat " + draCkpt + " 2>/dev/null; ls " + file + " 2>/dev/null")
		return !strings.Contains(out, string(rc.UID)) && !strings.Contains(out, file), out
	})
	t.Logf("driver killed: d2 kept its container; deleted, its claim was unprepared by the new instance")

	if out, err := hostSh(c.restartKubelet); err != nil {
		t.Fatalf("restart kubelet: %v\n%s", err, out)
	}
	c.createPod(t, c.claimPod("d5", "two", ""))
	c.waitReady(t, "d5", 3*time.Minute)
	ids := c.envDevices(t, "d5", "c")
	t.Logf("kubelet restarted: new claim pod d5 runs with %v", ids)

	if c.reboot == "" {
		t.Log("no E2E_REBOOT: the reboot part is skipped")
		return
	}
	_, restarts = containerOf(t, c, "d5")
	before := c.draStates(t)
	if out, err := hostSh(c.reboot); err != nil {
		t.Fatalf("reboot: %v\n%s", err, out)
	}
	t0 := time.Now()
	pod := c.waitRunning(t, "d5", restarts+1, 5*time.Minute)
	t.Logf("after the reboot d5 runs again after %v", time.Since(t0).Round(time.Millisecond))
	if got := c.envDevices(t, "d5", "c"); !slices.Equal(got, ids) {
		t.Errorf("d5 after the reboot has %v, before %v", got, ids)
	}
	after := c.checkStartState(t, pod, "c", ids, before)
	for _, id := range ids {
		if after[id].Generation != before[id].Generation+1 {
			t.Errorf("%s: generation %d after the reboot, %d before: want one preparation", id, after[id].Generation, before[id].Generation)
		}
	}
	if file := c.claimSpecFile(t, string(c.claimOf(t, "d5").UID)); file == "" {
		t.Error("no claim spec after the reboot")
	}
	c.draSpecDevices(t)
}

// draKind is the CDI kind of the DRA resource's devices.
const draKind = "k8s.e2e.cdi.dev/dra"

// draResourceID is how the kubelet names a DRA device in a pod's
// allocatedResourcesStatus: by the CDI device the driver handed out.
func draResourceID(id string) string { return draKind + "=" + id }

// Scenario D6: a held device's node removed: Unhealthy in the pod's
// status, Healthy again when restored; a free device's node removed: the
// unhealthy taint on it in the slice, and a pod asking for all 4 stays
// Pending; restored: no taint, and the pod runs with the 4 devices.
func (c *cluster) scenarioDRAHealth(t *testing.T, node string) {
	held := c.envDevices(t, "d5", "c")
	byName := c.draDevices(t, node)
	heldRID := draResourceID(held[0])
	heldNode := "/dev/" + draIDPrefix + "-" + indexOf(held[0])
	c.mustNodeSh(t, "rm "+heldNode)
	d := eventually(t, time.Minute, heldRID+" Unhealthy in d5's status", func() (bool, string) {
		h, seen := c.claimHealth("d5")
		return h[heldRID] == "Unhealthy", seen
	})
	t.Logf("removed the node of held %s: Unhealthy in d5's status after %v", held[0], d.Round(time.Millisecond))
	c.mustNodeSh(t, "mknod -m 0666 "+heldNode+" c 1 3")
	d = eventually(t, time.Minute, heldRID+" Healthy again in d5's status", func() (bool, string) {
		h, seen := c.claimHealth("d5")
		return h[heldRID] == "Healthy", seen
	})
	t.Logf("restored: Healthy in d5's status after %v", d.Round(time.Millisecond))
	c.deletePod(t, "d5")

	tainted := func(name string) (bool, string) {
		sl, err := c.draSlices(context.Background(), node)
		if err != nil {
			return false, err.Error()
		}
		for i := range sl {
			for _, dv := range sl[i].Spec.Devices {
				if dv.Name != name {
					continue
				}
				for _, tn := range dv.Taints {
					if tn.Key == draDriver+"/unhealthy" && tn.Effect == resourceapi.DeviceTaintEffectNoSchedule {
						return true, ""
					}
				}
				return false, fmt.Sprintf("taints %+v", dv.Taints)
			}
		}
		return false, "device " + name + " not in the slices"
	}
	victim := draIDPrefix + "-0"
	victimID := byName[victim]
	victimNode := "/dev/" + draIDPrefix + "-" + indexOf(victimID)
	c.mustNodeSh(t, "rm "+victimNode)
	d = eventually(t, 10*time.Second, victim+" tainted unhealthy", func() (bool, string) { return tainted(victim) })
	t.Logf("removed the node of free %s: tainted after %v", victimID, d.Round(time.Millisecond))
	c.createClaimTemplate(t, "four", 4)
	c.createPod(t, c.claimPod("d6", "four", ""))
	c.staysUnscheduled(t, "d6", 15*time.Second, "while a device is tainted")
	c.mustNodeSh(t, "mknod -m 0666 "+victimNode+" c 1 3")
	d = eventually(t, 30*time.Second, "no taint after the node came back", func() (bool, string) {
		ok, why := tainted(victim)
		return !ok, why
	})
	t.Logf("node restored: taint gone after %v", d.Round(time.Millisecond))
	c.waitReady(t, "d6", 3*time.Minute)
	if got := c.envDevices(t, "d6", "c"); len(got) != numDevices {
		t.Errorf("d6 got %v, want all %d devices", got, numDevices)
	}
}

// modeLabel picks the stack of a node in the per-node mode.
const modeLabel = "cdi-device-plugin/mode"

// labelMode sets the node's mode label (mode "": removes it; node "":
// every node).
func (c *cluster) labelMode(t *testing.T, node, mode string) {
	t.Helper()
	value := "null"
	if mode != "" {
		value = `"` + mode + `"`
	}
	patch := []byte(`{"metadata":{"labels":{"` + modeLabel + `":` + value + `}}}`)
	nodes := []string{node}
	if node == "" {
		l, err := c.cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nodes = nil
		for i := range l.Items {
			nodes = append(nodes, l.Items[i].Name)
		}
	}
	for _, n := range nodes {
		if _, err := c.cs.CoreV1().Nodes().Patch(context.Background(), n, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatalf("label %s %s=%s: %v", n, modeLabel, mode, err)
		}
	}
}

// handoverTainted reports whether every device of the node's slices
// carries the handover taint.
func (c *cluster) handoverTainted(node string) (bool, string) {
	sl, err := c.draSlices(context.Background(), node)
	if err != nil {
		return false, err.Error()
	}
	n := 0
	for i := range sl {
		for _, dv := range sl[i].Spec.Devices {
			n++
			found := false
			for _, tn := range dv.Taints {
				found = found || (tn.Key == draDriver+"/handover" && tn.Effect == resourceapi.DeviceTaintEffectNoSchedule)
			}
			if !found {
				return false, fmt.Sprintf("%s: taints %+v", dv.Name, dv.Taints)
			}
		}
	}
	return n > 0, fmt.Sprintf("%d devices in %d slices", n, len(sl))
}

// failedStart says why the pod's start failed, if it did: phase Failed or
// an UnexpectedAdmissionError.
func (c *cluster) failedStart(name string) string {
	p, err := c.getPod(name)
	if err != nil {
		return ""
	}
	if p.Status.Phase == corev1.PodFailed {
		return fmt.Sprintf("phase Failed: %s %s", p.Status.Reason, p.Status.Message)
	}
	// This pod's events only: those of an earlier pod of the same name
	// stay in the namespace.
	ev, err := c.cs.CoreV1().Events(podNS).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(p.UID)})
	if err != nil {
		return ""
	}
	var errs []string
	for i := range ev.Items {
		if e := &ev.Items[i]; e.Reason == "UnexpectedAdmissionError" || e.Reason == "FailedPrepareDynamicResources" {
			errs = append(errs, e.Reason+": "+e.Message)
		}
	}
	return strings.Join(errs, "; ")
}

// Scenario M: a node moves from the device plugin to DRA and back, with
// pods of one unchanged spec. Labelled device-plugin (per-node mode), pod
// a (limits: 2) runs through the device plugin. Relabelled dra: the
// driver's devices carry the handover taint while a runs; b, with the
// same spec, stays Pending and never fails a start; a deleted, b runs
// through DRA within 6 minutes of the relabel. Relabelled back: c runs
// through the device plugin, on devices b does not hold.
func (c *cluster) scenarioSwitch(t *testing.T, node string) {
	c.deletePod(t, "d6")
	c.labelMode(t, node, "device-plugin")
	vars := c.draVars()
	vars["MODE"] = "per-node"
	c.deploy(t, "apply", vars)
	eventually(t, 2*time.Minute, "the DRA driver pod gone from the node", func() (bool, string) {
		l, err := c.cs.CoreV1().Pods(draNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=cdi-dra-driver"})
		if err != nil {
			return false, err.Error()
		}
		return len(l.Items) == 0, fmt.Sprintf("%d driver pods", len(l.Items))
	})
	d := c.waitAllocatableOf(t, node, draResource, numDevices, 3*time.Minute)
	t.Logf("labelled %s: the device plugin serves %s, allocatable %d after %v", modeLabel+"=device-plugin", draResource, numDevices, d.Round(time.Millisecond))
	aPod := c.extendedPod("a", 2)
	c.createPod(t, aPod)
	a := c.waitRunning(t, "a", 0, 2*time.Minute)
	if a.Status.ExtendedResourceClaimStatus != nil {
		t.Fatalf("a went through DRA: %+v", a.Status.ExtendedResourceClaimStatus)
	}
	aIDs := c.envDevices(t, "a", "c")
	t.Logf("a runs through the device plugin with %v", aIDs)

	t0 := time.Now()
	c.labelMode(t, node, "dra")
	// The slices may still carry the taint a driver puts on as it stops
	// (scenario D1's, replaced by the per-node DaemonSet): look once the
	// new driver has published (ready).
	eventually(t, 2*time.Minute, "the driver ready on the relabelled node", func() (bool, string) {
		p, err := c.driverPod(context.Background())
		if err != nil {
			return false, err.Error()
		}
		if podReady(p) {
			return true, ""
		}
		return false, fmt.Sprintf("%s not ready: %+v", p.Name, p.Status.Conditions)
	})
	eventually(t, 30*time.Second, "the driver's devices published with the handover taint", func() (bool, string) { return c.handoverTainted(node) })
	t.Logf("relabelled dra: the driver is ready and its devices carry the handover taint %v after the relabel", time.Since(t0).Round(time.Millisecond))
	// Until the node's status says the device plugin is gone (the
	// kubelet reports it within its status update period), the scheduler
	// can still place a pod through the device plugin, and the kubelet,
	// which knows it gone, rejects it: the window any device plugin
	// restart has (scenario 11). b is created after it.
	c.waitAllocatableOf(t, node, draResource, 0, time.Minute)
	t.Logf("the node reports allocatable 0 for %s %v after the relabel", draResource, time.Since(t0).Round(time.Millisecond))
	b := c.extendedPod("b", 2)
	if ja, jb := mustJSON(t, aPod.Spec), mustJSON(t, b.Spec); ja != jb {
		t.Fatalf("b's spec differs from a's:\n%s\n%s", ja, jb)
	}
	c.createPod(t, b)
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		p, err := c.getPod("b")
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("b was scheduled onto %s while a still holds device-plugin devices", p.Spec.NodeName)
		}
		if why := c.failedStart("b"); why != "" {
			t.Fatalf("b failed to start: %s", why)
		}
		if ok, why := c.handoverTainted(node); !ok {
			t.Fatalf("the handover taint went while a runs: %s", why)
		}
	}
	c.deletePod(t, "a")
	var pod *corev1.Pod
	eventually(t, 6*time.Minute-time.Since(t0), "b running through DRA within 6 minutes of the relabel", func() (bool, string) {
		if why := c.failedStart("b"); why != "" {
			t.Fatalf("b failed to start: %s", why)
		}
		p, err := c.getPod("b")
		if err != nil {
			return false, err.Error()
		}
		pod = p
		ok, why := c.handoverTainted(node)
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready, fmt.Sprintf("phase %s, node %q, handover taint %v (%s)", p.Status.Phase, p.Spec.NodeName, ok, why)
	})
	if pod.Status.ExtendedResourceClaimStatus == nil {
		t.Fatalf("b runs, but not through DRA: %+v", pod.Status)
	}
	bIDs := c.envDevices(t, "b", "c")
	t.Logf("a deleted: b runs through DRA with %v, %v after the relabel", bIDs, time.Since(t0).Round(time.Second))

	// Back to the device plugin while b still runs through DRA (a
	// rollback): the device plugin reports b's devices Unhealthy, so the
	// kubelet never hands them out twice.
	t0 = time.Now()
	c.toDevicePlugin(t, node)
	c.waitAllocatableOf(t, node, draResource, numDevices-int64(len(bIDs)), time.Minute)
	t.Logf("relabelled device-plugin while b runs: allocatable %d (b's devices held by its claim) %v after the relabel", numDevices-len(bIDs), time.Since(t0).Round(time.Millisecond))

	// b's claim needs the driver to be unprepared (README: switch back
	// once the claim pods are gone): to DRA, end b, back.
	c.labelMode(t, node, "dra")
	eventually(t, 2*time.Minute, "the driver back", func() (bool, string) {
		_, err := c.driverPod(context.Background())
		return err == nil, fmt.Sprint(err)
	})
	c.deletePod(t, "b")
	t0 = time.Now()
	c.toDevicePlugin(t, node)
	// As after any device plugin restart, a pod scheduled before the node
	// reports the new plugin's devices is rejected by the kubelet (README:
	// switch back with the node cordoned until then).
	c.waitAllocatableOf(t, node, draResource, numDevices, time.Minute)
	c.createPod(t, c.extendedPod("c1", 2))
	p := c.waitRunning(t, "c1", 0, 2*time.Minute)
	if p.Status.ExtendedResourceClaimStatus != nil {
		t.Fatalf("c1 went through DRA after the relabel back: %+v", p.Status.ExtendedResourceClaimStatus)
	}
	t.Logf("b gone, relabelled device-plugin: c1 runs through the device plugin with %v, %v after the relabel", c.envDevices(t, "c1", "c"), time.Since(t0).Round(time.Second))
	c.deletePod(t, "c1")
}

// toDevicePlugin relabels the node device-plugin and waits until the
// driver has stopped and tainted its devices: until then the scheduler
// can still allocate them to a new pod, which would then wait for a
// driver that is gone (README: switch back with the node cordoned).
func (c *cluster) toDevicePlugin(t *testing.T, node string) {
	t.Helper()
	t0 := time.Now()
	c.labelMode(t, node, "device-plugin")
	eventually(t, time.Minute, "the driver gone, its devices tainted", func() (bool, string) {
		if p, err := c.driverPod(context.Background()); err == nil {
			return false, p.Name + " still runs"
		}
		sl, err := c.draSlices(context.Background(), node)
		if err != nil || len(sl) == 0 {
			return err == nil, fmt.Sprint("no slices: ", err)
		}
		return c.handoverTainted(node)
	})
	t.Logf("relabelled device-plugin: the driver left, its devices tainted, %v after the relabel", time.Since(t0).Round(time.Millisecond))
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sharedNode is the device node of the shared resource that a container
// sees (its path and its numbers), "" for none.
func (c *cluster) sharedNode(t *testing.T, pod, container string) string {
	t.Helper()
	out, err := c.execIn(pod, container, "sh", "-c", "for f in /dev/"+draSharedPrefix+"-*; do [ -e \"$f\" ] && stat -c '%n %t:%T' \"$f\"; done; true")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// Scenario D7: the shared resource, one device of
// replicas 2, published once with the shares capacity: two pods, each with
// its own claim for one device of it, run at once on the same device node,
// with share IDs of their own; the steps ran once. A third stays Pending
// until one of them ends, then runs; the device is reset only when the
// last of them is gone. Then two pods that ask for the extended resource
// (limits only) share the device the same way.
func (c *cluster) scenarioDRAShares(t *testing.T, node string) {
	ctx := context.Background()
	sl, err := c.poolSlices(ctx, node+"/"+draSharedPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(sl) != 1 || len(sl[0].Spec.Devices) != 1 {
		t.Fatalf("the shared resource's pool: %d slices, want one of one device", len(sl))
	}
	dev := sl[0].Spec.Devices[0]
	shares := dev.Capacity[resourceapi.QualifiedName(draDriver+"/shares")]
	if dev.AllowMultipleAllocations == nil || !*dev.AllowMultipleAllocations || shares.Value.Value() != 2 {
		t.Fatalf("device %s: allowMultipleAllocations %v, capacity %v; want true, %s/shares 2", dev.Name, dev.AllowMultipleAllocations, dev.Capacity, draDriver)
	}
	// The device's name in the spec: <idPrefix>-<node>-<index>. Not from
	// its id attribute, which the driver leaves out where the qualified
	// name is longer than an attribute may be (64 bytes: on kind, whose
	// node is cdi-e2e-control-plane).
	id := draSharedPrefix + "-" + node + "-" + attr(&dev, "index")
	if q := attr(&dev, "id"); q != "" && !strings.HasSuffix(q, "="+id) {
		t.Fatalf("device %s: id attribute %q, want the spec name %s", dev.Name, q, id)
	}
	_, err = c.cs.ResourceV1().ResourceClaimTemplates(podNS).Create(ctx, &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "one-share"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name:    "dev",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: draSharedClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	before := c.draStates(t)[id]
	var seen []string
	shareIDs := map[string]bool{}
	for _, name := range []string{"d7a", "d7b"} {
		c.createPod(t, c.claimPod(name, "one-share", ""))
	}
	for _, name := range []string{"d7a", "d7b"} {
		c.waitReady(t, name, 3*time.Minute)
		rc := c.claimOf(t, name)
		if rc.Status.Allocation == nil || len(rc.Status.Allocation.Devices.Results) != 1 {
			t.Fatalf("%s: claim %s allocation %+v", name, rc.Name, rc.Status.Allocation)
		}
		r := rc.Status.Allocation.Devices.Results[0]
		if r.Device != dev.Name || r.ShareID == nil {
			t.Fatalf("%s: allocated %s share %v, want a share of %s", name, r.Device, r.ShareID, dev.Name)
		}
		shareIDs[string(*r.ShareID)] = true
		seen = append(seen, c.sharedNode(t, name, "c"))
	}
	if len(shareIDs) != 2 || seen[0] == "" || seen[0] != seen[1] {
		t.Fatalf("d7a and d7b: share IDs %v, device nodes %q; want two share IDs, one node", shareIDs, seen)
	}
	// The steps (a reset among them) ran once, at the first share.
	held := c.draStates(t)[id]
	if g := held.Generation; g != before.Generation+1 {
		t.Errorf("%s: generation %d, %d before: the steps ran %d times for two shares, want once", id, g, before.Generation, g-before.Generation)
	}
	t.Logf("d7a and d7b run at once on %s (%s), shares %v", dev.Name, seen[0], shareIDs)

	c.createPod(t, c.claimPod("d7c", "one-share", ""))
	d := eventually(t, time.Minute, "d7c unschedulable (both shares taken)", func() (bool, string) {
		p, err := c.getPod("d7c")
		if err != nil {
			return false, err.Error()
		}
		for _, cd := range p.Status.Conditions {
			if cd.Type == corev1.PodScheduled && cd.Status == corev1.ConditionFalse && cd.Reason == corev1.PodReasonUnschedulable {
				return true, ""
			}
		}
		return false, fmt.Sprintf("phase %s, conditions %+v", p.Status.Phase, p.Status.Conditions)
	})
	t.Logf("d7c Pending, unschedulable, after %v", d.Round(time.Millisecond))
	c.deletePod(t, "d7a")
	c.waitReady(t, "d7c", 3*time.Minute)
	if n := c.sharedNode(t, "d7c", "c"); n != seen[0] {
		t.Errorf("d7c sees %q, want %q", n, seen[0])
	}
	st := c.draStates(t)[id]
	if st.ResetCount != held.ResetCount || st.Generation != held.Generation {
		t.Errorf("%s: reset %d times, prepared %d times while a share stayed held; want neither", id, st.ResetCount-held.ResetCount, st.Generation-held.Generation)
	}
	c.deletePod(t, "d7b")
	c.deletePod(t, "d7c")
	d = eventually(t, time.Minute, "the reset of the shared device once its last share is released", func() (bool, string) {
		st := c.draStates(t)[id]
		return st.ResetCount == held.ResetCount+1, fmt.Sprintf("reset count %d, %d while held", st.ResetCount, held.ResetCount)
	})
	t.Logf("d7c ran once d7a ended; the device reset once, %v after the last share was released", d.Round(time.Millisecond))

	// The extended resource (limits only): two pods share the device.
	seen = nil
	for _, name := range []string{"d7e", "d7f"} {
		p := c.testPodOf(name, draSharedResource, 1)
		p.Labels["app"] = "cdi-e2e-dra"
		c.createPod(t, p)
	}
	for _, name := range []string{"d7e", "d7f"} {
		p := c.waitReady(t, name, 3*time.Minute)
		if p.Status.ExtendedResourceClaimStatus == nil {
			t.Fatalf("%s has no extendedResourceClaimStatus: %+v", name, p.Status)
		}
		seen = append(seen, c.sharedNode(t, name, "c"))
	}
	if seen[0] == "" || seen[0] != seen[1] {
		t.Fatalf("d7e and d7f (limits only) see %q, want one node", seen)
	}
	t.Logf("d7e and d7f (limits {%s: 1}) run at once on %s", draSharedResource, seen[0])
	c.deletePod(t, "d7e")
	c.deletePod(t, "d7f")
}
