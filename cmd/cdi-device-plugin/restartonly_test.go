package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
)

// TestRestartOnly: a live reload that changes a setting the running parts
// were built with is refused (ErrNeedsRestart, naming the field and both
// values), as docs/operations.md says; sysRoot and procRoot among them:
// the sources read sysfs and procfs there, and a reload that took the new
// roots for "nothing to apply" left the old ones in use while the file
// said otherwise. Resources and log settings are applied live.
func TestRestartOnly(t *testing.T) {
	base := config.Config{PluginName: "p", DevicePluginDir: "/dp", CDIDir: "/cdi", DevRoot: "/dev", StateDir: "/state", NodeName: "n1",
		MetricsAddress: ":9400", PodResourcesSocket: "/pr.sock", SysRoot: "/sys", ProcRoot: "/proc"}
	for _, c := range []struct {
		field string
		edit  func(*config.Config)
	}{
		{"pluginName", func(c *config.Config) { c.PluginName = "q" }},
		{"devicePluginDir", func(c *config.Config) { c.DevicePluginDir = "/dp2" }},
		{"cdiDir", func(c *config.Config) { c.CDIDir = "/cdi2" }},
		{"devRoot", func(c *config.Config) { c.DevRoot = "/dev2" }},
		{"stateDir", func(c *config.Config) { c.StateDir = "/state2" }},
		{"nodeName", func(c *config.Config) { c.NodeName = "n2" }},
		{"metricsAddress", func(c *config.Config) { c.MetricsAddress = ":9401" }},
		{"podResourcesSocket", func(c *config.Config) { c.PodResourcesSocket = "/pr2.sock" }},
		{"sysRoot", func(c *config.Config) { c.SysRoot = "/host/sys" }},
		{"procRoot", func(c *config.Config) { c.ProcRoot = "/host/proc" }},
		{"", func(c *config.Config) { c.Resources = append(c.Resources, config.Resource{Name: "example.com/x"}) }},
	} {
		name := c.field
		if name == "" {
			name = "resources (live)"
		}
		t.Run(name, func(t *testing.T) {
			cur := base
			c.edit(&cur)
			err := restartOnly(&base, &cur)
			if c.field == "" {
				if err != nil {
					t.Fatalf("a resource change: %v, want it applied live", err)
				}
				return
			}
			if !errors.Is(err, ErrNeedsRestart) || !strings.HasPrefix(err.Error(), c.field+" ") {
				t.Fatalf("a change of %s: %v, want %v naming it", c.field, err, ErrNeedsRestart)
			}
		})
	}
}
