package deploy_test

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/device"
	"github.com/cdi-device-plugin/cdi-device-plugin/dra"
)

// The examples of deploy/examples: manifests to copy for the default
// install (exampleImage their one image, a public one pinned by tag), and
// replicasConfig, the driver configuration replicas-share.yaml needs.
const (
	examplesDir    = "examples"
	exampleImage   = "busybox:1.36"
	replicasConfig = "replicas-config.yaml"
)

// example is one manifest file of deploy/examples, decoded by kind.
type example struct {
	file      string
	pods      []corev1.Pod
	claims    []resourcev1.ResourceClaim
	templates []resourcev1.ResourceClaimTemplate
}

// exampleFiles are the manifests of deploy/examples, all but the config.
func exampleFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(examplesDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return filepath.Base(f) == replicasConfig })
	if len(files) < 5 {
		t.Fatalf("%s holds %d manifests: %v", examplesDir, len(files), files)
	}
	return files
}

// decodeExample decodes a file of deploy/examples strictly (a field the
// API type lacks fails, as the API server would drop it), by kind.
func decodeExample(t *testing.T, file string) example {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	ex := example{file: file}
	for _, d := range documents(t, b) {
		switch d.APIVersion + " " + d.Kind {
		case "v1 Pod":
			err = decodeInto(d.raw, &ex.pods)
		case "resource.k8s.io/v1 ResourceClaim":
			err = decodeInto(d.raw, &ex.claims)
		case "resource.k8s.io/v1 ResourceClaimTemplate":
			err = decodeInto(d.raw, &ex.templates)
		default:
			t.Fatalf("%s: an object of %s %s, which this test does not check:\n%s", file, d.APIVersion, d.Kind, d.raw)
		}
		if err != nil {
			t.Fatalf("%s: %v\n%s", file, err, d.raw)
		}
	}
	return ex
}

// defaultInstall is what the default DRA install creates, the same in
// every way to install it: its DeviceClasses, the resources they map
// (extendedResourceName), and the driver's name.
type defaultInstall struct {
	classes, extended map[string]bool
	driver            string
}

// renderDefaultInstalls renders mode dra with its defaults the three ways
// (kustomize deploy/modes/dra, deploy.sh MODE=dra, the chart) and
// returns each one's classes and driver.
func renderDefaultInstalls(t *testing.T) map[string]defaultInstall {
	t.Helper()
	out := map[string]defaultInstall{}
	for _, r := range renderers() {
		if r.name == "helm" && !haveHelm() {
			t.Log("no helm (make helm builds it): the chart's default install is not checked")
			continue
		}
		o := r.render(t, "dra")
		in := defaultInstall{classes: map[string]bool{}, extended: map[string]bool{}}
		for _, c := range o.DeviceClasses {
			in.classes[c.Name] = true
			if c.Spec.ExtendedResourceName != nil {
				in.extended[*c.Spec.ExtendedResourceName] = true
			}
		}
		drv := o.daemonSet(t, driverContainer)
		if drv == nil {
			t.Fatalf("%s: mode dra renders no driver", r.name)
		}
		for _, e := range drv.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "DRIVER_NAME" {
				in.driver = e.Value
			}
		}
		out[r.name] = in
	}
	return out
}

// haveHelm reports whether helm (the test's helm) would find a binary.
func haveHelm() bool {
	if h := os.Getenv("HELM"); h != "" {
		_, err := os.Stat(h)
		return err == nil
	}
	_, err := exec.LookPath("helm")
	return err == nil
}

// publishedAttributes are the attribute names a device of the driver can
// carry (dra.Device of a device with every identity field set, a NUMA
// node and a firmware digest), qualified as the slices publish them.
func publishedAttributes(t *testing.T, driver string) map[string]bool {
	t.Helper()
	kind, err := cdi.NewKind("k8s.example.com", "x")
	if err != nil {
		t.Fatal(err)
	}
	d := device.Device{Name: "x-0", NUMANode: 0, Healthy: true}
	id := reflect.ValueOf(&d.Identity).Elem()
	for i := range id.NumField() {
		switch f := id.Field(i); f.Kind() {
		case reflect.String:
			f.SetString("1")
		case reflect.Int:
			f.SetInt(1)
		}
	}
	pub := dra.Device(driver, dra.Published{Resource: "example.com/x", Kind: kind, IDPrefix: "x", FirmwareSHA256: "0"}, d)
	out := map[string]bool{}
	for name := range pub.Attributes {
		out[string(name)] = true
	}
	for _, a := range []string{dra.AttrResource, dra.AttrIndex, dra.AttrID, dra.AttrNUMANode, dra.AttrPCIAddress} {
		if !out[driver+"/"+a] {
			t.Fatalf("a device with every field set publishes no %s: %v", a, sortedKeys(out))
		}
	}
	return out
}

// celAttribute is how a selector reads an attribute: the attribute
// qualified by its domain, device.attributes["<domain>"].<name>, or asks
// for it, "<name>" in device.attributes["<domain>"]; celCapacity is the
// same for a capacity. celDevice is any use of device.attributes or
// device.capacity: each must be one of those forms.
var (
	celAttribute = regexp.MustCompile(`device\.attributes\["([^"]+)"\]\.([A-Za-z0-9_]+)|"([A-Za-z0-9_]+)" in device\.attributes\["([^"]+)"\]`)
	celCapacity  = regexp.MustCompile(`device\.capacity\["([^"]+)"\]\.([A-Za-z0-9_]+)`)
	celDevice    = regexp.MustCompile(`device\.(attributes|capacity)\b`)
)

// celNames returns the qualified attribute and capacity names expr reads,
// and fails on a use of device.attributes or device.capacity in another
// form (which this test could not check).
func celNames(t *testing.T, where, expr string) (attrs, capacities []string) {
	t.Helper()
	for _, m := range celAttribute.FindAllStringSubmatch(expr, -1) {
		if m[1] != "" {
			attrs = append(attrs, m[1]+"/"+m[2])
		} else {
			attrs = append(attrs, m[4]+"/"+m[3])
		}
	}
	for _, m := range celCapacity.FindAllStringSubmatch(expr, -1) {
		capacities = append(capacities, m[1]+"/"+m[2])
	}
	if n, known := len(celDevice.FindAllString(expr, -1)), len(attrs)+len(capacities); n != known {
		t.Errorf("%s: %d uses of device.attributes or device.capacity, %d of them as device.attributes[\"<domain>\"].<name>, "+
			"\"<name>\" in device.attributes[\"<domain>\"] or device.capacity[\"<domain>\"].<name>: write them so, or teach this test:\n%s",
			where, n, known, expr)
	}
	return attrs, capacities
}

// TestExamples: every manifest of deploy/examples decodes strictly into the
// API types and asks for what the default DRA install creates, rendered
// the three ways: its DeviceClasses by name, its extended resources in
// limits, attributes and capacities of its driver that the driver
// publishes; each pod's claims are defined beside it; every container
// runs the one public image; each file says first what it shows, and the
// README lists it. replicas-config.yaml is a driver configuration that
// keeps the default resource, so the default driver and DeviceClass.
func TestExamples(t *testing.T) {
	installs := renderDefaultInstalls(t)
	var driver string
	for name, in := range installs {
		if driver == "" {
			driver = in.driver
		}
		if in.driver != defaultDriver || !in.classes[defaultDriver] || !in.extended[defaultResource] {
			t.Fatalf("%s: the default install's driver %q, classes %v, extended resources %v; want driver and class %s mapping %s",
				name, in.driver, sortedKeys(in.classes), sortedKeys(in.extended), defaultDriver, defaultResource)
		}
	}
	attrs := publishedAttributes(t, driver)
	shares := string(dra.SharesCapacity(driver))
	readme, err := os.ReadFile(filepath.Join(examplesDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	classOK := func(t *testing.T, what, class string) {
		t.Helper()
		for name, in := range installs {
			if !in.classes[class] {
				t.Errorf("%s asks for DeviceClass %q; the default install (%s) makes %v", what, class, name, sortedKeys(in.classes))
			}
		}
	}
	request := func(t *testing.T, what string, r resourcev1.DeviceRequest) {
		t.Helper()
		if r.Exactly == nil {
			t.Errorf("%s, request %s: no exactly", what, r.Name)
			return
		}
		classOK(t, what+", request "+r.Name, r.Exactly.DeviceClassName)
		for _, s := range r.Exactly.Selectors {
			if s.CEL == nil {
				continue
			}
			as, cs := celNames(t, what, s.CEL.Expression)
			if len(as)+len(cs) == 0 {
				t.Errorf("%s: a CEL selector that reads no attribute: %s", what, s.CEL.Expression)
			}
			for _, a := range as {
				if !attrs[a] {
					t.Errorf("%s: its CEL selector reads attribute %s, which the driver does not publish (it publishes %v)", what, a, sortedKeys(attrs))
				}
			}
			for _, c := range cs {
				if c != shares {
					t.Errorf("%s: its CEL selector reads capacity %s; the driver publishes %s", what, c, shares)
				}
			}
		}
		if r.Exactly.Capacity != nil {
			for c := range r.Exactly.Capacity.Requests {
				if string(c) != shares {
					t.Errorf("%s asks for capacity %s; the driver publishes %s", what, c, shares)
				}
			}
		}
	}
	for _, file := range exampleFiles(t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			first, err := os.Open(file)
			if err != nil {
				t.Fatal(err)
			}
			line, _ := bufio.NewReader(first).ReadString('\n')
			_ = first.Close()
			if !strings.HasPrefix(line, "# ") || len(strings.TrimSpace(line)) < 20 {
				t.Errorf("%s does not start with a line on what it shows: %q", file, line)
			}
			if !bytes.Contains(readme, []byte("]("+filepath.Base(file)+")")) {
				t.Errorf("%s/README.md does not list %s", examplesDir, filepath.Base(file))
			}
			ex := decodeExample(t, file)
			if len(ex.pods) == 0 {
				t.Fatalf("%s runs no pod", file)
			}
			claims, templates := map[string]bool{}, map[string]bool{}
			for _, c := range ex.claims {
				claims[c.Name] = true
				for _, r := range c.Spec.Devices.Requests {
					request(t, "claim "+c.Name, r)
				}
			}
			for _, c := range ex.templates {
				templates[c.Name] = true
				for _, r := range c.Spec.Spec.Devices.Requests {
					request(t, "template "+c.Name, r)
				}
			}
			for _, p := range ex.pods {
				podClaims := map[string]bool{}
				for _, rc := range p.Spec.ResourceClaims {
					podClaims[rc.Name] = true
					switch {
					case rc.ResourceClaimName != nil && !claims[*rc.ResourceClaimName]:
						t.Errorf("pod %s: claim %s names ResourceClaim %s, which %s does not define", p.Name, rc.Name, *rc.ResourceClaimName, file)
					case rc.ResourceClaimTemplateName != nil && !templates[*rc.ResourceClaimTemplateName]:
						t.Errorf("pod %s: claim %s names ResourceClaimTemplate %s, which %s does not define", p.Name, rc.Name, *rc.ResourceClaimTemplateName, file)
					case rc.ResourceClaimName == nil && rc.ResourceClaimTemplateName == nil:
						t.Errorf("pod %s: claim %s names neither a claim nor a template", p.Name, rc.Name)
					}
				}
				for _, c := range p.Spec.Containers {
					if c.Image != exampleImage {
						t.Errorf("pod %s, container %s: image %q, want %s (public, pinned by tag)", p.Name, c.Name, c.Image, exampleImage)
					}
					for _, cl := range c.Resources.Claims {
						if !podClaims[cl.Name] {
							t.Errorf("pod %s, container %s: claim %s is not one of the pod's", p.Name, c.Name, cl.Name)
						}
					}
					for r := range c.Resources.Limits {
						for name, in := range installs {
							if strings.Contains(string(r), "/") && !in.extended[string(r)] {
								t.Errorf("pod %s asks for limits %s; the default install (%s) maps %v to DeviceClasses", p.Name, r, name, sortedKeys(in.extended))
							}
						}
					}
				}
			}
		})
	}

	t.Run(replicasConfig, func(t *testing.T) {
		file := filepath.Join(examplesDir, replicasConfig)
		cfg, err := config.LoadWith(config.DRADriver, []string{"--config", file, "--node-name", "n1"},
			func(string) (string, bool) { return "", false }, io.Discard)
		if err != nil {
			t.Fatalf("%s does not load as the driver's config: %v", file, err)
		}
		if d := dra.DefaultDriverName(cfg); d != driver {
			t.Errorf("%s names the driver %s; the default install's is %s", file, d, driver)
		}
		var replicas bool
		for _, r := range cfg.Resources {
			replicas = replicas || r.ReplicaCount() > 1
		}
		if !replicas {
			t.Errorf("%s has no resource with replicas above 1", file)
		}
		// The chart with this config makes the default class, and
		// deploy.sh with it and the default resource too.
		renders := map[string]*objects{"deploy.sh": renderers()[1].render(t, "dra", "PLUGIN_CONFIG="+file, "DRA_RESOURCES="+defaultResource)}
		if haveHelm() {
			renders["helm"] = helmRender(t, "--set", "mode=dra", "--set-file", "config="+file)
		}
		for what, o := range renders {
			if got := classes(t, o); len(got) != 1 || got[0].name != defaultDriver {
				t.Errorf("%s with %s renders DeviceClasses %+v, want %s alone", what, file, got, defaultDriver)
			}
		}
	})
}
