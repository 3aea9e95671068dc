//go:build e2e

package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// freezeRefusal is what runc says when it could not freeze a new
// container's cgroup within its 2 s while applying the cgroup config
// (cgroup v1 with the systemd driver, as in a kind node): the runtime
// refused the start before any process of the container ran, a known
// flake of loaded nodes (kubernetes/kubernetes#131087), and the kubelet
// counts it as a restart.
const freezeRefusal = "error setting cgroup config for procHooks process: unable to freeze"

// freezeRefusals counts the starts that events report runc refused with
// freezeRefusal: aggregated events count each occurrence.
func freezeRefusals(events []corev1.Event) int32 {
	var n int32
	for i := range events {
		e := &events[i]
		if e.Reason != "Failed" || !strings.Contains(e.Message, freezeRefusal) {
			continue
		}
		switch {
		case e.Series != nil && e.Series.Count > 0:
			n += e.Series.Count
		case e.Count > 0:
			n += e.Count
		default:
			n++
		}
	}
	return n
}

// refusedStarts excuses restarts of a pod that runc refused to start:
// each refusal its events report is excused once over the suite, so a
// restart the product caused is never hidden behind a refusal already
// excused.
type refusedStarts struct {
	mu      sync.Mutex
	excused map[types.UID]int32
}

// excuse reports whether extra restarts of pod p beyond those a scenario
// expects are all starts runc refused, and takes them as excused.
func (r *refusedStarts) excuse(t *testing.T, c *cluster, p *corev1.Pod, extra int32) bool {
	t.Helper()
	ev, err := c.cs.CoreV1().Events(p.Namespace).List(context.Background(),
		metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(p.UID)})
	if err != nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	left := freezeRefusals(ev.Items) - r.excused[p.UID]
	if extra > left {
		return false
	}
	if r.excused == nil {
		r.excused = map[types.UID]int32{}
	}
	r.excused[p.UID] += extra
	t.Logf("pod %s: %d restart(s) not counted: runc refused the start (%q)", p.Name, extra, freezeRefusal)
	return true
}

func TestFreezeRefusals(t *testing.T) {
	refused := "failed to create containerd task: failed to create shim task: OCI runtime create failed: " +
		"runc create failed: unable to start container process: error during container init: " + freezeRefusal
	for _, tc := range []struct {
		name   string
		events []corev1.Event
		want   int32
	}{
		{"none", nil, 0},
		{"one", []corev1.Event{{Reason: "Failed", Message: "Error: " + refused}}, 1},
		{"aggregated", []corev1.Event{{Reason: "Failed", Message: "Error: " + refused, Count: 3}}, 3},
		{"series", []corev1.Event{{Reason: "Failed", Message: "Error: " + refused, Count: 1,
			Series: &corev1.EventSeries{Count: 4}}}, 4},
		{"another runtime failure", []corev1.Event{{Reason: "Failed",
			Message: "Error: failed to create containerd task: OCI runtime create failed: error mounting \"/x\": no such file", Count: 2}}, 0},
		{"the plugin's prestart failed", []corev1.Event{{Reason: "Failed",
			Message: "Error: PreStartContainer: rpc error: code = Unknown desc = reset: step failed"}}, 0},
		{"not a failure", []corev1.Event{{Reason: "BackOff", Message: "Back-off restarting failed container c: " + refused}}, 0},
		{"mixed", []corev1.Event{
			{Reason: "Failed", Message: "Error: " + refused, Count: 2},
			{Reason: "Failed", Message: "Error: PreStartContainer failed"},
			{Reason: "Pulled", Message: "image present"},
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := freezeRefusals(tc.events); got != tc.want {
				t.Errorf("freezeRefusals = %d, want %d", got, tc.want)
			}
		})
	}
}
