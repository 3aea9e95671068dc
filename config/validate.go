package config

import (
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"tags.cncf.io/container-device-interface/pkg/parser"
)

var (
	envNameRe   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	nameRe      = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$`)
	dnsLabelRe  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	fileCompRe  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)
	qualifiedRe = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	sha256Re    = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
	indexRe     = regexp.MustCompile(`\[\d+\]`)
)

// MaxIDPrefix bounds idPrefix. The DRA driver names a device
// <idPrefix>-<index> in its ResourceSlice (the prefix made a DNS label,
// never longer), and a device name is a DNS label of at most 63
// characters. An index is an int, whose largest value
// (9223372036854775807) has 19 digits: 63 - len("-") - 19 = 43 leaves
// room for every index, so that no name is ever cut and two resources'
// names differ whenever their prefixes do (dra's TestIDPrefixBound checks
// the arithmetic against the names DeviceName makes).
const MaxIDPrefix = dnsLabelMax - len("-9223372036854775807")

// dnsLabelMax is the longest DNS label.
const dnsLabelMax = 63

// ResourceField names field name (e.g. "prestart.steps[0].command") of
// resource i as the user wrote it: resources[i].<name> in a config file,
// the environment variable in the simple mode.
func (c *Config) ResourceField(i int, name string) string {
	if c.ConfigFile == "" {
		bare := indexRe.ReplaceAllString(name, "")
		for _, e := range simpleEnv {
			if e.Field == bare {
				return e.Name
			}
		}
	}
	return fmt.Sprintf("resources[%d].%s", i, name)
}

// oneOf checks that v is one of allowed.
func oneOf[T ~string](field string, v T, allowed ...T) error {
	if slices.Contains(allowed, v) {
		return nil
	}
	names := make([]string, len(allowed))
	for i, a := range allowed {
		names[i] = string(a)
	}
	return fieldErr(field, string(v), "must be one of %s", strings.Join(names, ", "))
}

// cleanAbs checks that p is a clean absolute path.
func cleanAbs(field, p string) error {
	if !filepath.IsAbs(p) || path.Clean(p) != p {
		return fieldErr(field, p, "must be a clean absolute path")
	}
	return nil
}

func def[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

func (c *Config) defaultAndValidate() error {
	def(&c.PluginName, DefaultPluginName)
	def(&c.DevicePluginDir, DefaultDevicePluginDir)
	def(&c.CDIDir, DefaultCDIDir)
	def(&c.DevRoot, DefaultDevRoot)
	def(&c.StateDir, DefaultStateDir)
	def(&c.LogLevel, DefaultLogLevel)
	def(&c.LogFormat, DefaultLogFormat)
	def(&c.PodResourcesSocket, DefaultPodResourcesSocket)
	def(&c.SysRoot, DefaultSysRoot)
	def(&c.ProcRoot, DefaultProcRoot)
	if len(c.DeviceListStrategy) == 0 {
		c.DeviceListStrategy = Strategies{StrategyCDICRI}
	}

	if !nameRe.MatchString(c.PluginName) || len(c.PluginName) > 63 {
		return fieldErr("PLUGIN_NAME", c.PluginName, "must be 1-63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
	}
	if c.Namespace != "" && (len(c.Namespace) > 63 || !dnsLabelRe.MatchString(c.Namespace)) {
		return fieldErr("POD_NAMESPACE", c.Namespace, "must be a Kubernetes namespace name (a DNS label)")
	}
	for _, d := range []struct{ field, path string }{
		{"device-plugin-dir", c.DevicePluginDir}, {"cdi-dir", c.CDIDir},
		{"dev-root", c.DevRoot}, {"state-dir", c.StateDir}, {"pod-resources-socket", c.PodResourcesSocket},
		{"sys-root", c.SysRoot}, {"proc-root", c.ProcRoot},
	} {
		if err := cleanAbs(d.field, d.path); err != nil {
			return err
		}
	}
	if c.NodeName != "" && (len(c.NodeName) > 253 || !validDNSSubdomain(c.NodeName)) {
		return fieldErr("node-name", c.NodeName, "must be a DNS subdomain (lowercase letters, digits, '-' and '.')")
	}
	if c.FaultControlFlag != "" {
		on, err := strconv.ParseBool(c.FaultControlFlag)
		if err != nil {
			return fieldErr("fault-control", c.FaultControlFlag, "must be true or false")
		}
		c.FaultControl = on
	}
	if c.MetricsAddress != "" {
		_, port, err := net.SplitHostPort(c.MetricsAddress)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
			return fieldErr("metrics-address", c.MetricsAddress, "must be host:port, like :9400 or 127.0.0.1:9400")
		}
	}
	lvl, ok := parseLevel(c.LogLevel)
	if !ok {
		return fieldErr("log-level", c.LogLevel, "must be one of trace, debug, info, warn, error")
	}
	c.Level = lvl
	if err := oneOf("log-format", c.LogFormat, LogText, LogJSON); err != nil {
		return err
	}
	seenStrategy := map[Strategy]bool{}
	for _, s := range c.DeviceListStrategy {
		if err := oneOf("device-list-strategy", s, strategies...); err != nil {
			return err
		}
		if seenStrategy[s] {
			return fieldErr("device-list-strategy", string(s), "listed twice")
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
			return fieldErr(c.ResourceField(i, "name"), r.Name, "same resource as resources[%d]", j)
		}
		names[r.Name] = i
		if r.Simulated() {
			if j, dup := files[r.DeviceFilePrefix]; dup {
				return fieldErr(c.ResourceField(i, "deviceFilePrefix"), r.DeviceFilePrefix, "same device files as resources[%d]", j)
			}
			files[r.DeviceFilePrefix] = i
		}
	}
	return c.validateUnowned()
}

// validateUnowned refuses the nodes the configuration shows to be a
// device's own and yet no device's: a node every device of a resource
// shares (sharedNodes), or a node a simulated resource makes, that a
// hostDevices glob matches (it would be a device of its own, in that
// resource or another, beside the devices that share it or the simulated
// device), and a sharedNodes entry that is a simulated resource's node.
// Discovery finds the rest (symlinks, PCI and USB nodes) and holds such a
// device back (shared_node).
func (c *Config) validateUnowned() error {
	for i := range c.Resources {
		r := &c.Resources[i]
		for j, g := range r.HostGlobs {
			field := fmt.Sprintf("%s[%d]", c.ResourceField(i, "hostDevices"), j)
			for k := range c.Resources {
				o := &c.Resources[k]
				for l, rel := range o.SharedRel {
					if matches(g, rel) {
						return fieldErr(field, r.HostDevices[j], "matches %s[%d] (%s): a node the devices of %s share is no device's own; narrow the glob",
							c.ResourceField(k, "sharedNodes"), l, o.SharedNodes[l], o.Name)
					}
				}
				if !o.Simulated() {
					continue
				}
				for n := range o.DeviceCount() {
					if rel := simulatedNode(o, n); matches(g, rel) {
						return fieldErr(field, r.HostDevices[j], "matches %s, the node of simulated device %d of resources[%d] (%s), which the plugin makes: narrow the glob",
							rel, n, k, o.Name)
					}
				}
			}
		}
		for j, rel := range r.SharedRel {
			for k := range c.Resources {
				o := &c.Resources[k]
				if !o.Simulated() {
					continue
				}
				if n, err := strconv.Atoi(strings.TrimPrefix(rel, o.DeviceFilePrefix+"-")); err == nil && n >= 0 && n < o.DeviceCount() && rel == simulatedNode(o, n) {
					return fieldErr(fmt.Sprintf("%s[%d]", c.ResourceField(i, "sharedNodes"), j), r.SharedNodes[j],
						"is the node of simulated device %d of resources[%d] (%s), which the plugin makes for that device alone", n, k, o.Name)
				}
			}
		}
	}
	return nil
}

// simulatedNode is the node, relative to the dev root, of simulated
// device n of r.
func simulatedNode(r *Resource, n int) string { return r.DeviceFilePrefix + "-" + strconv.Itoa(n) }

// matches reports whether glob g matches rel.
func matches(g, rel string) bool {
	ok, _ := path.Match(g, rel)
	return ok
}

func (c *Config) validateResource(i int, r *Resource) error {
	f := func(name string) string { return c.ResourceField(i, name) }
	domain, class, ok := strings.Cut(r.Name, "/")
	if !ok || !validDNSSubdomain(domain) || !qualifiedRe.MatchString(class) || len(class) > 63 {
		return fieldErr(f("name"), r.Name, "must be <domain>/<name>, like example.com/fpga")
	}
	if domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") {
		return fieldErr(f("name"), r.Name, "the kubernetes.io domain is reserved")
	}
	// The name is the CDI class of the devices (their vendor is
	// k8s.<domain>, always valid for a DNS domain).
	if err := parser.ValidateClassName(class); err != nil {
		return fieldErr(f("name"), r.Name, "does not give a valid CDI kind: %v", err)
	}
	r.Domain, r.Class = domain, class

	if r.Replicas != nil && (*r.Replicas < 1 || *r.Replicas > MaxReplicas) {
		return fieldErr(f("replicas"), strconv.Itoa(*r.Replicas), "must be between 1 and %d", MaxReplicas)
	}
	def(&r.IDPrefix, DefaultIDPrefix)
	if !nameRe.MatchString(r.IDPrefix) {
		return fieldErr(f("idPrefix"), r.IDPrefix, "must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
	}
	if len(r.IDPrefix) > MaxIDPrefix {
		return fieldErr(f("idPrefix"), r.IDPrefix, "must be at most %d characters: the DRA driver names a device <idPrefix>-<index>, a DNS label of at most %d characters, and an index has up to 19 digits", MaxIDPrefix, dnsLabelMax)
	}
	if r.EnvPrefix != "" && !envNameRe.MatchString(r.EnvPrefix) {
		return fieldErr(f("envPrefix"), r.EnvPrefix, "must be a valid shell variable name ([A-Za-z_][A-Za-z0-9_]*)")
	}
	if r.AnnotationPrefix != "" {
		if err := validAnnotationKey(r.AnnotationPrefix + "-0"); err != nil {
			return fieldErr(f("annotationPrefix"), r.AnnotationPrefix, "%s", err)
		}
	}

	switch r.Discovery() {
	case DiscoverSimulated:
		if len(r.SharedNodes) > 0 || r.ContainerPath != "" || r.ForgetAfter != nil {
			return fieldErr(f("sharedNodes"), strings.Join(r.SharedNodes, ","), "sharedNodes, containerPath and forgetAfter apply to host devices (hostDevices, pci)")
		}
		if err := validateSimulated(f, r); err != nil {
			return err
		}
	case DiscoverGlobs:
		if err := validateHost(f, r); err != nil {
			return err
		}
	default:
		if err := validateDiscovered(f, r); err != nil {
			return err
		}
	}
	if !r.Simulated() {
		if err := validateNodes(f, r); err != nil {
			return err
		}
	}
	if r.Prestart != nil {
		if err := validatePrestart(f, r); err != nil {
			return err
		}
	}
	if err := validateFaults(f, r); err != nil {
		return err
	}
	for j, m := range r.Mounts {
		for _, p := range []struct{ name, v string }{{"hostPath", m.HostPath}, {"containerPath", m.ContainerPath}} {
			if err := cleanAbs(fmt.Sprintf("%s[%d].%s", f("mounts"), j, p.name), p.v); err != nil {
				return err
			}
		}
	}
	return nil
}

func validateSimulated(f func(string) string, r *Resource) error {
	if r.Count == nil {
		n := DefaultNumberDevices
		r.Count = &n
	}
	if *r.Count < 1 || *r.Count > MaxCount {
		return fieldErr(f("count"), strconv.Itoa(*r.Count), "must be between 1 and %d", MaxCount)
	}
	def(&r.DeviceFilePrefix, r.IDPrefix)
	if err := ValidateRelPath(r.DeviceFilePrefix); err != nil {
		return fieldErr(f("deviceFilePrefix"), r.DeviceFilePrefix, "%s", err)
	}
	def(&r.DeviceNode.Type, DefaultNodeType)
	if err := oneOf(f("deviceNode.type"), r.DeviceNode.Type, NodeChar, NodeBlock); err != nil {
		return err
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
	return nil
}

func validateHost(f func(string) string, r *Resource) error {
	if r.Count != nil {
		return fieldErr(f("count"), strconv.Itoa(*r.Count), "count and hostDevices exclude each other")
	}
	if r.DeviceFilePrefix != "" || r.DeviceNode != (DeviceNode{}) {
		return fieldErr(f("hostDevices"), strings.Join(r.HostDevices, ","), "hostDevices exclude deviceFilePrefix and deviceNode")
	}
	if r.NUMANodes != 0 {
		return fieldErr(f("numaNodes"), strconv.Itoa(r.NUMANodes), "simulated NUMA nodes apply to simulated devices only")
	}
	r.HostGlobs = make([]string, len(r.HostDevices))
	for j, g := range r.HostDevices {
		rel, err := HostGlob(g)
		if err != nil {
			return fieldErr(fmt.Sprintf("%s[%d]", f("hostDevices"), j), g, "%s", err)
		}
		r.HostGlobs[j] = rel
	}
	return nil
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

func validatePrestart(f func(string) string, r *Resource) error {
	p := r.Prestart
	def(&p.Budget.Duration, DefaultBudget)
	switch {
	case r.PrepareBeforeBind && (p.Budget.Duration < 0 || p.Budget.Duration > MaxPreBindBudget):
		return fieldErr(f("prestart.budget"), p.Budget.String(), "must be above 0 and at most %s (prepared before binding: the scheduler's default binding timeout)", MaxPreBindBudget)
	case !r.PrepareBeforeBind && (p.Budget.Duration < 0 || p.Budget.Duration > MaxBudget):
		return fieldErr(f("prestart.budget"), p.Budget.String(), "must be above 0 and at most %s (the kubelet allows 30s; up to %s with prepareBeforeBind, under DRA)", MaxBudget, MaxPreBindBudget)
	}
	def(&p.OnFailure, DefaultOnFailure)
	if err := oneOf(f("prestart.onFailure"), p.OnFailure, OnFailureUnhealthy, OnFailureIgnore); err != nil {
		return err
	}
	def(&p.Recovery, DefaultRecovery)
	if err := oneOf(f("prestart.recovery"), p.Recovery, RecoverAuto, RecoverReset, RecoverNever); err != nil {
		return err
	}
	if p.Recovery == RecoverReset && !p.HasReset() {
		return fieldErr(f("prestart.recovery"), string(p.Recovery), "needs a step of type reset, which this resource does not have: the device could never recover (use auto: any successful preparation heals it)")
	}
	def(&p.RecoveryInterval.Duration, DefaultRecoveryInterval)
	if p.RecoveryInterval.Duration < 0 || p.RecoveryInterval.Duration > MaxRecoveryInterval {
		return fieldErr(f("prestart.recoveryInterval"), p.RecoveryInterval.String(), "must be above 0 and at most %s", MaxRecoveryInterval)
	}
	for j := range p.Steps {
		if err := validateStep(f, r, p, j); err != nil {
			return err
		}
	}
	return nil
}

func validateStep(f func(string) string, r *Resource, p *Prestart, j int) error {
	s := &p.Steps[j]
	field := func(name string) string { return f(fmt.Sprintf("prestart.steps[%d].%s", j, name)) }
	if s.Timeout.Duration < 0 || s.Timeout.Duration > p.Budget.Duration {
		return fieldErr(field("timeout"), s.Timeout.String(), "must be above 0 and at most the budget (%s)", p.Budget)
	}
	def(&s.Timeout.Duration, DefaultStepTimeout)
	if err := oneOf(field("type"), s.Type, StepReset, StepReprogram, StepExec); err != nil {
		return err
	}
	if s.Type != StepExec && !r.Simulated() {
		return fieldErr(field("type"), string(s.Type), "%s works on simulated devices; use exec for host devices", s.Type)
	}
	if s.Type != StepReprogram && (s.Image != "" || s.SHA256 != "" || s.Always) {
		return fieldErr(field("type"), string(s.Type), "image, sha256 and always belong to reprogram steps")
	}
	if s.Type != StepExec && (len(s.Command) > 0 || len(s.Env) > 0) {
		return fieldErr(field("type"), string(s.Type), "command and env belong to exec steps")
	}
	switch s.Type {
	case StepReprogram:
		if s.Image != "" {
			if err := cleanAbs(field("image"), s.Image); err != nil {
				return err
			}
			if fi, err := os.Stat(s.Image); err != nil || !fi.Mode().IsRegular() {
				return fieldErr(field("image"), s.Image, "must be a readable regular file")
			}
		}
		if s.SHA256 != "" && !sha256Re.MatchString(s.SHA256) {
			return fieldErr(field("sha256"), s.SHA256, "must be 64 hex digits")
		}
	case StepExec:
		if len(s.Command) == 0 || !filepath.IsAbs(s.Command[0]) {
			return fieldErr(field("command"), strings.Join(s.Command, " "), "must start with an absolute path (no shell, no PATH lookup)")
		}
		for k := range s.Env {
			if !envNameRe.MatchString(k) {
				return fieldErr(field("env"), k, "must be a valid shell variable name")
			}
		}
	}
	return nil
}

// ParseLevel reads a log level as --log-level takes it; a bad one is a
// FieldError of log-level.
func ParseLevel(s string) (Level, error) {
	l, ok := parseLevel(s)
	if !ok {
		return "", fieldErr("log-level", s, "must be one of trace, debug, info, warn, error")
	}
	return l, nil
}

// ParseLogFormat reads a log format as --log-format takes it; a bad one
// is a FieldError of log-format.
func ParseLogFormat(s string) (LogFormat, error) {
	f := LogFormat(s)
	if err := oneOf("log-format", f, LogText, LogJSON); err != nil {
		return "", err
	}
	return f, nil
}

// KubeletBudget is what of budget a preparation inside a kubelet call may
// take: at most MaxBudget (a resource prepared before binding may have
// more, for the DRA driver's preparations out of the kubelet's calls; the
// device plugin's PreStartContainer cannot use it).
func KubeletBudget(budget time.Duration) time.Duration { return min(budget, MaxBudget) }
