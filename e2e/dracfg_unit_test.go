//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
)

// TestDRAConfig: the DRA scenarios' configuration file is one the driver
// takes, before a run spends minutes finding out: every resource with the
// settings the scenarios rely on (D10's prepared before binding, with a
// step longer than the kubelet's calls allow).
func TestDRAConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(draConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load([]string{"--config", file, "--node-name", "n1"}, func(string) (string, bool) { return "", false }, nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]config.Resource{}
	for _, r := range cfg.Resources {
		byName[r.Name] = r
	}
	for _, name := range []string{draResource, draSharedResource, pbbSlow.resource, pbbFail.resource, pbbFast.resource} {
		if _, ok := byName[name]; !ok {
			t.Errorf("no resource %s in draConfig", name)
		}
	}
	for _, r := range []pbbResource{pbbSlow, pbbFail, pbbFast} {
		rc := byName[r.resource]
		if !rc.PrepareBeforeBind || rc.IDPrefix != r.prefix || rc.DeviceCount() < 2 || rc.Class+"."+rc.Domain != r.class {
			t.Errorf("%s: prepareBeforeBind %v, idPrefix %s, %d devices, class %s.%s; want prepared before binding, %s, 2 devices or more, %s",
				r.resource, rc.PrepareBeforeBind, rc.IDPrefix, rc.DeviceCount(), rc.Class, rc.Domain, r.prefix, r.class)
		}
	}
	if b := byName[pbbSlow.resource].Prestart.Budget.Duration; b <= config.MaxBudget {
		t.Errorf("%s: budget %v, want more than the kubelet's calls allow (%v)", pbbSlow.resource, b, config.MaxBudget)
	}
}

// TestPBBFailStep: D10's failing step fails on device 0, saying so, and
// succeeds on device 1, run as the driver runs it (busybox from this
// machine, at its own path here).
func TestPBBFailStep(t *testing.T) {
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("no /bin/busybox")
	}
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(draConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load([]string{"--config", file, "--node-name", "n1"}, func(string) (string, bool) { return "", false }, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range cfg.Resources {
		if r.Name != pbbFail.resource {
			continue
		}
		s := r.Prestart.Steps[len(r.Prestart.Steps)-1]
		cmd := append([]string{"/bin/busybox"}, s.Command[1:]...)
		e, err := prestart.NewExec(cmd, s.Env, s.Timeout.Duration)
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range []string{"device 0: firmware load failed", ""} {
			err := e.Run(context.Background(), &prestart.Target{ID: "d", Index: i, Dir: t.TempDir(), State: &prestart.State{}, Log: logrus.NewEntry(logrus.New())})
			switch {
			case want == "" && err != nil:
				t.Errorf("device %d: %v, want success", i, err)
			case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
				t.Errorf("device %d: %v, want a failure saying %q", i, err, want)
			}
		}
		return
	}
	t.Fatalf("no %s in draConfig", pbbFail.resource)
}
