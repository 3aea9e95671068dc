package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func envOf(m map[string]string) Env {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultsFromSimpleEnv(t *testing.T) {
	cfg, err := Load(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PluginName != DefaultPluginName || cfg.DevicePluginDir != DefaultDevicePluginDir ||
		cfg.CDIDir != DefaultCDIDir || cfg.DevRoot != DefaultDevRoot || cfg.StateDir != DefaultStateDir {
		t.Fatalf("defaults: %+v", cfg)
	}
	if !reflect.DeepEqual(cfg.DeviceListStrategy, Strategies{StrategyCDICRI}) || cfg.Level != LevelInfo || cfg.Version != Version {
		t.Fatalf("strategy %v", cfg.DeviceListStrategy)
	}
	if len(cfg.Resources) != 1 {
		t.Fatalf("resources %d", len(cfg.Resources))
	}
	r := cfg.Resources[0]
	if r.Name != DefaultResourceName || r.DeviceCount() != 2 || r.IDPrefix != "simple-device" ||
		r.DeviceFilePrefix != "simple-device" || r.EnvPrefix != "" || r.AnnotationPrefix != "" ||
		r.DeviceNode.Type != "char" || *r.DeviceNode.Major != 1 || *r.DeviceNode.Minor != 3 || r.ReplicaCount() != 1 {
		t.Fatalf("resource defaults: %+v", r)
	}
}

func TestSimpleEnvVars(t *testing.T) {
	cfg, err := Load(nil, envOf(map[string]string{
		"PLUGIN_NAME": "fpga-plugin", "RESOURCE_NAME": "acme.io/fpga", "NUMBER_DEVICES": "8",
		"DEVICE_ID_PREFIX": "fpga", "ANNOTATION_PREFIX": "acme.io/fpga", "ENV_PREFIX": "FPGA",
		"DEVICE_FILE_PREFIX": "acme/fpga", "NODE_NAME": "node-1",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Resources[0]
	if cfg.PluginName != "fpga-plugin" || cfg.NodeName != "node-1" || r.Name != "acme.io/fpga" || r.DeviceCount() != 8 ||
		r.IDPrefix != "fpga" || r.AnnotationPrefix != "acme.io/fpga" || r.EnvPrefix != "FPGA" || r.DeviceFilePrefix != "acme/fpga" {
		t.Fatalf("%+v %+v", cfg, r)
	}
}

func TestPrecedenceFlagEnvFileDefault(t *testing.T) {
	file := writeFile(t, `
cdiDir: /file/cdi
devRoot: /file/dev
stateDir: /file/state
logLevel: debug
resources:
- name: example.com/a
  count: 3
`)
	env := envOf(map[string]string{"CONFIG_FILE": file, "CDI_DIR": "/env/cdi", "DEV_ROOT": "/env/dev"})
	cfg, err := Load([]string{"--cdi-dir=/flag/cdi"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ got, want string }{
		{cfg.CDIDir, "/flag/cdi"},                     // flag beats env and file
		{cfg.DevRoot, "/env/dev"},                     // env beats file
		{cfg.StateDir, "/file/state"},                 // file beats default
		{cfg.Level.String(), "debug"},                 // file
		{cfg.DevicePluginDir, DefaultDevicePluginDir}, // default
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	if cfg.Resources[0].DeviceCount() != 3 || cfg.ConfigFile != file {
		t.Fatalf("%+v", cfg.Resources[0])
	}
}

func TestConfigFileResources(t *testing.T) {
	file := writeFile(t, `
deviceListStrategy: [cdi-cri, device-specs]
resources:
- name: example.com/fpga
  count: 8
  idPrefix: fpga
  deviceFilePrefix: fpga
  deviceNode: {type: char, major: 1, minor: 5}
  envPrefix: FPGA
  annotationPrefix: example.com/fpga
  replicas: 2
  numaNodes: 2
  mounts: [{hostPath: /opt/fw, containerPath: /fw, readOnly: true}]
- name: example.com/tun
  hostDevices: ["/dev/net/tun"]
`)
	cfg, err := Load([]string{"--config", file}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Resources) != 2 || !cfg.DeviceListStrategy.Includes(StrategyDeviceSpecs) || cfg.DeviceListStrategy.Includes(StrategyCDIAnnotations) ||
		!cfg.DeviceListStrategy.AnyCDI() {
		t.Fatalf("%+v", cfg)
	}
	a, b := cfg.Resources[0], cfg.Resources[1]
	if a.ReplicaCount() != 2 || a.NUMANodes != 2 || *a.DeviceNode.Minor != 5 || len(a.Mounts) != 1 || !a.Simulated() {
		t.Fatalf("%+v", a)
	}
	if b.Simulated() || b.DeviceCount() != 0 {
		t.Fatalf("%+v", b)
	}
	if !reflect.DeepEqual(b.HostGlobs, []string{"net/tun"}) || a.Domain != "example.com" || a.Class != "fpga" || a.DeviceNode.Type.CDI() != "c" {
		t.Fatalf("parsed: globs %q, domain %q, class %q", b.HostGlobs, a.Domain, a.Class)
	}
}

func TestValidationErrors(t *testing.T) {
	cases := []struct {
		name  string
		args  []string
		env   map[string]string
		file  string
		field string
		value string
	}{
		{name: "count not a number", env: map[string]string{"NUMBER_DEVICES": "two"}, field: "NUMBER_DEVICES", value: "two"},
		{name: "count zero", env: map[string]string{"NUMBER_DEVICES": "0"}, field: "NUMBER_DEVICES", value: "0"},
		{name: "count too big", env: map[string]string{"NUMBER_DEVICES": "100000"}, field: "NUMBER_DEVICES", value: "100000"},
		{name: "resource without domain", env: map[string]string{"RESOURCE_NAME": "fpga"}, field: "RESOURCE_NAME", value: "fpga"},
		{name: "reserved domain", env: map[string]string{"RESOURCE_NAME": "kubernetes.io/x"}, field: "RESOURCE_NAME", value: "kubernetes.io/x"},
		{name: "env prefix with dash", env: map[string]string{"ENV_PREFIX": "MY-DEV"}, field: "ENV_PREFIX", value: "MY-DEV"},
		{name: "file prefix escapes", env: map[string]string{"DEVICE_FILE_PREFIX": "../etc/x"}, field: "DEVICE_FILE_PREFIX", value: "../etc/x"},
		{name: "file prefix absolute", env: map[string]string{"DEVICE_FILE_PREFIX": "/etc/x"}, field: "DEVICE_FILE_PREFIX", value: "/etc/x"},
		{name: "id prefix slash", env: map[string]string{"DEVICE_ID_PREFIX": "a/b"}, field: "DEVICE_ID_PREFIX", value: "a/b"},
		{name: "id prefix too long", env: map[string]string{"DEVICE_ID_PREFIX": strings.Repeat("a", 44)}, field: "DEVICE_ID_PREFIX", value: strings.Repeat("a", 44)},
		{name: "id prefix too long in file", file: "resources:\n- name: example.com/a\n  idPrefix: " + strings.Repeat("a", 44) + "\n", field: "resources[0].idPrefix", value: strings.Repeat("a", 44)},
		{name: "bad annotation prefix", env: map[string]string{"ANNOTATION_PREFIX": "Bad_Domain/x"}, field: "ANNOTATION_PREFIX", value: "Bad_Domain/x"},
		{name: "plugin name", env: map[string]string{"PLUGIN_NAME": "a b"}, field: "PLUGIN_NAME", value: "a b"},
		{name: "relative dir", args: []string{"--cdi-dir", "run/cdi"}, field: "cdi-dir", value: "run/cdi"},
		{name: "unclean dir", args: []string{"--dev-root", "/dev/../etc"}, field: "dev-root", value: "/dev/../etc"},
		{name: "log level", args: []string{"--log-level", "loud"}, field: "log-level", value: "loud"},
		{name: "log format", env: map[string]string{"LOG_FORMAT": "xml"}, field: "log-format", value: "xml"},
		{name: "strategy", args: []string{"--device-list-strategy", "cdi-cri,magic"}, field: "device-list-strategy", value: "magic"},
		{name: "node name", env: map[string]string{"NODE_NAME": "Node_1"}, field: "node-name", value: "Node_1"},
		{name: "missing file", args: []string{"--config", "/nonexistent/config.yaml"}, field: "config", value: "/nonexistent/config.yaml"},
		{name: "unknown field", file: "resources:\n- name: example.com/a\n  cuont: 3\n", field: "config"},
		{name: "no resources", file: "cdiDir: /x\n", field: "resources"},
		{name: "replicas zero", file: "resources:\n- name: example.com/a\n  replicas: 0\n", field: "resources[0].replicas", value: "0"},
		{name: "numa over count", file: "resources:\n- name: example.com/a\n  count: 2\n  numaNodes: 3\n", field: "resources[0].numaNodes", value: "3"},
		{name: "node type", file: "resources:\n- name: example.com/a\n  deviceNode: {type: pipe}\n", field: "resources[0].deviceNode.type", value: "pipe"},
		{name: "major zero", file: "resources:\n- name: example.com/a\n  deviceNode: {major: 0}\n", field: "resources[0].deviceNode.major", value: "0"},
		{name: "duplicate resource", file: "resources:\n- name: example.com/a\n- name: example.com/a\n  idPrefix: b\n", field: "resources[1].name", value: "example.com/a"},
		{name: "same device files", file: "resources:\n- name: example.com/a\n  deviceFilePrefix: x\n- name: example.com/b\n  deviceFilePrefix: x\n", field: "resources[1].deviceFilePrefix", value: "x"},
		{name: "count with host devices", file: "resources:\n- name: example.com/a\n  count: 2\n  hostDevices: [fuse]\n", field: "resources[0].count", value: "2"},
		{name: "host glob escapes", file: "resources:\n- name: example.com/a\n  hostDevices: [\"../etc/*\"]\n", field: "resources[0].hostDevices[0]", value: "../etc/*"},
		{name: "host glob absolute", file: "resources:\n- name: example.com/a\n  hostDevices: [\"/etc/passwd\"]\n", field: "resources[0].hostDevices[0]", value: "/etc/passwd"},
		{name: "bad glob", file: "resources:\n- name: example.com/a\n  hostDevices: [\"tty[\"]\n", field: "resources[0].hostDevices[0]", value: "tty["},
		{name: "mount path", file: "resources:\n- name: example.com/a\n  mounts: [{hostPath: /a/../b, containerPath: /c}]\n", field: "resources[0].mounts[0].hostPath", value: "/a/../b"},
		{name: "prestart step type", env: map[string]string{"PRESTART_STEPS": "reset,flash"}, field: "PRESTART_STEPS", value: "flash"},
		{name: "prestart budget", env: map[string]string{"PRESTART_BUDGET": "31s"}, field: "PRESTART_BUDGET", value: "31s"},
		{name: "prestart budget not a duration", env: map[string]string{"PRESTART_BUDGET": "soon"}, field: "PRESTART_BUDGET", value: "soon"},
		{name: "firmware image missing", env: map[string]string{"FIRMWARE_IMAGE": "/nonexistent/fw.bin"}, field: "FIRMWARE_IMAGE", value: "/nonexistent/fw.bin"},
		{name: "firmware image relative", env: map[string]string{"FIRMWARE_IMAGE": "fw.bin"}, field: "FIRMWARE_IMAGE", value: "fw.bin"},
		{name: "firmware sha256", env: map[string]string{"FIRMWARE_SHA256": "abc"}, field: "FIRMWARE_SHA256", value: "abc"},
		{name: "step timeout over budget", file: "resources:\n- name: example.com/a\n  prestart:\n    budget: 5s\n    steps: [{type: reset, timeout: 6s}]\n", field: "resources[0].prestart.steps[0].timeout", value: "6s"},
		{name: "timeout not a string", file: "resources:\n- name: example.com/a\n  prestart:\n    steps: [{type: reset, timeout: 5}]\n", field: "config"},
		{name: "exec relative command", file: "resources:\n- name: example.com/a\n  prestart:\n    steps: [{type: exec, command: [fpga-init]}]\n", field: "resources[0].prestart.steps[0].command", value: "fpga-init"},
		{name: "exec env name", file: "resources:\n- name: example.com/a\n  prestart:\n    steps: [{type: exec, command: [/bin/true], env: {A-B: x}}]\n", field: "resources[0].prestart.steps[0].env", value: "A-B"},
		{name: "image on reset", file: "resources:\n- name: example.com/a\n  prestart:\n    steps: [{type: reset, image: /x}]\n", field: "resources[0].prestart.steps[0].type", value: "reset"},
		{name: "reset on host devices", file: "resources:\n- name: example.com/a\n  hostDevices: [fuse]\n  prestart:\n    steps: [{type: reset}]\n", field: "resources[0].prestart.steps[0].type", value: "reset"},
		{name: "onFailure", file: "resources:\n- name: example.com/a\n  prestart:\n    onFailure: panic\n    steps: [{type: reset}]\n", field: "resources[0].prestart.onFailure", value: "panic"},
		{name: "recovery reset without a reset step", file: "resources:\n- name: example.com/a\n  hostDevices: [fuse]\n  prestart:\n    recovery: reset\n    steps: [{type: exec, command: [/bin/true]}]\n", field: "resources[0].prestart.recovery", value: "reset"},
		{name: "recovery", file: "resources:\n- name: example.com/a\n  prestart:\n    recovery: sometimes\n    steps: [{type: reset}]\n", field: "resources[0].prestart.recovery", value: "sometimes"},
		{name: "recovery interval", file: "resources:\n- name: example.com/a\n  prestart:\n    recoveryInterval: 2h\n    steps: [{type: reset}]\n", field: "resources[0].prestart.recoveryInterval", value: "2h0m0s"},
		{name: "pod namespace", env: map[string]string{"POD_NAMESPACE": "Not_A_Namespace"}, field: "POD_NAMESPACE", value: "Not_A_Namespace"},
		{name: "metrics address", env: map[string]string{"METRICS_ADDRESS": "9400"}, field: "metrics-address", value: "9400"},
		{name: "pod resources socket", args: []string{"--pod-resources-socket", "kubelet.sock"}, field: "pod-resources-socket", value: "kubelet.sock"},
		{name: "config version", file: "version: v2\nresources:\n- name: example.com/a\n", field: "version", value: "v2"},
		{name: "negative count in file", file: "resources:\n- name: example.com/a\n  count: -3\n", field: "resources[0].count", value: "-3"},
		{name: "huge count in file", file: "resources:\n- name: example.com/a\n  count: 4294967296\n", field: "resources[0].count"},
		{name: "huge replicas", file: "resources:\n- name: example.com/a\n  replicas: 1000000\n", field: "resources[0].replicas", value: "1000000"},
		{name: "state dir escapes", args: []string{"--state-dir", "/var/lib/x/../../etc"}, field: "state-dir", value: "/var/lib/x/../../etc"},
		{name: "file prefix escapes in file", file: "resources:\n- name: example.com/a\n  deviceFilePrefix: a/../../b\n", field: "resources[0].deviceFilePrefix", value: "a/../../b"},
		{name: "resource name with a space", file: "resources:\n- name: example.com/a b\n", field: "resources[0].name", value: "example.com/a b"},
		{name: "NUL in a name", env: map[string]string{"RESOURCE_NAME": "example.com/a\x00b"}, field: "RESOURCE_NAME", value: "example.com/a\x00b"},
		{name: "class starts with digit", file: "resources:\n- name: example.com/9a\n", field: "resources[0].name", value: "example.com/9a"},
		{name: "pci vendor not hex", file: "resources:\n- name: example.com/gpu\n  pci: {vendor: 10dx}\n", field: "resources[0].pci.vendor", value: "10dx"},
		{name: "pci vendor missing", file: "resources:\n- name: example.com/gpu\n  pci: {driver: nvidia}\n", field: "resources[0].pci.vendor"},
		{name: "pci device too long", file: "resources:\n- name: example.com/gpu\n  pci: {vendor: 10de, device: [\"2330\", \"23301\"]}\n", field: "resources[0].pci.device[1]", value: "23301"},
		{name: "pci class too long", file: "resources:\n- name: example.com/gpu\n  pci: {vendor: 10de, class: \"03020001\"}\n", field: "resources[0].pci.class", value: "03020001"},
		{name: "pci class odd length", file: "resources:\n- name: example.com/gpu\n  pci: {vendor: 10de, class: \"030\"}\n", field: "resources[0].pci.class", value: "030"},
		{name: "pci driver", file: "resources:\n- name: example.com/gpu\n  pci: {vendor: 10de, driver: \"nv/idia\"}\n", field: "resources[0].pci.driver", value: "nv/idia"},
		{name: "pci with count", file: "resources:\n- name: example.com/gpu\n  count: 2\n  pci: {vendor: 10de}\n", field: "resources[0].count", value: "2"},
		{name: "pci with hostDevices", file: "resources:\n- name: example.com/gpu\n  hostDevices: [nvidia0]\n  pci: {vendor: 10de}\n", field: "resources[0].hostDevices", value: "nvidia0"},
		{name: "pci and usb", file: "resources:\n- name: example.com/gpu\n  pci: {vendor: 10de}\n  usb: {vendor: \"0403\"}\n", field: "resources[0].usb", value: "0403"},
		{name: "usb product", file: "resources:\n- name: example.com/ser\n  usb: {vendor: \"0403\", product: \"60011\"}\n", field: "resources[0].usb.product", value: "60011"},
		{name: "shared node escapes", file: "resources:\n- name: example.com/gpu\n  pci: {vendor: 10de}\n  sharedNodes: [/dev/../etc/passwd]\n", field: "resources[0].sharedNodes[0]", value: "/dev/../etc/passwd"},
		{name: "shared nodes on simulated", file: "resources:\n- name: example.com/a\n  sharedNodes: [nvidiactl]\n", field: "resources[0].sharedNodes", value: "nvidiactl"},
		{name: "container path field", file: "resources:\n- name: example.com/ser\n  hostDevices: [ttyUSB*]\n  containerPath: /dev/ttyUSB{{.Name}}\n", field: "resources[0].containerPath", value: "/dev/ttyUSB{{.Name}}"},
		{name: "container path relative", file: "resources:\n- name: example.com/ser\n  hostDevices: [ttyUSB*]\n  containerPath: ttyUSB{{.Index}}\n", field: "resources[0].containerPath", value: "ttyUSB{{.Index}}"},
		{name: "forget after", file: "resources:\n- name: example.com/ser\n  hostDevices: [ttyUSB*]\n  forgetAfter: 1ms\n", field: "resources[0].forgetAfter", value: "1ms"},
		{name: "sys root relative", args: []string{"--sys-root", "sys"}, field: "sys-root", value: "sys"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range c.env {
				env[k] = v
			}
			if c.file != "" {
				env["CONFIG_FILE"] = writeFile(t, c.file)
			}
			_, err := Load(c.args, envOf(env), io.Discard)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("not a FieldError: %v", err)
			}
			if fe.Field != c.field {
				t.Errorf("field %q, want %q (%v)", fe.Field, c.field, err)
			}
			if c.value != "" && fe.Value != c.value {
				t.Errorf("value %q, want %q (%v)", fe.Value, c.value, err)
			}
			if !strings.Contains(err.Error(), c.field) {
				t.Errorf("message %q does not name the field", err)
			}
		})
	}
}

func TestPrestartDefaults(t *testing.T) {
	cfg, err := Load(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Resources[0].Prestart
	if p == nil || len(p.Steps) != 2 || p.Steps[0].Type != StepReset || p.Steps[1].Type != StepReprogram || p.Steps[1].Image != "" ||
		p.Budget.Duration != 25*time.Second || p.OnFailure != "unhealthy" || p.Recovery != "auto" ||
		p.RecoveryInterval.Duration != 30*time.Second {
		t.Fatalf("env mode default: %+v", p)
	}
	cfg, err = Load(nil, envOf(map[string]string{"PRESTART_STEPS": "none"}), io.Discard)
	if err != nil || cfg.Resources[0].Prestart != nil {
		t.Fatalf("none: %+v %v", cfg.Resources[0].Prestart, err)
	}
	file := writeFile(t, `
resources:
- name: example.com/a
- name: example.com/b
  idPrefix: b
  prestart:
    budget: 10s
    onFailure: ignore
    steps:
    - {type: exec, command: [/usr/bin/fpga-init, "--dev={{.HostPath}}"], env: {MODE: fast}, timeout: 2s}
`)
	cfg, err = Load([]string{"--config", file}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Resources[0].Prestart != nil {
		t.Fatal("a file resource without prestart has steps")
	}
	p = cfg.Resources[1].Prestart
	if p.Budget.Duration != 10*time.Second || p.OnFailure != "ignore" || p.Steps[0].Timeout.Duration != 2*time.Second || p.Steps[0].Env["MODE"] != "fast" {
		t.Fatalf("%+v", p)
	}
}

func TestVersionAndHelp(t *testing.T) {
	if _, err := Load([]string{"--version"}, envOf(nil), io.Discard); !errors.Is(err, ErrVersion) {
		t.Fatalf("version: %v", err)
	}
	if _, err := Load([]string{"-h"}, envOf(nil), io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("help: %v", err)
	}
}

func TestHardwareSelectors(t *testing.T) {
	cfg, err := Load([]string{"--sys-root", "/fixture/sys"}, envOf(map[string]string{"CONFIG_FILE": writeFile(t, `procRoot: /fixture/proc
resources:
- name: example.com/gpu
  idPrefix: gpu
  pci: {vendor: "0x10DE", device: ["2330", "0x2335"], class: "0302", driver: nvidia}
  sharedNodes: [/dev/nvidiactl, nvidia-uvm]
  envPrefix: GPU
- name: example.com/vf
  idPrefix: vf
  pci: {vendor: "8086", device: "154c", driver: vfio-pci}
- name: example.com/serial
  idPrefix: ser
  usb: {vendor: "0403", product: "6001"}
  containerPath: "/dev/ttyUSB{{.Index}}"
  forgetAfter: 30s
`)}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.SysRoot != "/fixture/sys" || cfg.ProcRoot != "/fixture/proc" {
		t.Errorf("roots %q %q", cfg.SysRoot, cfg.ProcRoot)
	}
	gpu, vf, ser := cfg.Resources[0], cfg.Resources[1], cfg.Resources[2]
	want := PCISelector{Vendor: "10de", Device: StringList{"2330", "2335"}, Class: "0302", Driver: "nvidia"}
	if gpu.Discovery() != DiscoverPCI || !reflect.DeepEqual(*gpu.PCI, want) {
		t.Errorf("gpu: %s %+v, want pci %+v", gpu.Discovery(), gpu.PCI, want)
	}
	if !reflect.DeepEqual(gpu.SharedRel, []string{"nvidiactl", "nvidia-uvm"}) {
		t.Errorf("gpu: shared %q", gpu.SharedRel)
	}
	if !reflect.DeepEqual(vf.PCI.Device, StringList{"154c"}) {
		t.Errorf("vf device %q: one string is a list of one", vf.PCI.Device)
	}
	if ser.Discovery() != DiscoverUSB || ser.USB.Product != "6001" || ser.ForgetAfterOrDefault() != 30*time.Second || gpu.ForgetAfterOrDefault() != DefaultForgetAfter {
		t.Errorf("serial: %+v", ser)
	}
	if got := ser.ContainerPathOf(3, "bus/usb/001/004"); got != "/dev/ttyUSB3" {
		t.Errorf("container path %q", got)
	}
	if got := gpu.ContainerPathOf(3, "nvidia3"); got != "/dev/nvidia3" {
		t.Errorf("container path %q", got)
	}
	if gpu.Simulated() || ser.Simulated() {
		t.Error("pci and usb resources are not simulated")
	}
}

// TestLoadWithExtraFlags: a command's own flags (the DRA
// driver's) take the flag, else the environment, else the default, beside
// the shared ones; Load itself does not know them.
func TestLoadWithExtraFlags(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"default", nil, nil, "sim.example.com"},
		{"env", nil, map[string]string{"DRIVER_NAME": "env.example.com"}, "env.example.com"},
		{"flag wins", []string{"--driver-name", "flag.example.com"}, map[string]string{"DRIVER_NAME": "env.example.com"}, "flag.example.com"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var v string
			cfg, err := LoadWith("cdi-dra-driver", append(c.args, "--cdi-dir", "/x/cdi"), envOf(c.env), io.Discard,
				Extra{Name: "driver-name", Env: "DRIVER_NAME", Default: "sim.example.com", Value: &v})
			if err != nil {
				t.Fatal(err)
			}
			if v != c.want || cfg.CDIDir != "/x/cdi" {
				t.Fatalf("driver name %q, cdi dir %q; want %q", v, cfg.CDIDir, c.want)
			}
		})
	}
	if _, err := Load([]string{"--driver-name", "x"}, envOf(nil), io.Discard); err == nil {
		t.Fatal("the device plugin accepted the DRA driver's flag")
	}
}

// TestIDPrefixBound: idPrefix is at most MaxIDPrefix
// characters, the message says the bound and why; one at the bound is
// taken.
func TestIDPrefixBound(t *testing.T) {
	if MaxIDPrefix != 43 {
		t.Fatalf("MaxIDPrefix %d: 63 (a DNS label) - 1 ('-') - 19 (the digits of the largest index) is 43", MaxIDPrefix)
	}
	at := strings.Repeat("a", MaxIDPrefix)
	if _, err := Load(nil, envOf(map[string]string{"DEVICE_ID_PREFIX": at}), io.Discard); err != nil {
		t.Fatalf("a prefix of %d characters: %v", MaxIDPrefix, err)
	}
	_, err := Load(nil, envOf(map[string]string{"DEVICE_ID_PREFIX": at + "a"}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "at most 43 characters") {
		t.Fatalf("a prefix of %d characters: %v, want a message with the bound", MaxIDPrefix+1, err)
	}
}

// TestSharedNodeIsNoOnesOwn: what the configuration shows of a node that
// would be a device's own and shared, or a device's own and a simulated
// device's, is refused at load, naming the glob (or the sharedNodes
// entry) and what else has the node. Nodes that several resources share,
// and globs beside shared nodes they do not match, are fine.
func TestSharedNodeIsNoOnesOwn(t *testing.T) {
	for _, c := range []struct {
		name, file, field, value string
		says                     []string
	}{
		{
			name:  "a glob matching its own resource's shared node",
			file:  "resources:\n- name: example.com/gpu\n  hostDevices: [\"nvidia[0-9]\"]\n  sharedNodes: [nvidia0, nvidiactl]\n",
			field: "resources[0].hostDevices[0]", value: "nvidia[0-9]", says: []string{"resources[0].sharedNodes[0]", "nvidia0"},
		},
		{
			name: "a glob matching another resource's shared node",
			file: "resources:\n- name: example.com/gpu\n  pci: {vendor: 10de}\n  sharedNodes: [/dev/nvidiactl]\n" +
				"- name: example.com/nv\n  hostDevices: [\"/dev/nvidia*\"]\n",
			field: "resources[1].hostDevices[0]", value: "/dev/nvidia*", says: []string{"resources[0].sharedNodes[0]", "/dev/nvidiactl"},
		},
		{
			name:  "a glob matching a simulated resource's nodes",
			file:  "resources:\n- name: example.com/fpga\n  count: 4\n  deviceFilePrefix: acme/fpga\n- name: example.com/raw\n  hostDevices: [\"acme/*-3\"]\n",
			field: "resources[1].hostDevices[0]", value: "acme/*-3", says: []string{"acme/fpga-3", "resources[0]"},
		},
		{
			name:  "a glob before the simulated resource",
			file:  "resources:\n- name: example.com/raw\n  hostDevices: [\"fpga-*\"]\n- name: example.com/fpga\n  idPrefix: fpga\n  count: 2\n",
			field: "resources[0].hostDevices[0]", value: "fpga-*", says: []string{"fpga-0", "resources[1]"},
		},
		{
			name:  "a shared node that a simulated resource makes",
			file:  "resources:\n- name: example.com/fpga\n  idPrefix: fpga\n  count: 2\n- name: example.com/gpu\n  pci: {vendor: 10de}\n  sharedNodes: [/dev/fpga-1]\n",
			field: "resources[1].sharedNodes[0]", value: "/dev/fpga-1", says: []string{"resources[0]"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load(nil, envOf(map[string]string{"CONFIG_FILE": writeFile(t, c.file)}), io.Discard)
			var fe *FieldError
			if !errors.Is(err, ErrInvalid) || !errors.As(err, &fe) {
				t.Fatalf("got %v, want a FieldError", err)
			}
			if fe.Field != c.field || fe.Value != c.value {
				t.Errorf("field %q value %q, want %q %q (%v)", fe.Field, fe.Value, c.field, c.value, err)
			}
			for _, w := range c.says {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}
	for _, ok := range []string{
		"resources:\n- name: example.com/a\n  pci: {vendor: 10de, device: \"2330\"}\n  sharedNodes: [nvidiactl]\n- name: example.com/b\n  pci: {vendor: 10de, device: \"2335\"}\n  sharedNodes: [nvidiactl]\n",
		"resources:\n- name: example.com/gpu\n  hostDevices: [\"nvidia[0-9]\"]\n  sharedNodes: [nvidiactl]\n",
		"resources:\n- name: example.com/fpga\n  idPrefix: fpga\n  count: 2\n- name: example.com/raw\n  hostDevices: [\"fpga-[2-9]\"]\n",
	} {
		if _, err := Load(nil, envOf(map[string]string{"CONFIG_FILE": writeFile(t, ok)}), io.Discard); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
}

// TestPrepareBeforeBind: a resource asks the DRA driver to prepare its
// devices before the scheduler binds a pod (prepareBeforeBind); off by
// default, and a value that is no boolean is refused naming the field.
func TestPrepareBeforeBind(t *testing.T) {
	cfg, err := Load([]string{"--config", writeFile(t, "resources:\n- name: example.com/fpga\n  idPrefix: fpga\n  prepareBeforeBind: true\n- name: example.com/tty\n  idPrefix: tty\n")}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Resources[0].PrepareBeforeBind || cfg.Resources[1].PrepareBeforeBind {
		t.Fatalf("prepareBeforeBind: %v, %v; want true, false", cfg.Resources[0].PrepareBeforeBind, cfg.Resources[1].PrepareBeforeBind)
	}
	_, err = Load([]string{"--config", writeFile(t, "resources:\n- name: example.com/fpga\n  prepareBeforeBind: soon\n")}, envOf(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "prepareBeforeBind") {
		t.Fatalf("prepareBeforeBind: soon: %v, want an error naming the field", err)
	}
}

// TestPrepareBeforeBindBudget: a resource prepared before binding may
// give its steps up to MaxPreBindBudget (the DRA driver runs them out of
// any kubelet call, within the scheduler's binding timeout); any other
// resource keeps the kubelet's 29 s, and neither more than its bound.
func TestPrepareBeforeBindBudget(t *testing.T) {
	for _, c := range []struct {
		name, budget string
		pbb          bool
		ok           bool
	}{
		{"2m before binding", "2m", true, true},
		{"10m before binding", "10m", true, true},
		{"11m before binding", "11m", true, false},
		{"2m in PreStartContainer", "2m", false, false},
		{"29s in PreStartContainer", "29s", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := writeFile(t, fmt.Sprintf("resources:\n- name: example.com/fpga\n  prepareBeforeBind: %v\n  prestart:\n    budget: %s\n    steps: [{type: reprogram, timeout: %s}]\n", c.pbb, c.budget, c.budget))
			_, err := Load([]string{"--config", file}, envOf(nil), io.Discard)
			if (err == nil) != c.ok {
				t.Fatalf("budget %s, prepareBeforeBind %v: %v, want ok %v", c.budget, c.pbb, err, c.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "prestart.budget") {
				t.Errorf("the error does not name prestart.budget: %v", err)
			}
		})
	}
}
