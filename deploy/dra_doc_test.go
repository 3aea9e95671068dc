package deploy_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/dra"
)

// draDoc is the walk-through of the DRA driver on the demo node, relative
// to this package.
const draDoc = "../docs/dra.md"

// demoRender renders what "make demo MODE=..." deploys: e2e/local/demo.sh
// render, with this test binary as kustomize (TestMain).
func demoRender(t *testing.T, mode string) *objects {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "../e2e/local/demo.sh", "render")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "MODE=" + mode,
		"KUBECTL=no-kubectl-in-this-test", "KUSTOMIZE=" + self, "DEPLOY_TEST_KUSTOMIZE=1"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("MODE=%s e2e/local/demo.sh render: %v\n%s", mode, err, stderr.Bytes())
	}
	return decode(t, out)
}

// shBlock is a ```sh block of a Markdown file (indented ones included).
var shBlock = regexp.MustCompile("(?s)(?:\\A|\n)( *)```sh\n(.*?)\n *```")

// textBlock is a ```text block (an output) of a Markdown file.
var textBlock = regexp.MustCompile("(?s)```text\n(.*?)\n *```")

// heredoc is the body of a here-document: <<'EOF' or <<EOF up to EOF.
var heredoc = regexp.MustCompile(`(?s)<<'?EOF'?\n(.*?)\nEOF(?:\n|\z)`)

// docManifests returns the objects of the here-documents in the doc's sh
// blocks (what it applies with kubectl apply -f -), by kind, decoded
// strictly: a misspelt field fails, as the API server would drop it.
func docManifests(t *testing.T, doc string) (pods []corev1.Pod, templates []resourcev1.ResourceClaimTemplate) {
	t.Helper()
	for _, b := range shBlock.FindAllStringSubmatch(doc, -1) {
		for _, h := range heredoc.FindAllStringSubmatch(b[2], -1) {
			dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(h[1]), 4096)
			for {
				var m map[string]any
				if err := dec.Decode(&m); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Fatalf("%s: a manifest does not parse: %v\n%s", draDoc, err, h[1])
				}
				if m == nil {
					continue
				}
				raw, err := yaml.Marshal(m)
				if err != nil {
					t.Fatal(err)
				}
				js, err := yaml.YAMLToJSON(raw)
				if err != nil {
					t.Fatal(err)
				}
				switch k := m["kind"]; k {
				case "Pod":
					err = decodeInto(js, &pods)
				case "ResourceClaimTemplate":
					err = decodeInto(js, &templates)
				default:
					t.Fatalf("%s: a manifest of kind %v, which this test does not check:\n%s", draDoc, k, raw)
				}
				if err != nil {
					t.Fatalf("%s: %v\n%s", draDoc, err, raw)
				}
			}
		}
	}
	return pods, templates
}

// scriptValue is the default a variable has in a script: NAME=value or
// NAME=${E2E_NAME:-value}.
func scriptValue(t *testing.T, file, name string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + name + `=(?:\$\{[A-Z0-9_]+:-([^}]*)\}|(\S+))$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s sets no %s", file, name)
	}
	return string(m[1]) + string(m[2])
}

// TestDRADoc keeps docs/dra.md honest without a node: its manifests parse
// (strictly, as the API types) and ask for what make demo MODE=dra
// deploys (the DeviceClasses and extended resources of e2e/local/demo.sh
// render), in the test image and on the node the demo node has; the
// names its commands use (the driver, its taint keys and attributes, the
// namespace, the node label) are the rendered ones; every resource of the
// demo's config shows in its outputs: its pool, its first device's row, a
// handover log line. docs/dra.md itself runs on the demo node.
func TestDRADoc(t *testing.T) {
	b, err := os.ReadFile(draDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	o := demoRender(t, "dra")

	classes := map[string]bool{}
	extended := map[string]bool{}
	for _, c := range o.DeviceClasses {
		classes[c.Name] = true
		if c.Spec.ExtendedResourceName != nil {
			extended[*c.Spec.ExtendedResourceName] = true
		}
	}
	drv := o.daemonSet(t, driverContainer)
	if drv == nil || o.daemonSet(t, pluginContainer) == nil {
		t.Fatalf("make demo MODE=dra renders no DRA driver or no device plugin DaemonSet: %d DaemonSets", len(o.DaemonSets))
	}
	var driver string
	for _, e := range drv.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "DRIVER_NAME" {
			driver = e.Value
		}
	}
	namespace := drv.Namespace
	if driver == "" || len(classes) < 2 {
		t.Fatalf("make demo MODE=dra: driver %q, DeviceClasses %v: want a driver and a class per resource", driver, classes)
	}
	image := scriptValue(t, "../e2e/local/cluster.sh", "TEST_IMAGE")
	node := scriptValue(t, "../e2e/local/cluster.sh", "NODE_NAME")

	pods, templates := docManifests(t, doc)
	if len(pods) < 3 || len(templates) < 2 {
		t.Fatalf("%s applies %d pods and %d claim templates: want a claim-template pod, a limits pod and the shared device's", draDoc, len(pods), len(templates))
	}
	tmpl := map[string]bool{}
	usedClasses := map[string]bool{}
	for _, rct := range templates {
		tmpl[rct.Name] = true
		for _, r := range rct.Spec.Spec.Devices.Requests {
			if r.Exactly == nil {
				t.Errorf("template %s, request %s: no exactly", rct.Name, r.Name)
				continue
			}
			usedClasses[r.Exactly.DeviceClassName] = true
			if !classes[r.Exactly.DeviceClassName] {
				t.Errorf("template %s asks for DeviceClass %q; make demo MODE=dra makes %v", rct.Name, r.Exactly.DeviceClassName, sortedKeys(classes))
			}
		}
	}
	for c := range classes {
		if !usedClasses[c] {
			t.Errorf("no claim template of %s asks for DeviceClass %s", draDoc, c)
		}
	}
	var limitsPod bool
	for _, p := range pods {
		claims := map[string]bool{}
		for _, rc := range p.Spec.ResourceClaims {
			claims[rc.Name] = true
			if rc.ResourceClaimTemplateName == nil || !tmpl[*rc.ResourceClaimTemplateName] {
				t.Errorf("pod %s: claim %s names no template of %s", p.Name, rc.Name, draDoc)
			}
		}
		if p.Spec.NodeName != "" && p.Spec.NodeName != node {
			t.Errorf("pod %s: nodeName %s, the demo node is %s", p.Name, p.Spec.NodeName, node)
		}
		for _, c := range p.Spec.Containers {
			if c.Image != image {
				t.Errorf("pod %s: image %s; the demo node has %s (e2e/local/cluster.sh TEST_IMAGE), and nothing else to pull", p.Name, c.Image, image)
			}
			for _, cl := range c.Resources.Claims {
				if !claims[cl.Name] {
					t.Errorf("pod %s, container %s: claim %s is not one of the pod's", p.Name, c.Name, cl.Name)
				}
			}
			for r := range c.Resources.Limits {
				if strings.Contains(string(r), "/") {
					limitsPod = true
					if !extended[string(r)] {
						t.Errorf("pod %s asks for limits %s; make demo MODE=dra maps %v to DeviceClasses", p.Name, r, sortedKeys(extended))
					}
				}
			}
		}
	}
	if !limitsPod {
		t.Errorf("%s has no pod that asks for a device by limits", draDoc)
	}

	// The names in its commands and outputs.
	for _, c := range []struct {
		what string
		re   string
		want string
	}{
		{"taint key", `([a-z0-9.-]+\.[a-z]+)/(?:handover|unhealthy)\b`, driver},
		{"attribute in a jsonpath", `attributes\.((?:[a-z0-9-]+\\\.)+[a-z0-9-]+)/`, strings.ReplaceAll(driver, ".", `\.`)},
		{"driver in a log line", `driver=([a-z0-9.-]+)`, driver},
		{"namespace", `kubectl -n ([a-z0-9-]+)`, namespace},
		{"node", `kubectl get node ([a-z0-9][a-z0-9-]*)`, node},
	} {
		ms := regexp.MustCompile(c.re).FindAllStringSubmatch(doc, -1)
		if len(ms) == 0 {
			t.Errorf("%s names no %s", draDoc, c.what)
		}
		for _, m := range ms {
			if m[1] != c.want {
				t.Errorf("%s: %s %q in %q; make demo MODE=dra has %q", draDoc, c.what, m[1], m[0], c.want)
			}
		}
	}
	for _, mode := range regexp.MustCompile(`cdi-device-plugin/mode=([a-z-]+)`).FindAllStringSubmatch(doc, -1) {
		if !slices.Contains([]string{"dra", "device-plugin"}, mode[1]) {
			t.Errorf("%s labels a node %s", draDoc, mode[0])
		}
	}
	cfg, err := config.LoadWith(config.DRADriver, []string{"--config", "../e2e/local/demo-dra.yaml", "--node-name", node},
		func(string) (string, bool) { return "", false }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// The outputs, each line without the indent of a list item's block.
	var text strings.Builder
	for _, m := range textBlock.FindAllStringSubmatch(doc, -1) {
		for _, l := range strings.Split(m[1], "\n") {
			text.WriteString(strings.TrimLeft(l, " ") + "\n")
		}
	}
	for _, r := range cfg.Resources {
		for what, want := range map[string]string{
			"pool":              " " + dra.PoolName(node, r.IDPrefix) + " ",
			"first device":      "\n" + dra.DeviceName(r.IDPrefix, 0) + "  ",
			"handover log line": "resource=" + r.Name + "\n",
		} {
			if !strings.Contains(text.String(), want) {
				t.Errorf("%s: no output shows the %s of %s (%q)", draDoc, what, r.Name, want)
			}
		}
	}
	for _, cmd := range []string{"make demo MODE=dra", "make demo-down"} {
		if !strings.Contains(doc, cmd) {
			t.Errorf("%s never says %q", draDoc, cmd)
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
