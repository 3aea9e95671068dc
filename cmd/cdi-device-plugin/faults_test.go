package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeletsim"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// faultClient talks HTTP to the fault control socket at sock, as curl
// --unix-socket does.
func faultClient(t *testing.T, sock string) func(method, path, body string) (int, string) {
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	return func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://localhost"+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
}

// TestFaultControl: with --fault-control, a configured lost fault makes
// its device Unhealthy on ListAndWatch from the first update; a fault injected
// through the socket (mode 0600) makes another Unhealthy, and clearing
// both makes them Healthy again, without a restart. Without the flag
// there is no socket.
func TestFaultControl(t *testing.T) {
	testutil.NeedMknod(t)
	d := newDirs(t)
	cfg := writeConfig(t, "resources:\n- name: example.com/sim\n  idPrefix: sim\n  count: 3\n"+
		"  faults: [{kind: lost, devices: [2], trigger: {atStart: true}}]\n")
	r := startRun(t, d, []string{"--config", cfg, "--fault-control=true"}, nil)
	health := func(want map[string]string) {
		t.Helper()
		if _, err := r.wait(5*time.Second, func(u kubeletsim.Update) bool {
			for _, dv := range u.Devices {
				if w, ok := want[dv.ID]; ok && dv.Health != w {
					return false
				}
			}
			return true
		}); err != nil {
			t.Fatalf("%v; log:\n%s", err, r.stderr.String())
		}
	}
	first, err := r.wait(5*time.Second, func(u kubeletsim.Update) bool { return len(u.Devices) == 3 })
	if err != nil {
		t.Fatal(err)
	}
	for _, dv := range first.Devices {
		if dv.ID == "sim-2" && dv.Health != pluginapi.Unhealthy {
			t.Errorf("the first update lists sim-2 %s: a fault at start must be there from the first publication", dv.Health)
		}
	}
	health(map[string]string{"sim-0": pluginapi.Healthy, "sim-1": pluginapi.Healthy, "sim-2": pluginapi.Unhealthy})
	sock := filepath.Join(d.state, "cdi-device-plugin-faults.sock")
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control socket: %v %v", fi, err)
	}
	do := faultClient(t, sock)
	if code, body := do("POST", "/faults", `{"device": "sim-0", "fault": {"kind": "unhealthy", "reason": "ECC error"}}`); code != http.StatusOK {
		t.Fatalf("inject: %d %s", code, body)
	}
	health(map[string]string{"sim-0": pluginapi.Unhealthy, "sim-1": pluginapi.Healthy, "sim-2": pluginapi.Unhealthy})
	for _, dev := range []string{"sim-0", "sim-2"} {
		if code, body := do("DELETE", "/faults?device="+dev, ""); code != http.StatusOK {
			t.Fatalf("clear %s: %d %s", dev, code, body)
		}
	}
	health(map[string]string{"sim-0": pluginapi.Healthy, "sim-1": pluginapi.Healthy, "sim-2": pluginapi.Healthy})
	if log := r.stderr.String(); !strings.Contains(log, "fault control request") || !strings.Contains(log, "device=sim-0") {
		t.Errorf("the requests are not logged:\n%s", log)
	}
}

// TestFaultControlOff: without --fault-control there is no socket.
func TestFaultControlOff(t *testing.T) {
	testutil.NeedMknod(t)
	d := newDirs(t)
	startRun(t, d, nil, map[string]string{"NUMBER_DEVICES": "1"})
	if _, err := os.Stat(filepath.Join(d.state, "cdi-device-plugin-faults.sock")); !os.IsNotExist(err) {
		t.Fatalf("control socket without the flag: %v", err)
	}
}
