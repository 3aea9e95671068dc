package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/fault"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/inotify"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
	"github.com/cdi-device-plugin/cdi-device-plugin/podresources"
)

// supervisor runs the configured resources, each under its own context,
// and applies a new configuration by stopping and starting only the
// resources that changed. Its fields are used by the goroutine that runs
// serve's loop, but served (the resource names, for the metrics) and the
// probes' checks, which are published atomically.
type supervisor struct {
	logger  *logrus.Logger
	log     *logrus.Entry
	metrics *metrics.Metrics
	server  *metrics.Server // nil: no metrics address
	writer  *cdi.Writer
	// owners is the registry of host node owners every resource shares.
	owners *device.Owners
	start  int64
	// driverName is the DRA driver's name (--driver-name; empty: its
	// default), for the claim guards.
	driverName string
	// registered is called after every registration of a resource.
	registered func()
	// podres is the kubelet's PodResources, one client for the process:
	// the metrics and every resource's claim guard and recovery ask it
	// (podResourcesSocket changes only with a restart).
	podres *podresources.Client

	cfg     *config.Config
	running map[string]*instance
	served  atomic.Pointer[[]string]
	// faults are the served resources' fault injectors (the control's).
	faults atomic.Pointer[[]*fault.Injector]

	wg     sync.WaitGroup
	failed chan error // a resource failed: the process ends
}

// instance is one running resource.
type instance struct {
	rc     config.Resource
	part   *part
	cancel context.CancelFunc
	done   chan struct{}
}

func newSupervisor(logger *logrus.Logger, log *logrus.Entry, m *metrics.Metrics, server *metrics.Server, writer *cdi.Writer, start int64) *supervisor {
	s := &supervisor{logger: logger, log: log, metrics: m, server: server, writer: writer, owners: device.NewOwners(log), start: start,
		running: map[string]*instance{}, failed: make(chan error, 1)}
	s.served.Store(&[]string{})
	s.faults.Store(&[]*fault.Injector{})
	return s
}

// servedResources lists the resources served now (safe from any goroutine).
func (s *supervisor) servedResources() []string { return *s.served.Load() }

// injectors lists the served resources' fault injectors (safe from any
// goroutine).
func (s *supervisor) injectors() []*fault.Injector { return *s.faults.Load() }

// ErrNeedsRestart is returned by apply for a change it cannot make while
// running.
var ErrNeedsRestart = errors.New("needs a restart of the plugin")

// restartOnly lists the settings that a reload cannot change.
func restartOnly(a, b *config.Config) error {
	for _, f := range []struct{ name, old, cur string }{
		{"pluginName", a.PluginName, b.PluginName}, {"devicePluginDir", a.DevicePluginDir, b.DevicePluginDir},
		{"cdiDir", a.CDIDir, b.CDIDir}, {"devRoot", a.DevRoot, b.DevRoot}, {"stateDir", a.StateDir, b.StateDir},
		{"nodeName", a.NodeName, b.NodeName}, {"metricsAddress", a.MetricsAddress, b.MetricsAddress},
		{"podResourcesSocket", a.PodResourcesSocket, b.PodResourcesSocket},
		{"sysRoot", a.SysRoot, b.SysRoot}, {"procRoot", a.ProcRoot, b.ProcRoot},
	} {
		if f.old != f.cur {
			return fmt.Errorf("%s %q -> %q: %w", f.name, f.old, f.cur, ErrNeedsRestart)
		}
	}
	return nil
}

// change is what apply did.
type change struct{ added, removed, restarted []string }

func (c change) empty() bool { return len(c.added)+len(c.removed)+len(c.restarted) == 0 }

// apply makes the running resources those of next. Every new and changed
// resource is built first (no disk is touched), and the new ones are
// prepared, so a configuration that fails there changes nothing. A changed
// resource's replacement is prepared only once its old part has stopped,
// its handlers ended: two parts never prepare one device, or save one
// registry, at once. If a replacement fails to prepare, the reload is
// refused and the old parts stopped for it are started again. Then the
// removed resources are stopped, the new and changed ones started, and the
// specs of removed resources removed. Unchanged resources keep running.
func (s *supervisor) apply(ctx context.Context, next *config.Config) (ch change, err error) {
	if s.cfg != nil {
		if err := restartOnly(s.cfg, next); err != nil {
			return ch, err
		}
	}
	strategiesChanged := s.cfg != nil && !slices.Equal(s.cfg.DeviceListStrategy, next.DeviceListStrategy)
	wanted := map[string]bool{}
	var parts []*part
	// Parts prepared but not run (a refused reload) let go of the host
	// nodes their first scan claimed.
	defer func() {
		if err != nil {
			for _, p := range parts {
				p.Source.Close()
			}
		}
	}()
	var kinds []cdi.Kind
	for i := range next.Resources {
		rc := &next.Resources[i]
		wanted[rc.Name] = true
		old, ok := s.running[rc.Name]
		if ok && !strategiesChanged && reflect.DeepEqual(old.rc, *rc) {
			kinds = append(kinds, old.part.kind)
			continue
		}
		p, err := build(next, i, s.writer, s.owners, time.Now().UnixNano(), s.log, s.metrics, s.podres, s.driverName, s.registered)
		if err != nil {
			return ch, err
		}
		parts = append(parts, p)
		kinds = append(kinds, p.kind)
		if ok {
			ch.restarted = append(ch.restarted, rc.Name)
		} else {
			ch.added = append(ch.added, rc.Name)
		}
	}
	restarted := map[string]bool{}
	for _, name := range ch.restarted {
		restarted[name] = true
	}
	for _, p := range parts {
		if restarted[p.name] {
			continue
		}
		if err := p.prepare(); err != nil {
			return ch, err
		}
	}
	var stopped []string
	for _, p := range parts {
		if !restarted[p.name] {
			continue
		}
		s.stop(p.name)
		stopped = append(stopped, p.name)
		if err := p.prepare(); err != nil {
			for _, name := range stopped {
				s.restore(ctx, name)
			}
			s.publish()
			return ch, err
		}
	}
	for name := range s.running {
		if !wanted[name] {
			ch.removed = append(ch.removed, name)
		}
	}
	sort.Strings(ch.removed)
	for _, name := range ch.removed {
		s.stop(name)
	}
	for _, name := range ch.removed {
		s.metrics.Forget(name)
	}
	for i := range next.Resources {
		for _, p := range parts {
			if p.name == next.Resources[i].Name {
				s.run(ctx, next.Resources[i], p)
			}
		}
	}
	removed, err := s.writer.RemoveStale(kinds)
	for _, p := range removed {
		s.log.WithField("spec", p).Info("removed the CDI spec of a resource no longer configured")
	}
	if err != nil {
		s.log.WithError(err).Warn("removing stale CDI specs")
	}
	logs.Apply(s.logger, next)
	s.cfg = next
	s.publish()
	return ch, nil
}

// run starts p under its own context; an error of its Run (not a stop)
// ends the process through s.failed.
func (s *supervisor) run(ctx context.Context, rc config.Resource, p *part) {
	ictx, cancel := context.WithCancel(ctx)
	in := &instance{rc: rc, part: p, cancel: cancel, done: make(chan struct{})}
	s.running[rc.Name] = in
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(in.done)
		if err := p.resource.Run(ictx); err != nil && ictx.Err() == nil {
			select {
			case s.failed <- fmt.Errorf("%s: %w", rc.Name, err):
			default:
			}
		}
	}()
}

// stop stops a running resource and waits for it (its handlers too).
func (s *supervisor) stop(name string) {
	in := s.running[name]
	if in == nil {
		return
	}
	in.cancel()
	<-in.done
	delete(s.running, name)
	s.log.WithField("resource", name).Info("resource stopped")
}

// restore starts again, with the running configuration, a resource that
// apply stopped for a replacement that then failed to prepare. If that
// fails too, the process ends (through s.failed): nothing else would bring
// the resource back.
func (s *supervisor) restore(ctx context.Context, name string) {
	i := slices.IndexFunc(s.cfg.Resources, func(rc config.Resource) bool { return rc.Name == name })
	if i < 0 {
		return
	}
	p, err := build(s.cfg, i, s.writer, s.owners, time.Now().UnixNano(), s.log, s.metrics, s.podres, s.driverName, s.registered)
	if err == nil {
		if err = p.prepare(); err != nil {
			p.Source.Close()
		}
	}
	if err != nil {
		s.log.WithError(err).WithField("resource", name).Error("restarting a resource with its running configuration failed")
		select {
		case s.failed <- fmt.Errorf("%s: restoring after a refused reload: %w", name, err):
		default:
		}
		return
	}
	s.run(ctx, s.cfg.Resources[i], p)
	s.log.WithField("resource", name).Info("resource restarted with its running configuration")
}

// stopAll stops every resource and waits for them.
func (s *supervisor) stopAll() {
	for name := range s.running {
		s.running[name].cancel()
	}
	s.wg.Wait()
	clear(s.running)
}

// publish hands the served resources to the metrics and their checks to
// the probes.
func (s *supervisor) publish() {
	names := make([]string, 0, len(s.running))
	faults := make([]*fault.Injector, 0, len(s.running))
	live, ready := map[string]metrics.Check{}, map[string]metrics.Check{}
	for name, in := range s.running {
		names = append(names, name)
		faults = append(faults, in.part.Faults)
		r := in.part.resource
		live[name] = r.Alive
		ready[name] = func(context.Context) error { return r.Ready() }
	}
	sort.Strings(names)
	s.served.Store(&names)
	s.faults.Store(&faults)
	if s.server != nil {
		s.server.SetChecks(live, ready)
	}
}

// reload loads the configuration again and applies it; a configuration
// that does not load, build or prepare is refused, and the running one
// stays.
func (s *supervisor) reload(ctx context.Context, load func() (*config.Config, error)) {
	next, err := load()
	if err == nil {
		var ch change
		ch, err = s.apply(ctx, next)
		if err == nil {
			if ch.empty() {
				s.metrics.Reload("unchanged")
				s.log.Debug("configuration file changed; nothing to apply")
				return
			}
			s.metrics.Reload("applied")
			s.log.WithField("added", strings.Join(ch.added, ",")).WithField("removed", strings.Join(ch.removed, ",")).
				WithField("restarted", strings.Join(ch.restarted, ",")).Info("configuration reloaded")
			return
		}
	}
	s.metrics.Reload("refused")
	s.log.WithError(err).Error("configuration reload refused; the running configuration stays")
}

// watchConfig signals reloads (latest wins) when the configuration file
// may have changed: it watches the file's directory, where a mounted
// ConfigMap changes by swapping a symlink, and waits for 200 ms of quiet
// so that a change is seen whole.
func watchConfig(ctx context.Context, path string, reloads chan<- struct{}) error {
	dir := filepath.Dir(path)
	w, err := inotify.Watch(ctx, inotify.EntryChanges|unix.IN_CLOSE_WRITE, dir)
	if err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	defer w.Close()
	quiet := time.NewTimer(0)
	quiet.Stop()
	defer quiet.Stop()
	for {
		select {
		case _, ok := <-w.Events():
			if !ok {
				if err := w.Err(); err != nil {
					return fmt.Errorf("watching %s: %w", dir, err)
				}
				return nil
			}
			quiet.Reset(200 * time.Millisecond)
		case <-quiet.C:
			select {
			case reloads <- struct{}{}:
			default:
			}
		}
	}
}
