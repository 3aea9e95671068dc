package fault

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
)

// controlClient is an HTTP client of the control socket at sock.
func controlClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
}

func do(t *testing.T, c *http.Client, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://control"+path, strings.NewReader(body))
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

// serveControl serves ctl on a real unix socket in a temp dir.
func serveControl(t *testing.T, ctl *Control) (string, *http.Client) {
	t.Helper()
	dir, err := os.MkdirTemp("", "fc") // short: a socket path is at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "faults.sock")
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	goRun(t, func(ctx context.Context) error { return ctl.Serve(ctx, ln) })
	return sock, controlClient(sock)
}

// TestControlSocketMode: the socket is the owner's alone (0600), and a
// stale one left by a killed run is replaced.
func TestControlSocketMode(t *testing.T) {
	inj, _, _ := newInjector(t, 0)
	sock, _ := serveControl(t, &Control{Enabled: true, Injectors: func() []*Injector { return []*Injector{inj} }})
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want a socket of mode 0600", fi.Mode())
	}
	ln, err := Listen(sock) // the first is still there: taken over
	if err != nil {
		t.Fatalf("listening again on a stale socket: %v", err)
	}
	ln.Close()
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(sock); err == nil {
		t.Fatal("a regular file in the socket's place was removed")
	}
}

// TestControlDisabled: a control that is not enabled refuses every
// request, saying how to enable it, and injects nothing.
func TestControlDisabled(t *testing.T) {
	inj, _, a := newInjector(t, 0)
	m := metrics.New("test")
	_, c := serveControl(t, &Control{Injectors: func() []*Injector { return []*Injector{inj} }, Metrics: m})
	code, body := do(t, c, "POST", "/faults", `{"device": "sim-0", "fault": {"kind": "lost"}}`)
	if code != http.StatusForbidden || !strings.Contains(body, "--fault-control") {
		t.Fatalf("%d %q, want 403 naming --fault-control", code, body)
	}
	if got := a.get("sim-0"); !got.None() {
		t.Fatalf("injected while disabled: %+v", got)
	}
	if n := counterValue(t, m, "cdi_device_plugin_fault_control_requests_total"); n != 1 {
		t.Fatalf("%v requests counted, want 1", n)
	}
}

// TestControlInjectListClear: inject a fault on one device, list it, clear
// it; a bad request says what is wrong.
func TestControlInjectListClear(t *testing.T) {
	inj, _, a := newInjector(t, 0)
	m := metrics.New("test")
	inj.o.Metrics = m
	_, c := serveControl(t, &Control{Enabled: true, Injectors: func() []*Injector { return []*Injector{inj} }, Metrics: m})
	code, body := do(t, c, "POST", "/faults", `{"device": "sim-2", "fault": {"kind": "unhealthy", "reason": "ECC error"}}`)
	if code != http.StatusOK || a.get("sim-2") != eccProblem {
		t.Fatalf("inject: %d %q; applied %+v", code, body, a.get("sim-2"))
	}
	code, body = do(t, c, "GET", "/faults", "")
	var list []Active
	if err := json.Unmarshal([]byte(body), &list); code != http.StatusOK || err != nil || len(list) != 1 || list[0].Device != "sim-2" || list[0].Fault.Kind != config.FaultUnhealthy {
		t.Fatalf("list: %d %q", code, body)
	}
	for _, c2 := range []struct{ body, want string }{
		{`{"device": "sim-9", "fault": {"kind": "lost"}}`, "no such device"},
		{`{"device": "sim-0", "fault": {"kind": "melted"}}`, `must be one of lost`},
		{`{"device": "sim-0", "fault": {"kind": "lost", "trigger": {"atStart": true}}}`, "starts at once"},
		{`{"device": "sim-0"`, "bad request"},
	} {
		if code, body := do(t, c, "POST", "/faults", c2.body); code != http.StatusBadRequest && code != http.StatusNotFound || !strings.Contains(body, c2.want) {
			t.Errorf("%s: %d %q, want an error saying %q", c2.body, code, body, c2.want)
		}
	}
	if code, body := do(t, c, "DELETE", "/faults?device=sim-2", ""); code != http.StatusOK || !a.get("sim-2").None() {
		t.Fatalf("clear: %d %q; applied %+v", code, body, a.get("sim-2"))
	}
	if n := counterValue(t, m, "cdi_device_plugin_injected_faults_total"); n != 1 {
		t.Fatalf("%v injected faults counted, want 1", n)
	}
}

// counterValue sums the counter's series in m.
func counterValue(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, s := range mf.GetMetric() {
				sum += s.GetCounter().GetValue()
			}
		}
	}
	return sum
}
