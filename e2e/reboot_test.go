//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// createDeployment runs one replica of the pod's spec as Deployment name
// (pods labelled app=name).
func (c *cluster) createDeployment(t *testing.T, name string, p *corev1.Pod) {
	t.Helper()
	one := int32(1)
	if _, err := c.cs.AppsV1().Deployments(podNS).Create(context.Background(), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNS},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}}, Spec: p.Spec},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create deployment %s: %v", name, err)
	}
}

// runningAgain holds for a pod whose single container runs, ready, after
// at least restarts restarts.
func runningAgain(p *corev1.Pod, restarts int32) bool {
	if p == nil || p.DeletionTimestamp != nil || len(p.Status.ContainerStatuses) != 1 {
		return false
	}
	s := p.Status.ContainerStatuses[0]
	return s.State.Running != nil && s.Ready && s.RestartCount >= restarts
}

// milestones records, for each named condition on the pods of podNS, how
// long after t0 it first held: it polls every 100 ms until stopped.
type milestones struct {
	t0    time.Time
	mu    sync.Mutex
	at    map[string]time.Duration
	stop  context.CancelFunc
	done  chan struct{}
	names []string
}

func (c *cluster) watchMilestones(t0 time.Time, conds map[string]func(pods map[string]*corev1.Pod) bool) *milestones {
	ctx, cancel := context.WithCancel(context.Background())
	m := &milestones{t0: t0, at: map[string]time.Duration{}, stop: cancel, done: make(chan struct{})}
	for n := range conds {
		m.names = append(m.names, n)
	}
	sort.Strings(m.names)
	go func() {
		defer close(m.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if l, err := c.cs.CoreV1().Pods(podNS).List(ctx, metav1.ListOptions{}); err == nil {
				now := time.Since(t0)
				pods := map[string]*corev1.Pod{}
				for i := range l.Items {
					pods[l.Items[i].Name] = &l.Items[i]
				}
				m.mu.Lock()
				for n, f := range conds {
					if _, seen := m.at[n]; !seen && f(pods) {
						m.at[n] = now
					}
				}
				m.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return m
}

// report stops the watch and returns "name: duration" for every milestone,
// "not seen" for those that never held.
func (m *milestones) report() string {
	m.stop()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, n := range m.names {
		if d, ok := m.at[n]; ok {
			out = append(out, fmt.Sprintf("%s %v", n, d.Round(100*time.Millisecond)))
		} else {
			out = append(out, n+" not seen")
		}
	}
	return strings.Join(out, "; ")
}

// rejectedAtAdmission waits until the kubelet has failed the pod with
// UnexpectedAdmissionError, and returns its status message.
func (c *cluster) rejectedAtAdmission(t *testing.T, name string) string {
	t.Helper()
	var msg string
	eventually(t, 2*time.Minute, name+" rejected at admission", func() (bool, string) {
		p, err := c.getPod(name)
		if err != nil {
			return false, err.Error()
		}
		msg = p.Status.Message
		return p.Status.Phase == corev1.PodFailed && p.Status.Reason == "UnexpectedAdmissionError",
			fmt.Sprintf("phase %s, reason %q, message %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
	})
	return msg
}
