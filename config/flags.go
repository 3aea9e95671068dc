package config

import (
	"strconv"
)

// Env is how the loader reads the environment (os.LookupEnv in production).
type Env func(string) (string, bool)

// Command is a binary of the project. Each takes as flags the settings it
// uses, with words of its own in -h; a setting it does not use is neither
// a flag of it nor read from the environment. LoadWith takes the device
// plugin's flags for any other name.
type Command string

// The two binaries.
const (
	DevicePlugin Command = "cdi-device-plugin"
	DRADriver    Command = "cdi-dra-driver"
)

// flagDef is a setting that a flag and an environment variable set: the
// field it sets, and what each command's -h says of it.
type flagDef struct {
	name, env string
	// def is the default that -h names ("": none to name).
	def string
	// plugin and driver are its words in the -h of the device plugin and
	// of the DRA driver; "": that command does not take it.
	plugin, driver string
	set            func(c *Config, v string)
}

// usage is what the -h of cmd says of f; "": cmd does not take it.
func (f flagDef) usage(cmd Command) string {
	words := f.plugin
	if cmd == DRADriver {
		words = f.driver
	}
	if words == "" || f.def == "" {
		return words
	}
	return words + " (default " + f.def + ")"
}

// Words that both commands' -h say alike.
const (
	configUsage         = "YAML configuration file with a list of resources"
	devRootUsage        = "where simulated device nodes are created and host devices are found (hostDevices globs, sharedNodes, the nodes of pci and usb devices); must exist"
	logLevelUsage       = "log level: trace, debug, info, warn, error"
	logFormatUsage      = "log format: text or json"
	metricsAddressUsage = "host:port to serve /metrics, /healthz and /readyz on (default: not served)"
	sysRootUsage        = "where sysfs is read, for pci, usb and the NUMA node of host devices"
	faultControlUsage   = "true: serve the fault control (inject and clear faults of simulated devices) on <state-dir>/<binary>-faults.sock, mode 0600; never on TCP"
)

// configFlag names the configuration file; it is read before the others.
var configFlag = flagDef{name: "config", env: "CONFIG_FILE", plugin: configUsage, driver: configUsage}

// flagDefs are the flags that override the file, each wired to its field.
var flagDefs = []flagDef{
	{name: "device-plugin-dir", env: "DEVICE_PLUGIN_DIR", def: DefaultDevicePluginDir,
		plugin: "the kubelet's device plugin directory: its kubelet.sock, where the plugin registers, and the plugin's sockets",
		set:    func(c *Config, v string) { c.DevicePluginDir = v }},
	{name: "cdi-dir", env: "CDI_DIR", def: DefaultCDIDir,
		plugin: "directory the CDI specs are written to",
		driver: "directory the CDI specs are written to: the resources' specs, the device plugin's very files, and one per prepared claim",
		set:    func(c *Config, v string) { c.CDIDir = v }},
	{name: "dev-root", env: "DEV_ROOT", def: DefaultDevRoot, plugin: devRootUsage, driver: devRootUsage,
		set: func(c *Config, v string) { c.DevRoot = v }},
	{name: "state-dir", env: "STATE_DIR", def: DefaultStateDir,
		plugin: "directory of the per-device state (PreStartContainer) and the host devices' registries; mounted into containers, so the same path as on the host",
		driver: "directory of the per-device state (prestart steps) and the host devices' registries, the device plugin's, and of the claim checkpoint " +
			"(dra/checkpoint.json); mounted into containers, so the same path as on the host",
		set: func(c *Config, v string) { c.StateDir = v }},
	{name: "node-name", env: "NODE_NAME",
		plugin: "the node's name: in device IDs (<idPrefix>-<node>-<index>), and in the pools of the DRA driver (<node>/<idPrefix>) " +
			"whose claims' devices are reported Unhealthy (the DaemonSet sets spec.nodeName)",
		driver: "the node's name, required: the driver's pools (<node>/<idPrefix>, one per resource) and ResourceSlices are named after it, " +
			"and device IDs carry it (the DaemonSet sets spec.nodeName)",
		set: func(c *Config, v string) { c.NodeName = v }},
	{name: "log-level", env: "LOG_LEVEL", def: string(LevelInfo), plugin: logLevelUsage, driver: logLevelUsage,
		set: func(c *Config, v string) { c.LogLevel = v }},
	{name: "log-format", env: "LOG_FORMAT", def: string(LogText), plugin: logFormatUsage, driver: logFormatUsage,
		set: func(c *Config, v string) { c.LogFormat = LogFormat(v) }},
	{name: "metrics-address", env: "METRICS_ADDRESS", plugin: metricsAddressUsage, driver: metricsAddressUsage,
		set: func(c *Config, v string) { c.MetricsAddress = v }},
	{name: "sys-root", env: "SYS_ROOT", def: DefaultSysRoot, plugin: sysRootUsage, driver: sysRootUsage,
		set: func(c *Config, v string) { c.SysRoot = v }},
	{name: "proc-root", env: "PROC_ROOT", def: DefaultProcRoot,
		plugin: "where procfs is read: the NVIDIA driver's GPU information",
		driver: "where procfs is read: the NVIDIA driver's GPU information, and the boot ID (a claim prepared before a reboot is prepared again)",
		set:    func(c *Config, v string) { c.ProcRoot = v }},
	{name: "pod-resources-socket", env: "POD_RESOURCES_SOCKET", def: DefaultPodResourcesSocket,
		plugin: "the kubelet's PodResources socket: the pod_device_assignment metric, and the devices DRA claims hold, reported Unhealthy; " +
			"until it answers once, no device is advertised Healthy",
		driver: "the kubelet's PodResources socket: a claim is not prepared on a device a device-plugin container holds (nor while PodResources cannot tell), " +
			"such a device is not reset, and its resource's devices are tainted (handover)",
		set: func(c *Config, v string) { c.PodResourcesSocket = v }},
	{name: "fault-control", env: "FAULT_CONTROL", def: "false", plugin: faultControlUsage, driver: faultControlUsage,
		set: func(c *Config, v string) { c.FaultControlFlag = v }},
	{name: "device-list-strategy", env: "DEVICE_LIST_STRATEGY", def: string(StrategyCDICRI),
		plugin: "how Allocate names the devices to the runtime, comma-separated, combinable: cdi-cri, cdi-annotations, device-specs",
		set: func(c *Config, v string) {
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

// EnvVars lists every environment variable the plugin reads (the DRA
// driver reads them all but those of the device plugin's own flags), with
// the device plugin's words: the one list
// docs/configuration.md and deploy/deploy.sh are checked against.
func EnvVars() []EnvVar {
	out := []EnvVar{{Name: configFlag.env, Flag: configFlag.name, Usage: configFlag.plugin}}
	for _, f := range flagDefs {
		out = append(out, EnvVar{Name: f.env, Flag: f.name, Usage: f.usage(DevicePlugin)})
	}
	out = append(out,
		EnvVar{Name: envPluginName, Default: DefaultPluginName, Usage: "base of the socket names; owner of our CDI specs"},
		EnvVar{Name: envPodNamespace, Usage: "the pod's namespace; qualifies the owner of our CDI specs"},
	)
	return append(out, simpleEnv...)
}
