package cdi

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/device"
)

// TestHelperWriteSpec is not a test: TestSpecWriteIsDurable runs the test
// binary under strace with this helper selected, to write one spec.
func TestHelperWriteSpec(t *testing.T) {
	dir := os.Getenv("CDI_TEST_WRITE_DIR")
	if dir == "" {
		t.Skip("helper for TestSpecWriteIsDurable")
	}
	w := NewWriter(dir, "test-plugin", 1)
	snap := &device.Snapshot{Devices: []device.Device{{Name: "fpga-0", HostPath: "/dev/null", ContainerPath: "/dev/fpga-0", Type: device.Char, Major: 1, Minor: 3}}}
	if err := w.Write(testResource(t), snap); err != nil {
		t.Fatal(err)
	}
}

// TestSpecWriteIsDurable: the spec's content is synced
// before it is renamed into place, and the directory after the rename, so
// a crash or power loss leaves the old spec or the new one, never an empty
// file. Observed with strace on a real write.
func TestSpecWriteIsDurable(t *testing.T) {
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("strace is not installed")
	}
	dir := filepath.Join(t.TempDir(), "cdi")
	trace := filepath.Join(t.TempDir(), "trace")
	cmd := exec.Command(strace, "-f", "-qq", "-o", trace, "-e", "trace=openat,fsync,fdatasync,rename,renameat,renameat2",
		os.Args[0], "-test.run=^TestHelperWriteSpec$", "-test.count=1")
	cmd.Env = append(os.Environ(), "CDI_TEST_WRITE_DIR="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("cannot strace here (%v): %s", err, out)
	}
	data, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(dir, "k8s.example.com-fpga.json")
	openRe := regexp.MustCompile(`openat\(AT_FDCWD, "([^"]+)", [^)]*\) = (\d+)$`)
	fsyncRe := regexp.MustCompile(`f(?:data)?sync\((\d+)\)\s+= 0$`)
	renameRe := regexp.MustCompile(`rename(?:at2?)?\((?:(AT_FDCWD|\d+), )?"([^"]+)", (?:(AT_FDCWD|\d+), )?"([^"]+)"`)
	fdPath := map[string]string{}
	synced := map[string]bool{}
	renamed := false
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if _, rest, ok := strings.Cut(line, " "); ok {
			line = rest // strip the pid
		}
		if m := openRe.FindStringSubmatch(line); m != nil {
			fdPath[m[2]] = m[1]
			continue
		}
		if m := fsyncRe.FindStringSubmatch(line); m != nil {
			synced[fdPath[m[1]]] = true
			if renamed && fdPath[m[1]] == dir {
				return // content synced before the rename, directory after
			}
			continue
		}
		if m := renameRe.FindStringSubmatch(line); m != nil {
			// Names are relative to a directory fd, or absolute.
			abs := func(dirfd, name string) string {
				if filepath.IsAbs(name) || dirfd == "" || dirfd == "AT_FDCWD" {
					return name
				}
				return filepath.Join(fdPath[dirfd], name)
			}
			from, to := abs(m[1], m[2]), abs(m[3], m[4])
			if to != spec {
				continue
			}
			if !synced[from] {
				t.Fatalf("%s renamed into place without being synced\n%s", from, data)
			}
			renamed = true
		}
	}
	if !renamed {
		t.Fatalf("no rename to %s seen\n%s", spec, data)
	}
	t.Fatalf("the directory is not synced after the rename\n%s", data)
}
