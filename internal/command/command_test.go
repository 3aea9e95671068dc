package command

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
)

func noEnv(string) (string, bool) { return "", false }

// TestLoad: -h and --version end the command with status 0 (the usage, or
// the name and version, on stderr), a bad configuration with 2 and the
// name before the error; a good one is returned with the command's own
// flags set.
func TestLoad(t *testing.T) {
	for _, c := range []struct {
		name   string
		args   []string
		exit   int
		stderr string // a part of it; "": empty
	}{
		{"help", []string{"-h"}, 0, "Usage of cdi-test:"},
		{"version", []string{"--version"}, 0, "cdi-test v1.2.3\n"},
		{"bad value", []string{"--log-level", "loud"}, 2, `cdi-test: invalid configuration: log-level="loud"`},
		{"unknown flag", []string{"--nope"}, 2, "cdi-test: flag provided but not defined: -nope"},
		{"good", []string{"--cdi-dir", "/x/cdi", "--own", "mine"}, 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			var own string
			cfg, exit := Load("cdi-test", "v1.2.3", c.args, noEnv, &stderr, config.Extra{Name: "own", Env: "OWN", Value: &own})
			if exit != c.exit {
				t.Errorf("exit %d, want %d", exit, c.exit)
			}
			if c.stderr == "" {
				if cfg == nil || cfg.CDIDir != "/x/cdi" || own != "mine" || stderr.Len() != 0 {
					t.Fatalf("config %+v, own %q, stderr %q; want the configuration and the flag, nothing said", cfg, own, stderr.String())
				}
				return
			}
			if cfg != nil || !strings.Contains(stderr.String(), c.stderr) {
				t.Fatalf("config %v, stderr %q; want none and %q", cfg, stderr.String(), c.stderr)
			}
		})
	}
}

// TestSweepTemps: a temp file another process left is removed and logged
// with its path; this process's temps (writes in flight) and the file
// itself are kept; a pattern that cannot be read is a warning.
func TestSweepTemps(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "spec.json")
	stale := strings.TrimSuffix(atomicfile.TempPattern(file), "*") + "1.killed-42"
	own := atomicfile.TempName(file) + "-7"
	for _, p := range []string{file, stale, own} {
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	l := logrus.New()
	l.SetOutput(&out)
	SweepTemps([]string{atomicfile.TempPattern(file), "["}, logrus.NewEntry(l))
	if _, err := os.Lstat(stale); err == nil {
		t.Errorf("the temp of a killed write is left: %s", stale)
	}
	for _, p := range []string{file, own} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("removed: %v", err)
		}
	}
	log := out.String()
	for _, want := range []string{"removed a temp file of an interrupted write", stale, "level=warning", "removing temp files of interrupted writes"} {
		if !strings.Contains(log, want) {
			t.Errorf("log has no %q:\n%s", want, log)
		}
	}
}

// TestExiting: the error a command stops with reaches stderr at every log
// level: logged at error, and written plainly besides where the level
// (fatal, panic) would drop it, so that a process never ends with a
// status and not a line.
func TestExiting(t *testing.T) {
	for _, level := range []logrus.Level{logrus.DebugLevel, logrus.ErrorLevel, logrus.FatalLevel, logrus.PanicLevel} {
		t.Run(level.String(), func(t *testing.T) {
			var out bytes.Buffer
			l := logrus.New()
			l.SetOutput(&out)
			l.SetLevel(level)
			Exiting(logrus.NewEntry(l), errors.New("the kubelet is gone"), &out)
			if n := strings.Count(out.String(), "the kubelet is gone"); n != 1 {
				t.Fatalf("level %s: the error written %d times, want once:\n%s", level, n, out.String())
			}
		})
	}
}
