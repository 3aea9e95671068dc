package fleet

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestFleetCPU: a round's CPU per pod and the steady window's per node
// per minute, from two samples of real processes; an ended process counts
// 0; the table's rows give the medians over the rounds.
func TestFleetCPU(t *testing.T) {
	ended := exec.Command("true")
	if err := ended.Run(); err != nil {
		t.Fatal(err)
	}
	if got := cpuOf([]int{ended.Process.Pid}); got != 0 {
		t.Errorf("cpuOf an ended process: %v, want 0", got)
	}
	self := cpuOf([]int{os.Getpid()})
	if self <= 0 {
		t.Fatalf("cpuOf(dp-bench's test) %v, want above 0", self)
	}
	if twice := cpuOf([]int{os.Getpid(), os.Getpid()}); twice < 2*self {
		t.Errorf("cpuOf(self, self) %v, want at least twice %v", twice, self)
	}

	before := cpuSample{Drivers: time.Second, ControlPlane: 2 * time.Second, StandIn: 3 * time.Second}
	after := cpuSample{Drivers: 5 * time.Second, ControlPlane: 12 * time.Second, StandIn: 4500 * time.Millisecond}
	for _, tc := range []struct {
		name          string
		pods          int
		perPod, cp, s float64
	}{
		{"640 pods", 640, 6.25, 10, 1.5},
		{"no pod", 0, 0, 10, 1.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			perPod, cp, s := roundCPU(after.sub(before), tc.pods)
			if perPod != tc.perPod || cp != tc.cp || s != tc.s {
				t.Errorf("roundCPU: %v ms a pod, %v s, %v s; want %v, %v, %v", perPod, cp, s, tc.perPod, tc.cp, tc.s)
			}
		})
	}
	if got := perNodeMinuteMs(3*time.Second, 100, 5*time.Minute); got != 6 {
		t.Errorf("3 s over 100 nodes and 5 min: %v ms per node per minute, want 6", got)
	}
	if got := perNodeMinuteMs(time.Second, 0, time.Minute); got != 0 {
		t.Errorf("no node: %v, want 0", got)
	}

	var b bytes.Buffer
	writeMarkdown(&b, &Report{N: 2, Targets: []TargetReport{{Name: "d", Pods: 1, SteadyCPUMsPerNodeMin: 12.34, Rounds: []schedRound{
		{DriverCPUPerPodMs: 4, ControlPlaneCPUS: 30, StandInCPUS: 2},
		{DriverCPUPerPodMs: 9, ControlPlaneCPUS: 10, StandInCPUS: 1},
		{DriverCPUPerPodMs: 5, ControlPlaneCPUS: 20, StandInCPUS: 3},
	}}}})
	for _, want := range []string{"| 5.0 ms; 20.0 s; 2.0 s |", "| steady state: driver CPU per node per minute | reported | 12.34 ms |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, b.String())
		}
	}
}
