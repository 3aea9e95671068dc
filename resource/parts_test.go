package resource

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
	"github.com/cdi-device-plugin/cdi-device-plugin/prestart"
)

// TestCorruptRegistryRebuiltFromSpec: a device registry that does not
// parse is rebuilt from the resource's CDI spec that an earlier run wrote
// (indexes handed out again in discovery order would move a held ID to
// other hardware): rediscovered in another order, every device keeps its
// ID and index, and a new one gets the next index. With no spec, or a spec
// that is not ours, the start is refused (device.ErrRegistry), with a
// message naming the file and the way out, and the file is left as it is.
func TestCorruptRegistryRebuiltFromSpec(t *testing.T) {
	testutil.NeedMknod(t)
	base := t.TempDir()
	dev, cdiDir, state := filepath.Join(base, "dev"), filepath.Join(base, "cdi"), filepath.Join(base, "state")
	cfgFile := filepath.Join(base, "config.yaml")
	if err := os.WriteFile(cfgFile, []byte("resources:\n- name: example.com/serial\n  idPrefix: ser\n  envPrefix: SER\n  hostDevices: [\"ttyR*\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	load := func(owner string) *config.Config {
		t.Helper()
		env := map[string]string{"PLUGIN_NAME": owner}
		cfg, err := config.Load([]string{"--config", cfgFile, "--dev-root", dev, "--cdi-dir", cdiDir, "--state-dir", state, "--node-name", "n1"},
			func(k string) (string, bool) { v, ok := env[k]; return v, ok }, nil)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	// start builds and prepares the resource as a command does, and writes
	// its spec as the follower does.
	start := func(owner string) (*Parts, error) {
		t.Helper()
		cfg := load(owner)
		p, err := Build(cfg, 0, Options{Writer: cdi.NewWriter(cdiDir, cfg.Owner(), time.Now().UnixNano())})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Prepare(); err != nil {
			return nil, err
		}
		if err := p.Spec.Write(p.Source.Snapshot()); err != nil {
			t.Fatal(err)
		}
		return p, nil
	}
	indexes := func(p *Parts) map[string]int {
		out := map[string]int{}
		for _, d := range p.Source.Snapshot().Devices {
			out[d.Name] = d.Index
		}
		return out
	}
	// ttyR3 first, then ttyR1: glob order would number them the other way.
	testutil.Mknod(t, filepath.Join(dev, "ttyR3"), 4, 67)
	if _, err := start("dp"); err != nil {
		t.Fatal(err)
	}
	testutil.Mknod(t, filepath.Join(dev, "ttyR1"), 4, 65)
	p, err := start("dp")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"ser-n1-ttyR3": 0, "ser-n1-ttyR1": 1}
	if got := indexes(p); len(got) != 2 || got["ser-n1-ttyR3"] != 0 || got["ser-n1-ttyR1"] != 1 {
		t.Fatalf("before: %v, want %v", got, want)
	}
	registry := filepath.Join(state, "resources", p.Kind.SpecName()+".json")
	corrupt := []byte(`{"version": 1, "devices": [{"path": "ttyR3", "id": "ser-n1-ttyR3", "ind`)
	specPath := p.Spec.Path()
	spec, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("refused without a spec", func(t *testing.T) {
		if err := os.WriteFile(registry, corrupt, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(specPath); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = os.WriteFile(specPath, spec, 0o644) }()
		_, err := start("dp")
		if !errors.Is(err, device.ErrRegistry) || !strings.Contains(err.Error(), registry) || !strings.Contains(err.Error(), "no pod holds") {
			t.Fatalf("got %v, want %v naming %s and the way out", err, device.ErrRegistry, registry)
		}
		if got, _ := os.ReadFile(registry); !bytes.Equal(got, corrupt) {
			t.Fatalf("the refused registry was changed: %q", got)
		}
	})
	t.Run("refused with a spec of another owner", func(t *testing.T) {
		if err := os.WriteFile(registry, corrupt, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := start("another")
		if !errors.Is(err, device.ErrRegistry) || !strings.Contains(err.Error(), "not ours") {
			t.Fatalf("got %v, want %v: the spec is not ours", err, device.ErrRegistry)
		}
	})
	t.Run("rebuilt from the spec", func(t *testing.T) {
		if err := os.WriteFile(registry, corrupt, 0o600); err != nil {
			t.Fatal(err)
		}
		testutil.Mknod(t, filepath.Join(dev, "ttyR0"), 4, 64)
		p, err := start("dp")
		if err != nil {
			t.Fatal(err)
		}
		got := indexes(p)
		if got["ser-n1-ttyR3"] != 0 || got["ser-n1-ttyR1"] != 1 || got["ser-n1-ttyR0"] != 2 || len(got) != 3 {
			t.Fatalf("after the rebuild: %v; want ttyR3 0, ttyR1 1, the new ttyR0 2", got)
		}
		if _, err := os.Stat(registry + ".corrupt"); err != nil {
			t.Errorf("the unreadable registry is not kept aside: %v", err)
		}
		// The rebuilt registry is read at the next start.
		p, err = start("dp")
		if err != nil {
			t.Fatal(err)
		}
		if again := indexes(p); len(again) != 3 || again["ser-n1-ttyR0"] != 2 || again["ser-n1-ttyR3"] != 0 {
			t.Fatalf("after a restart: %v", again)
		}
	})
	// A registry that is gone (the state directory cleaned) is missing
	// state too: rebuilt from the spec, with no file to keep aside.
	t.Run("rebuilt when missing", func(t *testing.T) {
		if err := os.Remove(registry); err != nil {
			t.Fatal(err)
		}
		p, err := start("dp")
		if err != nil {
			t.Fatal(err)
		}
		if got := indexes(p); len(got) != 3 || got["ser-n1-ttyR3"] != 0 || got["ser-n1-ttyR1"] != 1 || got["ser-n1-ttyR0"] != 2 {
			t.Fatalf("after the registry was removed: %v; want ttyR3 0, ttyR1 1, ttyR0 2 (glob order would give ttyR0 0)", got)
		}
		if _, err := os.Stat(registry); err != nil {
			t.Fatalf("the rebuilt registry is not written: %v", err)
		}
	})
	// Missing, with no spec of the resource's own: what the spec of
	// another owner (a plugin renamed, now run in a namespace) describes
	// are not its devices; without a spec nothing describes any.
	for _, c := range []struct{ name, owner string }{{"missing, with a spec of another owner: a first start", "another"}, {"missing, without a spec: a first start", "dp"}} {
		t.Run(c.name, func(t *testing.T) {
			if err := os.Remove(registry); err != nil {
				t.Fatal(err)
			}
			if c.owner == "dp" {
				if err := os.Remove(specPath); err != nil {
					t.Fatal(err)
				}
			}
			p, err := start(c.owner)
			if err != nil {
				t.Fatal(err)
			}
			if got := indexes(p); len(got) != 3 || got["ser-n1-ttyR0"] != 0 || got["ser-n1-ttyR1"] != 1 || got["ser-n1-ttyR3"] != 2 {
				t.Fatalf("a first start: %v, want glob order", got)
			}
		})
	}
}

// TestTempPatternsCoverEveryFile: every file a resource writes through a
// temp file (its spec; a host resource's registry) may be left as a temp
// by a run killed mid-write, and TempPatterns must glob it, or no later
// run removes it. A temp of another process beside each such file is
// removed by RemoveStaleTemps over TempPatterns; the resource's files are
// kept. The device state directories, which every resource shares, are
// StateTempPatterns' (TestStateTempPatterns).
func TestTempPatternsCoverEveryFile(t *testing.T) {
	testutil.NeedMknod(t)
	for _, c := range []struct{ name, resource string }{
		{"simulated", "count: 2"},
		{"host devices", `hostDevices: ["ttyR*"]`},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			dev, cdiDir, state := filepath.Join(base, "dev"), filepath.Join(base, "cdi"), filepath.Join(base, "state")
			testutil.Mknod(t, filepath.Join(dev, "ttyR0"), 1, 3)
			cfgFile := filepath.Join(base, "config.yaml")
			body := "resources:\n- name: example.com/r\n  idPrefix: r\n  envPrefix: R\n  " + c.resource + "\n"
			if err := os.WriteFile(cfgFile, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Load([]string{"--config", cfgFile, "--dev-root", dev, "--cdi-dir", cdiDir, "--state-dir", state, "--node-name", "n"},
				func(string) (string, bool) { return "", false }, nil)
			if err != nil {
				t.Fatal(err)
			}
			r, err := Build(cfg, 0, Options{Writer: cdi.NewWriter(cdiDir, cfg.Owner(), 1)})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.Prepare(); err != nil {
				t.Fatal(err)
			}
			files := []string{r.Spec.Path()}
			_ = filepath.WalkDir(state, func(p string, e fs.DirEntry, err error) error {
				switch {
				case err != nil:
					return nil
				case e.IsDir() && p == r.StateRoot:
					return fs.SkipDir
				case e.Type().IsRegular():
					files = append(files, p)
				}
				return nil
			})
			var killed []string
			for _, f := range files {
				// Named as Write names the temps of another process.
				p := strings.TrimSuffix(atomicfile.TempPattern(f), "*") + "1.killed-42"
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
					t.Fatal(err)
				}
				killed = append(killed, p)
			}
			for _, pattern := range r.TempPatterns() {
				if _, err := atomicfile.RemoveStaleTemps(pattern); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range killed {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("temp of a killed write left: %s (TempPatterns %q)", p, r.TempPatterns())
				}
			}
			for _, f := range files[1:] {
				if _, err := os.Lstat(f); err != nil {
					t.Errorf("the resource's own file: %v", err)
				}
			}
		})
	}
}

// TestStateTempPatterns: what a run killed mid-way through device state
// work may leave in a device's state directory (a temp of its state file,
// the scratch directory a reset moved aside) is globbed by
// StateTempPatterns of the state dir, below the resources' StateRoot, and
// removed by RemoveStaleTemps when another process left it; the state
// file, the scratch directory and this process's temps are kept.
func TestStateTempPatterns(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	cfg, err := config.Load([]string{"--state-dir", state, "--node-name", "n"}, func(string) (string, bool) { return "", false }, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Build(cfg, 0, Options{Writer: cdi.NewWriter(t.TempDir(), cfg.Owner(), 1)})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(r.StateRoot, "simple-device-n-0")
	stateFile, scratch := filepath.Join(dir, prestart.StateFile), filepath.Join(dir, prestart.ScratchDir)
	killed := []string{
		strings.TrimSuffix(atomicfile.TempPattern(stateFile), "*") + "1.killed-42",
		scratch + ".old-1.killed-42",
	}
	kept := []string{stateFile, scratch, atomicfile.TempName(stateFile), scratch + ".old-" + atomicfile.Tag() + "-1"}
	for _, p := range append(slices.Clone(killed), kept...) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, pattern := range StateTempPatterns(state) {
		if _, err := atomicfile.RemoveStaleTemps(pattern); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range killed {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("left by a killed run, not removed: %s (StateTempPatterns %q)", p, StateTempPatterns(state))
		}
	}
	for _, p := range kept {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("removed: %v", err)
		}
	}
}
