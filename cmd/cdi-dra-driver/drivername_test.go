package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// runOnce runs the driver with args on client. wait waits up to d for
// its exit status; stop cancels it and waits (an exit within 10 s).
func runOnce(t *testing.T, d dirs, client kubernetes.Interface, args ...string) (wait func(time.Duration) (int, bool), stderr *syncBuffer, stop func() int) {
	t.Helper()
	stderr = &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	code, finished := -1, make(chan struct{})
	go func() {
		defer close(finished)
		code = run(ctx, d.args(args...), envOf(map[string]string{"NODE_NAME": "n1"}), stderr,
			clientsOf(func(string) (kubernetes.Interface, error) { return client, nil }))
	}()
	wait = func(d time.Duration) (int, bool) {
		select {
		case <-finished:
			return code, true
		case <-time.After(d):
			return -1, false
		}
	}
	stop = func() int {
		t.Helper()
		cancel()
		c, ok := wait(10 * time.Second)
		if !ok {
			t.Error("no exit within 10s of the cancel")
		}
		return c
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Log(stderr.String())
		}
	})
	return wait, stderr, stop
}

// register registers with the driver's registration socket as driver and
// waits for its /readyz on addr (registered, slices published): a cancel
// then is a clean shutdown.
func register(t *testing.T, d dirs, driver, addr string) *kubeletsim.DRA {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	var kl *kubeletsim.DRA
	for kl == nil {
		var err error
		if kl, err = kubeletsim.RegisterDRA(context.Background(), filepath.Join(d.kubelet, "reg", driver+"-reg.sock")); err == nil {
			t.Cleanup(func() { _ = kl.Close() })
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no registration as %s within 10s: %v", driver, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for {
		res, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return kl
			}
		}
		if time.Now().After(end) {
			t.Fatalf("%s not ready within 10s: %v", driver, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDriverNameChangeRefused: the default driver name
// is the first published resource's; reordering the resources renames the
// driver. A driver that starts under another name than the one its
// checkpoint's prepared claims were prepared by refuses to start, with a
// message saying what to do; started with --driver-name <old> it serves
// and unprepares those claims; once none is left the new name starts and
// takes the checkpoint over.
func TestDriverNameChangeRefused(t *testing.T) {
	testutil.NeedMknod(t)
	d := newDirs(t)
	testutil.ServePodResources(t, d.podres)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	write := func(first, second string) {
		t.Helper()
		body := "resources:\n"
		for _, r := range []string{first, second} {
			body += "- name: example.com/" + r + "\n  idPrefix: " + r + "\n  count: 2\n"
		}
		if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	client, err := fakeClient(&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default", UID: "uid-c"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "r", Driver: "aaa.example.com", Pool: "n1", Device: "aaa-1"}}}}}})("")
	if err != nil {
		t.Fatal(err)
	}
	claim := &drav1.Claim{Namespace: "default", Name: "c", Uid: "uid-c"}

	write("aaa", "bbb")
	addr := freePort(t)
	_, _, stop := runOnce(t, d, client, "--config", cfg, "--metrics-address", addr)
	kl := register(t, d, "aaa.example.com", addr)
	resp, err := kl.Prepare(context.Background(), claim)
	if err != nil || resp.Claims["uid-c"].GetError() != "" {
		t.Fatalf("prepare as aaa.example.com: %v %v", resp, err)
	}
	if code := stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}

	// Reordered: the default name is bbb.example.com now.
	write("bbb", "aaa")
	wait, stderr, _ := runOnce(t, d, client, "--config", cfg)
	code, exited := wait(10 * time.Second)
	if !exited {
		t.Fatalf("started as bbb.example.com while claims of aaa.example.com are prepared:\n%s", stderr.String())
	}
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	for _, want := range []string{`aaa.example.com`, `bbb.example.com`, `--driver-name aaa.example.com`, "default/c"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, stderr.String())
		}
	}
	if _, err := os.Stat(filepath.Join(d.kubelet, "reg", "bbb.example.com-reg.sock")); err == nil {
		t.Error("registered as bbb.example.com")
	}

	// As told: the old name serves the claim until it is unprepared.
	addr = freePort(t)
	_, _, stop = runOnce(t, d, client, "--config", cfg, "--driver-name", "aaa.example.com", "--metrics-address", addr)
	kl = register(t, d, "aaa.example.com", addr)
	if un, err := kl.Unprepare(context.Background(), claim); err != nil || un.Claims["uid-c"].GetError() != "" {
		t.Fatalf("unprepare as aaa.example.com: %v %v", un, err)
	}
	if code := stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}

	// No claim left: the new default name starts.
	addr = freePort(t)
	_, _, stop = runOnce(t, d, client, "--config", cfg, "--metrics-address", addr)
	register(t, d, "bbb.example.com", addr)
	if code := stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}
}
