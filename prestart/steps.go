package prestart

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
)

// Target is what a step works on: one device, its state directory and the
// state being built by this preparation.
type Target struct {
	// ID is the device's name (its CDI name and base ID).
	ID       string
	Index    int
	HostPath string
	// ContainerPath is where the node appears in the container.
	ContainerPath string
	Resource      string
	// Dir is the device's state directory.
	Dir   string
	State *State
	Log   *logrus.Entry
}

// Step is one preparation step.
type Step interface {
	Name() string
	// Timeout bounds one run of the step.
	Timeout() time.Duration
	Run(ctx context.Context, t *Target) error
}

// ScratchDir is the device's scratch data, cleared by a reset.
const ScratchDir = "scratch"

// FirmwareFile is the image a reprogram step loaded into the device.
const FirmwareFile = "firmware.bin"

// Reset returns a simulated device to a clean state: its scratch data is
// cleared, the reset counter incremented, the time recorded, the status
// set to ready.
type Reset struct{ Limit time.Duration }

// Name is "reset".
func (Reset) Name() string { return "reset" }

// Timeout bounds one reset.
func (r Reset) Timeout() time.Duration { return r.Limit }

// Resets reports that the step returns the device to a clean state.
func (Reset) Resets() bool { return true }

// Run replaces the scratch directory by an empty one: the old one is
// renamed away first, so a reset never leaves half-cleared data behind.
func (Reset) Run(ctx context.Context, t *Target) error {
	scratch := filepath.Join(t.Dir, ScratchDir)
	old := scratch + ".old-" + atomicfile.Tag() + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := os.Rename(scratch, old); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("clear scratch: %w", err)
	}
	if err := ensureDir(scratch); err != nil {
		return fmt.Errorf("clear scratch: %w", err)
	}
	if err := os.RemoveAll(old); err != nil {
		return fmt.Errorf("clear scratch: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	t.State.ResetCount++
	t.State.LastReset = time.Now().UTC()
	t.State.Status = StatusReady
	return nil
}

// Reprogram loads a firmware image into a simulated device. The copy is
// hashed as it is written; a configured digest must match or nothing is
// loaded. A device that already holds the digest is not copied again
// unless Always is set.
type Reprogram struct {
	// Image is the image file; empty means the built-in image.
	Image string
	// SHA256 is the expected digest (hex), optional.
	SHA256 string
	Always bool
	Limit  time.Duration

	mu    sync.Mutex
	cache imageDigest
}

// imageDigest remembers an image file's digest while the file is unchanged.
type imageDigest struct {
	dev, ino     uint64
	size         int64
	mtime, ctime syscall.Timespec
	sha256       string
}

// Name is "reprogram".
func (*Reprogram) Name() string { return "reprogram" }

// Timeout bounds one load.
func (r *Reprogram) Timeout() time.Duration { return r.Limit }

// BuiltinImageName names the image used when none is configured.
const BuiltinImageName = "builtin-sim-firmware-v1"

// builtinImage is made on first use, not at package init: a plugin that
// never reprograms with it does not pay for it.
var builtinImage = sync.OnceValue(func() []byte {
	line := []byte("cdi-device-plugin simulated firmware image v1\n")
	return bytes.Repeat(line, 64*1024/len(line))
})

func (r *Reprogram) imageName() string {
	if r.Image == "" {
		return BuiltinImageName
	}
	return filepath.Base(r.Image)
}

// digest returns the image's digest, hashing the file only when it changed
// since the last call (same inode, size, mtime and ctime).
func (r *Reprogram) digest() (string, error) {
	if r.Image == "" {
		sum := sha256.Sum256(builtinImage())
		return hex.EncodeToString(sum[:]), nil
	}
	var st syscall.Stat_t
	if err := syscall.Stat(r.Image, &st); err != nil {
		return "", fmt.Errorf("image %s: %w", r.Image, err)
	}
	key := imageDigest{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
	r.mu.Lock()
	c := r.cache
	r.mu.Unlock()
	if c.sha256 != "" && c.dev == key.dev && c.ino == key.ino && c.size == key.size && c.mtime == key.mtime && c.ctime == key.ctime {
		return c.sha256, nil
	}
	f, err := os.Open(r.Image)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", r.Image, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("image %s: %w", r.Image, err)
	}
	key.sha256 = hex.EncodeToString(h.Sum(nil))
	r.mu.Lock()
	r.cache = key
	r.mu.Unlock()
	return key.sha256, nil
}

// Digest is the sha256 (hex) of the image the step loads: of the file
// (hashed again only when it changed), or of the built-in image.
func (r *Reprogram) Digest() (string, error) { return r.digest() }

// Run loads the image into the device, unless it already holds it.
func (r *Reprogram) Run(ctx context.Context, t *Target) error {
	want, err := r.digest()
	if err != nil {
		return err
	}
	if r.SHA256 != "" && !strings.EqualFold(want, r.SHA256) {
		return fmt.Errorf("image %s: sha256 %s does not match the configured %s", r.imageName(), want, r.SHA256)
	}
	fw := filepath.Join(t.Dir, FirmwareFile)
	if !r.Always && t.State.Firmware != nil && t.State.Firmware.SHA256 == want {
		if fi, err := os.Stat(fw); err == nil && fi.Size() == t.State.Firmware.Size {
			t.Log.WithField("sha256", want).Debug("firmware already loaded")
			return nil
		}
	}
	var src io.Reader = bytes.NewReader(builtinImage())
	if r.Image != "" {
		f, err := os.Open(r.Image)
		if err != nil {
			return fmt.Errorf("image %s: %w", r.Image, err)
		}
		defer f.Close()
		src = f
	}
	size, err := copyHashed(ctx, fw, src, want, r.imageName())
	if err != nil {
		return err
	}
	t.State.Firmware = &Firmware{Name: r.imageName(), SHA256: want, Size: size, At: time.Now().UTC()}
	return nil
}

// errImageChanged is returned when the bytes copied do not have the digest
// checked before the copy.
var errImageChanged = errors.New("changed while loading")

// copyHashed copies src into path atomically, hashing what it writes; ctx
// is checked between chunks. The bytes loaded are the ones checked: when
// their digest is not want (the image changed under us), nothing replaces
// the file in place.
func copyHashed(ctx context.Context, path string, src io.Reader, want, name string) (int64, error) {
	h := sha256.New()
	var n int64
	err := atomicfile.Write(path, 0o644, func(f *os.File) error {
		w := io.MultiWriter(f, h)
		// io.Copy's size: devices load in parallel, and what each load
		// takes grows the heap the plugin keeps afterwards.
		buf := make([]byte, 32*1024)
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			k, rerr := src.Read(buf)
			if k > 0 {
				if _, err := w.Write(buf[:k]); err != nil {
					return err
				}
				n += int64(k)
			}
			if rerr == io.EOF {
				break
			}
			if rerr != nil {
				return rerr
			}
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != want {
			return fmt.Errorf("image %s %w: sha256 %s, expected %s", name, errImageChanged, got, want)
		}
		return nil
	})
	if errors.Is(err, errImageChanged) {
		return 0, errors.Unwrap(err) // the path is ours, not news
	}
	if err != nil {
		return 0, fmt.Errorf("load firmware: %w", err)
	}
	return n, nil
}

// Exec runs a command for a real device: arguments are templates of the
// device's fields ({{.ID}}, {{.HostPath}}, {{.ContainerPath}},
// {{.Resource}}, {{.Index}}, {{.StateDir}}; see argTemplate), no shell is involved, the environment holds
// only PATH and the configured variables, the working directory is the
// device's state directory, and the output goes to the log.
type Exec struct {
	command []argTemplate
	Env     map[string]string
	Limit   time.Duration
	// MaxOutput bounds the output kept for the log (default 64 KiB).
	MaxOutput int
}

// NewExec parses the command's templates; an unknown field, or any action
// that is not one field, is an error now rather than at the first
// container start.
func NewExec(command []string, env map[string]string, limit time.Duration) (*Exec, error) {
	if len(command) == 0 || command[0] == "" {
		return nil, errors.New("exec needs a command")
	}
	e := &Exec{Env: env, Limit: limit}
	for i, a := range command {
		tpl, err := parseArg(strconv.Itoa(i), a)
		if err != nil {
			return nil, fmt.Errorf("argument %d %q: %w", i, a, err)
		}
		e.command = append(e.command, tpl)
	}
	return e, nil
}

// Name is "exec".
func (*Exec) Name() string { return "exec" }

// Timeout bounds one run of the command.
func (e *Exec) Timeout() time.Duration { return e.Limit }

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	max       int
	truncated bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room < len(p) {
		b.buf.Write(p[:max(room, 0)])
		b.truncated = true
		return len(p), nil
	}
	return b.buf.Write(p)
}

// Run runs the command for the device, killing its process group when ctx
// ends.
func (e *Exec) Run(ctx context.Context, t *Target) error {
	args := make([]string, len(e.command))
	for i, tpl := range e.command {
		args[i] = tpl.expand(t)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	keys := make([]string, 0, len(e.Env))
	for k := range e.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+e.Env[k])
	}
	cmd.Env = env
	cmd.Dir = t.Dir
	// Its own process group, killed whole on timeout: a hung child of the
	// command must not outlive the step.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	out := &limitedBuffer{max: e.MaxOutput}
	if out.max <= 0 {
		out.max = 64 * 1024
	}
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Run()
	out.mu.Lock()
	text := strings.TrimSpace(out.buf.String())
	if out.truncated {
		text += " [output truncated]"
	}
	out.mu.Unlock()
	l := t.Log.WithField("command", args[0])
	if text != "" {
		l = l.WithField("output", text)
	}
	if err != nil {
		switch last := lastLine(text, maxErrorLine); {
		case ctx.Err() != nil:
			err = fmt.Errorf("%s: %w", args[0], ctx.Err())
		case last != "":
			// Why it failed, as the command said it last: the device's
			// problem and the claim's status carry it.
			err = fmt.Errorf("%s: %w: %s", args[0], err, last)
		default:
			err = fmt.Errorf("%s: %w", args[0], err)
		}
		l.WithError(err).Warn("exec step failed")
		return err
	}
	l.Info("exec step done")
	return nil
}

// maxErrorLine bounds the output line a failed exec step's error carries.
const maxErrorLine = 200

// lastLine is the last non-empty line of text, cut to at most most bytes.
func lastLine(text string, most int) string {
	lines := strings.Split(strings.TrimSpace(text), "\n")
	l := strings.TrimSpace(lines[len(lines)-1])
	if len(l) > most {
		l = l[:most] + "..."
	}
	return l
}
