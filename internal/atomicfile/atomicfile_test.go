package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSweepSparesWritesInFlight: the start-up sweep runs beside the
// resources' first writes. A temp file this process is writing must
// survive it even when its time stamp is older than the process (the
// kernel stamps files from a coarse clock that lags time.Now by up to a
// tick), while a killed run's temp file of any age goes.
func TestSweepSparesWritesInFlight(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "spec.json")
	killed := filepath.Join(dir, ".spec.json.tmp-1.1-123")
	if err := os.WriteFile(killed, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour)
	var removed []string
	err := Write(path, 0o644, func(f *os.File) error {
		if err := os.Chtimes(f.Name(), past, past); err != nil {
			return err
		}
		var err error
		removed, err = RemoveStaleTemps(TempPattern(path))
		if err != nil {
			return err
		}
		_, err = f.WriteString("{}")
		return err
	})
	if err != nil {
		t.Fatalf("a write in flight failed under the sweep: %v", err)
	}
	if len(removed) != 1 || removed[0] != killed {
		t.Errorf("sweep removed %q, want only the killed run's %q", removed, killed)
	}
	if data, err := os.ReadFile(path); err != nil || string(data) != "{}" {
		t.Errorf("after the write: %q, %v", data, err)
	}
	left, _ := filepath.Glob(TempPattern(path))
	if len(left) != 0 {
		t.Errorf("temp files left: %q", left)
	}
}
