// Package config loads and validates the plugin configuration from flags,
// environment variables and an optional YAML file, in that order of
// precedence, and fills in defaults. Validation happens once, before anything
// is written on the node.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// ErrInvalid is wrapped by every validation error, so callers can tell bad
// input (exit status 2) from runtime failures with errors.Is.
var ErrInvalid = errors.New("invalid configuration")

// FieldError names the offending field and value.
type FieldError struct {
	Field  string
	Value  string
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("invalid configuration: %s=%q: %s", e.Field, e.Value, e.Reason)
}

// Unwrap lets errors.Is(err, ErrInvalid) match.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func fieldErr(field, value, format string, args ...any) error {
	return &FieldError{Field: field, Value: value, Reason: fmt.Sprintf(format, args...)}
}

// Device list strategies for Allocate answers.
const (
	StrategyCDICRI         = "cdi-cri"
	StrategyCDIAnnotations = "cdi-annotations"
	StrategyDeviceSpecs    = "device-specs"
)

// Defaults.
const (
	DefaultPluginName             = "simple-device-plugin"
	DefaultResourceName           = "example.com/simple-device"
	DefaultNumberDevices          = 2
	DefaultIDPrefix               = "simple-device"
	DefaultDevicePluginDir        = "/var/lib/kubelet/device-plugins"
	DefaultCDIDir                 = "/var/run/cdi"
	DefaultDevRoot                = "/dev"
	DefaultStateDir               = "/var/lib/cdi-device-plugin"
	DefaultLogLevel               = "info"
	DefaultLogFormat              = "text"
	DefaultNodeType               = "char"
	DefaultNodeMajor       uint32 = 1
	DefaultNodeMinor       uint32 = 3

	// MaxCount bounds the number of devices of one resource, MaxReplicas the
	// replicas of one device: a typo must not create a million nodes.
	MaxCount    = 4096
	MaxReplicas = 64
	// maxSocketPath is the longest unix socket path Linux accepts (108 bytes
	// including the terminating NUL).
	maxSocketPath = 107
)

// Config is the validated configuration of one plugin process.
type Config struct {
	PluginName         string     `json:"pluginName,omitempty"`
	DevicePluginDir    string     `json:"devicePluginDir,omitempty"`
	CDIDir             string     `json:"cdiDir,omitempty"`
	DevRoot            string     `json:"devRoot,omitempty"`
	StateDir           string     `json:"stateDir,omitempty"`
	NodeName           string     `json:"nodeName,omitempty"`
	LogLevel           string     `json:"logLevel,omitempty"`
	LogFormat          string     `json:"logFormat,omitempty"`
	DeviceListStrategy []string   `json:"deviceListStrategy,omitempty"`
	Resources          []Resource `json:"resources,omitempty"`

	// ConfigFile is the file the configuration was read from, if any.
	ConfigFile string `json:"-"`
	// Namespace is the namespace of the plugin's pod (POD_NAMESPACE, from
	// the downward API), empty outside a pod.
	Namespace string `json:"-"`
}

// Owner identifies this deployment of the plugin in the specs it writes:
// the plugin name, qualified by the pod's namespace when it has one, so
// that two deployments never remove each other's specs.
func (c *Config) Owner() string {
	if c.Namespace == "" {
		return c.PluginName
	}
	return c.Namespace + "/" + c.PluginName
}

// Resource is one extended resource advertised by the plugin.
type Resource struct {
	// Name is the extended resource name, e.g. example.com/fpga.
	Name string `json:"name"`
	// Count is the number of simulated devices (not with HostDevices).
	Count *int `json:"count,omitempty"`
	// IDPrefix starts every device ID: <idPrefix>-<node>-<index>.
	IDPrefix string `json:"idPrefix,omitempty"`
	// DeviceFilePrefix names the simulated nodes: <devRoot>/<prefix>-<index>.
	DeviceFilePrefix string `json:"deviceFilePrefix,omitempty"`
	// DeviceNode describes the simulated node.
	DeviceNode DeviceNode `json:"deviceNode,omitempty"`
	// EnvPrefix, when set, adds <envPrefix>_<index>=<path> per device and
	// <envPrefix>_DEVICES=<ids> per container.
	EnvPrefix string `json:"envPrefix,omitempty"`
	// AnnotationPrefix, when set, adds <annotationPrefix>-<index>=<id>.
	AnnotationPrefix string `json:"annotationPrefix,omitempty"`
	// Replicas advertises every device this many times.
	Replicas *int `json:"replicas,omitempty"`
	// NUMANodes spreads the devices over this many simulated NUMA nodes.
	NUMANodes int `json:"numaNodes,omitempty"`
	// HostDevices are globs, relative to the dev root, of existing nodes.
	HostDevices []string `json:"hostDevices,omitempty"`
	// Mounts are added to every container that gets a device.
	Mounts []Mount `json:"mounts,omitempty"`
	// Prestart configures PreStartContainer (nil: no steps).
	Prestart *Prestart `json:"prestart,omitempty"`
}

// Prestart is the device preparation run before every container start.
type Prestart struct {
	// Budget bounds one PreStartContainer call (default 25s, below the
	// kubelet's 30s).
	Budget Duration `json:"budget,omitempty"`
	// OnFailure: "unhealthy" (default) reports a device whose preparation
	// failed as Unhealthy; "ignore" only fails the call.
	OnFailure string `json:"onFailure,omitempty"`
	// Recovery: "auto" (default) makes such a device Healthy again after
	// any later preparation that succeeds, the plugin's own background
	// re-preparation included; "reset" only after one that includes a
	// reset step (which the resource must have); "never" keeps it
	// Unhealthy until its state.json is removed and the plugin restarted.
	Recovery string `json:"recovery,omitempty"`
	// RecoveryInterval is the wait before a failed device is prepared
	// again in the background (default 30s); it doubles after every
	// failed attempt, up to 10m.
	RecoveryInterval Duration `json:"recoveryInterval,omitempty"`
	Steps            []Step   `json:"steps"`
}

// Step is one preparation step.
type Step struct {
	// Type is reset, reprogram or exec.
	Type    string   `json:"type"`
	Timeout Duration `json:"timeout,omitempty"`
	// reprogram: the image (absolute path; empty: the built-in image), its
	// expected sha256, and whether to copy even when already loaded.
	Image  string `json:"image,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	Always bool   `json:"always,omitempty"`
	// exec: the command (absolute path first) with templated arguments and
	// the extra environment.
	Command []string          `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
}

// Duration is a time.Duration written as "10s" in YAML.
type Duration struct{ time.Duration }

// UnmarshalJSON accepts a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	s, err := strconv.Unquote(string(b))
	if err != nil {
		return fmt.Errorf("duration must be a string like \"10s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(strconv.Quote(d.String())), nil }

// Step types.
const (
	StepReset     = "reset"
	StepReprogram = "reprogram"
	StepExec      = "exec"
)

// DeviceNode is the kind of node created for a simulated device.
type DeviceNode struct {
	Type  string  `json:"type,omitempty"`
	Major *uint32 `json:"major,omitempty"`
	Minor *uint32 `json:"minor,omitempty"`
}

// Mount is a bind mount added by Allocate.
type Mount struct {
	HostPath      string `json:"hostPath"`
	ContainerPath string `json:"containerPath"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
}

// Simulated reports whether the resource creates its own nodes.
func (r *Resource) Simulated() bool { return len(r.HostDevices) == 0 }

// ReplicaCount returns the validated replica count.
func (r *Resource) ReplicaCount() int {
	if r.Replicas == nil {
		return 1
	}
	return *r.Replicas
}

// DeviceCount returns the validated number of simulated devices.
func (r *Resource) DeviceCount() int {
	if r.Count == nil {
		return 0
	}
	return *r.Count
}

// Has reports whether strategy s is enabled.
func (c *Config) Has(s string) bool {
	for _, v := range c.DeviceListStrategy {
		if v == s {
			return true
		}
	}
	return false
}

// Env is how the loader reads the environment (os.LookupEnv in production).
type Env func(string) (string, bool)

// Load parses args (without the program name), the environment and the
// config file they name, applies defaults and validates the result.
// flag.ErrHelp is returned as is for -h.
func Load(args []string, env Env, output io.Writer) (*Config, bool, error) {
	fs := flag.NewFlagSet("cdi-device-plugin", flag.ContinueOnError)
	fs.SetOutput(output)
	type strFlag struct {
		name, env, usage string
		val              *string
	}
	var (
		configFile, devicePluginDir, cdiDir, devRoot, stateDir string
		nodeName, logLevel, logFormat, strategy                string
		version                                                bool
	)
	flags := []strFlag{
		{"config", "CONFIG_FILE", "YAML configuration file with a list of resources", &configFile},
		{"device-plugin-dir", "DEVICE_PLUGIN_DIR", "kubelet device plugin directory (default " + DefaultDevicePluginDir + ")", &devicePluginDir},
		{"cdi-dir", "CDI_DIR", "directory the CDI specs are written to (default " + DefaultCDIDir + ")", &cdiDir},
		{"dev-root", "DEV_ROOT", "directory simulated device nodes are created in (default " + DefaultDevRoot + ")", &devRoot},
		{"state-dir", "STATE_DIR", "directory for per-device state (default " + DefaultStateDir + ")", &stateDir},
		{"node-name", "NODE_NAME", "node name used in device IDs", &nodeName},
		{"log-level", "LOG_LEVEL", "log level: trace, debug, info, warn, error (default info)", &logLevel},
		{"log-format", "LOG_FORMAT", "log format: text or json (default text)", &logFormat},
		{"device-list-strategy", "DEVICE_LIST_STRATEGY", "comma-separated: cdi-cri, cdi-annotations, device-specs (default cdi-cri)", &strategy},
	}
	for _, f := range flags {
		fs.StringVar(f.val, f.name, "", f.usage+" [$"+f.env+"]")
	}
	fs.BoolVar(&version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return nil, false, err
	}
	if fs.NArg() > 0 {
		return nil, false, fieldErr("args", strings.Join(fs.Args(), " "), "unexpected positional arguments")
	}
	if version {
		return nil, true, nil
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// pick returns the flag value if given, else the environment's.
	pick := func(f strFlag) (string, bool) {
		if set[f.name] {
			return *f.val, true
		}
		if v, ok := env(f.env); ok {
			return v, true
		}
		return "", false
	}

	cfg := &Config{}
	if path, ok := pick(flags[0]); ok && path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, false, &FieldError{Field: "config", Value: path, Reason: err.Error()}
		}
		if err := yaml.UnmarshalStrict(data, cfg); err != nil {
			return nil, false, &FieldError{Field: "config", Value: path, Reason: err.Error()}
		}
		if len(cfg.Resources) == 0 {
			return nil, false, fieldErr("resources", path, "the config file lists no resources")
		}
		cfg.ConfigFile = path
	}
	overrides := []*string{nil, &cfg.DevicePluginDir, &cfg.CDIDir, &cfg.DevRoot, &cfg.StateDir, &cfg.NodeName, &cfg.LogLevel, &cfg.LogFormat}
	for i, dst := range overrides {
		if dst == nil {
			continue
		}
		if v, ok := pick(flags[i]); ok {
			*dst = v
		}
	}
	if v, ok := pick(flags[8]); ok {
		cfg.DeviceListStrategy = splitList(v)
	}
	if v, ok := env("PLUGIN_NAME"); ok && v != "" {
		cfg.PluginName = v
	}
	if v, ok := env("POD_NAMESPACE"); ok {
		cfg.Namespace = v
	}
	if cfg.ConfigFile == "" {
		r, err := resourceFromEnv(env)
		if err != nil {
			return nil, false, err
		}
		cfg.Resources = []Resource{r}
	}
	if err := cfg.defaultAndValidate(); err != nil {
		return nil, false, err
	}
	return cfg, false, nil
}

// resourceFromEnv builds the single resource of the simple device plugin's
// environment variables.
func resourceFromEnv(env Env) (Resource, error) {
	get := func(k, def string) string {
		if v, ok := env(k); ok && v != "" {
			return v
		}
		return def
	}
	r := Resource{
		Name:             get("RESOURCE_NAME", DefaultResourceName),
		IDPrefix:         get("DEVICE_ID_PREFIX", DefaultIDPrefix),
		DeviceFilePrefix: get("DEVICE_FILE_PREFIX", ""),
		EnvPrefix:        get("ENV_PREFIX", ""),
		AnnotationPrefix: get("ANNOTATION_PREFIX", ""),
	}
	n := DefaultNumberDevices
	if v := get("NUMBER_DEVICES", ""); v != "" {
		var err error
		n, err = strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return r, fieldErr("NUMBER_DEVICES", v, "not an integer")
		}
	}
	r.Count = &n
	steps := get("PRESTART_STEPS", StepReset+","+StepReprogram)
	if steps != "none" {
		p := &Prestart{}
		if v := get("PRESTART_BUDGET", ""); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				return r, fieldErr("PRESTART_BUDGET", v, "not a duration like 25s")
			}
			p.Budget.Duration = d
		}
		for _, t := range splitList(steps) {
			st := Step{Type: t}
			if t == StepReprogram {
				st.Image, st.SHA256 = get("FIRMWARE_IMAGE", ""), get("FIRMWARE_SHA256", "")
			}
			p.Steps = append(p.Steps, st)
		}
		r.Prestart = p
	}
	return r, nil
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
