package resource

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestTempPatternsCoverEveryFile: every file a resource writes through a
// temp file (its spec; a host resource's registry) may be left as a temp
// by a run killed mid-write, and TempPatterns must glob it, or no later
// run removes it. A temp of another process beside each such file is
// removed by RemoveStaleTemps over TempPatterns; the resource's files are
// kept. The device state directories are the commands' own patterns.
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
