package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

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

// Level is a log level, LogLevel parsed. It is config's own type, so that
// callers need not share the logging library; cmd maps it onto logrus.
type Level string

// Log levels, from the most to the least verbose. Their values are the
// canonical spellings; LogLevel may also spell them in any case, and Warn
// as warning.
const (
	LevelTrace Level = "trace"
	LevelDebug Level = "debug"
	LevelInfo  Level = "info"
	LevelWarn  Level = "warn"
	LevelError Level = "error"
	LevelFatal Level = "fatal"
	LevelPanic Level = "panic"
)

var levels = []Level{LevelTrace, LevelDebug, LevelInfo, LevelWarn, LevelError, LevelFatal, LevelPanic}

// String returns the canonical spelling of l.
func (l Level) String() string { return string(l) }

// parseLevel reads a LogLevel in any case, warning standing for warn: the
// spellings logrus.ParseLevel accepts.
func parseLevel(s string) (Level, bool) {
	if strings.EqualFold(s, "warning") {
		return LevelWarn, true
	}
	for _, l := range levels {
		if strings.EqualFold(s, string(l)) {
			return l, true
		}
	}
	return "", false
}

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
	// MaxPreBindBudget bounds the steps of a resource prepared before
	// binding (PrepareBeforeBind), which the DRA driver runs out of any
	// kubelet call: the scheduler's default binding timeout (10 minutes),
	// after which it gives the devices up anyway.
	MaxPreBindBudget = 10 * time.Minute
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
	PodResourcesSocket string `json:"podResourcesSocket,omitempty"`
	// SysRoot and ProcRoot are where sysfs and procfs are read (pci, usb,
	// NUMA of host devices): /sys and /proc unless tests or e2e point
	// them at a fixture tree.
	SysRoot   string     `json:"sysRoot,omitempty"`
	ProcRoot  string     `json:"procRoot,omitempty"`
	Resources []Resource `json:"resources,omitempty"`

	// FaultControlFlag is --fault-control as written; FaultControl, it
	// parsed, serves the fault control socket (docs/simulation.md).
	FaultControlFlag string `json:"-"`
	FaultControl     bool   `json:"-"`

	// Level is LogLevel parsed.
	Level Level `json:"-"`
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
	// PCI finds the devices by PCI identity, USB by USB identity (each
	// excludes count and hostDevices).
	PCI *PCISelector `json:"pci,omitempty"`
	USB *USBSelector `json:"usb,omitempty"`
	// SharedNodes are added to every device of a host resource (globs,
	// pci, usb): paths below the dev root ("/dev/" optional); absent
	// ones are skipped.
	SharedNodes []string `json:"sharedNodes,omitempty"`
	// ContainerPath is where a device's own node appears in the
	// container, a template of {{.Index}}; empty: the host path.
	ContainerPath string `json:"containerPath,omitempty"`
	// ForgetAfter: a vanished host device that no container holds is
	// forgotten after this long (default 10m); one a container holds is
	// kept, Unhealthy.
	ForgetAfter *Duration `json:"forgetAfter,omitempty"`
	// PrepareBeforeBind (the DRA driver only; its prestart budget may be
	// up to MaxPreBindBudget, which the device plugin cuts to MaxBudget:
	// KubeletBudget): the resource's devices are
	// published with binding conditions, so the scheduler binds a pod to
	// the node only once the node's driver ran the prestart steps for
	// its claim, and sends it elsewhere when they fail. The device plugin
	// cannot do this: its steps run in PreStartContainer, after binding,
	// within the kubelet's 30 s.
	PrepareBeforeBind bool `json:"prepareBeforeBind,omitempty"`
	// Faults make simulated devices fail on purpose (docs/simulation.md);
	// FaultSeed makes their probabilities the same every run.
	Faults    []Fault `json:"faults,omitempty"`
	FaultSeed int64   `json:"faultSeed,omitempty"`

	// Domain and Class are the two parts of Name (the CDI class).
	Domain string `json:"-"`
	Class  string `json:"-"`
	// HostGlobs are HostDevices relative to the dev root ("/dev/" removed).
	HostGlobs []string `json:"-"`
	// SharedRel are SharedNodes relative to the dev root.
	SharedRel []string `json:"-"`
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
func (r *Resource) Simulated() bool { return r.Discovery() == DiscoverSimulated }

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
