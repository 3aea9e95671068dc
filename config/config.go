// Package config loads the plugin configuration from flags, environment
// variables and an optional YAML file, in that order of precedence, fills
// in defaults and parses everything into typed, normalised values, so that
// the rest of the program never parses a setting again. It is a leaf: it
// imports no package of this project. Checks that need the runtime
// packages (exec templates, socket paths, device names) are made by their
// constructors; cmd turns their errors into FieldErrors.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"sigs.k8s.io/yaml"
)

// ErrInvalid is wrapped by every validation error, so callers can tell bad
// input (exit status 2) from runtime failures with errors.Is.
var ErrInvalid = errors.New("invalid configuration")

// ErrVersion is returned by Load for --version, as flag.ErrHelp is for -h.
var ErrVersion = errors.New("version requested")

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

// Version is the version of the configuration file format this plugin
// reads; a file without a version is read as this one.
const Version = "v1"

// Strategy is a device list strategy: how Allocate hands devices over.
type Strategy string

// Device list strategies for Allocate answers.
const (
	StrategyCDICRI         Strategy = "cdi-cri"
	StrategyCDIAnnotations Strategy = "cdi-annotations"
	StrategyDeviceSpecs    Strategy = "device-specs"
)

var strategies = []Strategy{StrategyCDICRI, StrategyCDIAnnotations, StrategyDeviceSpecs}

// Strategies is a set of device list strategies.
type Strategies []Strategy

// Includes reports whether s is enabled.
func (ss Strategies) Includes(s Strategy) bool { return slices.Contains(ss, s) }

// AnyCDI reports whether the runtime resolves CDI names (from the CRI
// field or the annotations).
func (ss Strategies) AnyCDI() bool {
	return ss.Includes(StrategyCDICRI) || ss.Includes(StrategyCDIAnnotations)
}

// NodeType is the type of a simulated device node.
type NodeType string

// Node types.
const (
	NodeChar  NodeType = "char"
	NodeBlock NodeType = "block"
)

// CDI is the type as CDI and OCI spell it: "c" or "b".
func (t NodeType) CDI() string {
	if t == NodeBlock {
		return "b"
	}
	return "c"
}

// StepType is the type of a preparation step.
type StepType string

// Step types.
const (
	StepReset     StepType = "reset"
	StepReprogram StepType = "reprogram"
	StepExec      StepType = "exec"
)

// OnFailure says what a failed preparation does to the device.
type OnFailure string

// OnFailure values.
const (
	// OnFailureUnhealthy reports the device Unhealthy.
	OnFailureUnhealthy OnFailure = "unhealthy"
	// OnFailureIgnore only fails the call.
	OnFailureIgnore OnFailure = "ignore"
)

// MarksUnhealthy reports whether a failed preparation makes the device
// Unhealthy.
func (o OnFailure) MarksUnhealthy() bool { return o != OnFailureIgnore }

// Recovery says how a device a failed preparation made Unhealthy becomes
// Healthy again.
type Recovery string

// Recovery values.
const (
	// RecoverAuto: after any later preparation that succeeds in full, the
	// plugin's own background re-preparation included.
	RecoverAuto Recovery = "auto"
	// RecoverReset: the same, but only if it includes a reset step.
	RecoverReset Recovery = "reset"
	// RecoverNever: only when an operator removes the device's state.
	RecoverNever Recovery = "never"
)

// LogFormat is the format of log lines.
type LogFormat string

// Log formats.
const (
	LogText LogFormat = "text"
	LogJSON LogFormat = "json"
)

// Defaults.
const (
	DefaultPluginName                    = "simple-device-plugin"
	DefaultResourceName                  = "example.com/simple-device"
	DefaultNumberDevices                 = 2
	DefaultIDPrefix                      = "simple-device"
	DefaultDevicePluginDir               = "/var/lib/kubelet/device-plugins"
	DefaultCDIDir                        = "/var/run/cdi"
	DefaultDevRoot                       = "/dev"
	DefaultStateDir                      = "/var/lib/cdi-device-plugin"
	DefaultLogLevel                      = "info"
	DefaultLogFormat                     = LogText
	DefaultNodeType                      = NodeChar
	DefaultNodeMajor              uint32 = 1
	DefaultNodeMinor              uint32 = 3
	DefaultBudget                        = 25 * time.Second
	DefaultStepTimeout                   = 10 * time.Second
	DefaultRecoveryInterval              = 30 * time.Second
	DefaultOnFailure                     = OnFailureUnhealthy
	DefaultRecovery                      = RecoverAuto
	DefaultPrestartStepsInEnvMode        = "reset,reprogram"
	DefaultPodResourcesSocket            = "/var/lib/kubelet/pod-resources/kubelet.sock"

	// MaxCount bounds the number of devices of one resource, MaxReplicas the
	// replicas of one device: a typo must not create a million nodes.
	MaxCount    = 4096
	MaxReplicas = 64
	// MaxBudget keeps a PreStartContainer call below the kubelet's 30 s limit.
	MaxBudget = 29 * time.Second
	// MaxRecoveryInterval bounds the first wait before a background
	// re-preparation.
	MaxRecoveryInterval = time.Hour
)

// Config is the parsed configuration of one plugin process.
type Config struct {
	// Version is the file format's version (Version when absent).
	Version            string     `json:"version,omitempty"`
	PluginName         string     `json:"pluginName,omitempty"`
	DevicePluginDir    string     `json:"devicePluginDir,omitempty"`
	CDIDir             string     `json:"cdiDir,omitempty"`
	DevRoot            string     `json:"devRoot,omitempty"`
	StateDir           string     `json:"stateDir,omitempty"`
	NodeName           string     `json:"nodeName,omitempty"`
	LogLevel           string     `json:"logLevel,omitempty"`
	LogFormat          LogFormat  `json:"logFormat,omitempty"`
	DeviceListStrategy Strategies `json:"deviceListStrategy,omitempty"`
	// MetricsAddress is where /metrics, /healthz and /readyz are served
	// (host:port); empty: not served.
	MetricsAddress string `json:"metricsAddress,omitempty"`
	// PodResourcesSocket is the kubelet's PodResources API, read for the
	// pod_device_assignment metric.
	PodResourcesSocket string     `json:"podResourcesSocket,omitempty"`
	Resources          []Resource `json:"resources,omitempty"`

	// Level is LogLevel parsed.
	Level logrus.Level `json:"-"`
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

	// Domain and Class are the two parts of Name (the CDI class).
	Domain string `json:"-"`
	Class  string `json:"-"`
	// HostGlobs are HostDevices relative to the dev root ("/dev/" removed).
	HostGlobs []string `json:"-"`
}

// Prestart is the device preparation run before every container start.
type Prestart struct {
	// Budget bounds one PreStartContainer call (default 25s, below the
	// kubelet's 30s).
	Budget Duration `json:"budget,omitempty"`
	// OnFailure: unhealthy (default) or ignore.
	OnFailure OnFailure `json:"onFailure,omitempty"`
	// Recovery: auto (default), reset or never (see Recovery).
	Recovery Recovery `json:"recovery,omitempty"`
	// RecoveryInterval is the wait before a failed device is prepared
	// again in the background (default 30s); it doubles after every
	// failed attempt, up to 10m.
	RecoveryInterval Duration `json:"recoveryInterval,omitempty"`
	Steps            []Step   `json:"steps"`
}

// HasReset reports whether one of the steps resets the device.
func (p *Prestart) HasReset() bool {
	return slices.ContainsFunc(p.Steps, func(s Step) bool { return s.Type == StepReset })
}

// Step is one preparation step.
type Step struct {
	Type StepType `json:"type"`
	// Timeout bounds one run of the step (default 10s).
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

// DeviceNode is the kind of node created for a simulated device.
type DeviceNode struct {
	Type  NodeType `json:"type,omitempty"`
	Major *uint32  `json:"major,omitempty"`
	Minor *uint32  `json:"minor,omitempty"`
}

// Mount is a bind mount added by Allocate.
type Mount struct {
	HostPath      string `json:"hostPath"`
	ContainerPath string `json:"containerPath"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
}

// Simulated reports whether the resource creates its own nodes.
func (r *Resource) Simulated() bool { return len(r.HostDevices) == 0 }

// ReplicaCount returns the replica count.
func (r *Resource) ReplicaCount() int {
	if r.Replicas == nil {
		return 1
	}
	return *r.Replicas
}

// DeviceCount returns the number of simulated devices.
func (r *Resource) DeviceCount() int {
	if r.Count == nil {
		return 0
	}
	return *r.Count
}

// Env is how the loader reads the environment (os.LookupEnv in production).
type Env func(string) (string, bool)

// flagDef is a flag with its environment variable and the field it sets.
type flagDef struct {
	name, env, usage string
	set              func(c *Config, v string)
}

// configFlag names the configuration file; it is read before the others.
var configFlag = flagDef{"config", "CONFIG_FILE", "YAML configuration file with a list of resources", nil}

// flagDefs are the flags that override the file, each wired to its field.
var flagDefs = []flagDef{
	{"device-plugin-dir", "DEVICE_PLUGIN_DIR", "kubelet device plugin directory (default " + DefaultDevicePluginDir + ")",
		func(c *Config, v string) { c.DevicePluginDir = v }},
	{"cdi-dir", "CDI_DIR", "directory the CDI specs are written to (default " + DefaultCDIDir + ")",
		func(c *Config, v string) { c.CDIDir = v }},
	{"dev-root", "DEV_ROOT", "directory simulated device nodes are created in (default " + DefaultDevRoot + ")",
		func(c *Config, v string) { c.DevRoot = v }},
	{"state-dir", "STATE_DIR", "directory for per-device state (default " + DefaultStateDir + ")",
		func(c *Config, v string) { c.StateDir = v }},
	{"node-name", "NODE_NAME", "node name used in device IDs",
		func(c *Config, v string) { c.NodeName = v }},
	{"log-level", "LOG_LEVEL", "log level: trace, debug, info, warn, error (default info)",
		func(c *Config, v string) { c.LogLevel = v }},
	{"log-format", "LOG_FORMAT", "log format: text or json (default text)",
		func(c *Config, v string) { c.LogFormat = LogFormat(v) }},
	{"metrics-address", "METRICS_ADDRESS", "host:port to serve /metrics, /healthz and /readyz on (default: not served)",
		func(c *Config, v string) { c.MetricsAddress = v }},
	{"pod-resources-socket", "POD_RESOURCES_SOCKET", "the kubelet's PodResources socket, for the pod_device_assignment metric (default " + DefaultPodResourcesSocket + ")",
		func(c *Config, v string) { c.PodResourcesSocket = v }},
	{"device-list-strategy", "DEVICE_LIST_STRATEGY", "comma-separated: cdi-cri, cdi-annotations, device-specs (default cdi-cri)",
		func(c *Config, v string) {
			c.DeviceListStrategy = nil
			for _, s := range splitList(v) {
				c.DeviceListStrategy = append(c.DeviceListStrategy, Strategy(s))
			}
		}},
}

// Environment variables read without a flag.
const (
	envPluginName   = "PLUGIN_NAME"
	envPodNamespace = "POD_NAMESPACE"
)

// simpleEnv is the simple device plugin's environment: one resource, used
// when there is no config file. Field is the resource field it sets, so
// that errors name the variable the user wrote.
var simpleEnv = []EnvVar{
	{Name: "RESOURCE_NAME", Field: "name", Default: DefaultResourceName, Usage: "extended resource name"},
	{Name: "NUMBER_DEVICES", Field: "count", Default: strconv.Itoa(DefaultNumberDevices), Usage: "number of simulated devices"},
	{Name: "DEVICE_ID_PREFIX", Field: "idPrefix", Default: DefaultIDPrefix, Usage: "first part of every device ID"},
	{Name: "DEVICE_FILE_PREFIX", Field: "deviceFilePrefix", Usage: "simulated nodes <dev-root>/<prefix>-<i> (default: DEVICE_ID_PREFIX)"},
	{Name: "ENV_PREFIX", Field: "envPrefix", Usage: "adds <prefix>_<i> per device and <prefix>_DEVICES per container"},
	{Name: "ANNOTATION_PREFIX", Field: "annotationPrefix", Usage: "adds <prefix>-<i>=<ID> per device"},
	{Name: "PRESTART_STEPS", Field: "prestart.steps.type", Default: DefaultPrestartStepsInEnvMode, Usage: "PreStartContainer steps; none: no PreStartContainer"},
	{Name: "PRESTART_BUDGET", Field: "prestart.budget", Default: DefaultBudget.String(), Usage: "budget of one PreStartContainer call"},
	{Name: "FIRMWARE_IMAGE", Field: "prestart.steps.image", Usage: "image of the reprogram step (default: a built-in image)"},
	{Name: "FIRMWARE_SHA256", Field: "prestart.steps.sha256", Usage: "expected sha256 of the image"},
}

// EnvVar is an environment variable the plugin reads.
type EnvVar struct {
	Name string
	// Flag is the flag that overrides it ("" for none).
	Flag string
	// Field is the resource field it sets in the simple mode ("" for a
	// global setting).
	Field   string
	Default string
	Usage   string
}

// EnvVars lists every environment variable the plugin reads: the one list
// docs/configuration.md and deploy/deploy.sh are checked against.
func EnvVars() []EnvVar {
	out := []EnvVar{{Name: configFlag.env, Flag: configFlag.name, Usage: configFlag.usage}}
	for _, f := range flagDefs {
		out = append(out, EnvVar{Name: f.env, Flag: f.name, Usage: f.usage})
	}
	out = append(out,
		EnvVar{Name: envPluginName, Default: DefaultPluginName, Usage: "base of the socket names; owner of our CDI specs"},
		EnvVar{Name: envPodNamespace, Usage: "the pod's namespace; qualifies the owner of our CDI specs"},
	)
	return append(out, simpleEnv...)
}

// Load parses args (without the program name), the environment and the
// config file they name, applies defaults and validates the result.
// flag.ErrHelp is returned as is for -h, ErrVersion for --version.
func Load(args []string, env Env, output io.Writer) (*Config, error) {
	fs := flag.NewFlagSet("cdi-device-plugin", flag.ContinueOnError)
	fs.SetOutput(output)
	vals := map[string]*string{}
	for _, f := range append([]flagDef{configFlag}, flagDefs...) {
		vals[f.name] = fs.String(f.name, "", f.usage+" [$"+f.env+"]")
	}
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fieldErr("args", strings.Join(fs.Args(), " "), "unexpected positional arguments")
	}
	if *version {
		return nil, ErrVersion
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// pick returns the flag's value if given, else the environment's.
	pick := func(f flagDef) (string, bool) {
		if set[f.name] {
			return *vals[f.name], true
		}
		return env(f.env)
	}

	cfg := &Config{}
	if path, ok := pick(configFlag); ok && path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, &FieldError{Field: "config", Value: path, Reason: err.Error()}
		}
		if err := yaml.UnmarshalStrict(data, cfg); err != nil {
			return nil, &FieldError{Field: "config", Value: path, Reason: err.Error()}
		}
		if cfg.Version != "" && cfg.Version != Version {
			return nil, fieldErr("version", cfg.Version, "unknown configuration version; this plugin reads %s", Version)
		}
		if len(cfg.Resources) == 0 {
			return nil, fieldErr("resources", path, "the config file lists no resources")
		}
		cfg.ConfigFile = path
	}
	cfg.Version = Version
	for _, f := range flagDefs {
		if v, ok := pick(f); ok {
			f.set(cfg, v)
		}
	}
	if v, ok := env(envPluginName); ok && v != "" {
		cfg.PluginName = v
	}
	if v, ok := env(envPodNamespace); ok {
		cfg.Namespace = v
	}
	if cfg.ConfigFile == "" {
		r, err := resourceFromEnv(env)
		if err != nil {
			return nil, err
		}
		cfg.Resources = []Resource{r}
	}
	if err := cfg.defaultAndValidate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// resourceFromEnv builds the single resource of the simple device plugin's
// environment variables.
func resourceFromEnv(env Env) (Resource, error) {
	get := func(k string) string {
		if v, ok := env(k); ok && v != "" {
			return v
		}
		for _, e := range simpleEnv {
			if e.Name == k {
				return e.Default
			}
		}
		return ""
	}
	r := Resource{
		Name:             get("RESOURCE_NAME"),
		IDPrefix:         get("DEVICE_ID_PREFIX"),
		DeviceFilePrefix: get("DEVICE_FILE_PREFIX"),
		EnvPrefix:        get("ENV_PREFIX"),
		AnnotationPrefix: get("ANNOTATION_PREFIX"),
	}
	v := get("NUMBER_DEVICES")
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return r, fieldErr("NUMBER_DEVICES", v, "not an integer")
	}
	r.Count = &n
	steps := get("PRESTART_STEPS")
	if steps == "none" {
		return r, nil
	}
	p := &Prestart{}
	if v := get("PRESTART_BUDGET"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return r, fieldErr("PRESTART_BUDGET", v, "not a duration like 25s")
		}
		p.Budget.Duration = d
	}
	for _, t := range splitList(steps) {
		st := Step{Type: StepType(t)}
		if st.Type == StepReprogram {
			st.Image, st.SHA256 = get("FIRMWARE_IMAGE"), get("FIRMWARE_SHA256")
		}
		p.Steps = append(p.Steps, st)
	}
	r.Prestart = p
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
