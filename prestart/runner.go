package prestart

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
)

// HealthReporter receives preparation faults (device.Source): a problem
// makes the device unhealthy, none clears it.
type HealthReporter interface {
	SetFault(device string, p device.Problem)
}

// Faults are faults injected on purpose into the preparations
// (fault.Injector): Preparing is told of every preparation of a device,
// Step is asked before each of its steps, and fails or delays it.
type Faults interface {
	Preparing(d device.Device)
	Step(ctx context.Context, device, step string) error
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

// MaxRecoveryBackoff bounds the wait between background re-preparations of
// a failed device: the first comes after Options.RecoveryInterval, and the
// wait doubles after every failed attempt.
const MaxRecoveryBackoff = 10 * time.Minute

// MaxRecoveryAttempts bounds the background re-preparations of a failed
// device: after the last one fails, background recovery of that device is
// given up (logged once, counted in recovery_given_up_total) and it stays
// Unhealthy until a container start prepares it successfully, the device
// disappears and comes back, or the configuration changes (a new Runner).
const MaxRecoveryAttempts = 5

// Resetter is a step that returns the device to a clean state.
type Resetter interface {
	Resets() bool
}

// Options configure a Runner.
type Options struct {
	Resource string
	// StateRoot holds one directory per device: <StateRoot>/<device>.
	StateRoot string
	// LockDir, when set, holds a lock file per device (<LockDir>/<device>.lock)
	// that the runner locks (an open file description lock) while it runs
	// steps on the device, so that two processes sharing StateRoot (the
	// old and the new DRA driver during a rolling update) never run steps
	// on one device at once. Made when first needed.
	LockDir string
	Steps   []Step
	// Budget bounds a whole call (default DefaultBudget).
	Budget time.Duration
	// MarkUnhealthy reports a device whose preparation failed as unhealthy.
	MarkUnhealthy bool
	// Recovery (default config.DefaultRecovery) and the first wait before a
	// failed device is prepared again in the background (default
	// config.DefaultRecoveryInterval); see config.Recovery.
	Recovery         config.Recovery
	RecoveryInterval time.Duration
	Health           HealthReporter
	Log              *logrus.Entry
	// Metrics, when set, counts the failed steps.
	Metrics *metrics.Metrics
	// Holders returns the device IDs of the resource, as advertised to the
	// kubelet (replica IDs <device>::<n> included), that containers hold
	// now (the kubelet's PodResources List, see
	// podresources.Resources.Held). A device is prepared again in the
	// background only while no container holds it: a reset would wipe
	// what a running container uses. Nil, or an error, and no device is
	// prepared in the background.
	Holders func(ctx context.Context) ([]string, error)
	// Faults, when set, injects faults into the preparations (not into
	// the resets of Reset): a step it fails counts as a failed step.
	Faults Faults
}

// Runner prepares the devices of one resource.
type Runner struct {
	opts  Options
	locks sync.Map // device name -> *sync.Mutex

	mu sync.Mutex
	// failed are the devices marked Unhealthy by a failed preparation, to
	// be prepared again in the background.
	failed map[string]*failure
	// badState are the devices whose state directory is unusable, with
	// their fault (see Ensure).
	badState map[string]device.Problem
	// givenUp are the failed devices whose background recovery was given
	// up after MaxRecoveryAttempts.
	givenUp map[string]bool
	// noHolders is set while Options.Holders cannot tell (logged once).
	noHolders bool
	kick      chan struct{}
}

type failure struct {
	dev     device.Device
	next    time.Time
	backoff time.Duration
	// attempts counts the background re-preparations that failed.
	attempts int
}

// NewRunner returns a runner; it touches nothing on disk.
func NewRunner(o Options) *Runner {
	if o.Budget <= 0 {
		o.Budget = config.DefaultBudget
	}
	if o.Recovery == "" {
		o.Recovery = config.DefaultRecovery
	}
	if o.RecoveryInterval <= 0 {
		o.RecoveryInterval = config.DefaultRecoveryInterval
	}
	if o.Log == nil {
		o.Log = logs.Discard()
	}
	return &Runner{opts: o, failed: map[string]*failure{}, badState: map[string]device.Problem{}, givenUp: map[string]bool{}, kick: make(chan struct{}, 1)}
}

// Steps names the steps, in order.
func (r *Runner) Steps() []string {
	names := make([]string, len(r.opts.Steps))
	for i, s := range r.opts.Steps {
		names[i] = s.Name()
	}
	return names
}

// Budget bounds a whole call of the runner (Options.Budget).
func (r *Runner) Budget() time.Duration { return r.opts.Budget }

// HasSteps reports whether PreStartContainer is needed.
func (r *Runner) HasSteps() bool { return len(r.opts.Steps) > 0 }

// Dir is the state directory of a device.
func (r *Runner) Dir(name string) string { return filepath.Join(r.opts.StateRoot, name) }

// Ensure gives every device of snap its state directory, which the CDI
// spec mounts into its containers, so it must exist before the spec names
// it. Nothing else is written: a device without a state.json is new, and
// its state file appears with its first preparation.
//
// A device whose directory cannot be made, or is not a real directory (a
// symlink planted there), holds back no other: it is reported unhealthy
// (Options.Health) with a reason naming the path, BadState reports it, so
// that the spec leaves its mount out, and it is healthy again at the first
// Ensure that finds its directory usable. Only a state root that cannot be
// made is an error.
func (r *Runner) Ensure(snap *device.Snapshot) error {
	// The state root is the plugin's alone; a device's directory is
	// mounted into its containers, read by whatever user they run as.
	if err := os.MkdirAll(r.opts.StateRoot, 0o700); err != nil {
		return fmt.Errorf("state root: %w", err)
	}
	for _, d := range snap.Devices {
		r.setBadState(d.Name, ensureDir(r.Dir(d.Name)))
	}
	// A device that is gone is recovered afresh when it comes back.
	r.mu.Lock()
	for name := range r.givenUp {
		if !slices.ContainsFunc(snap.Devices, func(d device.Device) bool { return d.Name == name }) {
			delete(r.givenUp, name)
		}
	}
	r.mu.Unlock()
	return nil
}

// BadState reports whether the state directory of a device was found
// unusable by the last Ensure or Init: the spec must not mount it.
func (r *Runner) BadState(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, bad := r.badState[name]
	return bad
}

// badStateProblem is the fault of a device whose state directory is
// unusable.
func badStateProblem(err error) device.Problem {
	return device.Problem{Cause: device.CausePrepareFailed, Message: "state directory: " + err.Error()}
}

// setBadState records whether the state directory of a device is usable
// (err nil) and reports the change to the health reporter. A repaired
// directory clears the fault unless the device's preparation has failed
// too (background recovery heals that one).
func (r *Runner) setBadState(name string, err error) {
	r.mu.Lock()
	old, wasBad := r.badState[name]
	_, failed := r.failed[name]
	var reason device.Problem
	if err != nil {
		reason = badStateProblem(err)
		r.badState[name] = reason
	} else {
		delete(r.badState, name)
	}
	r.mu.Unlock()
	log := r.opts.Log.WithField("device", name)
	switch {
	case err != nil && reason != old:
		log.WithError(err).Error("unusable device state directory; device unhealthy")
		if r.opts.Health != nil {
			r.opts.Health.SetFault(name, reason)
		}
	case err == nil && wasBad:
		log.Info("device state directory usable again")
		if r.opts.Health != nil && !failed {
			r.opts.Health.SetFault(name, device.Problem{})
		}
	}
}

// ensureDir makes dir with mode 0755 whatever the umask, and refuses one
// that exists and is not a real directory (a symlink planted there).
func ensureDir(dir string) error {
	err := os.Mkdir(dir, 0o755)
	if err == nil {
		return os.Chmod(dir, 0o755)
	}
	if !errors.Is(err, os.ErrExist) {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s exists and is not a directory", dir)
	}
	return nil
}

// Init restores the faults recorded by an earlier run (devices whose last
// preparation failed), so health survives plugin restarts, and returns them
// by device. It writes nothing (the spec's writer ensures the directories,
// see Ensure), but sets aside an unreadable state file. A device whose
// state directory is not a real directory, or whose state cannot be read
// (another format version), is returned as a fault too, with the cause:
// it holds back no other device. The error is always nil.
func (r *Runner) Init(snap *device.Snapshot) (map[string]device.Problem, error) {
	faults := map[string]device.Problem{}
	for _, d := range snap.Devices {
		log := r.opts.Log.WithField("device", d.Name)
		dir := r.Dir(d.Name)
		if fi, err := os.Lstat(dir); err == nil && !fi.IsDir() {
			err := fmt.Errorf("%s exists and is not a directory", dir)
			r.setBadState(d.Name, err)
			faults[d.Name] = badStateProblem(err)
			continue
		}
		st, err := loadOrAside(dir, log)
		if err != nil {
			log.WithError(err).Error("unreadable device state; device unhealthy")
			faults[d.Name] = device.Problemf(device.CausePrepareFailed, "state of %s: %v", d.Name, err)
			continue
		}
		if st.Status == StatusFailed && r.opts.MarkUnhealthy {
			faults[d.Name] = device.Problem{Cause: device.CausePrepareFailed, Message: st.LastError}
			r.recordFailure(d)
		}
	}
	return faults, nil
}

// Prepare runs the steps on every device, in parallel, within the budget.
// The error names every device that failed, its step and the cause.
func (r *Runner) Prepare(ctx context.Context, devs []device.Device) error {
	return r.runAll(ctx, devs, r.opts.Steps, true)
}

// FirmwareSHA256 is the digest of the image the resource's reprogram step
// loads ("" without one; see Reprogram.Digest).
func (r *Runner) FirmwareSHA256() (string, error) {
	for _, s := range r.opts.Steps {
		if rp, ok := s.(*Reprogram); ok {
			return rp.Digest()
		}
	}
	return "", nil
}

// HasReset reports whether one of the steps resets the device.
func (r *Runner) HasReset() bool { return len(r.resetSteps()) > 0 }

func (r *Runner) resetSteps() []Step {
	var out []Step
	for _, s := range r.opts.Steps {
		if rs, ok := s.(Resetter); ok && rs.Resets() {
			out = append(out, s)
		}
	}
	return out
}

// Reset runs only the steps that reset the device (HasReset) on every
// device, in parallel, within the budget: the DRA driver resets the
// devices of a claim it unprepares. The state file records it as a
// preparation does, but a reset is not a preparation: the generation and
// preparedAt stay. A failure counts as a failed preparation (the device is
// unhealthy and recovered in the background, see Options.MarkUnhealthy).
func (r *Runner) Reset(ctx context.Context, devs []device.Device) error {
	return r.runAll(ctx, devs, r.resetSteps(), false)
}

// runAll runs steps on every device, in parallel, within the budget; the
// error names every device that failed, its step and the cause.
func (r *Runner) runAll(ctx context.Context, devs []device.Device, steps []Step, prepare bool) error {
	if len(steps) == 0 {
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
			errs[i] = r.runOne(ctx, devs[i], steps, prepare)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// lock keeps other runs of steps on device name out until the returned
// func is called: those of this runner (a mutex), and, with LockDir,
// those of any process (a lock of the device's file there, taken after
// the mutex, so a process waits for it once).
func (r *Runner) lock(name string) (func(), error) {
	m, _ := r.locks.LoadOrStore(name, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	if r.opts.LockDir == "" {
		return mu.Unlock, nil
	}
	f, err := lockFile(filepath.Join(r.opts.LockDir, name+".lock"))
	if err != nil {
		mu.Unlock()
		return nil, err
	}
	return func() {
		_ = f.Close() // lets the lock go
		mu.Unlock()
	}, nil
}

// lockFile opens path (made, with its directory, when missing) and takes
// an exclusive open file description lock of it, waiting for one another
// process or runner holds; closing the file lets it go.
func lockFile(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("device lock: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("device lock: %w", err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	for {
		err = unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLKW, &lk)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("device lock %s: %w", path, err)
	}
	return f, nil
}

// runOne runs steps on one device (prepare: the steps of a preparation,
// which counts in the state's generation). Concurrent calls for the same
// device (replicas shared by two containers, or a container start during a
// background re-preparation) run one after the other. The state file is
// written once, at the end, whatever happened.
func (r *Runner) runOne(ctx context.Context, d device.Device, steps []Step, prepare bool) error {
	unlock, err := r.lock(d.Name)
	if err != nil {
		return &StepError{Device: d.Name, Step: "state", Err: err}
	}
	defer unlock()
	log := r.opts.Log.WithField("device", d.Name)
	dir := r.Dir(d.Name)
	if err := ensureDir(dir); err != nil {
		return &StepError{Device: d.Name, Step: "state", Err: err}
	}
	st, err := loadOrAside(dir, log)
	if err != nil {
		return &StepError{Device: d.Name, Step: "state", Err: err}
	}
	st.Device, st.Resource = d.Name, r.opts.Resource
	t := &Target{ID: d.Name, Index: d.Index, HostPath: d.HostPath, ContainerPath: d.ContainerPath,
		Resource: r.opts.Resource, Dir: dir, State: &st, Log: log}
	prev := st.Status // a step may set it (a reset makes it ready)
	start := time.Now()
	didReset := false
	var failed *StepError
	faults := r.opts.Faults
	if !prepare {
		faults = nil
	}
	if faults != nil {
		faults.Preparing(d)
	}
	for _, s := range steps {
		limit := s.Timeout()
		if limit <= 0 {
			limit = config.DefaultStepTimeout
		}
		sctx, cancel := context.WithTimeout(ctx, limit)
		err := runStep(sctx, s, t, faults)
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
		if rs, ok := s.(Resetter); ok && rs.Resets() {
			didReset = true
		}
	}
	// The caller gave up (the kubelet restarted, our socket was served
	// again, a reload stopped the resource), not the budget or a step's
	// limit: not a fault of the device. A step may have half-run, so the
	// device is left unprepared and the next start prepares it again; one
	// that had failed stays failed (and in background recovery).
	if failed != nil && errors.Is(ctx.Err(), context.Canceled) {
		st.Status = StatusUnprepared
		if prev == StatusFailed {
			st.Status = StatusFailed
		}
		if err := st.Save(dir); err != nil {
			log.WithError(err).Error("writing device state")
		}
		log.WithField("step", failed.Step).WithField("status", st.Status).Warn("preparation cancelled")
		return failed
	}
	if failed != nil {
		st.Status = StatusFailed
		st.LastError = fmt.Sprintf("step %s: %v", failed.Step, failed.Err)
	} else {
		st.Status = StatusReady
		st.LastError = ""
		if prepare {
			st.Generation++
			st.PreparedAt = time.Now().UTC()
		}
	}
	if err := st.Save(dir); err != nil {
		if failed == nil {
			failed = &StepError{Device: d.Name, Step: "state", Err: err}
		}
		log.WithError(err).Error("writing device state")
	}
	if failed != nil {
		r.opts.Metrics.StepFailed(r.opts.Resource, failed.Step)
		log.WithError(failed.Err).WithField("step", failed.Step).Warn("device preparation failed")
		if r.opts.MarkUnhealthy {
			if r.opts.Health != nil {
				r.opts.Health.SetFault(d.Name, device.Problem{Cause: device.CausePrepareFailed, Message: st.LastError})
			}
			r.recordFailure(d)
		}
		return failed
	}
	log.WithField("generation", st.Generation).WithField("took", time.Since(start)).Debug("device prepared")
	if !r.heals(didReset) {
		r.mu.Lock()
		_, isFailed := r.failed[d.Name]
		r.mu.Unlock()
		if isFailed {
			r.recordFailure(d) // still unhealthy: try again later
		}
		return nil
	}
	r.mu.Lock()
	delete(r.failed, d.Name)
	delete(r.givenUp, d.Name)
	r.mu.Unlock()
	// Clearing a fault the device does not have is a no-op for the source.
	if r.opts.Health != nil {
		r.opts.Health.SetFault(d.Name, device.Problem{})
	}
	return nil
}

// runStep runs step s on t, after what the injected faults do to it (a
// delay, a failure in its place).
func runStep(ctx context.Context, s Step, t *Target, faults Faults) error {
	if faults != nil {
		if err := faults.Step(ctx, t.ID, s.Name()); err != nil {
			return err
		}
	}
	return s.Run(ctx, t)
}

// heals reports whether a successful preparation makes a failed device
// healthy again.
func (r *Runner) heals(didReset bool) bool {
	switch r.opts.Recovery {
	case config.RecoverAuto:
		return true
	case config.RecoverReset:
		return didReset
	}
	return false
}

// recordFailure schedules a failed device for background re-preparation:
// after the recovery interval, then after twice the last wait.
func (r *Runner) recordFailure(d device.Device) {
	r.mu.Lock()
	if r.givenUp[d.Name] {
		r.mu.Unlock()
		return
	}
	f := r.failed[d.Name]
	if f == nil {
		f = &failure{backoff: r.opts.RecoveryInterval}
		r.failed[d.Name] = f
	} else {
		f.backoff = min(2*f.backoff, max(MaxRecoveryBackoff, r.opts.RecoveryInterval))
	}
	f.dev = d
	f.next = time.Now().Add(f.backoff)
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run prepares failed devices again in the background until ctx is done,
// so that a device whose failed container is gone is healed too. It does
// nothing (and wakes up never) while no device has failed, and returns at
// once when recovery is off (never, onFailure ignore, or no steps).
func (r *Runner) Run(ctx context.Context) error {
	if !r.HasSteps() || !r.opts.MarkUnhealthy || r.opts.Recovery == config.RecoverNever {
		return nil
	}
	timer := time.NewTimer(0)
	timer.Stop()
	defer timer.Stop()
	for {
		var due <-chan time.Time
		if next, ok := r.nextAttempt(); ok {
			timer.Reset(time.Until(next))
			due = timer.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
			timer.Stop()
		case <-due:
			r.recoverDue(ctx)
		}
	}
}

func (r *Runner) nextAttempt() (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var next time.Time
	for _, f := range r.failed {
		if next.IsZero() || f.next.Before(next) {
			next = f.next
		}
	}
	return next, !next.IsZero()
}

// recoverDue prepares the failed devices whose time has come and that no
// container holds (Options.Holders): the steps may reset the device, and
// with it what a running container uses (a replica of it included). When
// nobody can tell which devices are held, nothing is prepared. A held
// device, or one nobody can tell about, waits for its next turn without
// using an attempt.
func (r *Runner) recoverDue(ctx context.Context) {
	now := time.Now()
	var due []device.Device
	r.mu.Lock()
	for _, f := range r.failed {
		if !f.next.After(now) {
			due = append(due, f.dev)
		}
	}
	r.mu.Unlock()
	if len(due) == 0 {
		return
	}
	held, err := r.holders(ctx)
	if ctx.Err() != nil {
		return
	}
	r.mu.Lock()
	logDown, logUp := err != nil && !r.noHolders, err == nil && r.noHolders
	r.noHolders = err != nil
	r.mu.Unlock()
	if logDown {
		r.opts.Log.WithError(err).Warn("cannot tell which devices containers hold; no background recovery")
	}
	if logUp {
		r.opts.Log.Info("devices held by containers known again; background recovery resumes")
	}
	var devs []device.Device
	for _, d := range due {
		switch {
		case err != nil:
			r.postpone(d.Name)
		case heldBy(d.Name, held):
			r.opts.Log.WithField("device", d.Name).Info("failed device held by a container; not prepared in the background")
			r.postpone(d.Name)
		default:
			r.opts.Log.WithField("device", d.Name).Info("preparing a failed device again")
			devs = append(devs, d)
		}
	}
	if len(devs) == 0 {
		return
	}
	if err := r.Prepare(ctx, devs); err == nil {
		r.opts.Log.WithField("devices", len(devs)).Info("failed devices prepared again")
	}
	if ctx.Err() != nil {
		return // cancelled: not an attempt
	}
	for _, d := range devs {
		r.countAttempt(d.Name)
	}
}

func (r *Runner) holders(ctx context.Context) ([]string, error) {
	if r.opts.Holders == nil {
		return nil, errors.New("no PodResources lister configured")
	}
	return r.opts.Holders(ctx)
}

// heldBy reports whether ids (kubelet device IDs) name the physical device
// name (device.HeldBy).
func heldBy(name string, ids []string) bool { return device.HeldBy(name, ids) }

// postpone moves a failed device's next background attempt one wait
// later, without counting an attempt.
func (r *Runner) postpone(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f := r.failed[name]; f != nil {
		f.next = time.Now().Add(f.backoff)
	}
}

// countAttempt counts a background re-preparation of a device that left it
// failed, and gives its background recovery up after MaxRecoveryAttempts.
func (r *Runner) countAttempt(name string) {
	r.mu.Lock()
	f := r.failed[name]
	if f == nil {
		r.mu.Unlock()
		return // healed
	}
	f.attempts++
	giveUp := f.attempts >= MaxRecoveryAttempts
	if giveUp {
		delete(r.failed, name)
		r.givenUp[name] = true
	}
	r.mu.Unlock()
	if giveUp {
		r.opts.Log.WithField("device", name).WithField("attempts", MaxRecoveryAttempts).
			WithField("unhealthy until", "a container start prepares it, it comes back, or the configuration changes").
			Warn("background recovery given up")
		r.opts.Metrics.RecoveryGivenUp(r.opts.Resource)
	}
}
