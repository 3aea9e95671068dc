package deploy_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// imageBinaries are the commands of cmd/ that the plugin image carries,
// each at /<name>: every one but dp-bench, a tool of the developer's
// machine and of CI, never run in a pod.
func imageBinaries(t *testing.T) []string {
	t.Helper()
	dirs, err := os.ReadDir(filepath.Join("..", "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range dirs {
		if d.IsDir() && d.Name() != "dp-bench" {
			names = append(names, d.Name())
		}
	}
	if len(names) == 0 {
		t.Fatal("no command in ../cmd")
	}
	return names
}

func readRepoFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestImageBinaries: every way the plugin image is made carries every
// binary a manifest may run: the Dockerfile builds each command with the
// release flags and copies it to /<name>; make build builds each into
// bin/; the e2e local node's image (e2e/local/cluster.sh, images) and the
// kind suite's offline image (e2e/kind/run.sh, make_images) build each
// and put it at /<name>. A binary left out of one of them would start in
// no pod there ("no such file or directory" at container start).
func TestImageBinaries(t *testing.T) {
	dockerfile := readRepoFile(t, "Dockerfile")
	makefile := readRepoFile(t, "Makefile")
	build := regexp.MustCompile(`(?m)^build:.*\n((?:\t.*\n)+)`).FindStringSubmatch(makefile)
	if build == nil {
		t.Fatal("the Makefile has no build target")
	}
	// The Dockerfile's go build, joined across its continuation lines.
	goBuild := regexp.MustCompile(`(?s)go build (.*?[^\\])\n`).FindStringSubmatch(dockerfile)
	if goBuild == nil {
		t.Fatal("the Dockerfile runs no go build")
	}
	for _, flag := range []string{"-trimpath", "-tags grpcnotrace", "-X main.version=${VERSION}"} {
		if !strings.Contains(goBuild[1], flag) {
			t.Errorf("the Dockerfile's go build lacks %s: %s", flag, goBuild[1])
		}
	}
	local := readRepoFile(t, filepath.Join("e2e", "local", "cluster.sh"))
	kind := readRepoFile(t, filepath.Join("e2e", "kind", "run.sh"))
	for _, name := range imageBinaries(t) {
		pkg := "./cmd/" + name
		if !slices.Contains(strings.Fields(goBuild[1]), pkg) {
			t.Errorf("the Dockerfile does not build %s", pkg)
		}
		if !regexp.MustCompile(`(?m)^COPY --from=build /out/` + regexp.QuoteMeta(name) + ` /` + regexp.QuoteMeta(name) + `$`).MatchString(dockerfile) {
			t.Errorf("the Dockerfile does not copy %s to /%s", name, name)
		}
		if !regexp.MustCompile(`-tags \$\(GO_TAGS\) -ldflags "\$\(LDFLAGS\)" -o \$\(BIN\)/` + regexp.QuoteMeta(name) + ` ` + regexp.QuoteMeta(pkg) + `\n`).MatchString(build[1]) {
			t.Errorf("make build does not build %s into $(BIN)/%s with the release flags", pkg, name)
		}
		for script, text := range map[string]string{"e2e/local/cluster.sh": local, "e2e/kind/run.sh": kind} {
			if !strings.Contains(text, " "+pkg) {
				t.Errorf("%s does not build %s for the plugin image", script, pkg)
			}
			if !regexp.MustCompile(`-file /` + regexp.QuoteMeta(name) + `="\$\{[a-z]+\}/` + regexp.QuoteMeta(name) + `"`).MatchString(text) {
				t.Errorf("%s does not put %s into the plugin image at /%s", script, name, name)
			}
		}
	}
}
