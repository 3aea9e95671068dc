package main

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestBuildReadBack(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	err := run([]string{"-o", out, "-tag", "e2e.local/x:1", "-arch", "amd64",
		"-file", "/usr/bin/tool=" + bin, "-symlink", "/bin/t=../usr/bin/tool",
		"-entrypoint", "/usr/bin/tool", "-cmd", "a", "-user", "0:0", "-env", "PATH=/bin"})
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("e2e.local/x:1")
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s, want linux/amd64 (containerd filters images without it)", cf.OS, cf.Architecture)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/bin/tool"}) || !slices.Equal(cf.Config.Cmd, []string{"a"}) ||
		cf.Config.User != "0:0" || !slices.Equal(cf.Config.Env, []string{"PATH=/bin"}) {
		t.Errorf("config %+v", cf.Config)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			got[h.Name] = "dir"
		case tar.TypeSymlink:
			got[h.Name] = "-> " + h.Linkname
		case tar.TypeReg:
			b, _ := io.ReadAll(tr)
			got[h.Name] = string(b) + " " + os.FileMode(h.Mode).String()
		}
	}
	want := map[string]string{
		"bin/": "dir", "usr/": "dir", "usr/bin/": "dir",
		"bin/t":        "-> ../usr/bin/tool",
		"usr/bin/tool": "#!/bin/sh\necho hi\n -rwxr-xr-x",
	}
	if len(got) != len(want) {
		t.Errorf("layer %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("layer %s = %q, want %q", k, got[k], v)
		}
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"no output", []string{"-tag", "x:1"}},
		{"bad tag", []string{"-o", filepath.Join(dir, "a.tar"), "-tag", "UPPER:1"}},
		{"relative path", []string{"-o", filepath.Join(dir, "b.tar"), "-tag", "x:1", "-symlink", "bin/sh=busybox"}},
		{"unclean path", []string{"-o", filepath.Join(dir, "c.tar"), "-tag", "x:1", "-symlink", "/bin/../sh=busybox"}},
		{"missing source", []string{"-o", filepath.Join(dir, "d.tar"), "-tag", "x:1", "-file", "/x=" + filepath.Join(dir, "nope")}},
		{"no source", []string{"-o", filepath.Join(dir, "e.tar"), "-tag", "x:1", "-file", "/x"}},
		{"missing layer", []string{"-o", filepath.Join(dir, "f.tar"), "-tag", "x:1", "-layer", filepath.Join(dir, "nope.tar")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := run(tc.args); err == nil {
				t.Fatal("no error")
			}
			if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) != 0 {
				t.Errorf("files left behind: %v", m)
			}
		})
	}
}

// -layer puts an existing tar below the layer of -file and -symlink.
func TestBaseLayer(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.tar")
	f, err := os.Create(base)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/os-release", Mode: 0o644, Size: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte("x\n")); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args  []string
		names [][]string // per layer
	}{
		{[]string{"-symlink", "/bin/sh=busybox"}, [][]string{{"etc/os-release"}, {"bin/", "bin/sh"}}},
		{nil, [][]string{{"etc/os-release"}}},
	} {
		out := filepath.Join(dir, "img.tar")
		args := append([]string{"-o", out, "-tag", "e2e.local/base:1", "-layer", base}, tc.args...)
		if err := run(args); err != nil {
			t.Fatal(err)
		}
		tag, _ := name.NewTag("e2e.local/base:1")
		img, err := tarball.ImageFromPath(out, &tag)
		if err != nil {
			t.Fatal(err)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != len(tc.names) {
			t.Fatalf("%v: %d layers (%v), want %d", tc.args, len(layers), err, len(tc.names))
		}
		for i, l := range layers {
			rc, err := l.Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			tr := tar.NewReader(rc)
			for {
				h, err := tr.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, h.Name)
			}
			rc.Close()
			if !slices.Equal(got, tc.names[i]) {
				t.Errorf("%v: layer %d holds %v, want %v", tc.args, i, got, tc.names[i])
			}
		}
	}
}
