package config

import (
	"strconv"
)

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
	{"sys-root", "SYS_ROOT", "where sysfs is read, for pci, usb and the NUMA node of host devices (default " + DefaultSysRoot + ")",
		func(c *Config, v string) { c.SysRoot = v }},
	{"proc-root", "PROC_ROOT", "where procfs is read (the NVIDIA driver's GPU information) (default " + DefaultProcRoot + ")",
		func(c *Config, v string) { c.ProcRoot = v }},
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
