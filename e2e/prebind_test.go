//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Scenario D10's resources, prepared before binding (prepareBeforeBind),
// 2 devices each, served by the same driver beside draResource: their
// steps are exec steps run by a static busybox that the scenario puts in
// the driver's state directory (the driver's image holds its binaries
// alone). Their names start with draIDPrefix, so draTeardown removes
// their device nodes, specs and states with the others.
type pbbResource struct {
	resource, class, prefix string
}

var (
	// pbbSlow's reprogram takes 60 s: more than the kubelet gives any
	// call (NodePrepareResources: 45 s).
	pbbSlow = pbbResource{"e2e.cdi.dev/dra-pbb-slow", "dra-pbb-slow.e2e.cdi.dev", draIDPrefix + "-pbb-slow"}
	// pbbFail's step fails on device 0, always, and succeeds on device 1.
	pbbFail = pbbResource{"e2e.cdi.dev/dra-pbb-fail", "dra-pbb-fail.e2e.cdi.dev", draIDPrefix + "-pbb-fail"}
	// pbbFast's step takes 1 s: the overhead of preparing before binding.
	pbbFast = pbbResource{"e2e.cdi.dev/dra-pbb-fast", "dra-pbb-fast.e2e.cdi.dev", draIDPrefix + "-pbb-fast"}
)

// pbbBusybox is where the exec steps find busybox on the node: below the
// state directory, which the driver's DaemonSet mounts at the same path.
const pbbBusybox = "/var/lib/cdi-device-plugin/e2e-bin/busybox"

// pbbConfig is the part of draConfig with D10's resources.
const pbbConfig = `- name: e2e.cdi.dev/dra-pbb-slow
  count: 2
  idPrefix: ` + draIDPrefix + `-pbb-slow
  deviceFilePrefix: ` + draIDPrefix + `-pbb-slow
  envPrefix: PBB_SLOW
  prepareBeforeBind: true
  prestart:
    budget: 2m
    steps:
    - type: reset
    - type: exec
      timeout: 90s
      command: [` + pbbBusybox + `, sleep, "60"]
- name: e2e.cdi.dev/dra-pbb-fail
  count: 2
  idPrefix: ` + draIDPrefix + `-pbb-fail
  deviceFilePrefix: ` + draIDPrefix + `-pbb-fail
  envPrefix: PBB_FAIL
  prepareBeforeBind: true
  prestart:
    steps:
    - type: reset
    - type: exec
      command: [` + pbbBusybox + `, sh, -c, 'if [ "$0" = 0 ]; then echo "device $0: firmware load failed"; exit 1; fi', "{{.Index}}"]
- name: e2e.cdi.dev/dra-pbb-fast
  count: 2
  idPrefix: ` + draIDPrefix + `-pbb-fast
  deviceFilePrefix: ` + draIDPrefix + `-pbb-fast
  envPrefix: PBB_FAST
  prepareBeforeBind: true
  prestart:
    steps:
    - type: reset
    - type: exec
      command: [` + pbbBusybox + `, sleep, "1"]
`

// pbbResources are D10's resources for DRA_RESOURCES (a DeviceClass each).
func pbbResources() string {
	return strings.Join([]string{pbbSlow.resource, pbbFail.resource, pbbFast.resource}, ",")
}

// nodeInstall copies the file src of this machine to dst on the node
// (mode 0755), through the node's shell: on the local node that is this
// machine, on kind "<engine> exec -i".
func (c *cluster) nodeInstall(t *testing.T, src, dst string) {
	t.Helper()
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	args := append(append([]string{}, c.nodeShell...), "sh", "-c",
		`mkdir -p "$(dirname "$1")" && cat >"$1.tmp" && chmod 0755 "$1.tmp" && mv -f "$1.tmp" "$1"`, "sh", dst)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin = f
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("copying %s to the node's %s: %v: %s", src, dst, err, out)
	}
}

// pbbTrace is what D10 saw of a pod and its claim, each read every 100 ms
// (the pod first, then the claim: a pod seen bound before the claim was
// read has its condition True in that read already).
type pbbTrace struct {
	created time.Time // the pod created (this machine's clock)
	// The first time each was seen (this machine's clock).
	allocated, prepared, bound, running time.Time
	// allocations are the devices of each allocation seen, in order.
	allocations []string
	// failed is the first failure condition seen True: device and message.
	failed, failedMsg string
	// early says what was seen when the pod was first seen bound, if the
	// claim's binding condition had not been seen True by then.
	early string
	pod   *corev1.Pod
	claim *resourceapi.ResourceClaim
}

// pbbCondition returns the claim's condition typ (<driver>/<typ>) on
// device dev, nil if it has none.
func pbbCondition(rc *resourceapi.ResourceClaim, dev, typ string) *metav1.Condition {
	for i := range rc.Status.Devices {
		st := &rc.Status.Devices[i]
		if st.Driver != draDriver || st.Device != dev {
			continue
		}
		for j := range st.Conditions {
			if st.Conditions[j].Type == draDriver+"/"+typ {
				return &st.Conditions[j]
			}
		}
	}
	return nil
}

// pbbRun creates a claim of one device of r and a pod with it, and follows
// both until the pod runs (or timeout).
func (c *cluster) pbbRun(t *testing.T, pod, claim string, r pbbResource, timeout time.Duration) *pbbTrace {
	t.Helper()
	ctx := context.Background()
	_, err := c.cs.ResourceV1().ResourceClaims(podNS).Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claim},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name:    "devs",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: r.class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr := &pbbTrace{created: time.Now()}
	c.createPod(t, c.claimPod(pod, "", claim))
	last := ""
	for time.Since(tr.created) < timeout {
		p, err := c.getPod(pod)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := c.cs.ResourceV1().ResourceClaims(podNS).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		tr.pod, tr.claim = p, rc
		var devs []string
		if rc.Status.Allocation != nil {
			for _, res := range rc.Status.Allocation.Devices.Results {
				devs = append(devs, res.Device)
			}
			if tr.allocated.IsZero() {
				tr.allocated = now
			}
			if d := strings.Join(devs, ","); len(tr.allocations) == 0 || tr.allocations[len(tr.allocations)-1] != d {
				tr.allocations = append(tr.allocations, d)
			}
		}
		prepared := len(devs) > 0
		for _, d := range devs {
			cd := pbbCondition(rc, d, "prepared")
			prepared = prepared && cd != nil && cd.Status == metav1.ConditionTrue
			if f := pbbCondition(rc, d, "prepareFailed"); f != nil && f.Status == metav1.ConditionTrue && tr.failed == "" {
				tr.failed, tr.failedMsg = d, f.Message
				t.Logf("%s: failure condition True on %s %v after the pod's creation: %s", claim, d, now.Sub(tr.created).Round(time.Millisecond), f.Message)
			}
		}
		if prepared && tr.prepared.IsZero() {
			tr.prepared = now
		}
		if p.Spec.NodeName != "" && tr.bound.IsZero() {
			tr.bound = now
			if tr.prepared.IsZero() {
				tr.early = fmt.Sprintf("allocation %v, status.devices %+v", devs, rc.Status.Devices)
			}
		}
		if len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil {
			tr.running = now
			return tr
		}
		last = fmt.Sprintf("pod: node %q phase %s conditions %+v; claim: allocation %v status.devices %+v", p.Spec.NodeName, p.Status.Phase, p.Status.Conditions, devs, rc.Status.Devices)
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s not running after %v; allocations seen %v; last: %s", pod, timeout, tr.allocations, last)
	return nil
}

// podScheduledAt is when the API server bound the pod (its PodScheduled
// condition's transition to True; seconds).
func podScheduledAt(p *corev1.Pod) time.Time {
	for _, cd := range p.Status.Conditions {
		if cd.Type == corev1.PodScheduled && cd.Status == corev1.ConditionTrue {
			return cd.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// pbbEnd deletes the pod and its claim.
func (c *cluster) pbbEnd(t *testing.T, pod, claim string) {
	t.Helper()
	c.deletePod(t, pod)
	if err := c.cs.ResourceV1().ResourceClaims(podNS).Delete(context.Background(), claim, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// pbbTainted reports whether device dev of resource r carries the
// driver's unhealthy taint in the node's slices.
func (c *cluster) pbbTainted(node string, r pbbResource, dev string) (bool, string) {
	sl, err := c.poolSlices(context.Background(), node+"/"+r.prefix)
	if err != nil {
		return false, err.Error()
	}
	for i := range sl {
		for _, d := range sl[i].Spec.Devices {
			if d.Name != dev {
				continue
			}
			for _, tn := range d.Taints {
				if tn.Key == draDriver+"/unhealthy" && tn.Effect == resourceapi.DeviceTaintEffectNoSchedule {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%s: taints %+v", dev, d.Taints)
		}
	}
	return false, dev + " not in the slices of pool " + node + "/" + r.prefix
}

// Scenario D10: prepare before binding. The feature gates are on, the
// driver's controller runs, and the three resources' devices are
// published with the binding condition <driver>/prepared and the failure
// condition <driver>/prepareFailed, untainted.
//   - 1 s step: the pod runs; the time from the claim's allocation to its
//     condition True is logged.
//   - A step that fails on device 0: the pod's claim is allocated device 0,
//     the failure condition turns True with the step's message, the
//     scheduler allocates again, device 1, and the pod runs with it; no
//     manual action. Device 0 is tainted unhealthy.
//   - 60 s step: the pod runs; it was never seen bound before its claim's
//     condition was seen True, and the API server bound it (PodScheduled)
//     no earlier than the condition's transition and the device's
//     preparation (state.json); its time from creation to Running is
//     logged.
func (c *cluster) scenarioDRAPrepareBeforeBind(t *testing.T, node string) {
	c.localNodeOnly(t)
	ctx := context.Background()
	c.requireFeatureGates(t, "DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus")
	ctl, err := c.runningPod(ctx, draNS, "cdi-dra-controller")
	if err != nil {
		t.Fatalf("the driver's controller: %v", err)
	}
	t.Logf("the driver's controller %s runs on %s", ctl.Name, ctl.Spec.NodeName)
	c.nodeInstall(t, "/bin/busybox", pbbBusybox)
	for _, r := range []pbbResource{pbbSlow, pbbFail, pbbFast} {
		d := eventually(t, 6*time.Minute, r.resource+": 2 devices with the binding conditions, untainted", func() (bool, string) {
			sl, err := c.poolSlices(ctx, node+"/"+r.prefix)
			if err != nil {
				return false, err.Error()
			}
			var seen []string
			n := 0
			for i := range sl {
				for _, dv := range sl[i].Spec.Devices {
					seen = append(seen, fmt.Sprintf("%s: binding %v failure %v taints %+v", dv.Name, dv.BindingConditions, dv.BindingFailureConditions, dv.Taints))
					if slices.Equal(dv.BindingConditions, []string{draDriver + "/prepared"}) &&
						slices.Equal(dv.BindingFailureConditions, []string{draDriver + "/prepareFailed"}) && len(dv.Taints) == 0 {
						n++
					}
				}
			}
			return n == 2, strings.Join(seen, "; ")
		})
		t.Logf("%s published with the binding conditions after %v", r.resource, d.Round(time.Millisecond))
	}

	// 1 s step.
	tr := c.pbbRun(t, "d10q", "d10-fast", pbbFast, 3*time.Minute)
	if tr.early != "" {
		t.Errorf("d10q seen bound before its claim's condition was True: %s", tr.early)
	}
	t.Logf("1 s step: allocation seen %v after the pod's creation; condition True %v after the allocation; pod bound %v after it; running %v after the pod's creation",
		tr.allocated.Sub(tr.created).Round(time.Millisecond), tr.prepared.Sub(tr.allocated).Round(time.Millisecond),
		tr.bound.Sub(tr.prepared).Round(time.Millisecond), tr.running.Sub(tr.created).Round(time.Millisecond))
	c.pbbEnd(t, "d10q", "d10-fast")

	// A step that fails on device 0.
	bad, good := pbbFail.prefix+"-0", pbbFail.prefix+"-1"
	tr = c.pbbRun(t, "d10f", "d10-fail", pbbFail, 4*time.Minute)
	if tr.failed != bad || !strings.Contains(tr.failedMsg, "device 0: firmware load failed") {
		t.Errorf("failure condition seen on %q (%q), want True on %s with the step's message; allocations seen %v", tr.failed, tr.failedMsg, bad, tr.allocations)
	}
	if got := tr.allocations[len(tr.allocations)-1]; got != good {
		t.Errorf("d10f runs with %s, want %s; allocations seen %v", got, good, tr.allocations)
	}
	if tr.early != "" {
		t.Errorf("d10f seen bound before its claim's condition was True: %s", tr.early)
	}
	out, err := c.execIn("d10f", "c", "sh", "-c", "echo $PBB_FAIL_DEVICES")
	if err != nil {
		t.Fatal(err)
	}
	if env := strings.TrimSpace(out); indexOf(env) != "1" {
		t.Errorf("d10f: PBB_FAIL_DEVICES %q, want device 1's ID", env)
	}
	d := eventually(t, 30*time.Second, bad+" tainted unhealthy", func() (bool, string) { return c.pbbTainted(node, pbbFail, bad) })
	if ok, why := c.pbbTainted(node, pbbFail, good); ok {
		t.Errorf("%s tainted unhealthy too: %s", good, why)
	}
	t.Logf("step failing on device 0: allocations seen %v; the pod runs with %s (%s) %v after its creation, no manual action; %s tainted unhealthy (seen %v later)",
		tr.allocations, good, strings.TrimSpace(out), tr.running.Sub(tr.created).Round(time.Millisecond), bad, d.Round(time.Millisecond))
	c.pbbEnd(t, "d10f", "d10-fail")

	// 60 s step.
	tr = c.pbbRun(t, "d10s", "d10-slow", pbbSlow, 5*time.Minute)
	if tr.early != "" {
		t.Errorf("d10s seen bound before its claim's condition was True: %s", tr.early)
	}
	if v := tr.claim.Labels[draDriver+"/prepare-node"]; v != node {
		t.Errorf("d10-slow: label %s/prepare-node %q, want %s (the controller's)", draDriver, v, node)
	}
	dev := tr.allocations[len(tr.allocations)-1]
	cd := pbbCondition(tr.claim, dev, "prepared")
	scheduled := podScheduledAt(tr.pod)
	// The device's ID (its state directory): <idPrefix>-<node>-<index>.
	id := pbbSlow.prefix + "-" + node + "-" + indexOf(dev)
	st := c.draStates(t)[id]
	switch {
	case cd == nil || cd.Status != metav1.ConditionTrue:
		t.Errorf("d10-slow: condition %+v on %s once the pod runs, want True", cd, dev)
	case scheduled.IsZero():
		t.Errorf("d10s runs with no PodScheduled True: %+v", tr.pod.Status.Conditions)
	case scheduled.Before(cd.LastTransitionTime.Time):
		t.Errorf("d10s bound at %v, before its claim's condition turned True at %v", scheduled, cd.LastTransitionTime)
	case st.PreparedAt.IsZero() || scheduled.Before(st.PreparedAt.Truncate(time.Second)):
		t.Errorf("d10s bound at %v, before %s was prepared (state.json: %v)", scheduled, id, st.PreparedAt)
	case tr.prepared.Sub(tr.allocated) < 55*time.Second:
		t.Errorf("d10-slow's condition True %v after its allocation: the 60 s step did not run before binding", tr.prepared.Sub(tr.allocated))
	}
	running := tr.running.Sub(tr.created)
	if cs := tr.pod.Status.ContainerStatuses[0].State.Running; cs != nil {
		t.Logf("60 s step: pod d10s created %v, bound (PodScheduled) %v, running %v (API times); the condition True at %v, %s prepared at %v",
			tr.pod.CreationTimestamp.UTC(), scheduled.UTC(), cs.StartedAt.UTC(), cd.LastTransitionTime.UTC(), id, st.PreparedAt.UTC())
	}
	t.Logf("60 s step: allocation seen %v after the pod's creation, condition True %v after the allocation, pod bound %v after that; pod running %v after its creation",
		tr.allocated.Sub(tr.created).Round(time.Millisecond), tr.prepared.Sub(tr.allocated).Round(time.Millisecond),
		tr.bound.Sub(tr.prepared).Round(time.Millisecond), running.Round(time.Millisecond))
	c.pbbEnd(t, "d10s", "d10-slow")
}
