package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
)

// TestPodLatencies: binding → prepared per pod takes the audit log's
// binding where it has the pod, else the watch's; a pod not prepared is
// left out.
func TestPodLatencies(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	k := newKubelet(nil, nil, func(string, ...any) {})
	k.pods = map[string]*podTimes{
		"a": {bound: ms(100), prepared: ms(150), call: 5 * time.Millisecond},  // audit: bound at 90
		"b": {bound: ms(200), prepared: ms(400), call: 40 * time.Millisecond}, // the watch's time
		"c": {bound: ms(300)},                                                 // not prepared
	}
	b2p, calls := k.latencies([]string{"a", "b", "c"}, map[string]time.Time{"a": ms(90)})
	if !slices.Equal(b2p, []time.Duration{60 * time.Millisecond, 200 * time.Millisecond}) {
		t.Errorf("binding to prepared %v, want [60ms 200ms]", b2p)
	}
	if !slices.Equal(calls, []time.Duration{5 * time.Millisecond, 40 * time.Millisecond}) {
		t.Errorf("calls %v, want [5ms 40ms]", calls)
	}
}

// TestStandInFollowsClaim: the kubelet stand-in queues a bound pod once,
// and prepares the claim its status names at each try, as the kubelet
// takes it from the pod it syncs: when the status names another claim
// after the binding, the new one is tried, and the pod's diagnostics list
// both.
func TestStandInFollowsClaim(t *testing.T) {
	var logged []string
	k := newKubelet(nil, nil, func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) })
	work := make(chan prepareWork, 4)
	k.work["n1"] = work
	pod := func(node, claim string) apiclient.Event {
		st := map[string]any{}
		if claim != "" {
			st["resourceClaimStatuses"] = []map[string]any{{"name": "dev", "resourceClaimName": claim}}
		}
		b, err := json.Marshal(map[string]any{"metadata": map[string]any{"name": "p"}, "spec": map[string]any{"nodeName": node}, "status": st})
		if err != nil {
			t.Fatal(err)
		}
		return apiclient.Event{Type: apiclient.Modified, Object: b, At: time.Now()}
	}
	k.event(pod("", "c1"))   // not bound yet
	k.event(pod("n1", ""))   // bound, no claim yet
	k.event(pod("n1", "c1")) // bound with its claim: queued
	k.event(pod("n1", "c1")) // the same again: nothing
	k.event(pod("n1", "c2")) // another claim named
	if len(work) != 1 {
		t.Fatalf("%d work items queued, want 1", len(work))
	}
	if w := <-work; w.pod != "p" {
		t.Errorf("work for pod %q, want p", w.pod)
	}
	if got := k.pods["p"].lastClaim(); got != "c2" {
		t.Errorf("the claim to prepare: %q, want c2 (the one the status names now)", got)
	}
	if got := k.pods["p"].claims; !slices.Equal(got, []string{"c1", "c2"}) {
		t.Errorf("claims seen %v, want [c1 c2]", got)
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "names claim c2 now, after c1") {
		t.Errorf("logged %q, want one line saying the claim changed", logged)
	}
	if got := k.pending([]string{"p"}, 5); !strings.Contains(got, "claims in its status c1 then c2") {
		t.Errorf("pending: %s", got)
	}
}
