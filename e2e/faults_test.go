//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// The fault control sockets of the two binaries on the node (their state
// directory, the same path in the pod and on the host).
const (
	pluginFaults = "/var/lib/cdi-device-plugin/cdi-device-plugin-faults.sock"
	driverFaults = "/var/lib/cdi-device-plugin/cdi-dra-driver-faults.sock"
)

// faultRequest runs curl on the node against a fault control socket, as
// docs/simulation.md does, and checks the answer says want.
func (c *cluster) faultRequest(t *testing.T, sock, method, query, body, want string) {
	t.Helper()
	cmd := "curl -sS --unix-socket " + sock + " -X " + method + " 'http://localhost/faults" + query + "'"
	if body != "" {
		cmd += " -d '" + body + "'"
	}
	if out := c.mustNodeSh(t, cmd); !strings.Contains(out, want) {
		t.Fatalf("%s: %q, want %q", cmd, out, want)
	}
}

// podDeviceHealth is the health the pod's status gives device id of
// resource, and every health it lists.
func (c *cluster) podDeviceHealth(pod, resource, id string) (string, string) {
	p, err := c.getPod(pod)
	if err != nil {
		return "", err.Error()
	}
	var seen []string
	got := ""
	for i := range p.Status.ContainerStatuses {
		for _, rs := range p.Status.ContainerStatuses[i].AllocatedResourcesStatus {
			for _, r := range rs.Resources {
				seen = append(seen, fmt.Sprintf("%s/%s=%s", rs.Name, r.ResourceID, r.Health))
				if string(rs.Name) == resource && string(r.ResourceID) == id {
					got = string(r.Health)
				}
			}
		}
	}
	return got, strings.Join(seen, " ")
}

// Scenario 9c2: a fault injected through the plugin's control socket
// (unhealthy, on a device p2 holds) shows in p2's
// allocatedResourcesStatus as Unhealthy; cleared, Healthy again; p2 keeps
// its container and devices throughout, and the metrics count the
// injection.
func (c *cluster) scenarioFaultInPodStatus(t *testing.T) {
	c.localNodeOnly(t)
	ids := c.devicesOf(t, "p2")
	cid, restarts := containerOf(t, c, "p2")
	victim := ids[0]
	status := func(want string) func() (bool, string) {
		return func() (bool, string) {
			h, seen := c.podDeviceHealth("p2", resourceName, victim)
			return h == want, seen
		}
	}
	eventually(t, time.Minute, victim+" Healthy in p2's status", status("Healthy"))
	start := time.Now()
	c.faultRequest(t, pluginFaults, "POST", "", `{"device": "`+victim+`", "fault": {"kind": "unhealthy", "reason": "e2e: ECC error"}}`, "injected")
	eventually(t, time.Minute, victim+" Unhealthy in p2's status", status("Unhealthy"))
	t.Logf("fault injected into %s: Unhealthy in p2's status %v after the injection", victim, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	c.faultRequest(t, pluginFaults, "DELETE", "?device="+victim, "", "cleared")
	eventually(t, time.Minute, victim+" Healthy again in p2's status", status("Healthy"))
	t.Logf("fault cleared: Healthy in p2's status %v after clearing", time.Since(start).Round(time.Millisecond))
	c.stillHasDevices(t, "p2", cid, restarts, ids)
	if m, _ := c.metrics(t, pluginNS); !strings.Contains(m, `cdi_device_plugin_injected_faults_total{kind="unhealthy",resource="`+resourceName+`"} 1`) {
		t.Errorf("the metrics do not count the injected fault:\n%s", grepLines(m, "fault"))
	}
}

// grepLines are the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// sliceTaint is the effect of the driver's unhealthy taint on the slice's
// device name ("" untainted), and what the slices say of it.
func (c *cluster) sliceTaint(node, name string) (resourceapi.DeviceTaintEffect, string) {
	sl, err := c.draSlices(context.Background(), node)
	if err != nil {
		return "", err.Error()
	}
	for i := range sl {
		for _, dv := range sl[i].Spec.Devices {
			if dv.Name != name {
				continue
			}
			for _, tn := range dv.Taints {
				if tn.Key == draDriver+"/unhealthy" {
					return tn.Effect, fmt.Sprintf("taints %+v", dv.Taints)
				}
			}
			return "", fmt.Sprintf("taints %+v", dv.Taints)
		}
	}
	return "", "device " + name + " not in the slices"
}

// Scenario D6b: a lost fault with noExecute injected through the
// driver's control socket into the device of pod f1's claim taints it
// NoExecute in the ResourceSlice; the eviction controller evicts f1; a
// new pod's claim gets another device. Cleared, the taint goes.
func (c *cluster) scenarioDRAFaultLost(t *testing.T, node string) {
	c.localNodeOnly(t)
	c.deletePod(t, "d6") // D6's pod holds every device
	c.createClaimTemplate(t, "fault-one", 1)
	c.createPod(t, c.claimPod("f1", "fault-one", ""))
	c.waitReady(t, "f1", 3*time.Minute)
	victim := c.allocatedDevice(t, "f1")
	// The device's name in the spec, <idPrefix>-<node>-<index> (the id
	// attribute may be left out: see scenarioDRAShares).
	victimID := draIDPrefix + "-" + node + "-" + strings.TrimPrefix(victim, draIDPrefix+"-")
	p, err := c.getPod("f1")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.faultRequest(t, driverFaults, "POST", "", `{"device": "`+victimID+`", "fault": {"kind": "lost", "noExecute": true}}`, "injected")
	eventually(t, time.Minute, victim+" tainted NoExecute", func() (bool, string) {
		e, why := c.sliceTaint(node, victim)
		return e == resourceapi.DeviceTaintEffectNoExecute, why
	})
	t.Logf("lost fault injected into %s (%s): slice taint NoExecute %v after the injection", victimID, victim, time.Since(start).Round(time.Millisecond))
	var evicted string
	eventually(t, 3*time.Minute, "f1 evicted", func() (bool, string) {
		q, err := c.getPod("f1")
		switch {
		case apierrors.IsNotFound(err):
			evicted = "gone"
			return true, ""
		case err != nil:
			return false, err.Error()
		}
		evicted = fmt.Sprintf("phase %s, deleting %v, conditions %+v", q.Status.Phase, q.DeletionTimestamp != nil, q.Status.Conditions)
		return q.UID != p.UID || q.DeletionTimestamp != nil || q.Status.Phase == corev1.PodFailed, evicted
	})
	t.Logf("f1 evicted %v after the injection (%s)", time.Since(start).Round(time.Millisecond), evicted)
	c.deletePod(t, "f1")
	c.createPod(t, c.claimPod("f2", "fault-one", ""))
	c.waitReady(t, "f2", 3*time.Minute)
	if got := c.allocatedDevice(t, "f2"); got == victim {
		t.Errorf("f2 got %s, the lost device", got)
	}
	start = time.Now()
	c.faultRequest(t, driverFaults, "DELETE", "?device="+victimID, "", "cleared")
	eventually(t, time.Minute, victim+" untainted", func() (bool, string) {
		e, why := c.sliceTaint(node, victim)
		return e == "", why
	})
	t.Logf("fault cleared: taint gone %v after clearing", time.Since(start).Round(time.Millisecond))
	c.deletePod(t, "f2")
}

// allocatedDevice is the slice name of the one device of the pod's claim.
func (c *cluster) allocatedDevice(t *testing.T, pod string) string {
	t.Helper()
	rc := c.claimOf(t, pod)
	if rc.Status.Allocation == nil || len(rc.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s of %s: allocation %+v, want one device", rc.Name, pod, rc.Status.Allocation)
	}
	return rc.Status.Allocation.Devices.Results[0].Device
}
