package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
	"github.com/cdi-device-plugin/cdi-device-plugin/podresources"
)

const (
	testDriver = "sim.example.com"
	testNode   = "node1"
)

// claimPod is pod ns/p whose container c holds claim ns/name, whose
// resources are res.
func claimPod(name string, res ...*podresourcesapi.ClaimResource) *podresourcesapi.PodResources {
	return &podresourcesapi.PodResources{Namespace: "ns", Name: "p-" + name, Containers: []*podresourcesapi.ContainerResources{{Name: "c",
		DynamicResources: []*podresourcesapi.DynamicResource{{ClaimNamespace: "ns", ClaimName: name, ClaimResources: res}}}}}
}

// byCDI is a claim device as a kubelet lists it: driver, pool, device and
// the CDI names the driver gave.
func byCDI(dev string, cdi ...string) *podresourcesapi.ClaimResource {
	cr := &podresourcesapi.ClaimResource{DriverName: testDriver, PoolName: testNode, DeviceName: dev}
	for _, n := range cdi {
		cr.CdiDevices = append(cr.CdiDevices, &podresourcesapi.CDIDevice{Name: n})
	}
	return cr
}

// byName is a claim device with no CDI names.
func byName(driver, pool, dev string) *podresourcesapi.ClaimResource {
	return &podresourcesapi.ClaimResource{DriverName: driver, PoolName: pool, DeviceName: dev}
}

func testMatch(t *testing.T) ClaimMatch {
	return ClaimMatch{Kind: testKind(t), IDPrefix: "sim", Drivers: []string{testDriver}, Pools: []string{testNode}}
}

// TestClaimMatch: the CDI names of a claim device decide when
// there are any (whatever the driver), otherwise the driver, pool and
// device name do.
func TestClaimMatch(t *testing.T) {
	snap := snapshot(3, 0, 1) // sim-0 .. sim-2, indexes 0 .. 2
	held := func(claim string) device.Problem {
		return device.Problem{Cause: device.CauseHeldByDRA, Message: "held by DRA claim " + claim}
	}
	for _, c := range []struct {
		name     string
		claims   []podresources.ClaimDevice
		replicas int
		want     map[string]device.Problem
	}{
		{"by CDI name", []podresources.ClaimDevice{{Claim: "ns/a", Driver: testDriver, Pool: testNode, Device: "sim-1",
			CDIDevices: []string{"k8s.sim.example.com/claim=uid", "k8s.example.com/sim=sim-1"}}}, 1, map[string]device.Problem{"sim-1": held("ns/a")}},
		{"by CDI name, another driver name", []podresources.ClaimDevice{{Claim: "ns/a", Driver: "renamed.example.com", Pool: "x", Device: "y",
			CDIDevices: []string{"k8s.example.com/sim=sim-2"}}}, 1, map[string]device.Problem{"sim-2": held("ns/a")}},
		{"CDI names of another kind decide", []podresources.ClaimDevice{{Claim: "ns/a", Driver: testDriver, Pool: testNode, Device: "sim-1",
			CDIDevices: []string{"k8s.example.com/other=sim-1"}}}, 1, nil},
		{"a CDI name of no device", []podresources.ClaimDevice{{Claim: "ns/a", CDIDevices: []string{"k8s.example.com/sim=sim-9"}}}, 1, nil},
		{"by driver, pool and device", []podresources.ClaimDevice{{Claim: "ns/a", Driver: testDriver, Pool: testNode, Device: "sim-2"}}, 1,
			map[string]device.Problem{"sim-2": held("ns/a")}},
		{"another driver", []podresources.ClaimDevice{{Claim: "ns/a", Driver: "gpu.vendor.com", Pool: testNode, Device: "sim-2"}}, 1, nil},
		{"another pool", []podresources.ClaimDevice{{Claim: "ns/a", Driver: testDriver, Pool: "node2", Device: "sim-2"}}, 1, nil},
		// The driver publishes a resource with replicas too,
		// each device once, shared by several claims.
		{"replicas: a shared device by driver, pool and device", []podresources.ClaimDevice{
			{Claim: "ns/a", Driver: testDriver, Pool: testNode, Device: "sim-2"},
			{Claim: "ns/b", Driver: testDriver, Pool: testNode, Device: "sim-2"},
		}, 2, map[string]device.Problem{"sim-2": held("ns/a")}},
		// Kubelet 1.36.3's PodResources gives a claim's later devices the
		// CDI names of the earlier ones too (seen in e2e scenario M).
		{"every CDI name of ours counts", []podresources.ClaimDevice{
			{Claim: "ns/a", Driver: testDriver, Pool: testNode, Device: "sim-0", CDIDevices: []string{"k8s.example.com/sim=sim-0", "k8s.sim.example.com/claim=uid"}},
			{Claim: "ns/a", Driver: testDriver, Pool: testNode, Device: "sim-1", CDIDevices: []string{"k8s.example.com/sim=sim-0", "k8s.sim.example.com/claim=uid", "k8s.example.com/sim=sim-1"}},
		}, 1, map[string]device.Problem{"sim-0": held("ns/a"), "sim-1": held("ns/a")}},
		{"the first claim is named", []podresources.ClaimDevice{
			{Claim: "ns/a", Driver: testDriver, Pool: testNode, Device: "sim-0"},
			{Claim: "ns/b", CDIDevices: []string{"k8s.example.com/sim=sim-0"}},
			{Claim: "ns/b", CDIDevices: []string{"k8s.example.com/sim=sim-1"}},
		}, 1, map[string]device.Problem{"sim-0": held("ns/a"), "sim-1": held("ns/b")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := snapshot(3, 0, 1)
			s.Replicas = c.replicas
			got := testMatch(t).Held(s, c.claims)
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("held %v, want %v", got, c.want)
			}
		})
	}
	if got := (ClaimMatch{Kind: testKind(t), IDPrefix: "sim", Drivers: []string{testDriver}}).Held(snap,
		[]podresources.ClaimDevice{{Claim: "ns/a", Driver: testDriver, Device: "sim-0"}}); got != nil {
		t.Fatalf("no pools: matched %v by an empty pool", got)
	}
}

// settleIntervals is the guard's Settle in runGuarded, in intervals.
const settleIntervals = 10

// guarded is a resource of 3 simulated devices (sim-node1-0 ..
// sim-node1-2) run with a claim guard against the PodResources stand-in.
type guarded struct {
	pr *testutil.PodResources
	// sock is the PodResources socket the guard asks (served unless
	// noSocket).
	sock    string
	started time.Time
	src     *device.Source
	k       *kubeletsim.Kubelet
	dir     string
	log     *logtest.Hook
	updates <-chan kubeletsim.Update
}

// runGuarded starts the resource, its PodResources listing pods (no
// PodResources socket when noSocket), and opens the kubelet's stream.
func runGuarded(t *testing.T, interval time.Duration, noSocket bool, pods ...*podresourcesapi.PodResources) *guarded {
	t.Helper()
	testutil.NeedMknod(t)
	g := &guarded{dir: testutil.ShortDir(t)}
	// Not in the plugin directory, which a kubelet restart empties.
	sock := filepath.Join(testutil.ShortDir(t), "pod-resources.sock")
	g.sock = sock
	if !noSocket {
		g.pr = testutil.ServePodResources(t, sock, pods...)
	}
	g.src = simSource(t)
	logger, hook := logtest.NewNullLogger()
	g.log = hook
	log := logrus.NewEntry(logger)
	guard := &ClaimGuard{Source: g.src, PodResources: podresClient(t, sock), Interval: interval, Settle: settleIntervals * interval, Log: log,
		Match: ClaimMatch{Kind: testKind(t), IDPrefix: "sim", Drivers: []string{testDriver}, Pools: []string{testNode}}}
	p := newPlugin(t, g.dir, nil, func(o *Options) { o.Registered = guard.Registered })
	r := &Resource{Source: g.src, Spec: &flakySpec{changed: make(chan struct{})}, Plugin: p, Claims: guard, Log: log}
	g.k = startKubelet(t, g.dir)
	g.started = time.Now()
	testutil.Go(t, r.Run)
	reg, err := g.k.WaitRegistration(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, g.updates = testutil.Watch(context.Background(), t, g.dir, reg.Request.Endpoint)
	return g
}

// podresClient is a PodResources client of sock, closed when the test
// ends.
func podresClient(t *testing.T, sock string) *podresources.Client {
	c := podresources.New(sock)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// simSource is a prepared source of 3 simulated devices, sim-node1-0 ..
// sim-node1-2.
func simSource(t *testing.T) *device.Source {
	t.Helper()
	src, err := device.NewSource(device.Options{DevRoot: t.TempDir(), IDPrefix: "sim", NodeName: testNode, Count: 3, FilePrefix: "sim",
		Type: device.Char, Major: 1, Minor: 3, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Prepare(); err != nil {
		t.Fatal(err)
	}
	return src
}

// first is the stream's first answer.
func (g *guarded) first(t *testing.T) kubeletsim.Update {
	t.Helper()
	select {
	case u := <-g.updates:
		return u
	case <-time.After(5 * time.Second):
		t.Fatal("no first ListAndWatch answer")
	}
	return kubeletsim.Update{}
}

// said counts the log entries that contain msg.
func (g *guarded) said(msg string) int {
	n := 0
	for _, e := range g.log.AllEntries() {
		if strings.Contains(e.Message, msg) {
			n++
		}
	}
	return n
}

func (g *guarded) wait(t *testing.T, what string, cond func(kubeletsim.Update) bool) {
	t.Helper()
	if _, err := kubeletsim.WaitFor(g.updates, 5*time.Second, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func health(u kubeletsim.Update) string {
	var out []string
	for _, d := range u.Devices {
		out = append(out, d.ID+"="+d.Health)
	}
	return strings.Join(out, " ")
}

// TestClaimGuard: a device a DRA claim holds is advertised
// Unhealthy from the first ListAndWatch answer on, for the cause
// dra_claim naming the claim, whether the kubelet gives its CDI names or
// only its driver, pool and device name; released, it is Healthy again
// within the poll interval.
func TestClaimGuard(t *testing.T) {
	const interval = 20 * time.Millisecond
	for _, c := range []struct {
		name string
		pod  *podresourcesapi.PodResources
	}{
		{"by CDI name", claimPod("c1", byCDI("sim-1", "k8s.example.com/sim=sim-node1-1", "k8s.sim.example.com/claim=uid1"))},
		{"by driver, pool and device", claimPod("c1", byName(testDriver, testNode, "sim-1"))},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := runGuarded(t, interval, false, c.pod)
			if u := g.first(t); health(u) != "sim-node1-0=Healthy sim-node1-1=Unhealthy sim-node1-2=Healthy" {
				t.Fatalf("first answer: %s", health(u))
			}
			want := device.Problem{Cause: device.CauseHeldByDRA, Message: "held by DRA claim ns/c1"}
			if p := g.src.Snapshot().Devices[1].Problem; p != want {
				t.Fatalf("problem %+v, want %+v", p, want)
			}
			if p := want.String(); p != "dra_claim: held by DRA claim ns/c1" {
				t.Fatalf("said as %q", p)
			}
			g.pr.Set()
			released := time.Now()
			g.wait(t, "released", func(u kubeletsim.Update) bool { return u.Healthy() == 3 })
			if d := time.Since(released); d > 2*time.Second {
				t.Fatalf("Healthy %v after the release, with a %v interval", d, interval)
			}
		})
	}
}

// TestClaimGuardPollsOnlyWhileHeld: PodResources is asked every
// interval while a claim holds a device, and no more once none does.
func TestClaimGuardPollsOnlyWhileHeld(t *testing.T) {
	const interval = 10 * time.Millisecond
	testutil.NeedMknod(t)
	sock := filepath.Join(testutil.ShortDir(t), "pod-resources.sock")
	pr := testutil.ServePodResources(t, sock, claimPod("c1", byCDI("sim-1", "k8s.example.com/sim=sim-node1-1")))
	logger, hook := logtest.NewNullLogger()
	guard := &ClaimGuard{Source: simSource(t), PodResources: podresClient(t, sock), Interval: interval, Log: logrus.NewEntry(logger), Match: testMatch(t)}
	guard.Start(context.Background())
	testutil.Go(t, guard.Run)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 5s (%d List calls)", what, pr.Calls())
			}
			time.Sleep(interval)
		}
	}
	waitFor("polled while held", func() bool { return pr.Calls() >= 4 })
	pr.Set()
	waitFor("the release seen", func() bool {
		for _, e := range hook.AllEntries() {
			if e.Message == "no DRA claim holds a device any more" {
				return true
			}
		}
		return false
	})
	calls := pr.Calls() // the List that saw the release is counted
	time.Sleep(30 * interval)
	if n := pr.Calls() - calls; n != 0 {
		t.Fatalf("%d List calls in %v once nothing was held", n, 30*interval)
	}
}

// TestClaimGuardIdle: with nothing held, PodResources is asked at the
// start, at the registration and every interval while the registration
// settles (Settle), and no more after that: not every interval for good.
func TestClaimGuardIdle(t *testing.T) {
	const interval = 10 * time.Millisecond
	g := runGuarded(t, interval, false, claimPod("other", byName("gpu.vendor.com", testNode, "sim-1")))
	if u := g.first(t); u.Healthy() != 3 {
		t.Fatalf("first answer: %s", health(u))
	}
	deadline := time.Now().Add(5 * time.Second)
	for g.pr.Calls() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d List calls, want 2: the start's and the registration's", g.pr.Calls())
		}
		time.Sleep(interval)
	}
	// Each ask while settling waits an interval: at most one per interval
	// of the window, however slow the machine; the window is long over
	// after five of its lengths.
	time.Sleep(5 * settleIntervals * interval)
	settled := g.pr.Calls()
	if most := 2 + settleIntervals + 1; settled > most {
		t.Fatalf("%d List calls by the end of the registration's settling, want at most %d", settled, most)
	}
	time.Sleep(30 * interval)
	if n := g.pr.Calls() - settled; n != 0 {
		t.Fatalf("%d List calls with nothing held once the registration settled, want none", n)
	}
}

// TestClaimGuardKubeletRestart: a claim that appears while
// nothing is held is seen at the next kubelet restart (the registration
// with the new kubelet asks once), even one that comes before the
// registration with the first kubelet was answered.
func TestClaimGuardKubeletRestart(t *testing.T) {
	g := runGuarded(t, time.Hour, false)
	if u := g.first(t); u.Healthy() != 3 {
		t.Fatalf("first answer: %s", health(u))
	}
	g.pr.Set(claimPod("c1", byCDI("sim-2", "k8s.example.com/sim=sim-node1-2")))
	if _, err := g.k.Restart(); err != nil {
		t.Fatal(err)
	}
	reg, err := g.k.WaitRegistration(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, updates := testutil.Watch(context.Background(), t, g.dir, reg.Request.Endpoint)
	if _, err := kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool {
		return u.Health("sim-node1-2") == pluginapi.Unhealthy && u.Healthy() == 2
	}); err != nil {
		t.Fatal(err)
	}
}

// TestClaimGuardSettlesAfterRegistration: the kubelet serves
// PodResources before it has its pods back after a restart (the server
// starts beside the pod sync, and a pod's claims are listed once the pod
// manager has the pod), so an empty answer right after a registration
// does not mean no claim holds a device: the guard keeps asking for a
// while after each registration, and a claim listed then makes its
// device Unhealthy with no other registration.
func TestClaimGuardSettlesAfterRegistration(t *testing.T) {
	g := runGuarded(t, 50*time.Millisecond, false)
	if u := g.first(t); u.Healthy() != 3 {
		t.Fatalf("first answer: %s", health(u))
	}
	if _, err := g.k.Restart(); err != nil {
		t.Fatal(err)
	}
	reg, err := g.k.WaitRegistration(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	calls := g.pr.Calls()
	deadline := time.Now().Add(5 * time.Second)
	for g.pr.Calls() == calls && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// The pods come back into the kubelet's pod manager after its
	// PodResources answered empty.
	time.Sleep(200 * time.Millisecond)
	g.pr.Set(claimPod("c1", byCDI("sim-2", "k8s.example.com/sim=sim-node1-2")))
	_, updates := testutil.Watch(context.Background(), t, g.dir, reg.Request.Endpoint)
	if _, err := kubeletsim.WaitFor(updates, 5*time.Second, func(u kubeletsim.Update) bool {
		return u.Health("sim-node1-2") == pluginapi.Unhealthy && u.Healthy() == 2
	}); err != nil {
		t.Fatalf("a claim the kubelet lists after its empty answer at registration: %v", err)
	}
}

// TestClaimGuardWithoutPodResources: without
// the PodResources socket the resource starts and fails closed: no device
// is advertised Healthy; the guard says once that held devices are not
// recognised, however often it asks, and once that PodResources answers
// again, when it does; what it found held stays so while it does not
// answer.
func TestClaimGuardWithoutPodResources(t *testing.T) {
	g := runGuarded(t, 10*time.Millisecond, true)
	if u := g.first(t); u.Healthy() != 0 || len(u.Devices) != 3 {
		t.Fatalf("first answer: %s", health(u))
	}

	logger, hook := logtest.NewNullLogger()
	sock := filepath.Join(testutil.ShortDir(t), "pod-resources.sock")
	src := simSource(t)
	guard := &ClaimGuard{Source: src, PodResources: podresClient(t, sock), Log: logrus.NewEntry(logger), Match: testMatch(t)}
	said := func(msg string) int {
		n := 0
		for _, e := range hook.AllEntries() {
			if strings.Contains(e.Message, msg) {
				n++
			}
		}
		return n
	}
	ctx := context.Background()
	guard.Start(ctx)
	gated := guard.gate(src)
	if p := gated.Snapshot().Devices[0].Problem.String(); p != "dra_claim: not known whether a DRA claim holds it: PodResources has not answered yet" {
		t.Fatalf("before PodResources answered: %q", p)
	}
	guard.check(ctx)
	guard.check(ctx)
	if n := said("cannot tell which devices DRA claims hold"); n != 1 {
		t.Fatalf("said %d times that PodResources cannot tell, want once", n)
	}
	testutil.ServePodResources(t, sock, claimPod("c1", byCDI("sim-0", "k8s.example.com/sim=sim-node1-0")))
	guard.check(ctx)
	guard.check(ctx)
	if n := said("PodResources answers again"); n != 1 {
		t.Fatalf("said %d times that PodResources answers again, want once", n)
	}
	if p := src.Refresh().Devices[0].Problem; p.Cause != device.CauseHeldByDRA {
		t.Fatalf("held once PodResources answers: %+v", p)
	}
	if snap := gated.Snapshot(); snap.Devices[0].Problem.Message != "held by DRA claim ns/c1" || !snap.Devices[1].Healthy {
		t.Fatalf("published once PodResources answers: %+v", snap.Devices)
	}
	// Gone again: what was held stays held, and the outage is said.
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	guard.check(ctx)
	if p := src.Refresh().Devices[0].Problem; p.Cause != device.CauseHeldByDRA {
		t.Fatalf("released while PodResources does not answer: %+v", p)
	}
	if n := said("cannot tell which devices DRA claims hold"); n != 2 {
		t.Fatalf("said %d times that PodResources cannot tell, want once per outage", n)
	}
}

// TestClaimGuardPodResourcesLate: PodResources comes up
// 100 ms after the resource started, with a DRA claim on sim-node1-0. The
// guard fails closed until its first answer: no device is advertised
// Healthy before it (each is Unhealthy for dra_claim), and it asks again,
// with a backoff, until PodResources answers: soon after, sim-node1-0 is
// Unhealthy and the others Healthy. sim-node1-0 is never advertised
// Healthy on the way, so the kubelet cannot give it to a second pod.
func TestClaimGuardPodResourcesLate(t *testing.T) {
	const late = 100 * time.Millisecond
	g := runGuarded(t, time.Hour, true)
	var seen []string // what ListAndWatch showed, in order
	check := func(u kubeletsim.Update, servedAt time.Time) {
		t.Helper()
		seen = append(seen, health(u))
		if h := u.Health("sim-node1-0"); h != pluginapi.Unhealthy {
			t.Fatalf("sim-node1-0 advertised %s, which a DRA claim holds; ListAndWatch showed:\n%s", h, strings.Join(seen, "\n"))
		}
		if servedAt.IsZero() && u.Healthy() > 0 {
			t.Fatalf("a device advertised Healthy before PodResources answered; ListAndWatch showed:\n%s", strings.Join(seen, "\n"))
		}
	}
	check(g.first(t), time.Time{})
	// PodResources comes up late: not before the first answer and not
	// before 100 ms after the start.
	time.Sleep(time.Until(g.started.Add(late)))
	for len(g.updates) > 0 {
		check(<-g.updates, time.Time{})
	}
	pr, err := kubeletsim.ServePodResources(g.sock, claimPod("c1", byCDI("sim-0", "k8s.example.com/sim=sim-node1-0")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pr.Stop)
	served := time.Now()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case u := <-g.updates:
			check(u, served)
			if u.Healthy() != 2 {
				continue
			}
			if d := time.Since(served); d > 2*time.Second {
				t.Fatalf("the claim seen %v after PodResources came up", d)
			}
			if said := g.said("cannot tell which devices DRA claims hold"); said != 1 {
				t.Fatalf("said %d times that PodResources cannot tell, want once", said)
			}
			return
		case <-deadline:
			t.Fatalf("not sim-node1-0 alone held within 5s of PodResources coming up (%d List calls); ListAndWatch showed:\n%s",
				pr.Calls(), strings.Join(seen, "\n"))
		}
	}
}
