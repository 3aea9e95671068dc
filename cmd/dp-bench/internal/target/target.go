// Package target is what dp-bench runs: a target (a plugin's or a
// driver's command line and what it must do, from a targets file or the
// flags), the settings that bound and size a run, and one run's fresh
// directories, files and command line, made from the target's templates
// (Prepare).
package target

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/template"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
)

// Target is one plugin command line, with the size it is run at, to check
// and measure. Command, Env, Files and RemoveDevice are templates over
// Dirs (e.g. "{{.SocketDir}}") with a function env ("{{env "BIN"}}").
// A target with DRA set is a DRA driver, driven as the kubelet drives one
// (package drasession); the others are device plugins (package
// dpsession).
type Target struct {
	// Name labels the plugin in the tables, Scenario its size.
	Name     string `json:"name"`
	Scenario string `json:"scenario,omitempty"`
	// Group is what -compare pairs targets by (default: the scenario):
	// the -compare target is compared with the others of its group.
	Group string `json:"group,omitempty"`
	// DRA, when set, makes the target a DRA driver.
	DRA *DRATarget `json:"dra,omitempty"`
	// Command is the plugin's argv.
	Command []string `json:"command"`
	// Env is the plugin's whole environment (KEY=VALUE), PATH aside.
	Env []string `json:"env,omitempty"`
	// Files are written into WorkDir before the start (name -> content).
	Files map[string]string `json:"files,omitempty"`
	// SocketDir and CDIDir are where the plugin expects its sockets and
	// writes CDI specs. Empty: a fresh directory every run, given to the
	// plugin through the template. A fixed path (a plugin that cannot be
	// told, e.g. /var/lib/kubelet/device-plugins): the plugin runs in a
	// private mount namespace with the fresh directory bound there (root).
	SocketDir string `json:"socketDir,omitempty"`
	CDIDir    string `json:"cdiDir,omitempty"`
	// DeviceFiles character nodes 1:3 are created as {{.DevDir}}/dev-<i>
	// before the start, for plugins that discover devices.
	DeviceFiles int `json:"deviceFiles,omitempty"`
	// RemoveDevice is a device file to remove (and put back) to test that
	// ListAndWatch reports the change; empty: not tested.
	RemoveDevice string `json:"removeDevice,omitempty"`
	// Setup is a shell script (sh -c) run before the start, not timed: a
	// device tree for a plugin that discovers devices in sysfs.
	Setup string `json:"setup,omitempty"`
	// Uevent, when set, checks that a kernel uevent makes ListAndWatch
	// report a change that no device file shows: Change (sh -c) alters
	// the device tree, then "change" is written to Trigger, a real
	// device's sysfs uevent file, so that the kernel sends an event.
	Uevent *UeventCheck `json:"uevent,omitempty"`
	// IDs is the number of device IDs the plugin must list (0: any).
	IDs int `json:"ids,omitempty"`
	// Resource is the resource name it must register (empty: any valid).
	Resource string `json:"resource,omitempty"`
}

// DRATarget is what a DRA driver target must do.
type DRATarget struct {
	// Driver is the driver name it must register and publish devices of.
	Driver string `json:"driver"`
	// Devices is the number of devices it must publish for the node (0:
	// any); the prepare calls take up to 8 of them.
	Devices int `json:"devices,omitempty"`
	// StepsEvidence is a glob (template) of files that its preparation
	// steps write (a device's state.json): a second NodePrepareResources
	// of a prepared claim must leave them as they were. Empty: not
	// checked.
	StepsEvidence string `json:"stepsEvidence,omitempty"`
}

// UeventCheck is Target.Uevent.
type UeventCheck struct {
	Change  string `json:"change"`
	Trigger string `json:"trigger"`
}

// CompareGroup is the comparison group: Group, else the scenario.
func (t Target) CompareGroup() string {
	if t.Group != "" {
		return t.Group
	}
	return t.Scenario
}

// Label is "name (scenario)".
func (t Target) Label() string {
	if t.Scenario == "" {
		return t.Name
	}
	return t.Name + " (" + t.Scenario + ")"
}

// Dirs are the fresh directories of one run, as the plugin sees them.
type Dirs struct {
	// SocketDir holds kubelet.sock; CDIDir the CDI specs; DevDir the
	// device files dp-bench creates; WorkDir the Files and anything else.
	SocketDir, CDIDir, DevDir, WorkDir string
	// PodResources is the kubelet's PodResources socket, listing no pods
	// (a device plugin's claim guard advertises no device healthy until
	// it answers).
	PodResources string
	// For DRA drivers: the kubelet's plugin registration directory and
	// plugins directory, the API server's kubeconfig and the name of the
	// node (a fresh Node object per run).
	RegistrarDir, PluginsDir, Kubeconfig, NodeName string
}

// file is the targets file: several targets, run side by side.
type file struct {
	Targets []Target `json:"targets"`
}

// Load reads a targets file (YAML or JSON).
func Load(path string) ([]Target, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f file
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(f.Targets) == 0 {
		return nil, fmt.Errorf("%s: no targets", path)
	}
	for i := range f.Targets {
		if err := f.Targets[i].Validate(); err != nil {
			return nil, fmt.Errorf("%s: targets[%d]: %w", path, i, err)
		}
		if (f.Targets[i].DRA != nil) != (f.Targets[0].DRA != nil) {
			return nil, fmt.Errorf("%s: targets[%d]: DRA drivers and device plugins in one file: their tables differ, give them in two files", path, i)
		}
	}
	return f.Targets, nil
}

// Validate checks a target's fields; errors name the field and the
// value.
func (t Target) Validate() error {
	if t.Name == "" {
		return errors.New("name: empty")
	}
	if len(t.Command) == 0 {
		return errors.New("command: empty")
	}
	for field, p := range map[string]string{"socketDir": t.SocketDir, "cdiDir": t.CDIDir} {
		if p != "" && (!filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/") {
			return fmt.Errorf("%s=%q: must be a clean absolute path other than /", field, p)
		}
	}
	if t.DeviceFiles < 0 || t.IDs < 0 {
		return fmt.Errorf("deviceFiles=%d, ids=%d: must not be negative", t.DeviceFiles, t.IDs)
	}
	for name := range t.Files {
		if name == "" || filepath.Base(name) != name {
			return fmt.Errorf("files: %q must be a plain file name", name)
		}
	}
	if t.DRA != nil {
		return t.DRA.validate(t)
	}
	return nil
}

func (d *DRATarget) validate(t Target) error {
	if d.Driver == "" {
		return errors.New("dra.driver: empty")
	}
	if d.Devices < 0 {
		return fmt.Errorf("dra.devices=%d: must not be negative", d.Devices)
	}
	for field, set := range map[string]bool{"socketDir": t.SocketDir != "", "cdiDir": t.CDIDir != "", "removeDevice": t.RemoveDevice != "",
		"uevent": t.Uevent != nil, "ids": t.IDs != 0, "resource": t.Resource != ""} {
		if set {
			return fmt.Errorf("%s: not used for a DRA driver (dra is set)", field)
		}
	}
	return nil
}

// Run is one run's directories on the host, and as the plugin sees them,
// and its command line. Cleanup removes the directories.
type Run struct {
	// Host is where dp-bench finds the directories, Plugin what the
	// plugin is told.
	Host, Plugin Dirs
	// Binds are the directories bound where the plugin expects them.
	Binds []proc.Bind
	// Argv and Env are the expanded command line and environment.
	Argv, Env []string
	// Remove is the host path of RemoveDevice, Change the expanded
	// Uevent.Change, Evidence the expanded DRA.StepsEvidence.
	Remove, Change, Evidence string
	// Scratch is an empty directory for the mount namespace's overlays.
	Scratch string

	root     string
	fastRoot string // on a tmpfs: DevDir and CDIDir, as /dev and /run on a node
}

// Cluster is what a DRA driver's run gets from the API server: its
// kubeconfig and the node's name.
type Cluster struct{ Kubeconfig, NodeName string }

// Prepare makes the run's directories and files and expands the templates.
// DevDir and CDIDir are made in tmpfsDir (when not empty), the others in
// TMPDIR: on a node /dev and /run are tmpfs, the kubelet's and the
// plugin's state are on disk. A DRA driver's run gets c's kubeconfig and
// node name, the registration and plugins directories and the
// PodResources socket's path.
func (t Target) Prepare(tmpfsDir string, c *Cluster) (*Run, error) {
	root, err := os.MkdirTemp("", "dpb")
	if err != nil {
		return nil, err
	}
	r := &Run{root: root, fastRoot: root, Scratch: filepath.Join(root, "ns")}
	if tmpfsDir != "" {
		if r.fastRoot, err = os.MkdirTemp(tmpfsDir, "dpb"); err != nil {
			r.Cleanup()
			return nil, err
		}
	}
	r.Host = Dirs{SocketDir: filepath.Join(root, "s"), CDIDir: filepath.Join(r.fastRoot, "cdi"), DevDir: filepath.Join(r.fastRoot, "dev"), WorkDir: filepath.Join(root, "work")}
	// A device plugin's run: the kubelet's PodResources, served beside
	// kubelet.sock, outside the device plugin directory.
	r.Host.PodResources = filepath.Join(r.Host.WorkDir, "pod-resources.sock")
	mkdirs := []string{r.Host.SocketDir, r.Host.CDIDir, r.Host.DevDir, r.Host.WorkDir, r.Scratch}
	if t.DRA != nil {
		if c == nil {
			r.Cleanup()
			return nil, errors.New("a DRA driver needs the API server")
		}
		r.Host.RegistrarDir, r.Host.PluginsDir = filepath.Join(root, "reg"), filepath.Join(root, "plugins")
		r.Host.PodResources = filepath.Join(r.Host.SocketDir, "pod-resources.sock")
		r.Host.Kubeconfig, r.Host.NodeName = c.Kubeconfig, c.NodeName
		mkdirs = append(mkdirs, r.Host.RegistrarDir, r.Host.PluginsDir)
	}
	r.Plugin = r.Host
	if t.SocketDir != "" {
		r.Plugin.SocketDir = t.SocketDir
		r.Binds = append(r.Binds, proc.Bind{Src: r.Host.SocketDir, Dst: t.SocketDir})
	}
	if t.CDIDir != "" {
		r.Plugin.CDIDir = t.CDIDir
		r.Binds = append(r.Binds, proc.Bind{Src: r.Host.CDIDir, Dst: t.CDIDir})
	}
	fail := func(err error) (*Run, error) {
		r.Cleanup()
		return nil, err
	}
	for _, d := range mkdirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fail(err)
		}
	}
	for i := 0; i < t.DeviceFiles; i++ {
		p := filepath.Join(r.Host.DevDir, fmt.Sprintf("dev-%d", i))
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			return fail(fmt.Errorf("deviceFiles: mknod %s (needs root): %w", p, err))
		}
	}
	expand := func(field, s string) (string, error) {
		tpl, err := template.New(field).Option("missingkey=error").Funcs(template.FuncMap{"env": os.Getenv}).Parse(s)
		if err != nil {
			return "", fmt.Errorf("%s: %w", field, err)
		}
		var b bytes.Buffer
		if err := tpl.Execute(&b, r.Plugin); err != nil {
			return "", fmt.Errorf("%s: %w", field, err)
		}
		return b.String(), nil
	}
	names := make([]string, 0, len(t.Files))
	for n := range t.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c, err := expand("files."+n, t.Files[n])
		if err != nil {
			return fail(err)
		}
		if err := os.WriteFile(filepath.Join(r.Host.WorkDir, n), []byte(c), 0o644); err != nil {
			return fail(err)
		}
	}
	for i, a := range t.Command {
		v, err := expand(fmt.Sprintf("command[%d]", i), a)
		if err != nil {
			return fail(err)
		}
		r.Argv = append(r.Argv, v)
	}
	if r.Argv[0] == "" {
		return fail(fmt.Errorf("command[0]=%q: the plugin binary is not set", t.Command[0]))
	}
	r.Env = []string{"PATH=" + os.Getenv("PATH")}
	for i, e := range t.Env {
		v, err := expand(fmt.Sprintf("env[%d]", i), e)
		if err != nil {
			return fail(err)
		}
		if !strings.Contains(v, "=") {
			return fail(fmt.Errorf("env[%d]=%q: want KEY=VALUE", i, v))
		}
		r.Env = append(r.Env, v)
	}
	if t.Setup != "" {
		v, err := expand("setup", t.Setup)
		if err != nil {
			return fail(err)
		}
		if out, err := exec.Command("sh", "-c", v).CombinedOutput(); err != nil {
			return fail(fmt.Errorf("setup: %w: %s", err, out))
		}
	}
	if t.Uevent != nil {
		if r.Change, err = expand("uevent.change", t.Uevent.Change); err != nil {
			return fail(err)
		}
	}
	if t.DRA != nil && t.DRA.StepsEvidence != "" {
		if r.Evidence, err = expand("dra.stepsEvidence", t.DRA.StepsEvidence); err != nil {
			return fail(err)
		}
	}
	if t.RemoveDevice != "" {
		v, err := expand("removeDevice", t.RemoveDevice)
		if err != nil {
			return fail(err)
		}
		// The plugin's view of a path below a bound directory.
		r.Remove = r.toHost(v)
	}
	return r, nil
}

// toHost maps a path as the plugin sees it to the host.
func (r *Run) toHost(p string) string {
	for _, b := range r.Binds {
		if rel, err := filepath.Rel(b.Dst, p); err == nil && !strings.HasPrefix(rel, "..") {
			return filepath.Join(b.Src, rel)
		}
	}
	return p
}

// Cleanup removes the run's directories.
func (r *Run) Cleanup() {
	_ = os.RemoveAll(r.root)
	if r.fastRoot != "" && r.fastRoot != r.root {
		_ = os.RemoveAll(r.fastRoot)
	}
}

// Settings bound and size one run.
type Settings struct {
	// Calls is the number of timed calls per RPC (p50 over them).
	Calls int
	// Idle is the window in which CPU and wake-ups are measured with no
	// kubelet activity (0: not measured).
	Idle time.Duration
	// Prompt bounds "at once": the first ListAndWatch list.
	Prompt time.Duration
	// Register bounds the first registration, Restart the one after a
	// kubelet restart, Change a ListAndWatch update after a device file
	// is removed or put back.
	Register, Restart, Change time.Duration
	// Settle is how long no further registration may arrive after the
	// one that followed a kubelet restart.
	Settle time.Duration
	// Connect bounds the kubelet's call to the endpoint during Register.
	Connect time.Duration
	// Term bounds the exit after SIGTERM.
	Term time.Duration
	// TmpfsDir holds the runs' DevDir and CDIDir ("": TMPDIR).
	TmpfsDir string
	// DRACalls is the number of claims per size a DRA driver prepares
	// (p50 over them).
	DRACalls int
	// APIInterval is the least time between two calls that make a DRA
	// driver read a claim from the API server: above the interval of
	// client-go's default limiter (5 a second), so that the limiter is
	// not what is timed.
	APIInterval time.Duration
}

// DefaultSettings suit a benchmark; tests shorten them.
func DefaultSettings() Settings {
	return Settings{Calls: 200, Idle: 10 * time.Second, Prompt: time.Second, Register: 30 * time.Second,
		Restart: 30 * time.Second, Change: 15 * time.Second, Settle: time.Second, Connect: 2 * time.Second, Term: 10 * time.Second,
		TmpfsDir: defaultTmpfsDir(), DRACalls: 20, APIInterval: 210 * time.Millisecond}
}

// defaultTmpfsDir is /dev/shm when it is a tmpfs, else "" (TMPDIR).
func defaultTmpfsDir() string {
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		return "/dev/shm"
	}
	return ""
}

// IsDRA reports whether the targets are DRA drivers (Load keeps a file to
// one kind).
func IsDRA(ts []Target) bool {
	return slices.ContainsFunc(ts, func(t Target) bool { return t.DRA != nil })
}

// BaseName is the last element of the path p (the whole of p without a
// slash).
func BaseName(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}
