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

	resourceapi "k8s.io/api/resource/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestFaultTaints: with --fault-control, a lost fault injected through
// the driver's socket with noExecute taints its device NoExecute in the
// ResourceSlice (the cause missing, as a real lost device), an unhealthy
// one NoSchedule (injected); cleared, the taints go, without a restart.
func TestFaultTaints(t *testing.T) {
	testutil.NeedMknod(t)
	d := newDirs(t)
	testutil.ServePodResources(t, d.podres)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("resources:\n- name: example.com/a\n  idPrefix: a\n  count: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startDriver(t, d, "a.example.com", "--config", cfg, "--fault-control=true")
	taint := func(dev resourceapi.Device) string {
		for _, tn := range dev.Taints {
			if tn.Key == "a.example.com/unhealthy" {
				return string(tn.Effect) + "/" + tn.Value
			}
		}
		return ""
	}
	s.waitFor(t, "a-0..2 published untainted", func(p map[string]resourceapi.Device) bool {
		return p["a.example.com a-2"].Name != "" && taint(p["a.example.com a-0"])+taint(p["a.example.com a-1"])+taint(p["a.example.com a-2"]) == ""
	})
	sock := filepath.Join(d.state, "cdi-dra-driver-faults.sock")
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	do := func(method, path, body string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://localhost"+path, strings.NewReader(body))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
	}
	do("POST", "/faults", `{"device": "a-n1-0", "fault": {"kind": "lost", "noExecute": true}}`)
	do("POST", "/faults", `{"device": "a-n1-1", "fault": {"kind": "unhealthy", "reason": "ECC error"}}`)
	s.waitFor(t, "a-0 NoExecute/missing, a-1 NoSchedule/injected", func(p map[string]resourceapi.Device) bool {
		return taint(p["a.example.com a-0"]) == "NoExecute/missing" && taint(p["a.example.com a-1"]) == "NoSchedule/injected" && taint(p["a.example.com a-2"]) == ""
	})
	do("DELETE", "/faults?device=a-n1-0", "")
	do("DELETE", "/faults?device=a-n1-1", "")
	s.waitFor(t, "the taints gone", func(p map[string]resourceapi.Device) bool {
		return taint(p["a.example.com a-0"])+taint(p["a.example.com a-1"]) == ""
	})
}
