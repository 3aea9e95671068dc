package config

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
	"github.com/sirupsen/logrus"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
)

var (
	envNameRe   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	nameRe      = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$`)
	dnsLabelRe  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	fileCompRe  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)
	qualifiedRe = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
)

// envFieldNames maps resource fields to the environment variable that sets
// them in the simple (config-file-less) mode, so errors name what the user
// actually wrote.
var envFieldNames = map[string]string{
	"name":                  "RESOURCE_NAME",
	"count":                 "NUMBER_DEVICES",
	"idPrefix":              "DEVICE_ID_PREFIX",
	"deviceFilePrefix":      "DEVICE_FILE_PREFIX",
	"envPrefix":             "ENV_PREFIX",
	"annotationPrefix":      "ANNOTATION_PREFIX",
	"prestart.budget":       "PRESTART_BUDGET",
	"prestart.steps.type":   "PRESTART_STEPS",
	"prestart.steps.image":  "FIRMWARE_IMAGE",
	"prestart.steps.sha256": "FIRMWARE_SHA256",
}

var indexRe = regexp.MustCompile(`\[\d+\]`)

func (c *Config) resField(i int, name string) string {
	if c.ConfigFile == "" {
		if e, ok := envFieldNames[indexRe.ReplaceAllString(name, "")]; ok {
			return e
		}
	}
	return fmt.Sprintf("resources[%d].%s", i, name)
}

func (c *Config) defaultAndValidate() error {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&c.PluginName, DefaultPluginName)
	def(&c.DevicePluginDir, DefaultDevicePluginDir)
	def(&c.CDIDir, DefaultCDIDir)
	def(&c.DevRoot, DefaultDevRoot)
	def(&c.StateDir, DefaultStateDir)
	def(&c.LogLevel, DefaultLogLevel)
	def(&c.LogFormat, DefaultLogFormat)
	if len(c.DeviceListStrategy) == 0 {
		c.DeviceListStrategy = []string{StrategyCDICRI}
	}

	if !nameRe.MatchString(c.PluginName) || len(c.PluginName) > 63 {
		return fieldErr("PLUGIN_NAME", c.PluginName, "must be 1-63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
	}
	if c.Namespace != "" && (len(c.Namespace) > 63 || !dnsLabelRe.MatchString(c.Namespace)) {
		return fieldErr("POD_NAMESPACE", c.Namespace, "must be a Kubernetes namespace name (a DNS label)")
	}
	for field, p := range map[string]string{
		"device-plugin-dir": c.DevicePluginDir, "cdi-dir": c.CDIDir,
		"dev-root": c.DevRoot, "state-dir": c.StateDir,
	} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return fieldErr(field, p, "must be a clean absolute path")
		}
	}
	if c.NodeName != "" && (len(c.NodeName) > 253 || !validDNSSubdomain(c.NodeName)) {
		return fieldErr("node-name", c.NodeName, "must be a DNS subdomain (lowercase letters, digits, '-' and '.')")
	}
	if _, err := logrus.ParseLevel(c.LogLevel); err != nil {
		return fieldErr("log-level", c.LogLevel, "must be one of trace, debug, info, warn, error")
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return fieldErr("log-format", c.LogFormat, "must be text or json")
	}
	seenStrategy := map[string]bool{}
	for _, s := range c.DeviceListStrategy {
		switch s {
		case StrategyCDICRI, StrategyCDIAnnotations, StrategyDeviceSpecs:
		default:
			return fieldErr("device-list-strategy", s, "must be one of %s, %s, %s", StrategyCDICRI, StrategyCDIAnnotations, StrategyDeviceSpecs)
		}
		if seenStrategy[s] {
			return fieldErr("device-list-strategy", s, "listed twice")
		}
		seenStrategy[s] = true
	}

	names := map[string]int{}
	files := map[string]int{}
	for i := range c.Resources {
		r := &c.Resources[i]
		if err := c.validateResource(i, r); err != nil {
			return err
		}
		if j, dup := names[r.Name]; dup {
			return fieldErr(c.resField(i, "name"), r.Name, "same resource as resources[%d]", j)
		}
		names[r.Name] = i
		if r.Simulated() {
			if j, dup := files[r.DeviceFilePrefix]; dup {
				return fieldErr(c.resField(i, "deviceFilePrefix"), r.DeviceFilePrefix, "same device files as resources[%d]", j)
			}
			files[r.DeviceFilePrefix] = i
		}
		if c.Has(StrategyCDIAnnotations) {
			if _, err := cdiapi.AnnotationKey(c.PluginName, r.Name); err != nil {
				return fieldErr(c.resField(i, "name"), r.Name, "with PLUGIN_NAME %q gives no valid CDI annotation key for the %s strategy: %v", c.PluginName, StrategyCDIAnnotations, err)
			}
		}
		if sock := filepath.Join(c.DevicePluginDir, SocketName(c.PluginName, r.Name, 1<<62)); len(sock) > maxSocketPath {
			return fieldErr("device-plugin-dir", c.DevicePluginDir, "socket path %q would exceed %d bytes", sock, maxSocketPath)
		}
	}
	return nil
}

func (c *Config) validateResource(i int, r *Resource) error {
	f := func(name string) string { return c.resField(i, name) }
	domain, class, ok := strings.Cut(r.Name, "/")
	if !ok || !validDNSSubdomain(domain) || !qualifiedRe.MatchString(class) || len(class) > 63 {
		return fieldErr(f("name"), r.Name, "must be <domain>/<name>, like example.com/fpga")
	}
	if domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") {
		return fieldErr(f("name"), r.Name, "the kubernetes.io domain is reserved")
	}
	if _, err := cdi.KindForResource(r.Name); err != nil {
		return fieldErr(f("name"), r.Name, "does not give a valid CDI kind: %v", err)
	}

	if r.Replicas != nil && (*r.Replicas < 1 || *r.Replicas > MaxReplicas) {
		return fieldErr(f("replicas"), strconv.Itoa(*r.Replicas), "must be between 1 and %d", MaxReplicas)
	}
	if r.IDPrefix == "" {
		r.IDPrefix = DefaultIDPrefix
	}
	if !nameRe.MatchString(r.IDPrefix) {
		return fieldErr(f("idPrefix"), r.IDPrefix, "must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
	}
	if r.EnvPrefix != "" && !envNameRe.MatchString(r.EnvPrefix) {
		return fieldErr(f("envPrefix"), r.EnvPrefix, "must be a valid shell variable name ([A-Za-z_][A-Za-z0-9_]*)")
	}
	if r.AnnotationPrefix != "" {
		if err := validAnnotationKey(r.AnnotationPrefix + "-0"); err != nil {
			return fieldErr(f("annotationPrefix"), r.AnnotationPrefix, "%s", err)
		}
	}

	if r.Simulated() {
		if r.Count == nil {
			n := DefaultNumberDevices
			r.Count = &n
		}
		if *r.Count < 1 || *r.Count > MaxCount {
			return fieldErr(f("count"), strconv.Itoa(*r.Count), "must be between 1 and %d", MaxCount)
		}
		if r.DeviceFilePrefix == "" {
			r.DeviceFilePrefix = r.IDPrefix
		}
		if err := ValidateRelPath(r.DeviceFilePrefix); err != nil {
			return fieldErr(f("deviceFilePrefix"), r.DeviceFilePrefix, "%s", err)
		}
		switch r.DeviceNode.Type {
		case "":
			r.DeviceNode.Type = DefaultNodeType
		case "char", "block":
		default:
			return fieldErr(f("deviceNode.type"), r.DeviceNode.Type, "must be char or block")
		}
		if r.DeviceNode.Major == nil {
			m := DefaultNodeMajor
			r.DeviceNode.Major = &m
		}
		if r.DeviceNode.Minor == nil {
			m := DefaultNodeMinor
			r.DeviceNode.Minor = &m
		}
		if *r.DeviceNode.Major == 0 || *r.DeviceNode.Major > 4095 {
			return fieldErr(f("deviceNode.major"), strconv.FormatUint(uint64(*r.DeviceNode.Major), 10), "must be between 1 and 4095")
		}
		if *r.DeviceNode.Minor > 1<<20-1 {
			return fieldErr(f("deviceNode.minor"), strconv.FormatUint(uint64(*r.DeviceNode.Minor), 10), "must be below 2^20")
		}
		if r.NUMANodes < 0 || r.NUMANodes > *r.Count {
			return fieldErr(f("numaNodes"), strconv.Itoa(r.NUMANodes), "must be between 0 and count (%d)", *r.Count)
		}
	} else {
		if r.Count != nil {
			return fieldErr(f("count"), strconv.Itoa(*r.Count), "count and hostDevices exclude each other")
		}
		if r.DeviceFilePrefix != "" || r.DeviceNode != (DeviceNode{}) {
			return fieldErr(f("hostDevices"), strings.Join(r.HostDevices, ","), "hostDevices exclude deviceFilePrefix and deviceNode")
		}
		if r.NUMANodes != 0 {
			return fieldErr(f("numaNodes"), strconv.Itoa(r.NUMANodes), "simulated NUMA nodes apply to simulated devices only")
		}
		for j, g := range r.HostDevices {
			if _, err := HostGlob(g); err != nil {
				return fieldErr(fmt.Sprintf("%s[%d]", f("hostDevices"), j), g, "%s", err)
			}
		}
	}
	// The longest device ID must still be a valid CDI device name.
	longest := device.DeviceID(r.IDPrefix, c.NodeName, strconv.Itoa(max(r.DeviceCount()-1, 0)))
	if err := parser.ValidateDeviceName(longest); err != nil {
		return fieldErr(f("idPrefix"), r.IDPrefix, "device IDs like %q are not valid CDI device names: %v", longest, err)
	}
	if r.Prestart != nil {
		if err := c.validatePrestart(f, r); err != nil {
			return err
		}
	}
	for j, m := range r.Mounts {
		for _, p := range []struct{ name, v string }{{"hostPath", m.HostPath}, {"containerPath", m.ContainerPath}} {
			if !path.IsAbs(p.v) || path.Clean(p.v) != p.v {
				return fieldErr(fmt.Sprintf("%s[%d].%s", f("mounts"), j, p.name), p.v, "must be a clean absolute path")
			}
		}
	}
	return nil
}

// SocketName is the socket file of one resource for a process started at
// start (nanoseconds): unique per process start.
func SocketName(plugin, resource string, start int64) string {
	r := strings.NewReplacer("/", "_", ".", "_").Replace(resource)
	return fmt.Sprintf("%s-%s-%d.sock", plugin, r, start)
}

// ValidateRelPath accepts a relative path made of plain components: no
// "..", no ".", no empty component, no leading "/".
func ValidateRelPath(p string) error {
	if p == "" || strings.HasPrefix(p, "/") {
		return fmt.Errorf("must be a relative path")
	}
	for _, comp := range strings.Split(p, "/") {
		if comp == "." || comp == ".." || !fileCompRe.MatchString(comp) {
			return fmt.Errorf("path component %q: components must be letters, digits, '_', '-' or '.', not '.' or '..'", comp)
		}
	}
	return nil
}

// HostGlob normalises a hostDevices pattern to a clean pattern relative to
// the dev root ("/dev/" is stripped) and checks it cannot leave it.
func HostGlob(g string) (string, error) {
	rel := strings.TrimPrefix(g, "/dev/")
	if rel == "" || strings.HasPrefix(rel, "/") {
		return "", fmt.Errorf("must be relative to the dev root or start with /dev/")
	}
	for _, comp := range strings.Split(rel, "/") {
		if comp == "" || comp == "." || comp == ".." {
			return "", fmt.Errorf("path component %q is not allowed", comp)
		}
	}
	if _, err := filepath.Match(rel, ""); err != nil {
		return "", fmt.Errorf("bad glob: %w", err)
	}
	return rel, nil
}

func validDNSSubdomain(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if len(l) > 63 || !dnsLabelRe.MatchString(l) {
			return false
		}
	}
	return true
}

// validAnnotationKey checks a Kubernetes qualified name: [prefix/]name.
func validAnnotationKey(k string) error {
	prefix, name, hasPrefix := strings.Cut(k, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	if hasPrefix && !validDNSSubdomain(prefix) {
		return fmt.Errorf("the part before '/' must be a DNS subdomain")
	}
	if len(name) > 63 || !qualifiedRe.MatchString(name) {
		return fmt.Errorf("keys like %q are not valid annotation keys", k)
	}
	return nil
}

var sha256Re = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// MaxBudget keeps a PreStartContainer call below the kubelet's 30 s limit.
const MaxBudget = 29 * time.Second

func (c *Config) validatePrestart(f func(string) string, r *Resource) error {
	p := r.Prestart
	if p.Budget.Duration == 0 {
		p.Budget.Duration = prestart.DefaultBudget
	}
	if p.Budget.Duration < 0 || p.Budget.Duration > MaxBudget {
		return fieldErr(f("prestart.budget"), p.Budget.String(), "must be above 0 and at most %s (the kubelet allows 30s)", MaxBudget)
	}
	switch p.OnFailure {
	case "":
		p.OnFailure = "unhealthy"
	case "unhealthy", "ignore":
	default:
		return fieldErr(f("prestart.onFailure"), p.OnFailure, "must be unhealthy or ignore")
	}
	switch p.Recovery {
	case "":
		p.Recovery = "auto"
	case "auto", "never":
	case "reset":
		if !slices.ContainsFunc(p.Steps, func(s Step) bool { return s.Type == StepReset }) {
			return fieldErr(f("prestart.recovery"), p.Recovery, "needs a step of type reset, which this resource does not have: the device could never recover (use auto: any successful preparation heals it)")
		}
	default:
		return fieldErr(f("prestart.recovery"), p.Recovery, "must be auto, reset or never")
	}
	if p.RecoveryInterval.Duration == 0 {
		p.RecoveryInterval.Duration = prestart.DefaultRecoveryInterval
	}
	if p.RecoveryInterval.Duration < 0 || p.RecoveryInterval.Duration > time.Hour {
		return fieldErr(f("prestart.recoveryInterval"), p.RecoveryInterval.String(), "must be above 0 and at most 1h")
	}
	for j := range p.Steps {
		s := &p.Steps[j]
		field := func(name string) string { return f(fmt.Sprintf("prestart.steps[%d].%s", j, name)) }
		if s.Timeout.Duration < 0 || s.Timeout.Duration > p.Budget.Duration {
			return fieldErr(field("timeout"), s.Timeout.String(), "must be above 0 and at most the budget (%s)", p.Budget)
		}
		switch s.Type {
		case StepReset, StepReprogram:
			if !r.Simulated() {
				return fieldErr(field("type"), s.Type, "%s works on simulated devices; use exec for host devices", s.Type)
			}
		case StepExec:
		default:
			return fieldErr(field("type"), s.Type, "must be reset, reprogram or exec")
		}
		if s.Type != StepReprogram && (s.Image != "" || s.SHA256 != "" || s.Always) {
			return fieldErr(field("type"), s.Type, "image, sha256 and always belong to reprogram steps")
		}
		if s.Type != StepExec && (len(s.Command) > 0 || len(s.Env) > 0) {
			return fieldErr(field("type"), s.Type, "command and env belong to exec steps")
		}
		if s.Type == StepReprogram {
			if s.Image != "" {
				if !filepath.IsAbs(s.Image) || filepath.Clean(s.Image) != s.Image {
					return fieldErr(field("image"), s.Image, "must be a clean absolute path")
				}
				if fi, err := os.Stat(s.Image); err != nil || !fi.Mode().IsRegular() {
					return fieldErr(field("image"), s.Image, "must be a readable regular file")
				}
			}
			if s.SHA256 != "" && !sha256Re.MatchString(s.SHA256) {
				return fieldErr(field("sha256"), s.SHA256, "must be 64 hex digits")
			}
		}
		if s.Type == StepExec {
			if len(s.Command) == 0 || !filepath.IsAbs(s.Command[0]) {
				return fieldErr(field("command"), strings.Join(s.Command, " "), "must start with an absolute path (no shell, no PATH lookup)")
			}
			if _, err := prestart.NewExec(s.Command, s.Env, s.Timeout.Duration); err != nil {
				return fieldErr(field("command"), strings.Join(s.Command, " "), "%v", err)
			}
			for k := range s.Env {
				if !envNameRe.MatchString(k) {
					return fieldErr(field("env"), k, "must be a valid shell variable name")
				}
			}
		}
	}
	return nil
}
