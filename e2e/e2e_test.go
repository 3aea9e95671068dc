//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestE2E runs the scenarios in order on one deployment; each builds on the
// state the previous one left (pod p2 holds 2 devices from scenario 2 on).
func TestE2E(t *testing.T) {
	c := newCluster(t)
	start := time.Now()
	defer func() {
		if t.Failed() {
			c.saveArtifacts(t, suiteNamespaces...)
			c.recap(t, start)
		}
		c.teardown(t)
		t.Logf("suite wall time %v", time.Since(start).Round(time.Second))
	}()
	c.teardown(t) // leftovers of an interrupted run

	var node string
	steps := []struct {
		name string
		f    func(t *testing.T)
	}{
		{"1-daemonset-capacity", func(t *testing.T) { node = c.scenarioDaemonSet(t) }},
		{"2-pod-sees-its-devices", func(t *testing.T) { c.scenarioPod(t) }},
		{"3-prestart-state", func(t *testing.T) { c.scenarioPrestart(t) }},
		{"4-kubelet-restart", func(t *testing.T) { c.scenarioKubeletRestart(t, node) }},
		{"5-plugin-restart", func(t *testing.T) { c.scenarioPluginRestart(t, node) }},
		{"6-device-failure", func(t *testing.T) { c.scenarioDeviceFailure(t, node) }},
		{"7-exhaustion", func(t *testing.T) { c.scenarioExhaustion(t) }},
		{"8-bad-config", func(t *testing.T) { c.scenarioBadConfig(t, node) }},
		{"9-spec-restored", func(t *testing.T) { c.scenarioSpecRestored(t) }},
		{"9a-unprivileged-pod", func(t *testing.T) { c.scenarioUnprivileged(t) }},
		{"9b-metrics-pod-devices", func(t *testing.T) { c.scenarioMetrics(t) }},
		{"9c-health-in-pod-status", func(t *testing.T) { c.scenarioHealthInPodStatus(t) }},
		{"9c2-injected-fault-in-pod-status", func(t *testing.T) { c.scenarioFaultInPodStatus(t) }},
		{"9d-live-reload", func(t *testing.T) { c.scenarioLiveReload(t, node) }},
		{"9e-rolling-update", func(t *testing.T) { c.scenarioRollingUpdate(t, node) }},
		{"9f-helm-install", func(t *testing.T) { c.scenarioHelm(t, node) }},
		{"9g-real-hardware", func(t *testing.T) { c.scenarioHardware(t, node) }},
		{"10-node-reboot", func(t *testing.T) { c.scenarioReboot(t, node) }},
		{"11-plugin-upgrade", func(t *testing.T) { c.scenarioUpgrade(t, node) }},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.f) {
			// Later scenarios build on this one.
			t.Fatalf("scenario %s failed; later scenarios skipped", s.name)
		}
	}
}

func (c *cluster) pluginVars() map[string]string {
	return map[string]string{
		"NAMESPACE":          pluginNS,
		"PLUGIN_NAME":        pluginNS,
		"RESOURCE_NAME":      resourceName,
		"NUMBER_DEVICES":     strconv.Itoa(numDevices),
		"DEVICE_ID_PREFIX":   idPrefix,
		"DEVICE_FILE_PREFIX": idPrefix,
		"ENV_PREFIX":         envPrefix,
		"ANNOTATION_PREFIX":  annotPrefix,
		"LOG_LEVEL":          "debug",
		// The fault control socket, for 9c2.
		"FAULT_CONTROL": "true",
	}
}

func badVars(config string) map[string]string {
	return map[string]string{"NAMESPACE": badNS, "PLUGIN_NAME": badNS, "PLUGIN_CONFIG": config}
}

// teardown removes everything the suite creates, on the cluster and the node.
func (c *cluster) teardown(t *testing.T) {
	ctx := context.Background()
	for _, ns := range suiteNamespaces {
		err := c.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", ns, err)
		}
	}
	eventually(t, 3*time.Minute, "namespaces gone", func() (bool, string) {
		for _, ns := range suiteNamespaces {
			if _, err := c.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, ns + " still there"
			}
		}
		return true, ""
	})
	if c.pluginHost != "" {
		if out, err := hostSh(c.pluginHost + " stop"); err != nil {
			t.Errorf("stop the host plugin: %v\n%s", err, out)
		}
	}
	if _, err := c.nodeSh("rm -rf /dev/" + idPrefix + "-* /dev/e2e-cfg-* /dev/" + hostIDPrefix + "-* " + specFile + " /var/run/cdi/k8s.e2e.cdi.dev-cfg.json " +
		hostSpecFile + " /var/lib/cdi-device-plugin/devices/" + idPrefix + "-* /var/lib/cdi-device-plugin/devices/e2e-cfg-* " +
		"/var/lib/cdi-device-plugin/devices/" + hostIDPrefix + "-* " + cfgMountHost); err != nil {
		t.Errorf("node cleanup: %v", err)
	}
}

// Scenario 1: the DaemonSet from deploy/ comes up and the node advertises
// the configured capacity; the CDI spec and device nodes are on the node.
func (c *cluster) scenarioDaemonSet(t *testing.T) string {
	c.deploy(t, "apply", c.pluginVars())
	if _, err := c.cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: podNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pod *corev1.Pod
	d := eventually(t, 3*time.Minute, "plugin pod running", func() (bool, string) {
		p, err := c.pluginPod(context.Background(), pluginNS)
		if err != nil {
			return false, err.Error()
		}
		pod = p
		return true, ""
	})
	node := pod.Spec.NodeName
	t.Logf("plugin pod %s running on %s after %v", pod.Name, node, d.Round(time.Millisecond))
	ds, err := c.cs.AppsV1().DaemonSets(pluginNS).Get(context.Background(), "cdi-device-plugin", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if img := ds.Spec.Template.Spec.Containers[0].Image; img != c.pluginImage {
		t.Errorf("DaemonSet image %q, want %q", img, c.pluginImage)
	}
	d = c.waitAllocatable(t, node, numDevices, 2*time.Minute)
	capacity, _, err := c.nodeResource(context.Background(), node, resourceName)
	if err != nil || capacity != numDevices {
		t.Fatalf("capacity %s = %d (%v), want %d", resourceName, capacity, err, numDevices)
	}
	t.Logf("capacity = allocatable = %d, %v after the pod ran", numDevices, d.Round(time.Millisecond))

	// The spec the runtime resolves, and the host nodes it points at.
	spec := c.readSpec(t)
	if spec.Kind != "k8s.e2e.cdi.dev/sim" || len(spec.Devices) != numDevices {
		t.Fatalf("spec kind %q with %d devices, want k8s.e2e.cdi.dev/sim with %d", spec.Kind, len(spec.Devices), numDevices)
	}
	for _, d := range spec.Devices {
		if len(d.Edits.DeviceNodes) != 1 || d.Edits.DeviceNodes[0].Path != "/dev/"+nodeOf(d.Name) {
			t.Errorf("spec device %s: nodes %+v, want /dev/%s", d.Name, d.Edits.DeviceNodes, nodeOf(d.Name))
		}
	}
	for i := range numDevices {
		p := fmt.Sprintf("/dev/%s-%d", idPrefix, i)
		if got := strings.TrimSpace(c.mustNodeSh(t, "stat -c '%F %t:%T' "+p)); got != "character special file 1:3" {
			t.Errorf("host node %s: %q, want a character device 1:3", p, got)
		}
	}
	if mode := strings.TrimSpace(c.mustNodeSh(t, "stat -c %a "+specFile)); mode != "644" {
		t.Errorf("spec mode %s, want 644", mode)
	}
	return node
}

// Scenario 2: a pod asking for 2 devices sees exactly them, with the env,
// mounts and annotations of the CDI spec and of Allocate.
func (c *cluster) scenarioPod(t *testing.T) {
	c.createPod(t, c.testPod("p2", 2))
	pod := c.waitRunning(t, "p2", 0, 3*time.Minute)
	ids := c.devicesOf(t, "p2")
	if len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("%s_DEVICES = %v, want 2 distinct IDs", envPrefix, ids)
	}
	env := c.mustExec(t, "p2", "env")
	nodes := strings.Fields(c.mustExec(t, "p2", "cd /dev && ls -d "+idPrefix+"-* 2>/dev/null || true"))
	var want []string
	for _, id := range ids {
		want = append(want, nodeOf(id))
	}
	if !slices.Equal(nodes, want) {
		t.Errorf("device nodes of the resource in the container %v, want exactly %v", nodes, want)
	}
	all := c.specDevices(t)
	for _, id := range all {
		mine := slices.Contains(ids, id)
		line := fmt.Sprintf("%s_%s=/dev/%s", envPrefix, indexOf(id), nodeOf(id))
		if got := strings.Contains(env, line+"\n"); got != mine {
			t.Errorf("env has %q: %v, want %v (env:\n%s)", line, got, mine, env)
		}
		st := strings.TrimSpace(c.mustExec(t, "p2", "test -e "+stateRoot+"/"+id+"/state.json && echo yes || echo no"))
		if (st == "yes") != mine {
			t.Errorf("state mount of %s visible: %s, want %v", id, st, mine)
		}
		if !mine {
			continue
		}
		p := "/dev/" + nodeOf(id)
		if got := strings.TrimSpace(c.mustExec(t, "p2", "stat -c '%F %t:%T' "+p)); got != "character special file 1:3" {
			t.Errorf("%s in the container: %q, want a character device 1:3", p, got)
		}
		// Usable: writable, and reads end at once (a null device).
		if got := strings.TrimSpace(c.mustExec(t, "p2", "echo probe > "+p+" && head -c 16 "+p+" | wc -c")); got != "0" {
			t.Errorf("%s: read %s bytes after a write, want 0", p, got)
		}
	}
	mounts := c.mustExec(t, "p2", "grep ' "+stateRoot+"/' /proc/mounts || true")
	for _, id := range ids {
		var found bool
		for _, l := range strings.Split(mounts, "\n") {
			f := strings.Fields(l)
			if len(f) >= 4 && f[1] == stateRoot+"/"+id && slices.Contains(strings.Split(f[3], ","), "ro") {
				found = true
			}
		}
		if !found {
			t.Errorf("no read-only mount of %s/%s in the container; /proc/mounts:\n%s", stateRoot, id, mounts)
		}
	}
	if strings.Count(mounts, "\n") != len(ids) {
		t.Errorf("state mounts:\n%s\nwant one per allocated device", mounts)
	}

	// Annotations reached the runtime: the OCI spec containerd gave runc.
	cid := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	var oci struct {
		Annotations map[string]string `json:"annotations"`
		Linux       struct {
			Devices []struct {
				Path string `json:"path"`
			} `json:"devices"`
		} `json:"linux"`
	}
	bundle := filepath.Join(c.runtimeState, "io.containerd.runtime.v2.task", "k8s.io", cid, "config.json")
	if err := json.Unmarshal([]byte(c.mustNodeSh(t, "cat "+bundle)), &oci); err != nil {
		t.Fatalf("%s: %v", bundle, err)
	}
	var got []string
	for k, v := range oci.Annotations {
		if strings.HasPrefix(k, annotPrefix+"-") {
			got = append(got, v)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, ids) {
		t.Errorf("OCI annotations %s-<i> carry %v, want %v (all: %v)", annotPrefix, got, ids, oci.Annotations)
	}
	var devs []string
	for _, d := range oci.Linux.Devices {
		if strings.HasPrefix(d.Path, "/dev/"+idPrefix+"-") {
			devs = append(devs, strings.TrimPrefix(d.Path, "/dev/"))
		}
	}
	slices.Sort(devs)
	if !slices.Equal(devs, want) {
		t.Errorf("OCI linux.devices of the resource %v, want %v", devs, want)
	}
	t.Logf("p2 got %v: nodes, env, state mounts and annotations checked", ids)
}

// Scenario 3: the device state mounted in the container shows a reset and a
// reprogram before the container started; a container restart prepares the
// devices again (generation increases).
func (c *cluster) scenarioPrestart(t *testing.T) {
	ids := c.devicesOf(t, "p2")
	pod, err := c.getPod("p2")
	if err != nil {
		t.Fatal(err)
	}
	started := pod.Status.ContainerStatuses[0].State.Running.StartedAt.Time
	first := parseStates(t, c.mustExec(t, "p2", "cat /tmp/state-at-start"))
	if len(first) != len(ids) {
		t.Fatalf("state at start covers %d devices, want %d: %v", len(first), len(ids), first)
	}
	for _, id := range ids {
		st, ok := first[id]
		switch {
		case !ok:
			t.Errorf("no state of %s at container start", id)
		case st.Generation < 1 || st.ResetCount < 1:
			t.Errorf("%s at start: generation %d, resets %d: not prepared", id, st.Generation, st.ResetCount)
		case st.Firmware == nil || len(st.Firmware.SHA256) != 64:
			t.Errorf("%s at start: no firmware loaded: %+v", id, st.Firmware)
		case st.Resource != resourceName:
			t.Errorf("%s: resource %q", id, st.Resource)
		case st.PreparedAt.IsZero() || st.PreparedAt.After(started.Add(time.Second)):
			// StartedAt has a resolution of one second.
			t.Errorf("%s prepared at %v, after the container started at %v", id, st.PreparedAt, started)
		}
	}
	c.mustExec(t, "p2", "touch /tmp/exit")
	c.waitRunning(t, "p2", 1, 2*time.Minute)
	second := parseStates(t, c.mustExec(t, "p2", "cat /tmp/state-at-start"))
	for _, id := range ids {
		a, b := first[id], second[id]
		if b.Generation <= a.Generation || b.ResetCount <= a.ResetCount {
			t.Errorf("%s after a container restart: generation %d -> %d, resets %d -> %d; want both to increase",
				id, a.Generation, b.Generation, a.ResetCount, b.ResetCount)
		}
	}
	t.Logf("generation %d -> %d across a container restart", first[ids[0]].Generation, second[ids[0]].Generation)
}

// registrations returns the running plugin pod and how often its log says
// it registered with the kubelet.
func (c *cluster) registrations() (string, int, error) {
	p, err := c.pluginPod(context.Background(), pluginNS)
	if err != nil {
		return "", 0, err
	}
	l, err := c.logs(context.Background(), pluginNS, p.Name, false)
	if err != nil {
		return p.Name, 0, fmt.Errorf("plugin logs: %w", err)
	}
	return p.Name, strings.Count(l, registeredAt), nil
}

func containerOf(t *testing.T, c *cluster, name string) (string, int32) {
	t.Helper()
	p, err := c.getPod(name)
	if err != nil {
		t.Fatal(err)
	}
	s := p.Status.ContainerStatuses[0]
	if s.State.Running == nil {
		t.Fatalf("pod %s not running: %+v", name, s.State)
	}
	return s.ContainerID, s.RestartCount
}

// stillHasDevices checks that a running pod kept its container and devices.
func (c *cluster) stillHasDevices(t *testing.T, name, cid string, restarts int32, ids []string) {
	t.Helper()
	cid2, r2 := containerOf(t, c, name)
	if cid2 != cid || r2 != restarts {
		t.Errorf("pod %s: container %s (restarts %d), was %s (restarts %d)", name, cid2, r2, cid, restarts)
	}
	c.stillUsable(t, name, ids)
}

// stillUsable checks that the pod can write to the nodes of its devices.
func (c *cluster) stillUsable(t *testing.T, name string, ids []string) {
	t.Helper()
	for _, id := range ids {
		if got := strings.TrimSpace(c.mustExec(t, name, "echo probe > /dev/"+nodeOf(id)+" && echo ok")); got != "ok" {
			t.Errorf("pod %s: /dev/%s no longer usable", name, nodeOf(id))
		}
	}
}

func disjoint(a, b []string) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// Scenario 4: after a kubelet restart the plugin registers again, running
// pods keep their devices, and a new pod gets devices.
func (c *cluster) scenarioKubeletRestart(t *testing.T, node string) {
	ids := c.devicesOf(t, "p2")
	cid, restarts := containerOf(t, c, "p2")
	pluginPod, before, err := c.registrations()
	if err != nil || before < 1 {
		t.Fatalf("plugin log shows no registration (%v)", err)
	}
	t0 := time.Now()
	if out, err := hostSh(c.restartKubelet); err != nil {
		t.Fatalf("restart kubelet: %v\n%s", err, out)
	}
	d := eventually(t, 2*time.Minute, "plugin registered again", func() (bool, string) {
		name, n, err := c.registrations()
		return err == nil && name == pluginPod && n > before, fmt.Sprintf("pod %s, %d registrations (%v)", name, n, err)
	})
	t.Logf("re-registered %v after the restart command began", d.Round(time.Millisecond))
	c.waitAllocatable(t, node, numDevices, 2*time.Minute)
	t.Logf("allocatable back to %d %v after the restart command began", numDevices, time.Since(t0).Round(time.Millisecond))
	c.stillHasDevices(t, "p2", cid, restarts, ids)

	c.newPodGetsTheRest(t, "p4", ids)
}

// newPodGetsTheRest runs a pod asking for the devices that held leaves free,
// checks it gets exactly those, usable, and deletes it.
func (c *cluster) newPodGetsTheRest(t *testing.T, name string, held []string) {
	t.Helper()
	c.createPod(t, c.testPod(name, numDevices-len(held)))
	c.waitRunning(t, name, 0, 2*time.Minute)
	got := c.devicesOf(t, name)
	if len(got) != numDevices-len(held) || !disjoint(got, held) {
		t.Errorf("new pod %s got %v while %v are held", name, got, held)
	}
	c.stillUsable(t, name, got)
	c.deletePod(t, name)
}

// Scenario 5: deleting the plugin pod: running pods keep running, the new
// plugin pod registers, allocations stay consistent, a new pod gets devices.
func (c *cluster) scenarioPluginRestart(t *testing.T, node string) {
	ids := c.devicesOf(t, "p2")
	cid, restarts := containerOf(t, c, "p2")
	old, _, err := c.registrations()
	if err != nil {
		t.Fatal(err)
	}
	if err = c.cs.CoreV1().Pods(pluginNS).Delete(context.Background(), old, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	d := eventually(t, 2*time.Minute, "a new plugin pod registered", func() (bool, string) {
		name, n, err := c.registrations()
		return err == nil && name != old && n > 0, fmt.Sprintf("pod %s, %d registrations (%v)", name, n, err)
	})
	t.Logf("new plugin pod registered %v after the delete", d.Round(time.Millisecond))
	c.waitAllocatable(t, node, numDevices, time.Minute)
	c.stillHasDevices(t, "p2", cid, restarts, ids)
	if got := c.devicesOf(t, "p2"); !slices.Equal(got, ids) {
		t.Errorf("p2 devices %v, were %v", got, ids)
	}

	c.newPodGetsTheRest(t, "p5", ids)
}

// Scenario 6: removing a device node on the host takes it out of
// allocatable within seconds; a pod that would need it waits; restoring the
// node brings it back and the pod gets it.
func (c *cluster) scenarioDeviceFailure(t *testing.T, node string) {
	held := c.devicesOf(t, "p2")
	var victim string
	for _, id := range c.specDevices(t) {
		if !slices.Contains(held, id) {
			victim = id
		}
	}
	c.mustNodeSh(t, "rm /dev/"+nodeOf(victim))
	d := c.waitAllocatable(t, node, numDevices-1, 30*time.Second)
	t.Logf("removed /dev/%s: allocatable %d after %v", victim, numDevices-1, d.Round(time.Millisecond))

	// The 2 devices p6 asks for are free but one is unhealthy.
	c.createPod(t, c.testPod("p6", 2))
	c.staysUnscheduled(t, "p6", 10*time.Second, "while a device is unhealthy")
	c.mustNodeSh(t, "mknod -m 0666 /dev/"+nodeOf(victim)+" c 1 3")
	d = c.waitAllocatable(t, node, numDevices, 30*time.Second)
	t.Logf("restored /dev/%s: allocatable %d after %v", victim, numDevices, d.Round(time.Millisecond))
	c.waitRunning(t, "p6", 0, 2*time.Minute)
	got := c.devicesOf(t, "p6")
	if len(got) != 2 || !disjoint(got, held) || !slices.Contains(got, victim) {
		t.Errorf("p6 got %v; want the 2 devices p2 (%v) does not hold, %s among them", got, held, victim)
	}
	c.stillUsable(t, "p6", []string{victim})
}

// Scenario 7: with every device taken, a pod asking for one stays Pending;
// when a holder goes, it runs on the freed device, never on a held one.
func (c *cluster) scenarioExhaustion(t *testing.T) {
	p2, p6 := c.devicesOf(t, "p2"), c.devicesOf(t, "p6")
	if !disjoint(p2, p6) {
		t.Fatalf("double allocation: p2 %v, p6 %v", p2, p6)
	}
	c.createPod(t, c.testPod("p7", 1))
	eventually(t, time.Minute, "FailedScheduling of p7 for "+resourceName, func() (bool, string) {
		ev, err := c.cs.CoreV1().Events(podNS).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=p7"})
		if err != nil {
			return false, err.Error()
		}
		for i := range ev.Items {
			if e := &ev.Items[i]; e.Reason == "FailedScheduling" && strings.Contains(e.Message, "Insufficient "+resourceName) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(ev.Items))
	})
	c.staysUnscheduled(t, "p7", 5*time.Second, "with all devices taken")
	c.deletePod(t, "p6")
	c.waitRunning(t, "p7", 0, 2*time.Minute)
	got := c.devicesOf(t, "p7")
	if len(got) != 1 || !slices.Contains(p6, got[0]) {
		t.Errorf("p7 got %v; want one of p6's freed devices %v (p2 holds %v)", got, p6, p2)
	}
	c.deletePod(t, "p7")
}

// Scenario 8: a bad configuration in the ConfigMap: the plugin exits with a
// message naming the field and value, and writes no CDI spec. Fixed, the
// plugin serves the resource it describes, with its mounts.
func (c *cluster) scenarioBadConfig(t *testing.T, node string) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	bad := "resources:\n  - name: e2e.cdi.dev/bad\n    count: 2\n    idPrefix: ../evil\n"
	if err := os.WriteFile(cfg, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	c.deploy(t, "apply", badVars(cfg))
	msg := c.endedLog(t, badNS, 2, []string{"invalid configuration", "idPrefix", "../evil"}, 2*time.Minute)
	t.Logf("bad config log: %s", strings.TrimSpace(msg))
	if out := strings.TrimSpace(c.mustNodeSh(t, "ls /var/run/cdi/ | grep -c bad || true")); out != "0" {
		t.Errorf("a CDI spec of the bad resource was written: %s", c.mustNodeSh(t, "ls -l /var/run/cdi/"))
	}
	if capacity, _, err := c.nodeResource(context.Background(), node, "e2e.cdi.dev/bad"); err != nil || capacity != 0 {
		t.Errorf("node capacity e2e.cdi.dev/bad = %d (%v), want none", capacity, err)
	}
	// The good deployment is untouched.
	if _, a, err := c.nodeResource(context.Background(), node, resourceName); err != nil || a != numDevices {
		t.Errorf("allocatable %s = %d (%v) after the bad deployment, want %d", resourceName, a, err, numDevices)
	}

	// Fixing the ConfigMap rolls the DaemonSet (the ConfigMap's name carries
	// a content hash); the fixed plugin serves its resource, with a mount
	// from Allocate.
	c.mustNodeSh(t, "mkdir -p "+cfgMountHost+" && echo "+node+" > "+cfgMountHost+"/marker")
	good := "resources:\n  - name: " + cfgResource + "\n    count: 1\n    idPrefix: e2e-cfg\n    envPrefix: CFG\n" +
		"    mounts:\n      - hostPath: " + cfgMountHost + "\n        containerPath: /cfg\n        readOnly: true\n"
	if err := os.WriteFile(cfg, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	c.deploy(t, "apply", badVars(cfg))
	d := eventually(t, 2*time.Minute, "allocatable "+cfgResource+" = 1", func() (bool, string) {
		_, a, err := c.nodeResource(context.Background(), node, cfgResource)
		return err == nil && a == 1, fmt.Sprintf("allocatable %d (%v)", a, err)
	})
	t.Logf("fixed ConfigMap: %s allocatable after %v", cfgResource, d.Round(time.Millisecond))
	p := c.testPod("p8", 1)
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(cfgResource): resource.MustParse("1")}
	c.createPod(t, p)
	c.waitRunning(t, "p8", 0, 2*time.Minute)
	if got := strings.TrimSpace(c.mustExec(t, "p8", "cat /cfg/marker")); got != node {
		t.Errorf("/cfg/marker in the container: %q, want %q (the Allocate mount)", got, node)
	}
	m := strings.Fields(c.mustExec(t, "p8", "grep ' /cfg ' /proc/mounts"))
	if len(m) < 4 || !slices.Contains(strings.Split(m[3], ","), "ro") {
		t.Errorf("/cfg mount not read-only: %q", m)
	}
	if got := strings.TrimSpace(c.mustExec(t, "p8", "echo $CFG_DEVICES; ls /dev | grep -c e2e-cfg")); got != "e2e-cfg-"+node+"-0\n1" {
		t.Errorf("CFG_DEVICES and e2e-cfg nodes in the container: %q", got)
	}
	c.deletePod(t, "p8")
	c.deploy(t, "delete", badVars(cfg))
}

// Scenario 9: our CDI spec removed or emptied by someone else on the node
// is written back at once, and a container restart (which resolves the CDI
// names the kubelet checkpointed, without asking the plugin again) gets
// its devices.
func (c *cluster) scenarioSpecRestored(t *testing.T) {
	ids := c.devicesOf(t, "p2")
	_, restarts := containerOf(t, c, "p2")
	want := c.readSpec(t)
	for _, damage := range []string{"rm -f " + specFile, ": > " + specFile} {
		// Damage, then poll every 10 ms for a complete spec again.
		out := c.mustNodeSh(t, `t0=$(date +%s%N); `+damage+`; i=0
while ! grep -q '"devices"' `+specFile+` 2>/dev/null; do i=$((i+1)); [ $i -lt 1000 ] || exit 1; sleep 0.01; done
echo $(( ($(date +%s%N) - t0) / 1000 ))`)
		t.Logf("%q: spec back after %s µs", damage, strings.TrimSpace(out))
		if got := c.readSpec(t); got.Kind != want.Kind || len(got.Devices) != len(want.Devices) {
			t.Fatalf("restored spec: kind %q with %d devices, want %q with %d", got.Kind, len(got.Devices), want.Kind, len(want.Devices))
		}
	}
	c.mustExec(t, "p2", "touch /tmp/exit")
	c.waitRunning(t, "p2", restarts+1, 2*time.Minute)
	if got := c.devicesOf(t, "p2"); !slices.Equal(got, ids) {
		t.Errorf("p2 devices %v after the restart, were %v", got, ids)
	}
	c.stillUsable(t, "p2", ids)
}

// The host-mode deployment of scenario 10: the plugin binary run on the
// node as a host process, started before containerd and the kubelet.
const (
	hostResource = "e2e.cdi.dev/host"
	hostIDPrefix = "e2e-host"
	hostEnv      = "HOST"
	hostSpecFile = "/var/run/cdi/k8s.e2e.cdi.dev-host.json"
)

// initPod is a pod whose init container holds a host device and appends
// the device's generation to a file that the main container shows.
func (c *cluster) initPod(name string) *corev1.Pod { return c.initPodOf(name, hostResource) }

// initPodOf is initPod for a device of resource res.
func (c *cluster) initPodOf(name, res string) *corev1.Pod {
	p := c.testPodOf(name, res, 0)
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}}
	p.Spec.Volumes = []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	p.Spec.InitContainers = []corev1.Container{{
		Name:            "init",
		Image:           c.testImage,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command: []string{"sh", "-c", `for d in ` + stateRoot + `/*/; do
  sed -n 's/.*"generation": *\([0-9]*\).*/\1/p' "$d/state.json"; done >> /shared/init-generations`},
		Resources:    corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceName(res): *resource.NewQuantity(1, resource.DecimalSI)}},
		VolumeMounts: []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}},
	}}
	return p
}

// initGenerations returns the generations of its device that the init
// container of an initPod saw, one per run.
func (c *cluster) initGenerations(t *testing.T, name string) []int64 {
	t.Helper()
	var gens []int64
	for _, f := range strings.Fields(c.mustExec(t, name, "cat /shared/init-generations")) {
		g, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("%s: init generations: %v", name, err)
		}
		gens = append(gens, g)
	}
	if len(gens) == 0 {
		t.Fatalf("%s: the init container recorded no generation", name)
	}
	return gens
}

// admissionErrors lists the UnexpectedAdmissionError events of the pod.
func (c *cluster) admissionErrors(name string) []string {
	ev, err := c.cs.CoreV1().Events(podNS).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for i := range ev.Items {
		if e := &ev.Items[i]; e.Reason == "UnexpectedAdmissionError" {
			out = append(out, e.Message)
		}
	}
	return out
}

// generations reads the generation of each device's state, as the
// container sees it now.
func (c *cluster) generations(t *testing.T, name string) map[string]int64 {
	t.Helper()
	out := c.mustExec(t, name, "for d in "+stateRoot+"/*/; do cat \"$d/state.json\"; echo; done")
	g := map[string]int64{}
	for id, st := range parseStates(t, out) {
		g[id] = st.Generation
	}
	return g
}

// Scenario 10: a node reboot (simulated: everything stops; mounts,
// containerd's state, the CDI specs and the simulated /dev nodes are
// gone; then the host plugin, containerd and the kubelet start, in that
// order). Each mode has a bare pod, a Deployment's pod and a bare pod
// whose init container holds a device. Host mode: all three run again,
// the same pods with the same devices, prepared again, never rejected at
// admission. DaemonSet mode: the kubelet re-admits the pods before the
// plugin pod could register: the Deployment's pod is rejected and
// replaced, and the replacement runs with a device; the bare pods (p2 and
// the init pod di1) are rejected for good. The figures logged are the
// times from the kubelet's start to each pod running again.
func (c *cluster) scenarioReboot(t *testing.T, node string) {
	if c.reboot == "" || c.pluginHost == "" {
		t.Skip("E2E_REBOOT and E2E_PLUGIN_HOST are not set: no reboot on this cluster")
	}
	vars := []string{"PLUGIN_NAME=cdi-e2e-host", "RESOURCE_NAME=" + hostResource, "NUMBER_DEVICES=4",
		"DEVICE_ID_PREFIX=" + hostIDPrefix, "DEVICE_FILE_PREFIX=" + hostIDPrefix, "ENV_PREFIX=" + hostEnv,
		"LOG_LEVEL=debug", "NODE_NAME=" + node}
	if out, err := hostSh(c.pluginHost + " start " + strings.Join(vars, " ")); err != nil {
		t.Fatalf("start the host plugin: %v\n%s", err, out)
	}
	c.waitAllocatableOf(t, node, hostResource, 4, time.Minute)
	// Host mode: 2 + 1 (init) + 1 of the 4 host devices.
	c.createPod(t, c.testPodOf("h1", hostResource, 2))
	c.createPod(t, c.initPod("h2"))
	c.createDeployment(t, "hd1", c.testPodOf("hd1", hostResource, 1))
	// DaemonSet mode: p2 holds 2 of the 4 devices since scenario 2.
	c.createDeployment(t, "d1", c.testPod("d1", 1))
	c.createPod(t, c.initPodOf("di1", resourceName))
	c.waitRunning(t, "h1", 0, 2*time.Minute)
	c.waitRunning(t, "h2", 0, 2*time.Minute)
	c.waitRunning(t, "di1", 0, 2*time.Minute)
	hd1 := c.deploymentPod(t, "hd1", "")
	d1 := c.deploymentPod(t, "d1", "")
	held := c.devicesOfEnv(t, "h1", hostEnv)
	hd1Held := c.devicesOfEnv(t, hd1, hostEnv)
	gen := c.generations(t, "h1")
	initGens := c.initGenerations(t, "h2")
	_, h1Restarts := containerOf(t, c, "h1")
	_, h2Restarts := containerOf(t, c, "h2")
	_, hd1Restarts := containerOf(t, c, hd1)

	t0 := time.Now()
	if out, err := hostSh(c.reboot); err != nil {
		t.Fatalf("reboot: %v\n%s", err, out)
	}
	t.Logf("simulated reboot: kubelet started again after %v", time.Since(t0).Round(time.Millisecond))
	t1 := time.Now()
	again := func(name string, restarts int32) func(map[string]*corev1.Pod) bool {
		return func(pods map[string]*corev1.Pod) bool { return runningAgain(pods[name], restarts+1) }
	}
	times := c.watchMilestones(t1, map[string]func(map[string]*corev1.Pod) bool{
		"host bare pod h1":           again("h1", h1Restarts),
		"host init pod h2":           again("h2", h2Restarts),
		"host deployment pod " + hd1: again(hd1, hd1Restarts),
		"daemonset deployment's new pod": func(pods map[string]*corev1.Pod) bool {
			for name, p := range pods {
				if strings.HasPrefix(name, "d1-") && name != d1 && runningAgain(p, 0) {
					return true
				}
			}
			return false
		},
	})

	// Host mode: the same pods run again, with the same devices, prepared again.
	c.waitRunning(t, "h1", h1Restarts+1, 3*time.Minute)
	c.waitRunning(t, "h2", h2Restarts+1, 3*time.Minute)
	c.waitRunning(t, hd1, hd1Restarts+1, 3*time.Minute)
	if got := c.devicesOfEnv(t, "h1", hostEnv); !slices.Equal(got, held) {
		t.Errorf("h1 devices %v after the reboot, were %v", got, held)
	}
	if got := c.devicesOfEnv(t, hd1, hostEnv); !slices.Equal(got, hd1Held) {
		t.Errorf("%s devices %v after the reboot, were %v", hd1, got, hd1Held)
	}
	for id, g := range c.generations(t, "h1") {
		if g <= gen[id] {
			t.Errorf("h1 device %s: generation %d, was %d: not prepared again", id, g, gen[id])
		}
	}
	if after := c.initGenerations(t, "h2"); len(after) <= len(initGens) || after[len(after)-1] <= initGens[len(initGens)-1] {
		t.Errorf("h2's init container: generations %v, were %v: not run again on a prepared device", after, initGens)
	}
	for _, p := range []string{"h1", "h2", hd1} {
		if errs := c.admissionErrors(p); len(errs) > 0 {
			t.Errorf("%s: %v", p, errs)
		}
	}

	// DaemonSet mode.
	c.waitAllocatable(t, node, numDevices, 3*time.Minute)
	d1b := c.deploymentPod(t, "d1", d1)
	if got := c.devicesOf(t, d1b); len(got) != 1 {
		t.Errorf("the Deployment's new pod %s has devices %v, want 1", d1b, got)
	}
	if errs := c.admissionErrors(d1); len(errs) == 0 {
		t.Errorf("DaemonSet mode: the Deployment's old pod %s was not rejected at admission", d1)
	}
	t.Logf("DaemonSet mode: the Deployment's pod %s replaced %s", d1b, d1)
	for _, p := range []string{"p2", "di1"} {
		t.Logf("DaemonSet mode: bare pod %s: UnexpectedAdmissionError: %s", p, c.rejectedAtAdmission(t, p))
	}
	t.Logf("reboot figures, from the kubelet's start to running again: %s", times.report())
}

// deploymentPod waits for a running, ready pod of the deployment other
// than not, and returns its name.
func (c *cluster) deploymentPod(t *testing.T, app, not string) string {
	t.Helper()
	var name string
	eventually(t, 3*time.Minute, "a running pod of "+app, func() (bool, string) {
		l, err := c.cs.CoreV1().Pods(podNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return false, err.Error()
		}
		var states []string
		for i := range l.Items {
			p := &l.Items[i]
			states = append(states, p.Name+":"+string(p.Status.Phase))
			if p.Name != not && p.DeletionTimestamp == nil && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready {
				name = p.Name
				return true, ""
			}
		}
		return false, strings.Join(states, " ")
	})
	return name
}
