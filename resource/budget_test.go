package resource

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
)

// TestPreBindBudget: the steps of a resource prepared before binding get
// its whole budget in the process that prepares before binding (the DRA
// driver: Options.PrepareBeforeBind); the device plugin, whose
// PreStartContainer runs within the kubelet's 30 s, cuts it to 29 s.
func TestPreBindBudget(t *testing.T) {
	base := t.TempDir()
	dev, cdiDir, state := filepath.Join(base, "dev"), filepath.Join(base, "cdi"), filepath.Join(base, "state")
	if err := os.Mkdir(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(base, "config.yaml")
	body := "resources:\n- name: example.com/fpga\n  count: 1\n  prepareBeforeBind: true\n  prestart:\n    budget: 2m\n    steps: [{type: reprogram, timeout: 90s}]\n"
	if err := os.WriteFile(cfgFile, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load([]string{"--config", cfgFile, "--dev-root", dev, "--cdi-dir", cdiDir, "--state-dir", state, "--node-name", "n"},
		func(string) (string, bool) { return "", false }, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		preBind bool
		want    time.Duration
	}{{"the DRA driver", true, 2 * time.Minute}, {"the device plugin", false, config.MaxBudget}} {
		t.Run(c.name, func(t *testing.T) {
			p, err := Build(cfg, 0, Options{Writer: cdi.NewWriter(cdiDir, cfg.Owner(), 1), PrepareBeforeBind: c.preBind})
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Runner.Budget(); got != c.want {
				t.Errorf("budget %v, want %v", got, c.want)
			}
		})
	}
}
