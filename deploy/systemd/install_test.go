// Package systemd holds the host install's unit and environment file; its
// test runs `make install` and `make uninstall` into temporary roots.
package systemd

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const (
	unitSrc = "cdi-device-plugin.service"
	envSrc  = "cdi-device-plugin.env"
)

// repo is the repository root, where the Makefile is.
func repo(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// fakeBin is a BIN directory holding a stand-in for the built plugin.
func fakeBin(t *testing.T, content string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cdi-device-plugin"), []byte("#!/bin/sh\n# "+content+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func mk(t *testing.T, target string, vars ...string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	cmd := exec.Command("make", append([]string{"-s", "-C", repo(t), target}, vars...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %s %v: %v\n%s", target, vars, err, out)
	}
	return string(out)
}

// files lists the regular files below root with their modes.
func files(t *testing.T, root string) map[string]fs.FileMode {
	t.Helper()
	got := map[string]fs.FileMode{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		got["/"+rel] = fi.Mode()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// unitLines returns the values of key in the unit text.
func unitLines(unit, key string) []string {
	var v []string
	for _, l := range strings.Split(unit, "\n") {
		if strings.HasPrefix(l, key+"=") {
			v = append(v, strings.TrimPrefix(l, key+"="))
		}
	}
	return v
}

func TestInstallUninstall(t *testing.T) {
	root := t.TempDir()
	dest := "DESTDIR=" + root
	mk(t, "install", dest, "BIN="+fakeBin(t, "v1"))

	want := map[string]fs.FileMode{
		"/usr/local/bin/cdi-device-plugin":                        0o755,
		"/usr/local/lib/systemd/system/cdi-device-plugin.service": 0o644,
		"/etc/default/cdi-device-plugin":                          0o644,
	}
	if got := files(t, root); !mapsEqual(got, want) {
		t.Fatalf("installed tree %v, want %v", got, want)
	}
	unit := read(t, root+"/usr/local/lib/systemd/system/cdi-device-plugin.service")
	if got := unitLines(unit, "ExecStart"); !slices.Equal(got, []string{"/usr/local/bin/cdi-device-plugin"}) {
		t.Errorf("ExecStart %v", got)
	}
	if got := unitLines(unit, "EnvironmentFile"); !slices.Equal(got, []string{"-/etc/default/cdi-device-plugin"}) {
		t.Errorf("EnvironmentFile %v", got)
	}
	if read(t, root+"/etc/default/cdi-device-plugin") != read(t, envSrc) {
		t.Error("the installed env file is not the shipped one")
	}
	if !strings.Contains(read(t, root+"/usr/local/bin/cdi-device-plugin"), "v1") {
		t.Error("the binary is not the built one")
	}

	// An upgrade replaces the binary and the unit, never an edited env file.
	edited := "NUMBER_DEVICES=8\n"
	if err := os.WriteFile(root+"/etc/default/cdi-device-plugin", []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	out := mk(t, "install", dest, "BIN="+fakeBin(t, "v2"))
	if !strings.Contains(read(t, root+"/usr/local/bin/cdi-device-plugin"), "v2") {
		t.Error("the binary was not upgraded")
	}
	if got := read(t, root+"/etc/default/cdi-device-plugin"); got != edited {
		t.Errorf("install overwrote the edited env file: %q", got)
	}
	if !strings.Contains(out, "kept") {
		t.Errorf("install did not say it kept the env file:\n%s", out)
	}

	// Uninstall keeps an edited env file, and removes an unchanged one.
	mk(t, "uninstall", dest)
	if got := files(t, root); !mapsEqual(got, map[string]fs.FileMode{"/etc/default/cdi-device-plugin": 0o644}) {
		t.Fatalf("after uninstall with an edited env file: %v", got)
	}
	mk(t, "install", dest, "BIN="+fakeBin(t, "v3"))
	if err := os.WriteFile(root+"/etc/default/cdi-device-plugin", []byte(read(t, envSrc)), 0o644); err != nil {
		t.Fatal(err)
	}
	mk(t, "uninstall", dest)
	if got := files(t, root); len(got) != 0 {
		t.Fatalf("uninstall left %v", got)
	}
}

// PREFIX and SYSCONFDIR move the files, and the unit points at them.
func TestInstallPrefix(t *testing.T) {
	root := t.TempDir()
	mk(t, "install", "DESTDIR="+root, "PREFIX=/opt/cdp", "SYSCONFDIR=/etc/cdp", "BIN="+fakeBin(t, "p"))
	want := map[string]fs.FileMode{
		"/opt/cdp/bin/cdi-device-plugin":                        0o755,
		"/opt/cdp/lib/systemd/system/cdi-device-plugin.service": 0o644,
		"/etc/cdp/default/cdi-device-plugin":                    0o644,
	}
	if got := files(t, root); !mapsEqual(got, want) {
		t.Fatalf("installed tree %v, want %v", got, want)
	}
	unit := read(t, root+"/opt/cdp/lib/systemd/system/cdi-device-plugin.service")
	if got := unitLines(unit, "ExecStart"); !slices.Equal(got, []string{"/opt/cdp/bin/cdi-device-plugin"}) {
		t.Errorf("ExecStart %v", got)
	}
	if got := unitLines(unit, "EnvironmentFile"); !slices.Equal(got, []string{"-/etc/cdp/default/cdi-device-plugin"}) {
		t.Errorf("EnvironmentFile %v", got)
	}
	mk(t, "uninstall", "DESTDIR="+root, "PREFIX=/opt/cdp", "SYSCONFDIR=/etc/cdp")
	if got := files(t, root); len(got) != 0 {
		t.Fatalf("uninstall left %v", got)
	}
}

// The installed unit passes systemd's own check: known keys and values,
// an executable ExecStart.
func TestUnitVerifies(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("no systemd-analyze (Debian package systemd)")
	}
	prefix := t.TempDir()
	mk(t, "install", "PREFIX="+prefix, "SYSCONFDIR="+prefix+"/etc", "BIN="+fakeBin(t, "verify"))
	unit := filepath.Join(prefix, "lib", "systemd", "system", "cdi-device-plugin.service")
	var stderr bytes.Buffer
	cmd := exec.Command("systemd-analyze", "verify", unit)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	// verify reports problems of the units it loads alongside (kubelet's
	// absence is none) on stderr; every line naming our unit is one of ours.
	var ours []string
	for _, l := range strings.Split(stderr.String()+string(out), "\n") {
		if strings.Contains(l, "cdi-device-plugin") {
			ours = append(ours, l)
		}
	}
	if err != nil || len(ours) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, strings.Join(ours, "\n"))
	}
	// Its hardening does not regress: systemd's exposure rating (0 best,
	// 10 worst) stays at 4.0 or better.
	if out, err := exec.Command("systemd-analyze", "security", "--offline=true", "--threshold=40", unit).CombinedOutput(); err != nil {
		t.Errorf("systemd-analyze security: exposure above 4.0 (%v):\n%s", err, out)
	}
	// The unit is ordered as the host mode needs.
	text := read(t, unit)
	for _, want := range []string{"Before=kubelet.service", "After=local-fs.target", "Restart=always", "WantedBy=multi-user.target"} {
		if !strings.Contains(text, "\n"+want+"\n") {
			t.Errorf("the unit lacks %s", want)
		}
	}
}

func mapsEqual(a, b map[string]fs.FileMode) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w.Perm() != v.Perm() || !v.IsRegular() {
			return false
		}
	}
	return true
}
