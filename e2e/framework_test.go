//go:build e2e

// Package e2e holds the end-to-end suite: it deploys the plugin's DaemonSet
// from deploy/ into the cluster that KUBECONFIG names and checks, through the
// API, from inside containers and on the node, that a real kubelet allocates
// the devices and a real containerd injects them through CDI.
//
// The suite is build-tagged: go test -tags e2e ./e2e/. The cluster comes from
// `make e2e` (a local node of real components, e2e/local/cluster.sh) or
// `make e2e-kind` (e2e/kind/run.sh). Both pass:
//
//	KUBECONFIG           the cluster (required)
//	KUBECTL              kubectl, for deploy/deploy.sh (default kubectl)
//	E2E_PLUGIN_IMAGE     plugin image present on the node (required)
//	E2E_TEST_IMAGE       a busybox image present on the node (required)
//	E2E_NODE_SHELL       command words that run "sh -c SCRIPT" on the node;
//	                     empty: the node is this machine
//	E2E_RESTART_KUBELET  a shell command that restarts the node's kubelet (required)
//	E2E_RUNTIME_STATE    containerd's state directory on the node, where the
//	                     OCI bundles of running containers live (required)
//	E2E_PLUGIN_HOST      a shell command that runs the plugin on the node as a
//	                     host process: "... start VAR=VALUE..." and "... stop"
//	                     (optional: without it and E2E_REBOOT the reboot
//	                     scenario is skipped)
//	E2E_REBOOT           a shell command that simulates a node reboot and
//	                     starts the host plugin, containerd and the kubelet
//	                     again, in that order (optional)
//	E2E_PLUGIN_IMAGE_NEXT another tag of the plugin image, present on the node,
//	                     that the upgrade scenario rolls the DaemonSet to
//	                     (optional: without it that scenario is skipped)
//	E2E_API_SERVER_HOST, E2E_API_SERVER_PORT
//	                     where pods reach the API server when the kubernetes
//	                     Service does not route (the local node: no
//	                     kube-proxy); passed to the DRA driver (optional)
//	E2E_M2               1: run scenario M2 (TestM2), which needs two
//	                     schedulable nodes (e2e/kind/run.sh sets it for its
//	                     second cluster); otherwise it is skipped
//	E2E_NODE_ROOT        the node's root directory as this machine sees it
//	                     ("/" for the local node, /proc/PID/root of a kind
//	                     node's container), where the real-hardware scenario
//	                     reads the kubelet's PodResources (optional: without
//	                     it the devices' topology is not checked)
//	E2E_ARTIFACTS        where logs and objects are saved when a test fails
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
)

// The deployment under test.
const (
	pluginNS     = "cdi-e2e"
	podNS        = "cdi-e2e-pods"
	resourceName = "e2e.cdi.dev/sim"
	numDevices   = 4
	idPrefix     = "e2e-sim"
	envPrefix    = "SIM"
	annotPrefix  = "e2e.cdi.dev/sim"
	specFile     = "/var/run/cdi/k8s.e2e.cdi.dev-sim.json"
	stateRoot    = "/run/cdi-device-plugin"
	registeredAt = "registered with the kubelet"
	badNS        = "cdi-e2e-bad" // scenario 8's deployment

	// The resource of the fixed configuration in scenario 8.
	cfgResource  = "e2e.cdi.dev/cfg"
	cfgMountHost = "/var/lib/cdi-e2e-cfg"
)

// suiteNamespaces are every namespace the suite creates.
var suiteNamespaces = []string{podNS, pluginNS, badNS}

type cluster struct {
	cs             *kubernetes.Clientset
	cfg            *rest.Config
	kubectl        string
	pluginImage    string
	testImage      string
	nodeShell      []string
	restartKubelet string
	runtimeState   string
	pluginHost     string
	reboot         string
	artifacts      string
	repo           string
	refused        refusedStarts
}

func mustEnv(t *testing.T, k string) string {
	t.Helper()
	v := os.Getenv(k)
	if v == "" {
		t.Fatalf("%s is not set (see the package documentation of e2e/)", k)
	}
	return v
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", mustEnv(t, "KUBECONFIG"))
	if err != nil {
		t.Fatalf("KUBECONFIG: %v", err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{
		cs: cs, cfg: cfg, repo: repo,
		kubectl:        os.Getenv("KUBECTL"),
		pluginImage:    mustEnv(t, "E2E_PLUGIN_IMAGE"),
		testImage:      mustEnv(t, "E2E_TEST_IMAGE"),
		nodeShell:      strings.Fields(os.Getenv("E2E_NODE_SHELL")),
		restartKubelet: mustEnv(t, "E2E_RESTART_KUBELET"),
		runtimeState:   mustEnv(t, "E2E_RUNTIME_STATE"),
		pluginHost:     os.Getenv("E2E_PLUGIN_HOST"),
		reboot:         os.Getenv("E2E_REBOOT"),
		artifacts:      os.Getenv("E2E_ARTIFACTS"),
	}
	if c.kubectl == "" {
		c.kubectl = "kubectl"
	}
	if c.artifacts == "" {
		c.artifacts = filepath.Join(repo, "_artifacts", "e2e")
	}
	return c
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// nodeSh runs script with sh -c on the node and returns its combined output.
func (c *cluster) nodeSh(script string) (string, error) {
	return shell(c.nodeShell, script)
}

// hostSh runs a command with sh -c on the machine that runs the suite (the
// kubelet restart hook is such a command; it may reach into the node itself).
func hostSh(cmd string) (string, error) { return shell(nil, cmd) }

func shell(prefix []string, script string) (string, error) {
	args := append(append([]string{}, prefix...), "sh", "-c", script)
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%v sh -c %q: %w: %s", prefix, script, err, out)
	}
	return string(out), nil
}

func (c *cluster) mustNodeSh(t *testing.T, script string) string {
	t.Helper()
	out, err := c.nodeSh(script)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// deploy runs deploy/deploy.sh CMD with the settings in vars.
func (c *cluster) deploy(t *testing.T, cmd string, vars map[string]string) {
	t.Helper()
	out, err := c.deployOut(cmd, vars)
	if err != nil {
		t.Fatalf("deploy.sh %s: %v\n%s", cmd, err, out)
	}
	t.Logf("deploy.sh %s:\n%s", cmd, strings.TrimSpace(out))
}

// deployOut runs deploy/deploy.sh CMD with the settings in vars and
// returns its output.
func (c *cluster) deployOut(cmd string, vars map[string]string) (string, error) {
	sh := exec.Command(filepath.Join(c.repo, "deploy", "deploy.sh"), cmd)
	sh.Env = append(os.Environ(), "KUBECTL="+c.kubectl, "IMAGE="+c.pluginImage)
	for k, v := range vars {
		sh.Env = append(sh.Env, k+"="+v)
	}
	out, err := sh.CombinedOutput()
	return string(out), err
}

// eventually polls f every 250ms until it returns true or timeout passes; it
// returns the time it took. The last error or state goes into the failure.
func eventually(t *testing.T, timeout time.Duration, what string, f func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	last := ""
	for time.Since(start) < timeout {
		ok, state := f()
		if ok {
			return time.Since(start)
		}
		last = state
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s; last: %s", timeout, what, last)
	return 0
}

// staysUnscheduled checks for d that the pod is neither bound to a node
// nor out of phase Pending.
func (c *cluster) staysUnscheduled(t *testing.T, name string, d time.Duration, why string) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < d {
		if p, err := c.getPod(name); err == nil && (p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending) {
			t.Fatalf("%s scheduled %s after %v: node %q, phase %s", name, why, time.Since(start).Round(time.Millisecond), p.Spec.NodeName, p.Status.Phase)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// nodeResource returns the capacity and allocatable of the resource on node.
func (c *cluster) nodeResource(ctx context.Context, node, res string) (capacity, allocatable int64, err error) {
	n, err := c.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return 0, 0, err
	}
	q := n.Status.Capacity[corev1.ResourceName(res)]
	a := n.Status.Allocatable[corev1.ResourceName(res)]
	return q.Value(), a.Value(), nil
}

func (c *cluster) waitAllocatable(t *testing.T, node string, want int64, timeout time.Duration) time.Duration {
	t.Helper()
	return c.waitAllocatableOf(t, node, resourceName, want, timeout)
}

func (c *cluster) waitAllocatableOf(t *testing.T, node, res string, want int64, timeout time.Duration) time.Duration {
	t.Helper()
	return eventually(t, timeout, fmt.Sprintf("allocatable %s = %d on %s", res, want, node), func() (bool, string) {
		_, a, err := c.nodeResource(context.Background(), node, res)
		if err != nil {
			return false, err.Error()
		}
		return a == want, fmt.Sprintf("allocatable %d", a)
	})
}

// pluginPod returns the running plugin pod of namespace ns.
func (c *cluster) pluginPod(ctx context.Context, ns string) (*corev1.Pod, error) {
	return c.runningPod(ctx, ns, "cdi-device-plugin")
}

// runningPod returns the running pod of namespace ns labelled
// app.kubernetes.io/name=app (cdi-device-plugin, cdi-dra-driver).
func (c *cluster) runningPod(ctx context.Context, ns, app string) (*corev1.Pod, error) {
	l, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + app})
	if err != nil {
		return nil, err
	}
	for i := range l.Items {
		p := &l.Items[i]
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no running %s pod in %s (%d pods)", app, ns, len(l.Items))
}

func (c *cluster) logs(ctx context.Context, ns, pod string, previous bool) (string, error) {
	b, err := c.cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Previous: previous}).DoRaw(ctx)
	return string(b), err
}

// missing returns the strings of want that s lacks.
func missing(s string, want []string) []string {
	var out []string
	for _, w := range want {
		if !strings.Contains(s, w) {
			out = append(out, w)
		}
	}
	return out
}

// endedLog waits until the container of a pod in namespace ns has exited
// with status code and returns the log of a container that ended, once it
// holds every string of want. Status and log are read in the same poll, and
// the log is retried while it lacks a line: with restartPolicy Always the
// kubelet starts the next container while the API may still show the one
// that ended as the current one (the kubelet's view runs ahead of the
// status it reports), so the current container's log can be the new one's,
// empty. When the restart count moved on between the status read and the
// log read, the container that ended is the previous one.
func (c *cluster) endedLog(t *testing.T, ns string, code int32, want []string, timeout time.Duration) string {
	t.Helper()
	ctx := context.Background()
	first := func() (string, corev1.ContainerStatus, error) {
		l, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", corev1.ContainerStatus{}, err
		}
		if len(l.Items) == 0 {
			return "", corev1.ContainerStatus{}, fmt.Errorf("no pod in %s yet", ns)
		}
		p := &l.Items[0]
		if len(p.Status.ContainerStatuses) == 0 {
			return p.Name, corev1.ContainerStatus{}, fmt.Errorf("pod %s: no container status", p.Name)
		}
		return p.Name, p.Status.ContainerStatuses[0], nil
	}
	var out string
	eventually(t, timeout, fmt.Sprintf("a container in %s to exit with status %d and log %q", ns, code, want), func() (bool, string) {
		pod, s, err := first()
		if err != nil {
			return false, err.Error()
		}
		term, prev := s.State.Terminated, false
		if term == nil {
			term, prev = s.LastTerminationState.Terminated, true
		}
		if term == nil {
			return false, fmt.Sprintf("pod %s: state %+v, restarts %d", pod, s.State, s.RestartCount)
		}
		if term.ExitCode != code {
			return false, fmt.Sprintf("pod %s: exit code %d, restarts %d", pod, term.ExitCode, s.RestartCount)
		}
		log, err := c.logs(ctx, ns, pod, prev)
		if !prev && (err != nil || len(missing(log, want)) > 0) {
			// The container that ended may be the previous one by now.
			if pod2, s2, err2 := first(); err2 == nil && pod2 == pod && s2.RestartCount > s.RestartCount {
				prev = true
				log, err = c.logs(ctx, ns, pod, true)
			}
		}
		if err != nil {
			return false, fmt.Sprintf("pod %s: logs (previous=%v): %v", pod, prev, err)
		}
		if m := missing(log, want); len(m) > 0 {
			return false, fmt.Sprintf("pod %s, restarts %d: the log (previous=%v) lacks %q: %q", pod, s.RestartCount, prev, m, log)
		}
		out = log
		return true, ""
	})
	return out
}

// testPod is a busybox pod asking for n devices. Its container records the
// device state it saw at start in /tmp/state-at-start and runs until
// /tmp/exit exists, then exits 1 (so that a restart can be triggered from
// exec without signals).
func (c *cluster) testPod(name string, n int) *corev1.Pod {
	return c.testPodOf(name, resourceName, n)
}

// testPodOf is testPod asking for n devices of resource res.
func (c *cluster) testPodOf(name, res string, n int) *corev1.Pod {
	script := `mkdir -p /tmp
for d in ` + stateRoot + `/*/; do cat "$d/state.json" 2>/dev/null; echo; done > /tmp/state-at-start
while [ ! -e /tmp/exit ]; do sleep 0.2; done
exit 1`
	var grace int64 = 1
	no := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNS, Labels: map[string]string{"app": "cdi-e2e"}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &no,
			RestartPolicy:                 corev1.RestartPolicyAlways,
			Containers: []corev1.Container{{
				Name:            "c",
				Image:           c.testImage,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{"sh", "-c", script},
				Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{corev1.ResourceName(res): *resource.NewQuantity(int64(n), resource.DecimalSI)},
				},
			}},
		},
	}
}

func (c *cluster) createPod(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, err := c.cs.CoreV1().Pods(p.Namespace).Create(ctxT(t, 30*time.Second), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
}

func (c *cluster) getPod(name string) (*corev1.Pod, error) {
	return c.cs.CoreV1().Pods(podNS).Get(context.Background(), name, metav1.GetOptions{})
}

// waitRunning waits until the pod's container runs (and, if restarts >= 0,
// has restarted exactly that often).
func (c *cluster) waitRunning(t *testing.T, name string, restarts int32, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, timeout, "pod "+name+" running", func() (bool, string) {
		p, err := c.getPod(name)
		if err != nil {
			return false, err.Error()
		}
		pod = p
		if len(p.Status.ContainerStatuses) == 1 {
			s := p.Status.ContainerStatuses[0]
			if s.State.Running != nil && s.Ready && (restarts < 0 || s.RestartCount == restarts) {
				return true, ""
			}
			if s.State.Running != nil && s.Ready && restarts >= 0 && s.RestartCount > restarts &&
				c.refused.excuse(t, c, p, s.RestartCount-restarts) {
				return true, ""
			}
			return false, fmt.Sprintf("phase %s, state %+v, restarts %d", p.Status.Phase, s.State, s.RestartCount)
		}
		return false, fmt.Sprintf("phase %s, conditions %+v", p.Status.Phase, p.Status.Conditions)
	})
	return pod
}

func (c *cluster) deletePod(t *testing.T, name string) {
	t.Helper()
	err := c.cs.CoreV1().Pods(podNS).Delete(context.Background(), name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete pod %s: %v", name, err)
	}
	eventually(t, 90*time.Second, "pod "+name+" gone", func() (bool, string) {
		_, err := c.getPod(name)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// exec runs cmd in the pod's container c and returns stdout; a non-zero
// exit is an error that carries stderr.
func (c *cluster) exec(name string, cmd ...string) (string, error) {
	return c.execIn(name, "c", cmd...)
}

// execIn runs cmd in the pod's container ct.
func (c *cluster) execIn(name, ct string, cmd ...string) (string, error) {
	req := c.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(podNS).Name(name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: ct, Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(c.cfg, "POST", req.URL())
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		return stdout.String(), fmt.Errorf("exec %q in %s/%s: %w: %s", cmd, name, ct, err, stderr.String())
	}
	return stdout.String(), nil
}

func (c *cluster) mustExec(t *testing.T, name, script string) string {
	t.Helper()
	out, err := c.exec(name, "sh", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// nodeOf returns the device node name (below /dev) of a device ID: IDs are
// <DEVICE_ID_PREFIX>-<node>-<i>, nodes <DEVICE_FILE_PREFIX>-<i>.
func nodeOf(id string) string { return idPrefix + "-" + indexOf(id) }

// indexOf returns the <i> of a device ID.
func indexOf(id string) string { return id[strings.LastIndexByte(id, '-')+1:] }

// cdiSpec is the part of the resource's CDI spec the suite reads.
type cdiSpec struct {
	Kind    string `json:"kind"`
	Devices []struct {
		Name  string `json:"name"`
		Edits struct {
			DeviceNodes []struct {
				Path string `json:"path"`
			} `json:"deviceNodes"`
		} `json:"containerEdits"`
	} `json:"devices"`
}

// readSpec reads the resource's CDI spec on the node.
func (c *cluster) readSpec(t *testing.T) cdiSpec {
	t.Helper()
	var spec cdiSpec
	if err := json.Unmarshal([]byte(c.mustNodeSh(t, "cat "+specFile)), &spec); err != nil {
		t.Fatalf("%s: %v", specFile, err)
	}
	return spec
}

// specDevices returns the device names (= IDs) in the resource's CDI spec.
func (c *cluster) specDevices(t *testing.T) []string {
	t.Helper()
	var ids []string
	for _, d := range c.readSpec(t).Devices {
		ids = append(ids, d.Name)
	}
	if len(ids) != numDevices {
		t.Fatalf("devices in %s: %v, want %d", specFile, ids, numDevices)
	}
	sort.Strings(ids)
	return ids
}

// devicesOf returns the device IDs the pod got, from <ENV_PREFIX>_DEVICES
// inside the container, sorted.
func (c *cluster) devicesOf(t *testing.T, name string) []string {
	t.Helper()
	return c.devicesOfEnv(t, name, envPrefix)
}

// devicesOfEnv is devicesOf for a resource with another env prefix.
func (c *cluster) devicesOfEnv(t *testing.T, name, prefix string) []string {
	t.Helper()
	out := strings.TrimSpace(c.mustExec(t, name, "echo $"+prefix+"_DEVICES"))
	if out == "" {
		t.Fatalf("pod %s: %s_DEVICES is empty", name, prefix)
	}
	ids := strings.Split(out, ",")
	sort.Strings(ids)
	return ids
}

// deviceState is the part of <state-dir>/devices/<id>/state.json the suite reads.
type deviceState struct {
	Device     string    `json:"device"`
	Resource   string    `json:"resource"`
	Generation int64     `json:"generation"`
	ResetCount int64     `json:"resetCount"`
	PreparedAt time.Time `json:"preparedAt"`
	Firmware   *struct {
		SHA256 string `json:"sha256"`
	} `json:"firmware"`
}

// parseStates decodes a stream of state.json documents, keyed by device.
func parseStates(t *testing.T, s string) map[string]deviceState {
	t.Helper()
	out := map[string]deviceState{}
	dec := json.NewDecoder(strings.NewReader(s))
	for dec.More() {
		var st deviceState
		if err := dec.Decode(&st); err != nil {
			t.Fatalf("device state: %v in %q", err, s)
		}
		out[st.Device] = st
	}
	return out
}

// saveArtifacts writes what helps to read a failure: the plugin's logs,
// the pods and events of the suite's namespaces, the node.
func (c *cluster) saveArtifacts(t *testing.T, namespaces ...string) {
	dir := filepath.Join(c.artifacts, time.Now().Format("20060102-150405"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("artifacts: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	write := func(name string, v any) {
		var b []byte
		if s, ok := v.(string); ok {
			b = []byte(s)
		} else {
			b, _ = json.MarshalIndent(v, "", "  ")
		}
		_ = os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	if nodes, err := c.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
		write("nodes.json", nodes)
	}
	for _, ns := range namespaces {
		pods, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		write(ns+"-pods.json", pods)
		if ev, err := c.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil {
			write(ns+"-events.json", ev)
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			for _, prev := range []bool{false, true} {
				if l, err := c.logs(ctx, ns, p.Name, prev); err == nil && l != "" {
					write(fmt.Sprintf("%s-%s-previous=%v.log", ns, p.Name, prev), l)
				}
			}
		}
	}
	if out, err := c.nodeSh("ls -la /var/run/cdi /etc/cdi /dev 2>&1; cat /var/run/cdi/*.json 2>&1"); err == nil {
		write("node-cdi-dev.txt", out)
	}
	t.Logf("artifacts saved in %s", dir)
}

// recap logs, as the last lines of a failed test, what its reader needs
// first: the pods of the suite's namespaces that are not running and ready
// (node, phase, reason, what their containers wait for) and the Warning
// events since since. The failure's own message comes before the logs a
// failure dumps; CI shows only the output's tail.
func (c *cluster) recap(t *testing.T, since time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var lines []string
	for _, ns := range suiteNamespaces {
		if pods, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
			for i := range pods.Items {
				if s := podRecap(&pods.Items[i]); s != "" {
					lines = append(lines, "pod "+ns+"/"+s)
				}
			}
		}
		ev, err := c.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "type=" + corev1.EventTypeWarning})
		if err != nil {
			continue
		}
		for i := range ev.Items {
			e := &ev.Items[i]
			at := e.LastTimestamp.Time
			if at.IsZero() {
				at = e.EventTime.Time
			}
			if at.IsZero() {
				at = e.CreationTimestamp.Time
			}
			if at.Before(since.Add(-time.Second)) {
				continue
			}
			lines = append(lines, fmt.Sprintf("event %s %s/%s/%s: %s (x%d): %s", at.UTC().Format("15:04:05"), ns, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, max(e.Count, 1), e.Message))
		}
	}
	if len(lines) == 0 {
		lines = []string{"every pod running and ready, no Warning event"}
	}
	t.Logf("recap at the failure (since %s):\n%s", since.UTC().Format("15:04:05"), strings.Join(lines, "\n"))
}

// podReady reports whether the pod's Ready condition is true.
func podReady(p *corev1.Pod) bool {
	for _, cd := range p.Status.Conditions {
		if cd.Type == corev1.PodReady {
			return cd.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podRecap is "name on node: phase ..." for a pod that is not running
// and ready, "" for one that is.
func podRecap(p *corev1.Pod) string {
	if p.Status.Phase == corev1.PodRunning && podReady(p) && p.DeletionTimestamp == nil {
		return ""
	}
	s := fmt.Sprintf("%s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
	if p.DeletionTimestamp != nil {
		s += " (being deleted)"
	}
	if p.Status.Reason != "" || p.Status.Message != "" {
		s += fmt.Sprintf(", %s: %s", p.Status.Reason, p.Status.Message)
	}
	for _, cd := range p.Status.Conditions {
		if cd.Status != corev1.ConditionTrue && (cd.Reason != "" || cd.Message != "") {
			s += fmt.Sprintf(", %s %s: %s", cd.Type, cd.Reason, cd.Message)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			s += fmt.Sprintf(", container %s waiting: %s %s", cs.Name, w.Reason, w.Message)
		}
		if x := cs.State.Terminated; x != nil {
			s += fmt.Sprintf(", container %s terminated: %s (exit %d) %s", cs.Name, x.Reason, x.ExitCode, x.Message)
		}
	}
	return s
}

// localNodeOnly skips a scenario on clusters other than the local node
// (e2e/local: the suite runs on the node itself, E2E_NODE_SHELL empty).
// The fault and prepare-before-bind scenarios have been run there only;
// on kind they would reach the node through the engine's exec, a path
// they have not been proven on yet.
func (c *cluster) localNodeOnly(t *testing.T) {
	t.Helper()
	if len(c.nodeShell) > 0 {
		t.Skipf("runs on the local node only (make e2e, make e2e-next); E2E_NODE_SHELL is %q", strings.Join(c.nodeShell, " "))
	}
}
