package fleet

import (
	"os"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
)

// The fleet's CPU. On one machine every driver, the control plane and
// dp-bench (the kubelets' stand-in) share the same cores: a driver that
// spends more CPU slows the scheduler and the API server too. The on-CPU
// time of each group is read from /proc (schedstat of every thread) before
// and after a scheduling round and the steady window.

// cpuSample is the on-CPU time of the fleet's processes at one moment.
type cpuSample struct {
	Drivers      time.Duration // every node's driver process
	ControlPlane time.Duration // etcd, kube-apiserver, kube-scheduler, kube-controller-manager
	StandIn      time.Duration // dp-bench: the kubelets' stand-in and its watches
}

// sub is s - o, group by group.
func (s cpuSample) sub(o cpuSample) cpuSample {
	return cpuSample{Drivers: s.Drivers - o.Drivers, ControlPlane: s.ControlPlane - o.ControlPlane, StandIn: s.StandIn - o.StandIn}
}

// cpuOf is the on-CPU time of the processes pids; one that ended counts 0.
func cpuOf(pids []int) time.Duration {
	var sum time.Duration
	for _, pid := range pids {
		if s, err := proc.Read(pid); err == nil {
			sum += s.CPU
		}
	}
	return sum
}

// cpu samples the fleet's processes now.
func (f *fleet) cpu() cpuSample {
	var drivers []int
	for _, n := range f.nodes {
		if n != nil {
			drivers = append(drivers, n.process().Pid())
		}
	}
	cp := []int{f.fc.cp.Etcd.Pid(), f.fc.cp.APIServer.Pid()}
	for _, p := range f.fc.others {
		cp = append(cp, p.Pid())
	}
	return cpuSample{Drivers: cpuOf(drivers), ControlPlane: cpuOf(cp), StandIn: cpuOf([]int{os.Getpid()})}
}

// roundCPU is a scheduling round's CPU: the drivers' per pod prepared,
// milliseconds, and the control plane's and the stand-in's, seconds.
func roundCPU(d cpuSample, pods int) (driverPerPodMs, controlPlaneS, standInS float64) {
	if pods > 0 {
		driverPerPodMs = float64(d.Drivers) / float64(time.Millisecond) / float64(pods)
	}
	return driverPerPodMs, d.ControlPlane.Seconds(), d.StandIn.Seconds()
}

// perNodeMinuteMs is CPU spent over a window by n processes, milliseconds
// per process per minute.
func perNodeMinuteMs(cpu time.Duration, n int, window time.Duration) float64 {
	if n == 0 || window <= 0 {
		return 0
	}
	return float64(cpu) / float64(time.Millisecond) / float64(n) / window.Minutes()
}
