package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check is a probe of one part: nil when it is fine.
type Check func(ctx context.Context) error

// CheckTimeout bounds one probe's checks.
const CheckTimeout = 3 * time.Second

// Server serves /metrics, and the probes: /healthz (the process works:
// every check of liveness passes) and /readyz (every check of readiness
// passes). The checks can be replaced while it runs.
type Server struct {
	m      *Metrics
	checks atomic.Pointer[checkSet]
}

type checkSet struct{ live, ready map[string]Check }

// NewServer returns a server of m's metrics, with no checks yet.
func NewServer(m *Metrics) *Server {
	s := &Server{m: m}
	s.checks.Store(&checkSet{})
	return s
}

// SetChecks replaces the checks, by name.
func (s *Server) SetChecks(live, ready map[string]Check) {
	s.checks.Store(&checkSet{live: live, ready: ready})
}

// Handler is the server's HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.m.Registry(), promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { probe(w, r, s.checks.Load().live) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) { probe(w, r, s.checks.Load().ready) })
	return mux
}

// probe runs the checks in parallel; 200 "ok" when all pass, else 503 with
// a line per failed check.
func probe(w http.ResponseWriter, r *http.Request, checks map[string]Check) {
	ctx, cancel := context.WithTimeout(r.Context(), CheckTimeout)
	defer cancel()
	var (
		mu     sync.Mutex
		failed []string
		wg     sync.WaitGroup
	)
	for name, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c(ctx); err != nil {
				mu.Lock()
				failed = append(failed, name+": "+err.Error())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if len(failed) > 0 {
		sort.Strings(failed)
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, strings.Join(failed, "\n"))
		return
	}
	fmt.Fprintln(w, "ok")
}

// Serve serves on ln until ctx is done, then shuts down (closing ln).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
