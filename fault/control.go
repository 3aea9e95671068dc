package fault

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
)

// SocketName is the control socket's name in the state directory, per
// binary (cmd): the device plugin and the DRA driver may share one state
// directory.
func SocketName(cmd config.Command) string { return string(cmd) + "-faults.sock" }

// Control injects and clears faults at run time, over HTTP on a unix
// socket (Listen): GET /faults lists the faults on, POST /faults
// {"device": ..., "fault": {...}} injects one, DELETE /faults?device=...
// clears a device's. Every request is logged and counted; a control that
// is not Enabled refuses them all.
type Control struct {
	Enabled bool
	// Injectors are the running resources' injectors.
	Injectors func() []*Injector
	Log       *logrus.Entry
	Metrics   *metrics.Metrics
}

// Listen opens the control socket at path, mode 0600 (root's alone: it
// makes devices fail). A socket left there by an earlier run is replaced;
// anything else in its place is an error.
func Listen(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("fault control socket %s: exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("fault control socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("fault control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("fault control socket: %w", err)
	}
	return ln, nil
}

// Serve answers on ln until ctx is done.
func (c *Control) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 5 * time.Second}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	err := srv.Serve(ln)
	<-stopped
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// request is the body of a POST.
type request struct {
	Device string       `json:"device"`
	Fault  config.Fault `json:"fault"`
}

func (c *Control) log() *logrus.Entry {
	if c.Log == nil {
		return logs.Discard()
	}
	return c.Log
}

// ServeHTTP answers one request.
func (c *Control) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	action := map[string]string{http.MethodGet: "list", http.MethodPost: "inject", http.MethodDelete: "clear"}[r.Method]
	log := c.log().WithField("action", action).WithField("method", r.Method).WithField("path", r.URL.Path)
	status, body, dev := c.answer(r, action)
	result := "ok"
	switch {
	case status == http.StatusForbidden:
		result = "refused"
	case status >= 400:
		result = "error"
	}
	c.Metrics.FaultControl(action, result)
	log = log.WithField("device", dev).WithField("status", status).WithField("result", result)
	if status >= 400 {
		log.WithField("error", body).Warn("fault control request refused")
	} else {
		log.Warn("fault control request")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// answer is the status, the body and the device of a request.
func (c *Control) answer(r *http.Request, action string) (int, any, string) {
	if !c.Enabled {
		return http.StatusForbidden, "fault control is disabled: start the binary with --fault-control=true (or FAULT_CONTROL=true)", ""
	}
	if r.URL.Path != "/faults" || action == "" {
		return http.StatusNotFound, "use GET /faults, POST /faults {\"device\": ..., \"fault\": {...}}, DELETE /faults?device=...", ""
	}
	switch action {
	case "list":
		var all []Active
		for _, in := range c.Injectors() {
			all = append(all, in.List()...)
		}
		return http.StatusOK, all, ""
	case "clear":
		dev := r.URL.Query().Get("device")
		in := c.owner(dev)
		if in == nil {
			return http.StatusNotFound, fmt.Sprintf("no such device %q", dev), dev
		}
		return errStatus(in.Clear(dev), "cleared", dev)
	}
	var req request
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return http.StatusBadRequest, "bad request: " + err.Error(), ""
	}
	in := c.owner(req.Device)
	if in == nil {
		return http.StatusNotFound, fmt.Sprintf("no such device %q", req.Device), req.Device
	}
	return errStatus(in.Inject(req.Device, req.Fault), "injected "+string(req.Fault.Kind), req.Device)
}

// owner is the injector of the resource that has device dev.
func (c *Control) owner(dev string) *Injector {
	for _, in := range c.Injectors() {
		if in.Has(dev) {
			return in
		}
	}
	return nil
}

func errStatus(err error, ok, dev string) (int, any, string) {
	switch {
	case err == nil:
		return http.StatusOK, ok, dev
	case errors.Is(err, ErrNoDevice):
		return http.StatusNotFound, err.Error(), dev
	}
	return http.StatusBadRequest, err.Error(), dev
}

// Open opens the control socket of binary cmd in stateDir, logging where
// it listens, and returns what serves it until its context is done.
func Open(stateDir string, cmd config.Command, injectors func() []*Injector, log *logrus.Entry, m *metrics.Metrics) (func(context.Context) error, error) {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, fmt.Errorf("fault control: %w", err)
	}
	path := filepath.Join(stateDir, SocketName(cmd))
	ln, err := Listen(path)
	if err != nil {
		return nil, err
	}
	log.WithField("socket", path).Warn("fault control on: simulated devices fail when asked (docs/simulation.md)")
	c := &Control{Enabled: true, Injectors: injectors, Log: log.WithField("component", "fault-control"), Metrics: m}
	return func(ctx context.Context) error { return c.Serve(ctx, ln) }, nil
}
