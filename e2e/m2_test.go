//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Scenario M2: one node per API in one cluster, and one pod
// spec served by both. It needs two schedulable nodes, which the suite's
// clusters (the local node, run.sh's first kind cluster) do not have:
// e2e/kind/run.sh makes a second kind cluster for it and sets E2E_M2=1;
// elsewhere TestM2 is skipped.
const (
	m2Deployment = "m2"
	m2App        = "cdi-e2e-m2"
)

// TestM2: a node labelled device-plugin and one labelled dra (MODE=per-node),
// a Deployment of 2 replicas (pod anti-affinity on the hostname) whose one
// pod spec asks limits {e2e.cdi.dev/dra: 1}: both pods run, the one on the
// device-plugin node through the device plugin (no
// status.extendedResourceClaimStatus), the one on the dra node through DRA
// (extendedResourceClaimStatus set, its claim allocated from that node's
// ResourceSlice); each sees its node's device in DRA_DEVICES and /dev.
func TestM2(t *testing.T) {
	if os.Getenv("E2E_M2") != "1" {
		t.Skip("E2E_M2 is not 1: scenario M2 needs two schedulable nodes (e2e/kind/run.sh makes a cluster for it)")
	}
	c := newCluster(t)
	start := time.Now()
	defer func() {
		if t.Failed() {
			c.saveArtifacts(t, suiteNamespaces...)
			c.draDriverLog(t)
			c.recap(t, start)
		}
		c.m2Teardown(t)
		t.Logf("M2 wall time %v", time.Since(start).Round(time.Second))
	}()
	c.m2Teardown(t)
	c.scenarioM2(t)
}

// m2Teardown removes the Deployment (its pods before the deployment, so
// that the driver unprepares their claims), the claims, both DaemonSets
// and the driver's objects, the slices and the nodes' mode labels. The
// files on the nodes stay: the cluster is thrown away after the test.
func (c *cluster) m2Teardown(t *testing.T) {
	ctx := context.Background()
	err := c.cs.AppsV1().Deployments(podNS).Delete(ctx, m2Deployment, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete deployment %s: %v", m2Deployment, err)
	}
	eventually(t, 2*time.Minute, "M2 pods gone", func() (bool, string) {
		l, err := c.cs.CoreV1().Pods(podNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + m2App})
		if err != nil {
			return apierrors.IsNotFound(err), err.Error()
		}
		return len(l.Items) == 0, fmt.Sprintf("%d pods", len(l.Items))
	})
	_ = c.cs.ResourceV1().ResourceClaims(podNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	vars := c.draVars()
	vars["MODE"] = "per-node"
	c.deployQuiet(t, "delete", vars)
	_ = c.cs.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "spec.driver=" + draDriver})
	c.labelMode(t, "", "")
}

// m2Nodes returns the names of two Ready nodes without a NoSchedule or
// NoExecute taint, sorted, waiting for them a while (run.sh hands over a
// cluster whose worker may still be joining).
func (c *cluster) m2Nodes(t *testing.T) []string {
	t.Helper()
	var nodes []string
	eventually(t, 3*time.Minute, "two Ready schedulable nodes", func() (bool, string) {
		l, err := c.cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		nodes = nil
		var seen []string
		for i := range l.Items {
			n := &l.Items[i]
			ready := false
			for _, cd := range n.Status.Conditions {
				ready = ready || (cd.Type == corev1.NodeReady && cd.Status == corev1.ConditionTrue)
			}
			tainted := n.Spec.Unschedulable
			for _, tn := range n.Spec.Taints {
				tainted = tainted || tn.Effect == corev1.TaintEffectNoSchedule || tn.Effect == corev1.TaintEffectNoExecute
			}
			seen = append(seen, fmt.Sprintf("%s ready=%v taints=%v unschedulable=%v", n.Name, ready, n.Spec.Taints, n.Spec.Unschedulable))
			if ready && !tainted {
				nodes = append(nodes, n.Name)
			}
		}
		return len(nodes) >= 2, strings.Join(seen, "; ")
	})
	sort.Strings(nodes)
	return nodes[:2]
}

// m2Pods returns the Deployment's pods that are not being deleted, by node.
func (c *cluster) m2Pods(ctx context.Context) (map[string]*corev1.Pod, int, error) {
	l, err := c.cs.CoreV1().Pods(podNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + m2App})
	if err != nil {
		return nil, 0, err
	}
	byNode := map[string]*corev1.Pod{}
	for i := range l.Items {
		if p := &l.Items[i]; p.DeletionTimestamp == nil {
			byNode[p.Spec.NodeName] = p
		}
	}
	return byNode, len(l.Items), nil
}

// m2Deploy is the Deployment: 2 replicas of one pod spec asking for one
// device, at most one per node.
func (c *cluster) m2Deploy() *appsv1.Deployment {
	p := c.testPodOf("", draResource, 1)
	labels := map[string]string{"app": m2App}
	p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
			TopologyKey:   corev1.LabelHostname,
		}},
	}}
	replicas := int32(2)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: m2Deployment, Namespace: podNS},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: p.Spec},
		},
	}
}

// Scenario M2: see TestM2.
func (c *cluster) scenarioM2(t *testing.T) {
	ctx := context.Background()
	c.requireFeatureGates(t, draFeatureGates...)
	nodes := c.m2Nodes(t)
	dpNode, draNode := nodes[0], nodes[1]
	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: podNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// Labelled before the deployment: no stack ever runs on the wrong node.
	c.labelMode(t, dpNode, "device-plugin")
	c.labelMode(t, draNode, "dra")
	vars := c.draVars()
	vars["MODE"] = "per-node"
	c.deploy(t, "apply", vars)

	// Each DaemonSet runs on its node only. Ready: the driver's readiness
	// is its registration with the kubelet, which a pod it serves needs (a
	// slice can be published before it; a pod scheduled then would fail
	// its first preparation, "driver ... is not registered"). The driver's
	// controller, one pod in the cluster, runs on either node.
	d := eventually(t, 3*time.Minute, "the device plugin ready on "+dpNode+", the driver on "+draNode+", its controller on either, nothing else", func() (bool, string) {
		l, err := c.cs.CoreV1().Pods(draNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		ok := len(l.Items) == 3
		for i := range l.Items {
			p := &l.Items[i]
			app := p.Labels["app.kubernetes.io/name"]
			ready := podReady(p)
			seen = append(seen, fmt.Sprintf("%s (%s) on %q: %s, ready %v", p.Name, app, p.Spec.NodeName, p.Status.Phase, ready))
			if app == "cdi-dra-controller" {
				ok = ok && (p.Spec.NodeName == dpNode || p.Spec.NodeName == draNode) && ready
				continue
			}
			want := map[string]string{"cdi-device-plugin": dpNode, "cdi-dra-driver": draNode}[app]
			ok = ok && p.Spec.NodeName == want && ready
		}
		return ok, strings.Join(seen, "; ")
	})
	t.Logf("%s=device-plugin on %s, =dra on %s: each stack runs on its node (%v)", modeLabel, dpNode, draNode, d.Round(time.Millisecond))
	d = c.waitAllocatableOf(t, dpNode, draResource, numDevices, 3*time.Minute)
	t.Logf("%s: allocatable %s %d after %v", dpNode, draResource, numDevices, d.Round(time.Millisecond))
	d = eventually(t, 2*time.Minute, draNode+": one ResourceSlice of 4 untainted devices", func() (bool, string) {
		sl, err := c.draSlices(ctx, draNode)
		if err != nil {
			return false, err.Error()
		}
		if len(sl) != 1 || len(sl[0].Spec.Devices) != numDevices {
			return false, fmt.Sprintf("%d slices", len(sl))
		}
		for _, dv := range sl[0].Spec.Devices {
			if len(dv.Taints) != 0 {
				return false, fmt.Sprintf("%s: taints %+v", dv.Name, dv.Taints)
			}
		}
		return true, ""
	})
	t.Logf("%s: the driver's slice of %d untainted devices after %v", draNode, numDevices, d.Round(time.Millisecond))
	if sl, err := c.draSlices(ctx, dpNode); err != nil || len(sl) != 0 {
		t.Fatalf("%s (device-plugin) has %d slices of the driver (%v)", dpNode, len(sl), err)
	}
	if _, a, err := c.nodeResource(ctx, draNode, draResource); err != nil || a != 0 {
		t.Fatalf("%s (dra) reports allocatable %s %d (%v): the device plugin ran there", draNode, draResource, a, err)
	}

	dep, err := c.cs.AppsV1().Deployments(podNS).Create(ctx, c.m2Deploy(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pods map[string]*corev1.Pod
	d = eventually(t, 3*time.Minute, "both pods of the Deployment running, one on each node", func() (bool, string) {
		byNode, n, err := c.m2Pods(ctx)
		if err != nil {
			return false, err.Error()
		}
		// Every pod of the one spec starts at its first try: none is
		// rejected by a kubelet or fails to prepare its devices.
		if why := c.m2FailedStarts(ctx, dep.CreationTimestamp.Time); why != "" {
			t.Fatalf("a pod of %s failed to start: %s", m2Deployment, why)
		}
		pods = byNode
		var seen []string
		ready := 0
		for node, p := range byNode {
			if p.Status.Phase == corev1.PodFailed {
				t.Fatalf("%s on %s failed: %s %s", p.Name, node, p.Status.Reason, p.Status.Message)
			}
			s := fmt.Sprintf("%s on %q: %s", p.Name, node, p.Status.Phase)
			if len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready {
				ready++
				s += " ready"
			}
			seen = append(seen, s)
		}
		sort.Strings(seen)
		return n == 2 && ready == 2 && byNode[dpNode] != nil && byNode[draNode] != nil, strings.Join(seen, "; ")
	})
	t.Logf("Deployment %s: both pods ready after %v", m2Deployment, d.Round(time.Millisecond))

	dp := pods[dpNode]
	if dp.Status.ExtendedResourceClaimStatus != nil || len(dp.Status.ResourceClaimStatuses) != 0 {
		t.Fatalf("%s on the device-plugin node %s went through DRA: %+v %+v", dp.Name, dpNode, dp.Status.ExtendedResourceClaimStatus, dp.Status.ResourceClaimStatuses)
	}
	dpIDs := c.envDevices(t, dp.Name, "c")
	c.m2CheckDevices(t, dp.Name, dpNode, dpIDs)
	t.Logf("%s on %s runs through the device plugin with %v", dp.Name, dpNode, dpIDs)

	dr := pods[draNode]
	if dr.Status.ExtendedResourceClaimStatus == nil {
		t.Fatalf("%s on the dra node %s has no extendedResourceClaimStatus: %+v", dr.Name, draNode, dr.Status)
	}
	rc := c.claimOf(t, dr.Name)
	if rc.Name != dr.Status.ExtendedResourceClaimStatus.ResourceClaimName {
		t.Fatalf("%s: claim %s, extendedResourceClaimStatus names %s", dr.Name, rc.Name, dr.Status.ExtendedResourceClaimStatus.ResourceClaimName)
	}
	if rc.Status.Allocation == nil {
		t.Fatalf("claim %s of %s not allocated", rc.Name, dr.Name)
	}
	for _, r := range rc.Status.Allocation.Devices.Results {
		if r.Driver != draDriver || r.Pool != draPool(draNode) {
			t.Fatalf("claim %s: device %s of driver %s, pool %s; want %s, pool %s", rc.Name, r.Device, r.Driver, r.Pool, draDriver, draPool(draNode))
		}
	}
	reserved := false
	for _, ref := range rc.Status.ReservedFor {
		reserved = reserved || ref.UID == dr.UID
	}
	if !reserved {
		t.Errorf("claim %s is not reserved for %s: %+v", rc.Name, dr.Name, rc.Status.ReservedFor)
	}
	drIDs := c.allocatedIDs(t, draNode, rc)
	if env := c.envDevices(t, dr.Name, "c"); !slices.Equal(env, drIDs) {
		t.Fatalf("%s: %s_DEVICES %v, claim %s allocated %v", dr.Name, draEnv, env, rc.Name, drIDs)
	}
	c.m2CheckDevices(t, dr.Name, draNode, drIDs)
	t.Logf("%s on %s runs through DRA (claim %s) with %v", dr.Name, draNode, rc.Name, drIDs)
}

// m2CheckDevices checks that the pod got exactly one device of its node
// (device IDs carry the node's name) and sees its node below /dev.
func (c *cluster) m2CheckDevices(t *testing.T, pod, node string, ids []string) {
	t.Helper()
	if len(ids) != 1 || !strings.HasPrefix(ids[0], draIDPrefix+"-"+node+"-") {
		t.Fatalf("%s: %s_DEVICES %v, want one device of %s (%s-%s-<i>)", pod, draEnv, ids, node, draIDPrefix, node)
	}
	if nodes := c.devNodes(t, pod, "c"); !slices.Equal(nodes, draNodes(ids)) {
		t.Fatalf("%s sees /dev %v, want %v", pod, nodes, draNodes(ids))
	}
}

// m2FailedStarts says which pods of the Deployment were rejected by a
// kubelet or failed to prepare their devices since the Deployment was
// created, if any.
func (c *cluster) m2FailedStarts(ctx context.Context, since time.Time) string {
	ev, err := c.cs.CoreV1().Events(podNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod"})
	if err != nil {
		return "list events: " + err.Error()
	}
	var errs []string
	for i := range ev.Items {
		e := &ev.Items[i]
		if !strings.HasPrefix(e.InvolvedObject.Name, m2Deployment+"-") || e.CreationTimestamp.Time.Before(since.Add(-time.Second)) {
			continue
		}
		if e.Reason == "UnexpectedAdmissionError" || e.Reason == "FailedPrepareDynamicResources" {
			errs = append(errs, e.InvolvedObject.Name+": "+e.Reason+": "+e.Message)
		}
	}
	return strings.Join(errs, "; ")
}
