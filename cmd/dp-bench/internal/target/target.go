// Package target is what dp-bench runs: a target (a plugin's or a
// driver's command line and what it must do, from a targets file or the
// flags), the settings that bound and size a run, and one run's fresh
// directories, files and command line, made from the target's templates
// (Prepare).
package target

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"sigs.k8s.io/yaml"
)

// Target is one plugin command line, with the size it is run at, to check
// and measure. Command, Env, Files and RemoveDevice are templates over
// Dirs (e.g. "{{.SocketDir}}") with a function env ("{{env "BIN"}}").
// A target with DRA set is a DRA driver, driven as the kubelet drives one
// (package drasession); the others are device plugins (package
// dpsession).
type Target struct {
	// Name labels the plugin in the tables, Scenario its size.
	Name     string `json:"name"`
	Scenario string `json:"scenario,omitempty"`
	// Group is what -compare pairs targets by (default: the scenario):
	// the -compare target is compared with the others of its group.
	Group string `json:"group,omitempty"`
	// DRA, when set, makes the target a DRA driver.
	DRA *DRATarget `json:"dra,omitempty"`
	// Command is the plugin's argv.
	Command []string `json:"command"`
	// Env is the plugin's whole environment (KEY=VALUE), PATH aside.
	Env []string `json:"env,omitempty"`
	// Files are written into WorkDir before the start (name -> content).
	Files map[string]string `json:"files,omitempty"`
	// SocketDir and CDIDir are where the plugin expects its sockets and
	// writes CDI specs. Empty: a fresh directory every run, given to the
	// plugin through the template. A fixed path (a plugin that cannot be
	// told, e.g. /var/lib/kubelet/device-plugins): the plugin runs in a
	// private mount namespace with the fresh directory bound there (root).
	SocketDir string `json:"socketDir,omitempty"`
	CDIDir    string `json:"cdiDir,omitempty"`
	// DeviceFiles character nodes 1:3 are created as {{.DevDir}}/dev-<i>
	// before the start, for plugins that discover devices.
	DeviceFiles int `json:"deviceFiles,omitempty"`
	// RemoveDevice is a device file to remove (and put back) to test that
	// ListAndWatch reports the change; empty: not tested.
	RemoveDevice string `json:"removeDevice,omitempty"`
	// Setup is a shell script (sh -c) run before the start, not timed: a
	// device tree for a plugin that discovers devices in sysfs.
	Setup string `json:"setup,omitempty"`
	// Uevent, when set, checks that a kernel uevent makes ListAndWatch
	// report a change that no device file shows: Change (sh -c) alters
	// the device tree, then "change" is written to Trigger, a real
	// device's sysfs uevent file, so that the kernel sends an event.
	Uevent *UeventCheck `json:"uevent,omitempty"`
	// IDs is the number of device IDs the plugin must list (0: any).
	IDs int `json:"ids,omitempty"`
	// Resource is the resource name it must register (empty: any valid).
	Resource string `json:"resource,omitempty"`
}

// DRATarget is what a DRA driver target must do.
type DRATarget struct {
	// Driver is the driver name it must register and publish devices of.
	Driver string `json:"driver"`
	// Devices is the number of devices it must publish for the node (0:
	// any); the prepare calls take up to 8 of them.
	Devices int `json:"devices,omitempty"`
	// StepsEvidence is a glob (template) of files that its preparation
	// steps write (a device's state.json): a second NodePrepareResources
	// of a prepared claim must leave them as they were. Empty: not
	// checked.
	StepsEvidence string `json:"stepsEvidence,omitempty"`
	// Controller is a command run once per fleet beside the drivers
	// (dp-bench -fleet only): the bind marker of a driver that prepares
	// before binding. Templates: {{.Kubeconfig}} (the control plane's,
	// as a user of its own) and env.
	Controller []string `json:"controller,omitempty"`
}

// UeventCheck is Target.Uevent.
type UeventCheck struct {
	Change  string `json:"change"`
	Trigger string `json:"trigger"`
}

// CompareGroup is the comparison group: Group, else the scenario.
func (t Target) CompareGroup() string {
	if t.Group != "" {
		return t.Group
	}
	return t.Scenario
}

// Label is "name (scenario)".
func (t Target) Label() string {
	if t.Scenario == "" {
		return t.Name
	}
	return t.Name + " (" + t.Scenario + ")"
}

// file is the targets file: several targets, run side by side.
type file struct {
	Targets []Target `json:"targets"`
}

// ErrNoCluster is Prepare's error for a DRA driver's run without the API
// server.
var ErrNoCluster = errors.New("a DRA driver needs the API server")

// Load reads a targets file (YAML or JSON).
func Load(path string) ([]Target, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f file
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(f.Targets) == 0 {
		return nil, fmt.Errorf("%s: no targets", path)
	}
	for i := range f.Targets {
		if err := f.Targets[i].Validate(); err != nil {
			return nil, fmt.Errorf("%s: targets[%d]: %w", path, i, err)
		}
		if (f.Targets[i].DRA != nil) != (f.Targets[0].DRA != nil) {
			return nil, fmt.Errorf("%s: targets[%d]: DRA drivers and device plugins in one file: their tables differ, give them in two files", path, i)
		}
	}
	return f.Targets, nil
}

// Validate checks a target's fields; errors name the field and the
// value.
func (t Target) Validate() error {
	if t.Name == "" {
		return errors.New("name: empty")
	}
	if len(t.Command) == 0 {
		return errors.New("command: empty")
	}
	for field, p := range map[string]string{"socketDir": t.SocketDir, "cdiDir": t.CDIDir} {
		if p != "" && (!filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/") {
			return fmt.Errorf("%s=%q: must be a clean absolute path other than /", field, p)
		}
	}
	if t.DeviceFiles < 0 || t.IDs < 0 {
		return fmt.Errorf("deviceFiles=%d, ids=%d: must not be negative", t.DeviceFiles, t.IDs)
	}
	for name := range t.Files {
		if name == "" || filepath.Base(name) != name {
			return fmt.Errorf("files: %q must be a plain file name", name)
		}
	}
	if t.DRA != nil {
		return t.DRA.validate(t)
	}
	return nil
}

func (d *DRATarget) validate(t Target) error {
	if d.Driver == "" {
		return errors.New("dra.driver: empty")
	}
	if d.Devices < 0 {
		return fmt.Errorf("dra.devices=%d: must not be negative", d.Devices)
	}
	for field, set := range map[string]bool{"socketDir": t.SocketDir != "", "cdiDir": t.CDIDir != "", "removeDevice": t.RemoveDevice != "",
		"uevent": t.Uevent != nil, "ids": t.IDs != 0, "resource": t.Resource != ""} {
		if set {
			return fmt.Errorf("%s: not used for a DRA driver (dra is set)", field)
		}
	}
	return nil
}

// IsDRA reports whether the targets are DRA drivers (Load keeps a file to
// one kind).
func IsDRA(ts []Target) bool {
	return slices.ContainsFunc(ts, func(t Target) bool { return t.DRA != nil })
}
