package config

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// checkLoaded is what a config that loads must be: every error is a
// FieldError naming a field; a config that loads has names with a domain,
// relative clean device paths, globs inside the dev root, clean absolute
// directories and positive counts.
func checkLoaded(t *testing.T, cfg *Config, err error) {
	t.Helper()
	if err != nil {
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field == "" || !errors.Is(err, ErrInvalid) {
			t.Fatalf("error without a field: %v", err)
		}
		return
	}
	for _, dir := range []string{cfg.CDIDir, cfg.DevRoot, cfg.StateDir, cfg.DevicePluginDir} {
		if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
			t.Fatalf("directory %q", dir)
		}
	}
	if len(cfg.Resources) == 0 {
		t.Fatal("no resources")
	}
	for i := range cfg.Resources {
		r := &cfg.Resources[i]
		if r.Domain == "" || r.Class == "" || r.Name != r.Domain+"/"+r.Class {
			t.Fatalf("resource name %q", r.Name)
		}
		if r.Simulated() {
			if err := ValidateRelPath(r.DeviceFilePrefix); err != nil || r.DeviceCount() <= 0 || r.ReplicaCount() <= 0 {
				t.Fatalf("%s: file prefix %q (%v), %d devices, %d replicas", r.Name, r.DeviceFilePrefix, err, r.DeviceCount(), r.ReplicaCount())
			}
		}
		for _, g := range r.HostGlobs {
			if _, err := HostGlob(g); err != nil || strings.HasPrefix(g, "/") || strings.Contains(g, "..") {
				t.Fatalf("%s: host glob %q: %v", r.Name, g, err)
			}
		}
		if strings.ContainsAny(r.IDPrefix, "/\x00") {
			t.Fatalf("%s: ID prefix %q", r.Name, r.IDPrefix)
		}
	}
}

// FuzzConfigFile loads what the fuzzer writes as the config file.
func FuzzConfigFile(f *testing.F) {
	for _, s := range []string{
		"resources:\n- name: example.com/a\n",
		"version: v1\nresources:\n- name: example.com/fpga\n  count: 4\n  replicas: 2\n  numaNodes: 2\n  deviceNode: {type: c, major: 1, minor: 3}\n",
		"resources:\n- name: example.com/tun\n  hostDevices: [\"net/tun\", \"tty*\"]\n",
		"resources:\n- name: example.com/a\n  idPrefix: ../evil\n",
		"resources:\n- name: example.com/a\n  mounts: [{hostPath: /a, containerPath: /b, readOnly: true}]\n  prestart:\n    budget: 5s\n    steps: [{type: reset}, {type: exec, command: [/bin/true, \"{{.ID}}\"]}]\n",
		"cdiDir: /var/run/cdi\ndevRoot: /dev\nresources:\n- name: example.com/a\n  count: -1\n",
	} {
		f.Add([]byte(s))
	}
	path := filepath.Join(f.TempDir(), "config.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load([]string{"--config", path}, func(string) (string, bool) { return "", false }, io.Discard)
		checkLoaded(t, cfg, err)
	})
}

// FuzzEnv loads the simple device plugin's environment variables.
func FuzzEnv(f *testing.F) {
	f.Add("4", "example.com/sim", "sim", "sim", "SIM", "reset,reprogram")
	f.Add("0", "fpga", "../x", "/etc/x", "A-B", "flash")
	f.Add("99999", "kubernetes.io/x", "a/b", "dev/../x", "", "none")
	f.Fuzz(func(t *testing.T, n, resource, idPrefix, filePrefix, envPrefix, steps string) {
		env := map[string]string{"NUMBER_DEVICES": n, "RESOURCE_NAME": resource, "DEVICE_ID_PREFIX": idPrefix,
			"DEVICE_FILE_PREFIX": filePrefix, "ENV_PREFIX": envPrefix, "PRESTART_STEPS": steps}
		cfg, err := Load(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, io.Discard)
		checkLoaded(t, cfg, err)
	})
}
