package resource

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestFaultsAtStartPrepared: a fault configured at start is in the
// snapshot Prepare leaves, so the first publication (the device
// plugin's first ListAndWatch answer, the DRA driver's first slice)
// already has it.
func TestFaultsAtStartPrepared(t *testing.T) {
	testutil.NeedMknod(t)
	base := t.TempDir()
	dev, cdiDir, state := filepath.Join(base, "dev"), filepath.Join(base, "cdi"), filepath.Join(base, "state")
	if err := os.Mkdir(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(base, "config.yaml")
	body := "resources:\n- name: example.com/sim\n  count: 2\n  faults: [{kind: lost, devices: [1], trigger: {atStart: true}}]\n"
	if err := os.WriteFile(cfgFile, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load([]string{"--config", cfgFile, "--dev-root", dev, "--cdi-dir", cdiDir, "--state-dir", state, "--node-name", "n"},
		func(string) (string, bool) { return "", false }, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Build(cfg, 0, Options{Writer: cdi.NewWriter(cdiDir, cfg.Owner(), 1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Prepare(); err != nil {
		t.Fatal(err)
	}
	devs := p.Source.Snapshot().Devices
	if !devs[0].Healthy || devs[1].Healthy || devs[1].Problem.Cause != device.CauseMissing {
		t.Fatalf("after Prepare: %+v", devs)
	}
}
