package prestart

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// DefaultBudget is the time one PreStartContainer call may take: below the
// kubelet's 30 s limit, so our error, not the kubelet's timeout, reaches
// the user.
const DefaultBudget = 25 * time.Second

// DefaultStepTimeout bounds a step without its own timeout.
const DefaultStepTimeout = 10 * time.Second

// HealthReporter receives preparation faults (device.Source): a non-empty
// reason makes the device unhealthy, "" clears it.
type HealthReporter interface {
	SetFault(device, reason string)
}

// StepError says which device and step failed, and why.
type StepError struct {
	Device, Step string
	Err          error
}

func (e *StepError) Error() string {
	return fmt.Sprintf("device %s: step %s: %v", e.Device, e.Step, e.Err)
}

func (e *StepError) Unwrap() error { return e.Err }

// Options configure a Runner.
type Options struct {
	Resource string
	// StateRoot holds one directory per device: <StateRoot>/<device>.
	StateRoot string
	Steps     []Step
	// Budget bounds a whole call (default DefaultBudget).
	Budget time.Duration
	// MarkUnhealthy reports a device whose preparation failed as unhealthy.
	MarkUnhealthy bool
	// RecoverOnReset makes it healthy again after a later preparation that
	// succeeded and included a reset.
	RecoverOnReset bool
	Health         HealthReporter
	Log            *logrus.Entry
}

// Runner prepares the devices of one resource.
type Runner struct {
	opts  Options
	locks sync.Map // device name -> *sync.Mutex
}

// NewRunner returns a runner; it touches nothing on disk.
func NewRunner(o Options) *Runner {
	if o.Budget <= 0 {
		o.Budget = DefaultBudget
	}
	if o.Log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		o.Log = logrus.NewEntry(l)
	}
	return &Runner{opts: o}
}

// HasSteps reports whether PreStartContainer is needed.
func (r *Runner) HasSteps() bool { return len(r.opts.Steps) > 0 }

// Dir is the state directory of a device.
func (r *Runner) Dir(name string) string { return filepath.Join(r.opts.StateRoot, name) }

// Init creates the state directory of every device and returns the faults
// recorded by an earlier run (devices whose last preparation failed), so
// health survives plugin restarts.
func (r *Runner) Init(snap *device.Snapshot) (map[string]string, error) {
	faults := map[string]string{}
	for _, d := range snap.Devices {
		dir := r.Dir(d.Name)
		if err := os.MkdirAll(filepath.Join(dir, ScratchDir), 0o755); err != nil {
			return nil, fmt.Errorf("state of %s: %w", d.Name, err)
		}
		st, err := LoadState(dir)
		if err != nil {
			return nil, fmt.Errorf("state of %s: %w", d.Name, err)
		}
		if st.Status == StatusNew {
			st.Device, st.Resource = d.Name, r.opts.Resource
			if err := st.Save(dir); err != nil {
				return nil, err
			}
		}
		if st.Status == StatusFailed && r.opts.MarkUnhealthy {
			faults[d.Name] = "prestart: " + st.LastError
		}
	}
	return faults, nil
}

// Prepare runs the steps on every device, in parallel, within the budget.
// The error names every device that failed, its step and the cause.
func (r *Runner) Prepare(ctx context.Context, devs []device.Device) error {
	if !r.HasSteps() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.Budget)
	defer cancel()
	errs := make([]error, len(devs))
	var wg sync.WaitGroup
	for i := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.prepareOne(ctx, devs[i])
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (r *Runner) lock(name string) func() {
	m, _ := r.locks.LoadOrStore(name, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// prepareOne runs the steps on one device. Concurrent calls for the same
// device (replicas shared by two containers) run one after the other. The
// state file is written once, at the end, whatever happened.
func (r *Runner) prepareOne(ctx context.Context, d device.Device) error {
	defer r.lock(d.Name)()
	log := r.opts.Log.WithField("device", d.Name)
	dir := r.Dir(d.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return &StepError{Device: d.Name, Step: "state", Err: err}
	}
	st, err := LoadState(dir)
	if err != nil {
		// A corrupt state file is replaced by a fresh state, not fatal.
		log.WithError(err).Warn("unreadable device state; starting afresh")
		st = State{}
	}
	st.Device, st.Resource = d.Name, r.opts.Resource
	t := &Target{ID: d.Name, Index: d.Index, HostPath: d.HostPath, ContainerPath: d.ContainerPath,
		Resource: r.opts.Resource, Dir: dir, State: &st, Log: log}
	start := time.Now()
	didReset := false
	var failed *StepError
	for _, s := range r.opts.Steps {
		limit := s.Timeout()
		if limit <= 0 {
			limit = DefaultStepTimeout
		}
		sctx, cancel := context.WithTimeout(ctx, limit)
		err := s.Run(sctx, t)
		if err == nil && sctx.Err() != nil {
			err = sctx.Err()
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			err = fmt.Errorf("call budget of %s used up: %w", r.opts.Budget, err)
		} else if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("timed out after %s: %w", limit, err)
		}
		cancel()
		if err != nil {
			failed = &StepError{Device: d.Name, Step: s.Name(), Err: err}
			break
		}
		if _, ok := s.(Reset); ok {
			didReset = true
		}
	}
	if failed != nil {
		st.Status = StatusFailed
		st.LastError = fmt.Sprintf("step %s: %v", failed.Step, failed.Err)
	} else {
		st.Status = StatusReady
		st.LastError = ""
		st.Generation++
		st.PreparedAt = time.Now().UTC()
	}
	if err := st.Save(dir); err != nil {
		if failed == nil {
			failed = &StepError{Device: d.Name, Step: "state", Err: err}
		}
		log.WithError(err).Error("writing device state")
	}
	if failed != nil {
		log.WithError(failed.Err).WithField("step", failed.Step).Warn("device preparation failed")
		if r.opts.MarkUnhealthy && r.opts.Health != nil {
			r.opts.Health.SetFault(d.Name, "prestart: "+st.LastError)
		}
		return failed
	}
	log.WithField("generation", st.Generation).WithField("took", time.Since(start)).Debug("device prepared")
	// Clearing a fault the device does not have is a no-op for the source.
	if didReset && r.opts.RecoverOnReset && r.opts.Health != nil {
		r.opts.Health.SetFault(d.Name, "")
	}
	return nil
}
