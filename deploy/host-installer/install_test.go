// Package hostinstaller holds the host installer's DaemonSet and script;
// its test runs install.sh against a fake node root and a recording
// systemctl.
package hostinstaller

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type node struct {
	root, src, calls, systemctl string
}

func newNode(t *testing.T, failOn string) *node {
	t.Helper()
	n := &node{root: t.TempDir(), src: t.TempDir()}
	if err := os.MkdirAll(filepath.Join(n.root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	n.calls = filepath.Join(t.TempDir(), "calls")
	n.systemctl = filepath.Join(t.TempDir(), "systemctl")
	script := "#!/bin/sh\necho \"$*\" >>" + n.calls + "\n"
	if failOn != "" {
		script += "[ \"$1\" != " + failOn + " ] || exit 1\n"
	}
	if err := os.WriteFile(n.systemctl, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	n.binary(t, "v1")
	for _, f := range []string{"cdi-device-plugin.service", "cdi-device-plugin.env"} {
		b, err := os.ReadFile(filepath.Join("..", "systemd", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(n.src, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// binary puts a stand-in for the plugin of that version into the image.
func (n *node) binary(t *testing.T, version string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(n.src, "cdi-device-plugin"), []byte("#!/bin/sh\necho cdi-device-plugin "+version+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// install runs install.sh once with the shell sh and PATH path (empty:
// this process's), and returns the systemctl calls it made.
func (n *node) install(t *testing.T, sh []string, path string, env ...string) ([]string, error) {
	t.Helper()
	_ = os.Remove(n.calls)
	cmd := exec.Command(sh[0], append(sh[1:], "install.sh")...)
	cmd.Env = append(os.Environ(), "HOST_ROOT="+n.root, "SRC_DIR="+n.src, "SYSTEMCTL="+n.systemctl, "ONCE=1",
		"CONFIG_ENV="+filepath.Join(n.src, "no-config"))
	if path != "" {
		cmd.Env = append(cmd.Env, "PATH="+path)
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	t.Logf("install.sh:\n%s", out)
	b, _ := os.ReadFile(n.calls)
	return strings.Split(strings.TrimSpace(string(b)), "\n"), err
}

func (n *node) read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.root, p))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// shells are the shells to run install.sh with: this machine's sh, and
// busybox's sh with busybox's applets alone (the image's), when present.
func shells(t *testing.T) map[string]struct {
	sh   []string
	path string
} {
	out := map[string]struct {
		sh   []string
		path string
	}{"sh": {[]string{"sh"}, ""}}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return out
	}
	dir := t.TempDir()
	for _, a := range []string{"sh", "cp", "cmp", "chmod", "mv", "mkdir", "dirname", "sed", "mktemp", "rm", "cat", "sleep", "chroot"} {
		if err := os.Symlink(bb, filepath.Join(dir, a)); err != nil {
			t.Fatal(err)
		}
	}
	out["busybox"] = struct {
		sh   []string
		path string
	}{[]string{bb, "sh"}, dir}
	return out
}

func TestInstallScript(t *testing.T) {
	for name, s := range shells(t) {
		t.Run(name, func(t *testing.T) {
			n := newNode(t, "")
			restart := []string{"daemon-reload", "enable cdi-device-plugin.service", "restart cdi-device-plugin.service", "is-active cdi-device-plugin.service"}
			start := []string{"daemon-reload", "enable cdi-device-plugin.service", "start cdi-device-plugin.service", "is-active cdi-device-plugin.service"}
			check := func(what string, got, want []string, err error) {
				t.Helper()
				if err != nil || strings.Join(got, "|") != strings.Join(want, "|") {
					t.Fatalf("%s: systemctl calls %q (err %v), want %q", what, got, err, want)
				}
			}

			calls, err := n.install(t, s.sh, s.path)
			check("first install", calls, restart, err)
			for p, mode := range map[string]os.FileMode{
				"usr/local/bin/cdi-device-plugin":              0o755,
				"etc/systemd/system/cdi-device-plugin.service": 0o644,
				"etc/default/cdi-device-plugin":                0o644,
			} {
				fi, err := os.Stat(filepath.Join(n.root, p))
				if err != nil || fi.Mode().Perm() != mode {
					t.Fatalf("%s: %v %v, want mode %v", p, fi, err, mode)
				}
			}
			if !strings.Contains(n.read(t, "usr/local/bin/cdi-device-plugin"), "v1") {
				t.Fatal("binary not installed")
			}
			if !strings.Contains(n.read(t, "etc/systemd/system/cdi-device-plugin.service"), "\nExecStart=/usr/local/bin/cdi-device-plugin\n") {
				t.Fatal("unit not installed")
			}

			// Nothing changed: started (a no-op if running), not restarted.
			calls, err = n.install(t, s.sh, s.path)
			check("same image again", calls, start, err)

			// The node's own env file is kept.
			if err := os.WriteFile(filepath.Join(n.root, "etc", "default", "cdi-device-plugin"), []byte("NUMBER_DEVICES=8\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			calls, err = n.install(t, s.sh, s.path)
			check("edited env file", calls, start, err)
			if got := n.read(t, "etc/default/cdi-device-plugin"); got != "NUMBER_DEVICES=8\n" {
				t.Fatalf("the node's env file was replaced: %q", got)
			}

			// A cluster-wide env file (ConfigMap) replaces it and restarts.
			cfg := filepath.Join(t.TempDir(), "cdi-device-plugin.env")
			if err := os.WriteFile(cfg, []byte("NUMBER_DEVICES=6\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			calls, err = n.install(t, s.sh, s.path, "CONFIG_ENV="+cfg)
			check("config env", calls, restart, err)
			if got := n.read(t, "etc/default/cdi-device-plugin"); got != "NUMBER_DEVICES=6\n" {
				t.Fatalf("env file %q, want the ConfigMap's", got)
			}

			// A new image: the binary is upgraded and the service restarted.
			n.binary(t, "v2")
			calls, err = n.install(t, s.sh, s.path, "CONFIG_ENV="+cfg)
			check("upgrade", calls, restart, err)
			if !strings.Contains(n.read(t, "usr/local/bin/cdi-device-plugin"), "v2") {
				t.Fatal("binary not upgraded")
			}
			_ = filepath.WalkDir(n.root, func(p string, _ os.DirEntry, _ error) error {
				if strings.Contains(filepath.Base(p), ".new.") {
					t.Errorf("temp file left: %s", p)
				}
				return nil
			})

			// Another BINDIR: the unit points at it.
			calls, err = n.install(t, s.sh, s.path, "BINDIR=/opt/bin")
			if err != nil || !strings.Contains(n.read(t, "etc/systemd/system/cdi-device-plugin.service"), "\nExecStart=/opt/bin/cdi-device-plugin\n") {
				t.Fatalf("BINDIR=/opt/bin: %v %q", err, calls)
			}
		})
	}
}

// A service that does not start fails the installer (the pod shows it).
func TestInstallScriptFailsWhenTheServiceFails(t *testing.T) {
	n := newNode(t, "restart")
	if _, err := n.install(t, []string{"sh"}, ""); err == nil {
		t.Fatal("install.sh succeeded though systemctl restart failed")
	}
}

// The kustomization renders, and its DaemonSet mounts the node's root.
func TestKustomization(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("no kubectl")
	}
	out, err := exec.Command(kubectl, "kustomize", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	for _, want := range []string{"kind: DaemonSet", "namespace: cdi-device-plugin-host", "mountPath: /host", "path: /\n", "privileged: true"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("rendered manifests lack %q", want)
		}
	}
}

// The Dockerfile's build context is deploy/ (the root's .dockerignore
// leaves deploy/ out): every file it copies is there, and it copies what
// install.sh reads.
func TestDockerfileSources(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var copied []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || f[0] != "COPY" || strings.HasPrefix(f[1], "--from") {
			continue
		}
		for _, src := range f[1 : len(f)-1] {
			if _, err := os.Stat(filepath.Join("..", src)); err != nil {
				t.Errorf("COPY %s: not in the build context deploy/: %v", src, err)
			}
			copied = append(copied, filepath.Base(src))
		}
	}
	for _, want := range []string{"install.sh", "cdi-device-plugin.service", "cdi-device-plugin.env"} {
		if !slices.Contains(copied, want) {
			t.Errorf("the image lacks %s (copies %v)", want, copied)
		}
	}
}
