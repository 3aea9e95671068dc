package config

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// TestCommandsTakeTheirSettings: the device plugin takes every setting as
// a flag (Load, EnvVars and the docs have its words for each); the DRA
// driver neither takes the device plugin's own (its kubelet directory,
// the device list strategy) as flags nor reads their variables: a value
// the device plugin refuses leaves the driver at the default.
func TestCommandsTakeTheirSettings(t *testing.T) {
	for _, f := range flagDefs {
		if f.usage(DevicePlugin) == "" {
			t.Errorf("--%s: no words in the device plugin's -h", f.name)
		}
	}
	env := envOf(map[string]string{"DEVICE_PLUGIN_DIR": "relative", "DEVICE_LIST_STRATEGY": "bogus"})
	cfg, err := LoadWith(DRADriver, nil, env, io.Discard)
	if err != nil {
		t.Fatalf("DRA driver: %v", err)
	}
	if cfg.DevicePluginDir != DefaultDevicePluginDir || len(cfg.DeviceListStrategy) != 1 || cfg.DeviceListStrategy[0] != StrategyCDICRI {
		t.Errorf("DRA driver: device plugin dir %q, strategies %v; want the defaults", cfg.DevicePluginDir, cfg.DeviceListStrategy)
	}
	_, err = LoadWith(DevicePlugin, nil, env, io.Discard)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "device-plugin-dir") {
		t.Errorf("device plugin: %v, want the device plugin dir refused", err)
	}
	for _, flag := range []string{"--device-plugin-dir", "--device-list-strategy"} {
		if _, err := LoadWith(DRADriver, []string{flag, "x"}, envOf(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "not defined") {
			t.Errorf("DRA driver %s: %v, want an undefined flag", flag, err)
		}
	}
}
