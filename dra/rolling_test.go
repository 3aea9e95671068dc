package dra

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestRollingUpdate: two instances of the driver on one node, the new one
// started while the old one serves (Options.RollingUpdateUID: sockets of
// their own), share the claims: a claim one prepared is unprepared
// through the other, its device reset; the first then prepares the device
// for another claim, having read what the second saved. The old instance
// that stops while the new one serves leaves the devices untainted: they
// stay schedulable through the rollout.
func TestRollingUpdate(t *testing.T) {
	h := newHarness(t, nil)
	h.podUID = "pod-old"
	h.start()
	oldKL, oldCancel, oldDone := h.kl, h.cancel, h.done
	h.cancel = nil // the harness stops the new one
	stopOld := func() {
		if oldCancel == nil {
			return
		}
		oldCancel()
		if err := <-oldDone; err != nil {
			t.Errorf("old instance: %v", err)
		}
		_ = oldKL.Close()
		oldCancel = nil
	}
	t.Cleanup(stopOld)
	c1 := h.claim("c1", "sim-0")
	if r := h.prepare(c1)[c1.Uid]; r.Error != "" {
		t.Fatal(r.Error)
	}
	before := h.deviceState("sim-n1-0").ResetCount

	h.podUID = "pod-new"
	h.start()
	newKL := h.kl
	if r := h.unprepare(c1)[c1.Uid]; r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	if n := h.deviceState("sim-n1-0").ResetCount - before; n != 1 {
		t.Fatalf("the new instance's Unprepare of a claim the old one prepared reset the device %d times, want 1", n)
	}
	if _, ok := h.checkpointed()[types.UID(c1.Uid)]; ok {
		t.Fatal("c1 still checkpointed after the new instance unprepared it")
	}
	h.kl = oldKL
	c2 := h.claim("c2", "sim-0")
	if r := h.prepare(c2)[c2.Uid]; r.Error != "" {
		t.Fatalf("the old instance, preparing the device the new one released: %s", r.Error)
	}
	h.kl = newKL
	stopOld()
	for name, d := range h.published() {
		if hasTaint(d, TaintHandover) {
			t.Errorf("%s tainted once the old instance stopped while the new one serves", name)
		}
	}
}

// TestDeadInstanceSockets: an instance started in a rolling update
// removes the sockets an instance killed without grace left (nobody
// accepts on them: the kubelet's plugin watcher would keep trying the
// registration one), and leaves a live instance's.
func TestDeadInstanceSockets(t *testing.T) {
	h := newHarness(t, nil)
	drv := filepath.Join(h.plugins, testDriver)
	for _, dir := range []string{h.registrar, drv} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	dead := []string{filepath.Join(h.registrar, testDriver+"-pod-dead-reg.sock"), filepath.Join(drv, "dra-pod-dead.sock")}
	for _, p := range dead {
		l, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		_ = l.Close()
	}
	live := filepath.Join(h.registrar, testDriver+"-pod-live-reg.sock")
	l, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h.podUID = "pod-new"
	h.start()
	for _, p := range dead {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a dead instance's socket %s left: %v", p, err)
		}
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("a live instance's socket removed: %v", err)
	}
}

// slowRegistrar answers GetInfo with driver's name after delay, as a new
// instance busy with its start on a loaded node does.
type slowRegistrar struct {
	registerapi.UnimplementedRegistrationServer
	driver string
	delay  time.Duration
}

func (s *slowRegistrar) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: s.driver}, nil
}

// TestOtherInstanceSlow: the old instance that stops while the new one,
// registered, is slow to answer (a rollout of a busy node: in a 100-node
// fleet replaced at once, 2 cores, GetInfo took over a second) still
// finds it serving, and leaves the devices untainted; a socket nobody
// serves is no instance, found at once.
func TestOtherInstanceSlow(t *testing.T) {
	dir := testutil.ShortDir(t)
	sock := filepath.Join(dir, kubeletplugin.RollingUpdateRegistrarSocketFile(dir, testDriver, "pod-new"))
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, &slowRegistrar{driver: testDriver, delay: 1500 * time.Millisecond})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	if !otherInstanceServes(dir, testDriver, "pod-old") {
		t.Error("the new instance, answering GetInfo after 1.5 s, not found")
	}
	srv.Stop()
	<-done
	l2, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l2.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = l2.Close()
	start := time.Now()
	if otherInstanceServes(dir, testDriver, "pod-old") {
		t.Error("a socket nobody serves taken for an instance")
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("a socket nobody serves took %s to rule out", took)
	}
}
