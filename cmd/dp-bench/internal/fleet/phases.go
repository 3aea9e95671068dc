package fleet

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/audit"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/stats"
)

// round is scheduling round r: Fill of the devices claimed by pods
// created at once; after a round but the last, the pods are deleted and
// their claims unprepared and deleted (kubeletsim.Pods.Finish). The last
// round's pods stay (the rollout needs them).
func (f *fleet) round(ctx context.Context, r int) error {
	count := int(f.c.Fill * float64(f.ft.Devices))
	mark, err := f.markTraffic(ctx)
	if err != nil {
		return err
	}
	cpu0 := f.cpu()
	names, err := f.createPods(ctx, fmt.Sprintf("sched%d", r), count)
	if err != nil {
		return fmt.Errorf("round %d: creating pods: %w", r+1, err)
	}
	f.pods = count
	if err := f.k.WaitPrepared(ctx, names, time.Minute+time.Duration(count)*200*time.Millisecond); err != nil {
		if e := f.fc.alive(); e != nil {
			return e
		}
		return fmt.Errorf("round %d: scheduling: %w; kube-scheduler: %s; kube-controller-manager: %s", r+1, err, f.fc.others[0].LogTail(1500), f.fc.others[1].LogTail(1500))
	}
	var rd schedRound
	rd.DriverCPUPerPodMs, rd.ControlPlaneCPUS, rd.StandInCPUS = roundCPU(f.cpu().sub(cpu0), count)
	prepared := time.Now()
	ws, err := f.flushedAudit(ctx)
	if err != nil {
		return err
	}
	if rd.Traffic, err = f.traffic(ctx, mark, ws, prepared); err != nil {
		return err
	}
	f.logf("round %d: claim traffic %s", r+1, rd.Traffic)
	var missed int
	binds := audit.BindTimes(ws, names)
	rd.BoundPerS, rd.PreparedPerS, missed = f.k.Rates(names, binds)
	b2p, calls := f.k.Latencies(names, binds)
	wd := f.k.WatchDelays(names, binds)
	rd.WatchDelayP50Ms, rd.WatchDelayP99Ms = report.Ms(stats.Quantile(wd, 0.5)), report.Ms(stats.Quantile(wd, 0.99))
	rd.BindToPreparedP50Ms, rd.BindToPreparedP99Ms = report.Ms(stats.Quantile(b2p, 0.5)), report.Ms(stats.Quantile(b2p, 0.99))
	rd.PrepareCallP50Ms, rd.PrepareCallP99Ms = report.Ms(stats.Quantile(calls, 0.5)), report.Ms(stats.Quantile(calls, 0.99))
	if missed > 0 {
		f.logf("round %d: %d bindings not in the audit log: the watch's times taken for them", r+1, missed)
	}
	f.ft.Rounds = append(f.ft.Rounds, rd)
	f.logf("round %d: %d pods: %.1f/s bound, %.1f/s prepared; per pod, binding to prepared p50 %.0f ms, p99 %.0f ms (the pod watch's delay p50 %.0f ms); NodePrepareResources p50 %.1f ms, p99 %.1f ms; CPU: drivers %.1f ms a pod, control plane %.1f s, stand-in %.1f s",
		r+1, count, rd.BoundPerS, rd.PreparedPerS, rd.BindToPreparedP50Ms, rd.BindToPreparedP99Ms, rd.WatchDelayP50Ms, rd.PrepareCallP50Ms, rd.PrepareCallP99Ms,
		rd.DriverCPUPerPodMs, rd.ControlPlaneCPUS, rd.StandInCPUS)
	if r == f.c.Rounds-1 {
		return nil
	}
	if err := f.k.Finish(ctx, names); err != nil {
		return fmt.Errorf("round %d: %w", r+1, err)
	}
	if err := f.waitNoClaims(ctx, 2*time.Minute); err != nil {
		return fmt.Errorf("round %d: %w", r+1, err)
	}
	return proc.Sleep(ctx, f.c.Settle)
}

// scheduled sums up the rounds: their medians.
func (f *fleet) scheduled() {
	f.ft.Pods = f.pods
	f.ft.BoundPerS = roundsMedian(f.ft.Rounds, func(r schedRound) float64 { return r.BoundPerS })
	f.ft.PreparedPerS = roundsMedian(f.ft.Rounds, func(r schedRound) float64 { return r.PreparedPerS })
	f.ft.PrepareErrors = f.k.Errors()
	f.logf("%d rounds of %d pods: medians %.1f/s bound, %.1f/s prepared", len(f.ft.Rounds), f.pods, f.ft.BoundPerS, f.ft.PreparedPerS)
}

// waitNoClaims waits until the fleet's namespace has no ResourceClaim
// (the stand-in's Finish deleted them; the resourceclaim controller deallocates
// each and lets it go): the devices are free.
func (f *fleet) waitNoClaims(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var list struct {
			Items []apiclient.ResourceClaim `json:"items"`
		}
		if err := f.fc.cp.Client.Do(ctx, http.MethodGet, apiclient.PathClaims(fleetNamespace), nil, &list); err != nil {
			return fmt.Errorf("listing claims: %w", err)
		}
		if len(list.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d claims left %s after their pods were deleted", len(list.Items), timeout)
		}
		if err := proc.Sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// memory: the drivers' resident memory and the API server's.
func (f *fleet) memory() {
	var rss []float64
	for _, n := range f.nodes {
		rss = append(rss, report.MiB(n.rss()))
	}
	f.ft.DriverRSSMiB = stats.Median(rss)
	f.ft.DriverRSSMaxMiB = slices.Max(rss)
	f.ft.Health = f.healthStreams()
}

// healthStreams says what the stand-in's health streams read so far.
func (f *fleet) healthStreams() string {
	var opened, updates int64
	var unserved int
	var lastErr string
	for _, n := range f.nodes {
		opened += n.health.opened.Load()
		updates += n.health.updates.Load()
		if n.health.unserved.Load() {
			unserved++
		}
		if e, ok := n.health.lastErr.Load().(string); ok {
			lastErr = e
		}
	}
	out := fmt.Sprintf("%d opened on %d nodes, %d updates read", opened, len(f.nodes), updates)
	if unserved > 0 {
		out += fmt.Sprintf("; not served by the driver on %d nodes", unserved)
	}
	if lastErr != "" {
		out += "; a stream ended: " + lastErr
	}
	return out
}

// window runs during, waits until d has passed since it began, and
// returns the audit log's writes and the window's bounds [from, to).
func (f *fleet) window(ctx context.Context, d time.Duration, during func(context.Context) error) ([]audit.Write, time.Time, time.Time, error) {
	from := time.Now()
	if during != nil {
		if err := during(ctx); err != nil {
			return nil, from, from, err
		}
	}
	if err := proc.Sleep(ctx, time.Until(from.Add(d))); err != nil {
		return nil, from, from, err
	}
	to := time.Now()
	ws, err := f.flushedAudit(ctx)
	return ws, from, to, err
}

// flushedAudit reads the audit log once what happened until now is in it:
// the log is written before each request is answered (blocking mode), but
// a request sent just before now may still be on its way.
func (f *fleet) flushedAudit(ctx context.Context) ([]audit.Write, error) {
	if err := proc.Sleep(ctx, time.Second); err != nil {
		return nil, err
	}
	return f.fc.audit(ctx)
}

// steady: nothing changes for Steady; every write of the drivers counts.
func (f *fleet) steady(ctx context.Context) error {
	if err := proc.Sleep(ctx, f.c.Settle); err != nil {
		return err
	}
	before, err := f.fc.metrics(ctx)
	if err != nil {
		return err
	}
	mark, err := f.markTraffic(ctx)
	if err != nil {
		return err
	}
	cpu0 := f.cpu()
	// The API server's memory, once a second through the window: one
	// sample is wherever its GC happened to be.
	var rss []float64
	sampled := make(chan struct{})
	sctx, stopSampling := context.WithCancel(ctx)
	go func() {
		defer close(sampled)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			rss = append(rss, report.MiB(f.fc.apiserverRSS()))
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	ws, from, to, err := f.window(ctx, f.c.Steady, nil)
	stopSampling()
	<-sampled
	f.ft.APIServerRSS = memSamples(rss)
	if err != nil {
		return err
	}
	f.ft.SteadyCPUMsPerNodeMin = perNodeMinuteMs(f.cpu().sub(cpu0).Drivers, f.c.N, to.Sub(from))
	tally := audit.TallyWrites(ws, "", from, to)
	if after, err := f.fc.metrics(ctx); err == nil {
		f.ft.SteadyAll = audit.RequestWrites(before, after)
	}
	f.ft.Steady = tally
	if f.ft.SteadyTraffic, err = f.traffic(ctx, mark, ws, to); err != nil {
		return err
	}
	f.logf("steady: claim traffic %s", f.ft.SteadyTraffic)
	f.ft.SteadyPerNodeMin = float64(tally.Total) / float64(f.c.N) / to.Sub(from).Minutes()
	f.logf("steady: kube-apiserver resident memory %s", f.ft.APIServerRSS)
	f.logf("steady %s: %d driver writes (%.2f per node per minute) %v; driver CPU %.2f ms per node per minute", to.Sub(from).Round(time.Second), tally.Total, f.ft.SteadyPerNodeMin, tally.ByKind, f.ft.SteadyCPUMsPerNodeMin)
	return nil
}

// storm: every device node of every node removed and made again,
// StormRate times a second, for Storm; the slice writes in the storm and
// the second after it, and when the last state (all healthy) was
// published.
func (f *fleet) storm(ctx context.Context) error {
	if f.c.Storm == 0 {
		f.ft.StormNA = "not run (-fleet-storm=0)"
		return nil
	}
	type devNode struct {
		path string
		mode uint32
		dev  uint64
	}
	var devs []devNode
	for _, n := range f.nodes {
		paths, err := n.deviceNodes()
		if err != nil {
			return err
		}
		for _, p := range paths {
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil {
				return err
			}
			devs = append(devs, devNode{p, st.Mode, st.Rdev})
		}
	}
	if len(devs) == 0 {
		f.ft.StormNA = "n/a: the driver makes no device node whose health dp-bench can flip"
		return nil
	}
	events0 := f.st.eventCount()
	flip := func(up bool) {
		for _, d := range devs {
			if up {
				_ = unix.Mknod(d.path, d.mode, int(d.dev))
			} else {
				_ = os.Remove(d.path)
			}
		}
	}
	var end time.Time
	during := func(ctx context.Context) error {
		tick := time.NewTicker(time.Second / time.Duration(2*f.c.StormRate))
		defer tick.Stop()
		stop := time.Now().Add(f.c.Storm)
		up := true
		for time.Now().Before(stop) {
			select {
			case <-ctx.Done():
				flip(true)
				return ctx.Err()
			case <-tick.C:
			}
			up = !up
			flip(up)
			if up {
				f.ft.StormFlips++
			}
		}
		flip(true)
		end = time.Now()
		return nil
	}
	ws, from, to, err := f.window(ctx, f.c.Storm+time.Second, during)
	if err != nil {
		return err
	}
	c := audit.StormRates(ws, f.c.N, from, end, to)
	last, err := f.st.waitClean(ctx, f.names, time.Minute)
	if err != nil {
		return fmt.Errorf("after the storm: %w", err)
	}
	f.ft.StormLastS = max(0, last.Sub(end).Seconds())
	f.ft.Storm, f.ft.StormPerNodeS = c.Window, c.WindowPerNodeS
	f.ft.StormDuring, f.ft.StormDuringPerNodeS = c.During.Total, c.DuringPerNodeS
	f.logf("storm %s: %d flips per device, %d slice events seen; %d slice writes in it (%.2f per node per second), %d with the %s after it (%.2f per node per second, at most %d of a node in a second), last state published %.2f s after its end",
		end.Sub(from).Round(time.Millisecond), f.ft.StormFlips, f.st.eventCount()-events0, c.During.Total, c.DuringPerNodeS,
		c.Window.Total, to.Sub(end).Round(time.Millisecond), c.WindowPerNodeS, c.Window.MaxNodeSecond, f.ft.StormLastS)
	return nil
}

// rollout: every driver replaced at once (Options.Rollout says how)
// while its pods' claims are prepared; pods created during the rollout on
// the remaining devices must be scheduled and prepared, and no pod may
// fail.
func (f *fleet) rollout(ctx context.Context) error {
	if err := proc.Sleep(ctx, f.c.Settle); err != nil {
		return err
	}
	extra := max(1, (f.ft.Devices-f.pods)/2)
	var names []string
	var rolled, prepared time.Time
	var mu sync.Mutex
	var reps []replacement
	var cpu0, cpu1 cpuSample
	during := func(ctx context.Context) error {
		cpu0 = f.cpu()
		var restarts errgroup.Group
		for _, n := range f.nodes {
			restarts.Go(func() error {
				replace := n.surge
				if f.c.Rollout == RolloutRestart {
					replace = n.restart
				}
				rp, err := replace(ctx, f.c.Settings.Term, 2*time.Minute)
				if rp.killed {
					f.logf("node %s: the old driver did not exit within %s of SIGTERM and was killed; its log ended: %s", n.name, f.c.Settings.Term, rp.killedLog)
				}
				mu.Lock()
				reps = append(reps, rp)
				mu.Unlock()
				return err
			})
		}
		var err error
		names, err = f.createPods(ctx, "rollout", extra)
		if rerr := restarts.Wait(); rerr != nil {
			return rerr
		}
		if err != nil {
			return err
		}
		if _, err := f.st.waitClean(ctx, f.names, 2*time.Minute); err != nil {
			return err
		}
		if err := f.k.WaitPrepared(ctx, names, 5*time.Minute); err != nil {
			return fmt.Errorf("pods created during the rollout: %w", err)
		}
		rolled = time.Now()
		// The drivers now are the new processes: their CPU is all of
		// their lives, spent in the rollout.
		cpu1 = f.cpu()
		prepared, _ = f.k.LastPrepared(names)
		return proc.Sleep(ctx, f.c.Settle)
	}
	ws, from, to, err := f.window(ctx, 0, during)
	if err != nil {
		return fmt.Errorf("rollout: %w", err)
	}
	tally := audit.TallyWrites(ws, "resourceslices", from, to)
	f.ft.Rollout = tally
	f.ft.RolloutS = rolled.Sub(from).Seconds()
	f.ft.RolloutPreparedS = prepared.Sub(from).Seconds()
	f.ft.RolloutNodes = newReplacements(reps)
	f.ft.RolloutDriverCPUMs = float64(cpu1.Drivers) / float64(time.Millisecond) / float64(f.c.N)
	f.ft.RolloutControlPlaneCPUS = (cpu1.ControlPlane - cpu0.ControlPlane).Seconds()
	f.ft.RolloutPerNode = float64(tally.Total) / float64(f.c.N)
	f.ft.RolloutPods = extra
	f.ft.RolloutFailed = f.k.Failures()
	f.logf("rollout: the %d pods created during it prepared %.1f s after it began, every driver replaced and that done %.1f s after; %s; CPU: %.0f ms a new driver, %.1f s the control plane; %d slice writes (%.2f per node, at most %d), %d pods failed %v",
		extra, f.ft.RolloutPreparedS, f.ft.RolloutS, f.ft.RolloutNodes, f.ft.RolloutDriverCPUMs, f.ft.RolloutControlPlaneCPUS, tally.Total, f.ft.RolloutPerNode, tally.MaxNode, len(f.ft.RolloutFailed), tally.ByKind)
	if len(f.ft.RolloutFailed) > 0 {
		return fmt.Errorf("rollout: pods failed: %s", strings.Join(f.ft.RolloutFailed, "; "))
	}
	return nil
}
