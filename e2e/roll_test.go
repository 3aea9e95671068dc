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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// rollResult is what one roll of the driver's DaemonSet showed.
type rollResult struct {
	// rolled is the time from the patch to the new driver pod ready and
	// the old one gone.
	rolled time.Duration
	// waits are the claim pods' times from creation to their container's
	// start, by pod.
	waits map[string]time.Duration
	// failed are the claim pods that failed, or did not start, with why.
	failed []string
	// tainted are the slice devices seen with a taint, with when.
	tainted []string
	// started counts the claim pods whose container started.
	started int
}

func (r rollResult) longest() (string, time.Duration) {
	var name string
	var most time.Duration
	for n, w := range r.waits {
		if w > most {
			name, most = n, w
		}
	}
	return name, most
}

// scenarioDRARoll: the driver's DaemonSet rolled twice while claim pod d9
// runs and a new claim pod (1 device, its container exits at once) is
// created every second: first with the strategy the driver had before rolling
// updates with overlap (maxUnavailable 1, maxSurge 0: the old pod goes,
// then the new one starts), for the measure, then as deployed (maxSurge
// 1, maxUnavailable 0: the new pod beside the old one, POD_UID). As
// deployed: no claim pod fails and every one starts; no device is
// prepared twice (the devices' generations grow by exactly the claim
// pods started); no device of the node's slices carries a taint at any
// point (polled every 100 ms); d9 keeps its container. The longest time a
// new claim pod waited to start is logged for both rolls.
func (c *cluster) scenarioDRARoll(t *testing.T, node string) {
	ctx := context.Background()
	_ = c.cs.CoreV1().Pods(podNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "app=cdi-e2e-dra"})
	eventually(t, 2*time.Minute, "the earlier scenarios' claim pods gone", func() (bool, string) {
		l, err := c.cs.CoreV1().Pods(podNS).List(ctx, metav1.ListOptions{LabelSelector: "app=cdi-e2e-dra"})
		if err != nil {
			return false, err.Error()
		}
		return len(l.Items) == 0, fmt.Sprintf("%d pods", len(l.Items))
	})
	c.createClaimTemplate(t, "one", 1)
	c.createPod(t, c.claimPod("d9", "one", ""))
	c.waitReady(t, "d9", 3*time.Minute)
	cid, restarts := containerOf(t, c, "d9")

	gap := c.rollDriver(t, node, "gap", `{"maxSurge":0,"maxUnavailable":1}`, false)
	before := c.draStates(t)
	surge := c.rollDriver(t, node, "surge", `{"maxSurge":1,"maxUnavailable":0}`, true)
	after := c.draStates(t)

	for _, r := range []struct {
		how string
		res rollResult
	}{{"maxUnavailable 1, maxSurge 0 (before)", gap}, {"maxSurge 1, maxUnavailable 0 (as deployed)", surge}} {
		name, most := r.res.longest()
		t.Logf("roll with %s: rolled in %v; %d claim pods started, the longest wait %v (%s); failed %v; tainted %v",
			r.how, r.res.rolled.Round(time.Millisecond), r.res.started, most.Round(time.Millisecond), name, r.res.failed, r.res.tainted)
	}
	if len(surge.failed) > 0 {
		t.Errorf("claim pods failed or did not start during the roll as deployed: %v", surge.failed)
	}
	if len(surge.tainted) > 0 {
		t.Errorf("devices tainted during the roll as deployed: %v", surge.tainted)
	}
	var grown int64
	for id, s := range after {
		grown += s.Generation - before[id].Generation
	}
	if grown != int64(surge.started) {
		t.Errorf("the devices were prepared %d times for %d claim pods started during the roll as deployed: want one preparation each", grown, surge.started)
	}
	if cid2, r2 := containerOf(t, c, "d9"); cid2 != cid || r2 != restarts {
		t.Errorf("d9's container %s (restarts %d) became %s (%d) during the rolls", cid, restarts, cid2, r2)
	}
	c.deletePod(t, "d9")
}

// rollDriver rolls the driver's DaemonSet with the rolling update strategy
// (JSON) while a claim pod (its container exits at once) is created every
// second, until the new driver pod is ready, the old one gone, and 5 s
// more; each claim pod is read and deleted as it ends (its device free
// again), and all have ended when it returns; it watches the node's slices
// (taints recorded when watchTaints).
func (c *cluster) rollDriver(t *testing.T, node, how, strategy string, watchTaints bool) rollResult {
	t.Helper()
	ctx := context.Background()
	old, err := c.driverPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res := rollResult{waits: map[string]time.Duration{}}
	if watchTaints {
		// A driver stopping alone taints its devices until the next one
		// publishes: start from untainted slices.
		eventually(t, time.Minute, "the node's slices untainted before the "+how+" roll", func() (bool, string) {
			sl, err := c.draSlices(ctx, node)
			if err != nil {
				return false, err.Error()
			}
			for i := range sl {
				for _, d := range sl[i].Spec.Devices {
					if len(d.Taints) > 0 {
						return false, d.Name + " " + d.Taints[0].Key
					}
				}
			}
			return true, ""
		})
	}
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// Claim pods, one a second.
	var created []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for n := 0; ; n++ {
			name := fmt.Sprintf("r-%s-%d", how, n)
			p := c.claimPod(name, "one", "")
			p.Spec.RestartPolicy = corev1.RestartPolicyNever
			p.Spec.Containers[0].Command = []string{"true"}
			if _, err := c.cs.CoreV1().Pods(podNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				mu.Lock()
				res.failed = append(res.failed, name+": create: "+err.Error())
				mu.Unlock()
			} else {
				mu.Lock()
				created = append(created, name)
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	// Claim pods that ended are read and deleted as they end, so that
	// their devices are free again: a new pod waits for the driver, not
	// for a device.
	pending := map[string]bool{}
	reap := func() {
		mu.Lock()
		for _, n := range created {
			pending[n] = true
		}
		created = nil
		names := make([]string, 0, len(pending))
		for n := range pending {
			names = append(names, n)
		}
		mu.Unlock()
		for _, n := range names {
			p, err := c.getPod(n)
			switch {
			case apierrors.IsNotFound(err):
				mu.Lock()
				delete(pending, n)
				res.failed = append(res.failed, n+": gone")
				mu.Unlock()
				continue
			case err != nil:
				continue
			}
			if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				continue
			}
			mu.Lock()
			if p.Status.Phase == corev1.PodFailed {
				res.failed = append(res.failed, fmt.Sprintf("%s: %s %s", n, p.Status.Reason, p.Status.Message))
			}
			if st := startedAt(p); !st.IsZero() {
				res.waits[n] = st.Sub(p.CreationTimestamp.Time)
				res.started++
			}
			delete(pending, n)
			mu.Unlock()
			c.deletePod(t, n)
		}
	}
	every(&wg, stop, 200*time.Millisecond, reap)
	// The node's slices, every 100 ms.
	t0 := time.Now()
	if watchTaints {
		every(&wg, stop, 100*time.Millisecond, func() {
			sl, err := c.draSlices(ctx, node)
			if err != nil {
				return
			}
			for i := range sl {
				for _, d := range sl[i].Spec.Devices {
					for _, tn := range d.Taints {
						mu.Lock()
						res.tainted = append(res.tainted, fmt.Sprintf("%s %s at %v", d.Name, tn.Key, time.Since(t0).Round(100*time.Millisecond)))
						mu.Unlock()
					}
				}
			}
		})
	}
	patch := fmt.Sprintf(`{"spec":{"updateStrategy":{"rollingUpdate":%s},"template":{"metadata":{"annotations":{"e2e.cdi.dev/restarted-at":"%d"}}}}}`,
		strategy, time.Now().UnixNano())
	if _, err := c.cs.AppsV1().DaemonSets(draNS).Patch(ctx, "cdi-dra-driver", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	eventually(t, 3*time.Minute, "the new driver pod ready and the old one gone ("+how+")", func() (bool, string) {
		l, err := c.cs.CoreV1().Pods(draNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=cdi-dra-driver"})
		if err != nil {
			return false, err.Error()
		}
		var states []string
		oldThere, ready := false, false
		for i := range l.Items {
			p := &l.Items[i]
			r := len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready
			states = append(states, fmt.Sprintf("%s:%s ready=%v", p.Name, p.Status.Phase, r))
			if p.Name == old.Name {
				oldThere = true
			} else if r && p.DeletionTimestamp == nil {
				ready = true
			}
		}
		time.Sleep(100 * time.Millisecond)
		return !oldThere && ready, strings.Join(states, " ")
	})
	res.rolled = time.Since(t0)
	time.Sleep(5 * time.Second)
	close(stop)
	wg.Wait()
	eventually(t, 3*time.Minute, "the "+how+" roll's claim pods ended", func() (bool, string) {
		reap()
		mu.Lock()
		defer mu.Unlock()
		left := make([]string, 0, len(pending))
		for n := range pending {
			left = append(left, n)
		}
		sort.Strings(left)
		return len(pending) == 0, "waiting for " + strings.Join(left, ",")
	})
	return res
}

// every runs f every period, in a goroutine wg counts, until stop is
// closed.
func every(wg *sync.WaitGroup, stop <-chan struct{}, period time.Duration, f func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(period):
			}
			f()
		}
	}()
}

// startedAt is when the pod's first container started (zero when it did
// not).
func startedAt(p *corev1.Pod) time.Time {
	if len(p.Status.ContainerStatuses) == 0 {
		return time.Time{}
	}
	s := p.Status.ContainerStatuses[0].State
	switch {
	case s.Terminated != nil:
		return s.Terminated.StartedAt.Time
	case s.Running != nil:
		return s.Running.StartedAt.Time
	}
	return time.Time{}
}
