package target

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"golang.org/x/sys/unix"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
)

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
			return nil, ErrNoCluster
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
		if err := sh("setup", v); err != nil {
			return fail(err)
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

// BaseName is the last element of the path p (the whole of p without a
// slash).
func BaseName(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}
