// Command mkimage writes a single-layer linux/amd64 (or -arch) container image
// as a tarball that `ctr images import` (and `docker load`) accept, without a
// container engine or a registry. The e2e harness uses it for the pause, test
// and plugin images of the local node.
//
//	mkimage -o out.tar -tag docker.io/library/x:1 \
//	  -file /bin/busybox=/usr/bin/busybox -symlink /bin/sh=busybox \
//	  -entrypoint /bin/sh -cmd -c -cmd 'sleep 1'
//
// Files keep their mode; owners are root. Repeated flags accumulate.
//
// -layer TAR adds an existing uncompressed tar (for example a root filesystem)
// as a layer below the one the -file and -symlink flags make; that layer is
// left out when there are no such flags.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

// entry is one file of the layer.
type entry struct {
	dst    string // absolute path in the image
	src    string // host file, for regular files
	target string // for symlinks
}

type options struct {
	out, tag, arch, user, workdir string
	files, symlinks, layers       list
	entrypoint, cmd, env          list
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var o options
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	fs.StringVar(&o.out, "o", "", "output tarball (required)")
	fs.StringVar(&o.tag, "tag", "", "image reference, e.g. docker.io/library/busybox:1.36 (required)")
	fs.StringVar(&o.arch, "arch", runtime.GOARCH, "image architecture")
	fs.StringVar(&o.user, "user", "", "config User")
	fs.StringVar(&o.workdir, "workdir", "", "config WorkingDir")
	fs.Var(&o.files, "file", "DST=SRC: copy host file SRC to DST in the image (repeatable)")
	fs.Var(&o.symlinks, "symlink", "DST=TARGET: a symlink at DST (repeatable)")
	fs.Var(&o.layers, "layer", "TAR: an uncompressed tar added as a layer below the -file/-symlink one (repeatable)")
	fs.Var(&o.entrypoint, "entrypoint", "config Entrypoint word (repeatable)")
	fs.Var(&o.cmd, "cmd", "config Cmd word (repeatable)")
	fs.Var(&o.env, "env", "config Env entry NAME=VALUE (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.out == "" || o.tag == "" {
		return errors.New("-o and -tag are required")
	}
	return build(o)
}

func build(o options) error {
	ref, err := name.NewTag(o.tag)
	if err != nil {
		return fmt.Errorf("-tag %q: %w", o.tag, err)
	}
	var entries []entry
	for _, f := range o.files {
		dst, src, ok := strings.Cut(f, "=")
		if !ok || src == "" {
			return fmt.Errorf("-file %q: want DST=SRC", f)
		}
		entries = append(entries, entry{dst: dst, src: src})
	}
	for _, s := range o.symlinks {
		dst, target, ok := strings.Cut(s, "=")
		if !ok || target == "" {
			return fmt.Errorf("-symlink %q: want DST=TARGET", s)
		}
		entries = append(entries, entry{dst: dst, target: target})
	}
	var layers []v1.Layer
	for _, p := range o.layers {
		// Fast compression: these are large root filesystems read once.
		l, err := tarball.LayerFromFile(p, tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			return fmt.Errorf("-layer %s: %w", p, err)
		}
		layers = append(layers, l)
	}
	if len(entries) > 0 || len(layers) == 0 {
		layerTar, err := layer(entries)
		if err != nil {
			return err
		}
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(layerTar)), nil
		})
		if err != nil {
			return fmt.Errorf("layer: %w", err)
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	// Without OS and architecture, containerd filters the image out on import.
	cf.OS = "linux"
	cf.Architecture = o.arch
	cf.Config.Entrypoint = o.entrypoint
	cf.Config.Cmd = o.cmd
	cf.Config.Env = o.env
	cf.Config.User = o.user
	cf.Config.WorkingDir = o.workdir
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return err
	}
	tmp := o.out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", o.out, err)
	}
	return os.Rename(tmp, o.out)
}

// layer returns an uncompressed tar of the entries, with every parent
// directory, in a stable order.
func layer(entries []entry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	sort.Slice(entries, func(i, j int) bool { return entries[i].dst < entries[j].dst })
	for _, e := range entries {
		if !path.IsAbs(e.dst) || path.Clean(e.dst) != e.dst || e.dst == "/" {
			return nil, fmt.Errorf("image path %q: must be absolute and clean", e.dst)
		}
		rel := strings.TrimPrefix(e.dst, "/")
		for d := path.Dir(rel); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var ds []string
	for d := range dirs {
		ds = append(ds, d)
	}
	sort.Strings(ds) // parents sort before their children
	for _, d := range ds {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755}); err != nil {
			return nil, err
		}
	}
	for _, e := range entries {
		rel := strings.TrimPrefix(e.dst, "/")
		if e.src == "" {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: rel, Linkname: e.target, Mode: 0o777}); err != nil {
				return nil, err
			}
			continue
		}
		if err := addFile(tw, rel, e); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// addFile writes the host file of e into tw as rel, with its mode.
func addFile(tw *tar.Writer, rel string, e entry) error {
	f, err := os.Open(e.src)
	if err != nil {
		return fmt.Errorf("-file %s: %w", e.dst, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("-file %s: %w", e.dst, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("-file %s: %s is not a regular file", e.dst, e.src)
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: int64(st.Mode().Perm()), Size: st.Size()}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("-file %s: %w", e.dst, err)
	}
	return nil
}
