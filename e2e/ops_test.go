//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The live-reload deployment: a config-file deployment of its own.
const (
	opsNS      = "cdi-e2e-ops"
	opsResA    = "e2e.cdi.dev/opsa"
	opsResB    = "e2e.cdi.dev/opsb"
	metricPort = "9400"
)

func init() { suiteNamespaces = append(suiteNamespaces, opsNS) }

// metrics scrapes the plugin pod of namespace ns at :9400/metrics from the
// node (the pod network is reachable from it).
func (c *cluster) metrics(t *testing.T, ns string) (string, *corev1.Pod) {
	t.Helper()
	p, err := c.pluginPod(context.Background(), ns)
	if err != nil {
		t.Fatal(err)
	}
	return c.mustNodeSh(t, "curl -fsS --max-time 10 http://"+p.Status.PodIP+":"+metricPort+"/metrics"), p
}

// metricValue returns the value of the series whose line starts with
// name{ and carries every label given as `k="v"`; -1 when there is none.
func metricValue(text, name string, labels ...string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		ok := true
		for _, lb := range labels {
			if !strings.Contains(l, lb) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err == nil {
			return v
		}
	}
	return -1
}

// Scenario: the plugin pod that the DaemonSet of deploy/ runs is not
// privileged: its spec says so (no privileged, capabilities drop ALL and
// add MKNOD only, no privilege escalation, read-only root, seccomp
// RuntimeDefault, no service account token), and so does its process on
// the node (/proc/PID/status: the effective and bounding sets hold
// CAP_MKNOD alone, no_new_privs, a seccomp filter).
func (c *cluster) scenarioUnprivileged(t *testing.T) {
	p, err := c.pluginPod(context.Background(), pluginNS)
	if err != nil {
		t.Fatal(err)
	}
	ctr := p.Spec.Containers[0]
	sc := ctr.SecurityContext
	if sc == nil {
		t.Fatal("plugin container has no securityContext")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Errorf("plugin container is privileged")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("allowPrivilegeEscalation %v, want false", sc.AllowPrivilegeEscalation)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("readOnlyRootFilesystem %v, want true", sc.ReadOnlyRootFilesystem)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		!slices.Equal(sc.Capabilities.Add, []corev1.Capability{"MKNOD"}) {
		t.Errorf("capabilities %+v, want drop [ALL] add [MKNOD]", sc.Capabilities)
	}
	if psc := p.Spec.SecurityContext; psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccompProfile %+v, want RuntimeDefault", p.Spec.SecurityContext)
	}
	if a := p.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("automountServiceAccountToken %v, want false", a)
	}
	if p.Spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", p.Spec.PriorityClassName)
	}
	for _, m := range ctr.VolumeMounts {
		if strings.HasPrefix(m.MountPath, "/var/run/secrets/kubernetes.io") {
			t.Errorf("a service account token is mounted: %+v", m)
		}
		if m.MountPath == "/var/lib/kubelet/pod-resources" && !m.ReadOnly {
			t.Errorf("the PodResources socket directory is mounted read-write")
		}
	}

	// The process itself, seen from the node.
	cid := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	status := c.mustNodeSh(t, "cat /proc/$(cat "+c.runtimeState+"/io.containerd.runtime.v2.task/k8s.io/"+cid+"/init.pid)/status")
	const mknod = 1 << 27 // CAP_MKNOD
	for _, f := range []string{"CapEff", "CapPrm", "CapBnd"} {
		m := regexp.MustCompile(`(?m)^` + f + `:\s*([0-9a-f]+)$`).FindStringSubmatch(status)
		if m == nil {
			t.Fatalf("no %s in /proc/PID/status:\n%s", f, status)
		}
		v, _ := strconv.ParseUint(m[1], 16, 64)
		if v != mknod {
			t.Errorf("%s of the plugin process = %#x, want CAP_MKNOD alone (%#x)", f, v, mknod)
		}
	}
	for _, want := range []string{"NoNewPrivs:\t1", "Seccomp:\t2"} {
		if !strings.Contains(status, want+"\n") {
			t.Errorf("plugin process: no %q in /proc/PID/status", want)
		}
	}
	ro := c.mustNodeSh(t, "grep ' / / ' /proc/$(cat "+c.runtimeState+"/io.containerd.runtime.v2.task/k8s.io/"+cid+"/init.pid)/mountinfo")
	if !strings.Contains(strings.Fields(ro)[5], "ro") {
		t.Errorf("root filesystem of the plugin is not read-only: %s", ro)
	}
	t.Logf("plugin process: %s", strings.Join(regexp.MustCompile(`(?m)^(CapEff|CapBnd|NoNewPrivs|Seccomp):.*$`).FindAllString(status, -1), ", "))
}

// Scenario: the metrics endpoint of the plugin pod, scraped from the node,
// reports the devices and names p2, whose container env lists the devices
// it holds, as their holder (pod_device_assignment from the kubelet's
// PodResources API); /healthz and /readyz answer ok. Logs the plugin's
// memory and CPU use (what the DaemonSet's requests are based on).
func (c *cluster) scenarioMetrics(t *testing.T) {
	ids := c.devicesOf(t, "p2")
	text, p := c.metrics(t, pluginNS)
	res := `resource="` + resourceName + `"`
	if v := metricValue(text, "cdi_device_plugin_devices", res, `health="healthy"`); v != numDevices {
		t.Errorf("cdi_device_plugin_devices healthy = %v, want %d", v, numDevices)
	}
	if v := metricValue(text, "cdi_device_plugin_registrations_total", res, `result="ok"`); v < 1 {
		t.Errorf("registrations_total ok = %v, want >= 1", v)
	}
	var held []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "cdi_device_plugin_pod_device_assignment{") && strings.Contains(l, res) {
			held = append(held, l)
		}
	}
	for _, id := range ids {
		want := []string{`namespace="` + podNS + `"`, `pod="p2"`, `container="c"`, `device="` + id + `"`}
		if v := metricValue(text, "cdi_device_plugin_pod_device_assignment", append(want, res)...); v != 1 {
			t.Errorf("no pod_device_assignment naming p2 for %s (p2's env says it holds %v); series:\n%s", id, ids, strings.Join(held, "\n"))
		}
	}
	if len(held) != len(ids) {
		t.Errorf("pod_device_assignment series for %s: %d, want %d (p2's):\n%s", resourceName, len(held), len(ids), strings.Join(held, "\n"))
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if got := strings.TrimSpace(c.mustNodeSh(t, "curl -sS --max-time 5 http://"+p.Status.PodIP+":"+metricPort+path)); got != "ok" {
			t.Errorf("%s: %q, want ok", path, got)
		}
	}
	var ours []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "cdi_device_plugin_") && !strings.Contains(l, "_bucket{") {
			ours = append(ours, l)
		}
	}
	t.Logf("curl http://%s:%s/metrics | grep ^cdi_device_plugin_ | grep -v _bucket:\n%s", p.Status.PodIP, metricPort, strings.Join(ours, "\n"))
	rss := metricValue(text, "process_resident_memory_bytes")
	cpu := metricValue(text, "process_cpu_seconds_total")
	start := metricValue(text, "process_start_time_seconds")
	t.Logf("plugin pod %s: RSS %.1f MiB, CPU %.2f s over %.0f s of life (%.1f millicores on average), heap in use %.1f MiB",
		p.Name, rss/(1<<20), cpu, float64(time.Now().Unix())-start, 1000*cpu/(float64(time.Now().Unix())-start),
		metricValue(text, "go_memstats_heap_inuse_bytes")/(1<<20))
	// A burst of scrapes: the cost of PodResources reads at scrape time.
	c.mustNodeSh(t, "for i in $(seq 50); do curl -fsS -o /dev/null http://"+p.Status.PodIP+":"+metricPort+"/metrics; done")
	text2, _ := c.metrics(t, pluginNS)
	t.Logf("after 50 scrapes: RSS %.1f MiB, CPU %.2f s",
		metricValue(text2, "process_resident_memory_bytes")/(1<<20), metricValue(text2, "process_cpu_seconds_total"))
}

// Scenario (KEP-4680): a device that a running pod holds goes away on the
// host: the kubelet shows it Unhealthy in the pod's
// status.containerStatuses[].allocatedResourcesStatus; restored, Healthy.
// The pod keeps running throughout.
func (c *cluster) scenarioHealthInPodStatus(t *testing.T) {
	ids := c.devicesOf(t, "p2")
	cid, restarts := containerOf(t, c, "p2")
	victim := ids[0]
	health := func() (string, string) {
		p, err := c.getPod("p2")
		if err != nil {
			return "", err.Error()
		}
		var seen []string
		got := ""
		for i := range p.Status.ContainerStatuses {
			for _, rs := range p.Status.ContainerStatuses[i].AllocatedResourcesStatus {
				for _, r := range rs.Resources {
					seen = append(seen, fmt.Sprintf("%s/%s=%s", rs.Name, r.ResourceID, r.Health))
					if string(rs.Name) == resourceName && string(r.ResourceID) == victim {
						got = string(r.Health)
					}
				}
			}
		}
		return got, strings.Join(seen, " ")
	}
	d := eventually(t, time.Minute, "p2's allocatedResourcesStatus to list "+victim+" Healthy", func() (bool, string) {
		h, seen := health()
		return h == "Healthy", seen
	})
	t.Logf("before: %s Healthy in p2's status (%v)", victim, d.Round(time.Millisecond))
	c.mustNodeSh(t, "rm /dev/"+nodeOf(victim))
	var seen string
	d = eventually(t, time.Minute, victim+" Unhealthy in p2's status", func() (bool, string) {
		var h string
		h, seen = health()
		return h == "Unhealthy", seen
	})
	t.Logf("removed /dev/%s: p2's status says %s after %v", nodeOf(victim), seen, d.Round(time.Millisecond))
	c.mustNodeSh(t, "mknod -m 0666 /dev/"+nodeOf(victim)+" c 1 3")
	d = eventually(t, time.Minute, victim+" Healthy again in p2's status", func() (bool, string) {
		h, seen := health()
		return h == "Healthy", seen
	})
	t.Logf("restored: Healthy in p2's status after %v", d.Round(time.Millisecond))
	c.stillHasDevices(t, "p2", cid, restarts, ids)
}

// opsConfig is the live-reload deployment's configuration file.
func opsConfig(extra string) string {
	return "resources:\n  - name: " + opsResA + "\n    count: 2\n    idPrefix: e2e-opsa\n    envPrefix: OPSA\n" + extra
}

// setConfig writes body into the ConfigMap of the ops deployment and
// touches the plugin pod (an annotation), so that the kubelet refreshes the
// mounted ConfigMap now rather than at its next periodic sync.
func (c *cluster) setConfig(t *testing.T, body string) {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	l, err := c.cs.CoreV1().ConfigMaps(opsNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := range l.Items {
		cm := &l.Items[i]
		if !strings.HasPrefix(cm.Name, "cdi-device-plugin-config") {
			continue
		}
		cm.Data["config.yaml"] = body
		if _, err := c.cs.CoreV1().ConfigMaps(opsNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("%d plugin ConfigMaps in %s, want 1", n, opsNS)
	}
	p, err := c.pluginPod(ctx, opsNS)
	if err != nil {
		t.Fatal(err)
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{"e2e.cdi.dev/config-touched":"%d"}}}`, time.Now().UnixNano())
	if _, err := c.cs.CoreV1().Pods(opsNS).Patch(ctx, p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// Scenario: live reload. A config-file deployment serves opsa; pod r1
// holds one. Editing the ConfigMap to add opsb makes its capacity appear
// while r1 keeps running untouched (same container, no restart) and the
// plugin pod is the same, never restarted. Then a bad configuration changes
// nothing, and config_reloads_total{result="refused"} rises.
func (c *cluster) scenarioLiveReload(t *testing.T, node string) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(opsConfig("")), 0o644); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"NAMESPACE": opsNS, "PLUGIN_NAME": opsNS, "PLUGIN_CONFIG": cfg, "LOG_LEVEL": "debug"}
	c.deploy(t, "apply", vars)
	t.Cleanup(func() {
		c.deletePod(t, "r1")
		c.deploy(t, "delete", vars)
		_, _ = c.nodeSh("rm -rf /dev/e2e-opsa-* /dev/e2e-opsb-* /var/run/cdi/k8s.e2e.cdi.dev-ops*.json /var/lib/cdi-device-plugin/devices/e2e-ops*")
	})
	c.waitAllocatableOf(t, node, opsResA, 2, 2*time.Minute)
	plugin, err := c.pluginPod(context.Background(), opsNS)
	if err != nil {
		t.Fatal(err)
	}
	p := c.testPodOf("r1", opsResA, 1)
	c.createPod(t, p)
	c.waitRunning(t, "r1", 0, 2*time.Minute)
	cid, restarts := containerOf(t, c, "r1")
	held := c.devicesOfEnv(t, "r1", "OPSA")

	unchanged := func(step string) {
		t.Helper()
		if cid2, r2 := containerOf(t, c, "r1"); cid2 != cid || r2 != restarts {
			t.Errorf("%s: r1 container %s (restarts %d), was %s (%d)", step, cid2, r2, cid, restarts)
		}
		if got := c.devicesOfEnv(t, "r1", "OPSA"); !slices.Equal(got, held) {
			t.Errorf("%s: r1 devices %v, were %v", step, got, held)
		}
		if got := strings.TrimSpace(c.mustExec(t, "r1", "echo probe > /dev/"+strings.Replace(held[0], "-"+node, "", 1)+" && echo ok")); got != "ok" {
			t.Errorf("%s: r1's device no longer usable", step)
		}
		now, err := c.pluginPod(context.Background(), opsNS)
		if err != nil {
			t.Fatal(err)
		}
		if now.Name != plugin.Name || now.Status.ContainerStatuses[0].RestartCount != 0 {
			t.Errorf("%s: plugin pod %s (restarts %d), was %s: not a live reload", step, now.Name, now.Status.ContainerStatuses[0].RestartCount, plugin.Name)
		}
		if _, a, err := c.nodeResource(context.Background(), node, opsResA); err != nil || a != 2 {
			t.Errorf("%s: allocatable %s = %d (%v), want 2", step, opsResA, a, err)
		}
	}

	t0 := time.Now()
	c.setConfig(t, opsConfig("  - name: "+opsResB+"\n    count: 3\n    idPrefix: e2e-opsb\n    envPrefix: OPSB\n"))
	c.waitAllocatableOf(t, node, opsResB, 3, 2*time.Minute)
	t.Logf("ConfigMap edited: %s allocatable 3 after %v", opsResB, time.Since(t0).Round(time.Millisecond))
	unchanged("after adding " + opsResB)
	text, _ := c.metrics(t, opsNS)
	applied := metricValue(text, "cdi_device_plugin_config_reloads_total", `result="applied"`)
	refused := metricValue(text, "cdi_device_plugin_config_reloads_total", `result="refused"`)
	if applied < 1 {
		t.Errorf("config_reloads_total applied = %v after the reload, want >= 1", applied)
	}

	// A bad one: refused, nothing changes.
	c.setConfig(t, opsConfig("  - name: "+opsResB+"\n    count: 3\n    idPrefix: ../evil\n"))
	d := eventually(t, 2*time.Minute, "config_reloads_total{result=refused} to rise", func() (bool, string) {
		text, _ := c.metrics(t, opsNS)
		v := metricValue(text, "cdi_device_plugin_config_reloads_total", `result="refused"`)
		return v > max(refused, 0), fmt.Sprintf("refused %v (was %v)", v, refused)
	})
	t.Logf("bad ConfigMap: refusal counted after %v", d.Round(time.Millisecond))
	// Give a wrong apply the time to show.
	time.Sleep(3 * time.Second)
	unchanged("after the bad configuration")
	if _, a, err := c.nodeResource(context.Background(), node, opsResB); err != nil || a != 3 {
		t.Errorf("after the bad configuration: allocatable %s = %d (%v), want 3", opsResB, a, err)
	}
	// The plugin counts the refusal before it logs it: poll the log too.
	eventually(t, 30*time.Second, "the refusal naming ../evil in the plugin's log", func() (bool, string) {
		logs, err := c.logs(context.Background(), opsNS, plugin.Name, false)
		if err != nil {
			return false, err.Error()
		}
		m := missing(logs, []string{"configuration reload refused", "../evil"})
		return len(m) == 0, fmt.Sprintf("the log lacks %q", m)
	})
	// A new pod still gets the added resource.
	p = c.testPodOf("r2", opsResB, 2)
	c.createPod(t, p)
	c.waitRunning(t, "r2", 0, 2*time.Minute)
	if got := c.devicesOfEnv(t, "r2", "OPSB"); len(got) != 2 {
		t.Errorf("r2 got %v, want 2 %s devices", got, opsResB)
	}
	c.deletePod(t, "r2")
}

// Scenario: a rolling update of the DaemonSet as deploy/ configures it
// (maxUnavailable 1, maxSurge 0). The new plugin pod registers and is
// ready, and still is 10 s after the old one is gone (with maxSurge 1 the
// kubelet disconnected the new plugin when the old one exited, leaving the
// node without devices: see deploy/README.md); allocatable, polled every
// 100 ms, is back at numDevices; p2 keeps its container and devices; a new
// pod gets the other devices.
func (c *cluster) scenarioRollingUpdate(t *testing.T, node string) {
	ids := c.devicesOf(t, "p2")
	cid, restarts := containerOf(t, c, "p2")
	old, err := c.pluginPod(context.Background(), pluginNS)
	if err != nil {
		t.Fatal(err)
	}
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"e2e.cdi.dev/restarted-at":"%d"}}}}}`, time.Now().UnixNano())
	if _, err := c.cs.AppsV1().DaemonSets(pluginNS).Patch(context.Background(), "cdi-device-plugin", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	var dips []string
	sample := func() {
		if _, a, err := c.nodeResource(context.Background(), node, resourceName); err == nil && a != numDevices {
			dips = append(dips, fmt.Sprintf("%d at %v", a, time.Since(t0).Round(100*time.Millisecond)))
		}
	}
	var newPod string
	eventually(t, 3*time.Minute, "the new plugin pod ready and the old one gone", func() (bool, string) {
		sample()
		l, err := c.cs.CoreV1().Pods(pluginNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=cdi-device-plugin"})
		if err != nil {
			return false, err.Error()
		}
		var states []string
		oldThere := false
		newPod = ""
		for i := range l.Items {
			p := &l.Items[i]
			ready := len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready
			states = append(states, fmt.Sprintf("%s:%s ready=%v", p.Name, p.Status.Phase, ready))
			if p.Name == old.Name {
				oldThere = true
			} else if ready && p.DeletionTimestamp == nil {
				newPod = p.Name
			}
		}
		time.Sleep(100 * time.Millisecond)
		return !oldThere && newPod != "", strings.Join(states, " ")
	})
	rolled := time.Since(t0)
	c.waitAllocatable(t, node, numDevices, time.Minute)
	// Stays registered, with the kubelet's stream open, once alone.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		sample()
		p, err := c.cs.CoreV1().Pods(pluginNS).Get(context.Background(), newPod, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) != 1 || !p.Status.ContainerStatuses[0].Ready {
			t.Fatalf("new plugin pod %s no longer ready %v after the rollout began (%v)", newPod, time.Since(t0).Round(time.Millisecond), err)
		}
	}
	t.Logf("rolled %s -> %s in %v; allocatable below %d: %v", old.Name, newPod, rolled.Round(time.Millisecond), numDevices, dips)
	c.stillHasDevices(t, "p2", cid, restarts, ids)
	c.newPodGetsTheRest(t, "p11", ids)
}

// The Helm-installed deployment.
const (
	helmNS  = "cdi-e2e-helm"
	helmRes = "e2e.cdi.dev/helm"
)

func init() { suiteNamespaces = append(suiteNamespaces, helmNS) }

// helmCmd runs the pinned helm (HELM, set by make e2e) against the cluster.
func (c *cluster) helmCmd(t *testing.T, args ...string) string {
	t.Helper()
	h := os.Getenv("HELM")
	if h == "" {
		t.Fatal("HELM is not set (make e2e builds helm and sets it)")
	}
	cmd := exec.Command(h, append(args, "--kubeconfig", os.Getenv("KUBECONFIG"))...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Scenario: the plugin installed with the Helm chart (deploy/helm) serves
// its resource: capacity appears, a pod gets the device, the pod spec the
// chart runs is the unprivileged one, its readiness probe (/readyz) passes;
// helm uninstall removes it.
func (c *cluster) scenarioHelm(t *testing.T, node string) {
	repo, tag := c.pluginImage, "latest"
	if i := strings.LastIndexByte(repo, ':'); i > strings.LastIndexByte(repo, '/') {
		repo, tag = repo[:i], repo[i+1:]
	}
	out := c.helmCmd(t, "install", "cdp", filepath.Join(c.repo, "deploy", "helm", "cdi-device-plugin"),
		"--namespace", helmNS, "--create-namespace", "--wait", "--timeout", "2m",
		"--set", "image.repository="+repo, "--set", "image.tag="+tag,
		"--set", "env.PLUGIN_NAME="+helmNS, "--set", "env.RESOURCE_NAME="+helmRes, "--set-string", "env.NUMBER_DEVICES=2",
		"--set", "env.DEVICE_ID_PREFIX=e2e-helm", "--set", "env.ENV_PREFIX=HELM")
	t.Logf("helm install:\n%s", strings.TrimSpace(out))
	t.Cleanup(func() {
		c.helmCmd(t, "uninstall", "cdp", "--namespace", helmNS, "--wait")
		_, _ = c.nodeSh("rm -rf /dev/e2e-helm-* /var/run/cdi/k8s.e2e.cdi.dev-helm.json /var/lib/cdi-device-plugin/devices/e2e-helm-*")
	})
	c.waitAllocatableOf(t, node, helmRes, 2, 2*time.Minute)
	// helm --wait does not wait for readiness here: a DaemonSet of one node
	// with maxUnavailable 1 counts as ready with no pod ready. The kubelet
	// reports the pod's phase and readiness apart from the registration
	// that raises allocatable, so either may come first: wait for the
	// probe to pass, as an operator's kubectl rollout status does.
	var p *corev1.Pod
	eventually(t, time.Minute, "the helm-installed plugin pod running and ready", func() (bool, string) {
		var err error
		if p, err = c.pluginPod(context.Background(), helmNS); err != nil {
			return false, err.Error()
		}
		return podReady(p), fmt.Sprintf("pod %s: phase %s, not ready", p.Name, p.Status.Phase)
	})
	if sc := p.Spec.Containers[0].SecurityContext; sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.Capabilities == nil ||
		!slices.Equal(sc.Capabilities.Add, []corev1.Capability{"MKNOD"}) {
		t.Errorf("helm-installed plugin pod is not the unprivileged one: %+v", sc)
	}
	c.createPod(t, c.testPodOf("hm1", helmRes, 1))
	c.waitRunning(t, "hm1", 0, 2*time.Minute)
	if got := c.devicesOfEnv(t, "hm1", "HELM"); len(got) != 1 || !strings.HasPrefix(got[0], "e2e-helm-") {
		t.Errorf("hm1 got %v, want one e2e-helm device", got)
	}
	c.deletePod(t, "hm1")
}
