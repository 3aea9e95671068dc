//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// allocSample is the node's allocatable of the resource at a time.
type allocSample struct {
	at    time.Duration
	value int64
}

// allocWatch polls the node's allocatable of a resource every 100 ms
// (what the scheduler sees; the kubelet reports it at most every
// nodeStatusUpdateFrequency, 4 s on the local node, and at once on a change).
type allocWatch struct {
	t0      time.Time
	mu      sync.Mutex
	samples []allocSample
	stop    context.CancelFunc
	done    chan struct{}
}

func (c *cluster) watchAllocatable(node, res string) *allocWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &allocWatch{t0: time.Now(), stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, a, err := c.nodeResource(ctx, node, res); err == nil {
				w.mu.Lock()
				w.samples = append(w.samples, allocSample{time.Since(w.t0), a})
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// zeroDips stops the watch and returns the stretches during which the
// allocatable was 0: from the first sample at 0 to the first one above
// again (or the last sample).
func (w *allocWatch) zeroDips() (dips []time.Duration, samples int) {
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	var from time.Duration = -1
	for _, s := range w.samples {
		switch {
		case s.value == 0 && from < 0:
			from = s.at
		case s.value > 0 && from >= 0:
			dips = append(dips, s.at-from)
			from = -1
		}
	}
	if from >= 0 {
		dips = append(dips, w.samples[len(w.samples)-1].at-from)
	}
	return dips, len(w.samples)
}

// logTimes reads the log of a plugin pod, following it until it ends (or
// ctx is done) when follow is set, and delivers the time of the first line containing each marker
// (logrus' time="..." field); a marker never logged is absent.
func (c *cluster) logTimes(ctx context.Context, pod string, follow bool, markers ...string) <-chan map[string]time.Time {
	out := make(chan map[string]time.Time, 1)
	go func() {
		got := map[string]time.Time{}
		defer func() { out <- got }()
		r, err := c.cs.CoreV1().Pods(pluginNS).GetLogs(pod, &corev1.PodLogOptions{Follow: follow}).Stream(ctx)
		if err != nil {
			return
		}
		defer func() { _ = r.Close() }()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			for _, m := range markers {
				if _, seen := got[m]; seen || !strings.Contains(line, m) {
					continue
				}
				if i := strings.Index(line, `time="`); i >= 0 {
					if j := strings.IndexByte(line[i+6:], '"'); j > 0 {
						if ts, err := time.Parse(time.RFC3339Nano, line[i+6:i+6+j]); err == nil {
							got[m] = ts
						}
					}
				}
			}
		}
	}()
	return out
}

// Scenario 11 (plugin upgrade): the DaemonSet is rolled to
// another tag of the plugin image while pod u1 holds 2 devices and
// Deployment u2, asking for 1, is created during the rollout. u1 keeps its
// container and its devices (no admission error), u2's pod runs with a
// device u1 does not hold (a pod of it admitted in the kubelet's window
// without a healthy device is rejected and replaced, as any pod would be), the new plugin pod
// registers, and the node's allocatable is 0 at most once, for no longer
// than the plugin's restart (rollout start to the new pod's registration)
// plus one node status report. The window in which the kubelet itself has
// no healthy device of the resource (the old plugin's shutdown to the new
// one's registration, from their logs) is logged: the API's allocatable,
// reported every few seconds, can miss it.
func (c *cluster) scenarioUpgrade(t *testing.T, node string) {
	next := os.Getenv("E2E_PLUGIN_IMAGE_NEXT")
	if next == "" {
		t.Skip("E2E_PLUGIN_IMAGE_NEXT is not set: no second tag of the plugin image on this cluster")
	}
	statusReport := c.statusUpdateFrequency(t, node)
	t.Logf("the kubelet reports the node's status every %v", statusReport)
	c.waitAllocatable(t, node, numDevices, time.Minute)
	c.createPod(t, c.testPod("u1", 2))
	c.waitRunning(t, "u1", 0, 2*time.Minute)
	held := c.devicesOf(t, "u1")
	cid, restarts := containerOf(t, c, "u1")
	old, _, err := c.registrations()
	if err != nil {
		t.Fatal(err)
	}

	// The old plugin's shutdown, from its own log: from then until the new
	// one registers, the kubelet holds the resource's devices unhealthy
	// (its device manager marks them so when a plugin disconnects).
	logCtx, stopLogs := context.WithTimeout(context.Background(), 3*time.Minute)
	defer stopLogs()
	oldLog := c.logTimes(logCtx, old, true, "shut down cleanly")
	w := c.watchAllocatable(node, resourceName)
	time.Sleep(time.Second) // a baseline
	ctx := context.Background()
	dsc := c.cs.AppsV1().DaemonSets(pluginNS)
	ds, err := dsc.Get(ctx, "cdi-device-plugin", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	from := ds.Spec.Template.Spec.Containers[0].Image
	ds.Spec.Template.Spec.Containers[0].Image = next
	t0 := time.Now()
	if _, err := dsc.Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("roll the DaemonSet to %s: %v", next, err)
	}
	// u2 is a Deployment's pod: with maxSurge 0 there is a window (logged
	// below) in which the kubelet has no healthy device of the resource
	// and rejects a pod it admits then, as it would any pod; the
	// ReplicaSet makes another, which must run.
	c.createDeployment(t, "u2", c.testPod("u2", 1))

	var newPod string
	eventually(t, 3*time.Minute, "the new plugin pod registered", func() (bool, string) {
		name, n, err := c.registrations()
		if err != nil || name == old || n == 0 {
			return false, fmt.Sprintf("pod %s, %d registrations (%v)", name, n, err)
		}
		p, err := c.cs.CoreV1().Pods(pluginNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil || p.Spec.Containers[0].Image != next {
			return false, fmt.Sprintf("pod %s not of image %s (%v)", name, next, err)
		}
		newPod = name
		return true, ""
	})
	restart := time.Since(t0)
	t.Logf("rolled %s -> %s: new plugin pod %s registered %v after the update", from, next, newPod, restart.Round(time.Millisecond))
	newLog := <-c.logTimes(logCtx, newPod, false, registeredAt)
	oldTimes := <-oldLog
	down, up := oldTimes["shut down cleanly"], newLog[registeredAt]
	switch {
	case down.IsZero() || up.IsZero():
		t.Errorf("plugin logs: old pod %s shut down at %v, new pod %s registered at %v", old, down, newPod, up)
	case up.Before(down):
		t.Logf("the new plugin registered %v before the old one shut down", down.Sub(up).Round(time.Millisecond))
	default:
		gap := up.Sub(down)
		t.Logf("no plugin registered for %v (old plugin's shutdown to the new one's registration, from their logs)", gap.Round(time.Millisecond))
		if gap > restart {
			t.Errorf("gap %v longer than the whole restart %v", gap, restart)
		}
	}
	eventually(t, 2*time.Minute, "the rollout done", func() (bool, string) {
		d, err := dsc.Get(ctx, "cdi-device-plugin", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		s := d.Status
		return s.ObservedGeneration >= d.Generation && s.UpdatedNumberScheduled == s.DesiredNumberScheduled && s.NumberAvailable == s.DesiredNumberScheduled,
			fmt.Sprintf("%+v", s)
	})

	u2 := c.deploymentPod(t, "u2", "")
	t.Logf("u2 (%s), created with the update, seen running %v after it (checked after the rollout)", u2, time.Since(t0).Round(100*time.Millisecond))
	got := c.devicesOf(t, u2)
	if len(got) != 1 || !disjoint(got, held) {
		t.Errorf("u2 got %v while u1 holds %v", got, held)
	}
	c.stillUsable(t, u2, got)
	c.stillHasDevices(t, "u1", cid, restarts, held)
	if now := c.devicesOf(t, "u1"); !slices.Equal(now, held) {
		t.Errorf("u1 devices %v after the upgrade, were %v", now, held)
	}
	if errs := c.admissionErrors("u1"); len(errs) > 0 {
		t.Errorf("u1: %v", errs)
	}
	if rejected := c.rejectedPods("u2"); len(rejected) > 0 {
		t.Logf("u2: %d pod(s) admitted in the window and rejected, then replaced: %v", len(rejected), rejected)
	}

	c.waitAllocatable(t, node, numDevices, time.Minute)
	time.Sleep(statusReport + time.Second) // a report after the rollout
	dips, n := w.zeroDips()
	t.Logf("allocatable %s during the upgrade (%d samples, 100 ms apart): %d stretch(es) at 0: %v", resourceName, n, len(dips), dips)
	if len(dips) > 1 {
		t.Errorf("allocatable went to 0 %d times during one upgrade: %v", len(dips), dips)
	}
	for _, d := range dips {
		if d > restart+statusReport+time.Second {
			t.Errorf("allocatable at 0 for %v, longer than the plugin's restart (%v) and a status report (%v)", d, restart.Round(time.Millisecond), statusReport)
		}
	}
	c.deletePod(t, "u1")
	if err := c.cs.AppsV1().Deployments(podNS).Delete(ctx, "u2", metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete deployment u2: %v", err)
	}
}

// rejectedPods are the pods of deployment app that the kubelet rejected at
// admission (UnexpectedAdmissionError), with the message.
func (c *cluster) rejectedPods(app string) []string {
	l, err := c.cs.CoreV1().Pods(podNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for i := range l.Items {
		if p := &l.Items[i]; p.Status.Reason == "UnexpectedAdmissionError" {
			out = append(out, p.Name+": "+p.Status.Message)
		}
	}
	return out
}

// kubeletDefaultStatusUpdate is the kubelet's default
// nodeStatusUpdateFrequency.
const kubeletDefaultStatusUpdate = 10 * time.Second

// statusUpdateFrequency is how often the node's kubelet reports its status
// (allocatable with it): its nodeStatusUpdateFrequency, read from its
// configz through the API server's node proxy (the local node sets 4 s,
// kind's kubelet keeps the default 10 s); the default when configz does
// not answer.
func (c *cluster) statusUpdateFrequency(t *testing.T, node string) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := c.cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node, "proxy", "configz").DoRaw(ctx)
	if err == nil {
		var d time.Duration
		if d, err = parseStatusUpdateFrequency(raw); err == nil {
			return d
		}
	}
	t.Logf("the kubelet's configz: %v; taking its default nodeStatusUpdateFrequency, %v", err, kubeletDefaultStatusUpdate)
	return kubeletDefaultStatusUpdate
}

// parseStatusUpdateFrequency reads nodeStatusUpdateFrequency from a
// kubelet's configz answer; unset, it is the kubelet's default.
func parseStatusUpdateFrequency(raw []byte) (time.Duration, error) {
	var z struct {
		KubeletConfig *struct {
			NodeStatusUpdateFrequency string `json:"nodeStatusUpdateFrequency"`
		} `json:"kubeletconfig"`
	}
	if err := json.Unmarshal(raw, &z); err != nil {
		return 0, fmt.Errorf("configz: %w", err)
	}
	if z.KubeletConfig == nil {
		return 0, errors.New("configz: no kubeletconfig")
	}
	if z.KubeletConfig.NodeStatusUpdateFrequency == "" {
		return kubeletDefaultStatusUpdate, nil
	}
	d, err := time.ParseDuration(z.KubeletConfig.NodeStatusUpdateFrequency)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("configz: nodeStatusUpdateFrequency %q: not a positive duration", z.KubeletConfig.NodeStatusUpdateFrequency)
	}
	return d, nil
}

func TestParseStatusUpdateFrequency(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		want      time.Duration
		err       bool
	}{
		{"the local node", `{"kubeletconfig":{"nodeStatusUpdateFrequency":"4s","syncFrequency":"1m0s"}}`, 4 * time.Second, false},
		{"kind: the default", `{"kubeletconfig":{"nodeStatusUpdateFrequency":"10s"}}`, 10 * time.Second, false},
		{"unset", `{"kubeletconfig":{}}`, kubeletDefaultStatusUpdate, false},
		{"no kubeletconfig", `{}`, 0, true},
		{"odd value", `{"kubeletconfig":{"nodeStatusUpdateFrequency":"soon"}}`, 0, true},
		{"not JSON", `<html>`, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatusUpdateFrequency([]byte(tc.raw))
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("got %v, %v; want %v, error %v", got, err, tc.want, tc.err)
			}
		})
	}
}
