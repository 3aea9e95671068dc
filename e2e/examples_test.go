//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The examples of deploy/examples are written for the default install:
// the driver and DeviceClass simple-device.example.com, the public image
// busybox:1.36. The suite's driver is draDriver, whose DeviceClass has the
// same name (draClass), and its node has no registry. So the suite applies
// them with two rewrites, and nothing else: exampleDriver becomes
// draDriver wherever it appears (the DeviceClass a request names, the
// domain of the attributes a CEL selector reads), exampleImage the test
// image.
const (
	exampleDriver = "simple-device.example.com"
	exampleImage  = "busybox:1.36"
)

// exampleObjects are the objects of deploy/examples/<file> as the suite
// applies them: rewritten (see exampleDriver), decoded strictly, in the
// pods' namespace, the pods labelled for the DRA teardown.
type exampleObjects struct {
	pods      []corev1.Pod
	claims    []resourceapi.ResourceClaim
	templates []resourceapi.ResourceClaimTemplate
}

func (c *cluster) example(t *testing.T, file string) exampleObjects {
	t.Helper()
	if draDriver != draClass {
		t.Fatalf("the examples name the driver and the DeviceClass alike; the suite's are %s and %s", draDriver, draClass)
	}
	path := filepath.Join(c.repo, "deploy", "examples", file)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(exampleDriver)) || !bytes.Contains(b, []byte("image: "+exampleImage)) {
		t.Fatalf("%s names no %s or runs no %s: the rewrites would not apply", path, exampleDriver, exampleImage)
	}
	b = bytes.ReplaceAll(b, []byte(exampleDriver), []byte(draDriver))
	b = bytes.ReplaceAll(b, []byte("image: "+exampleImage), []byte("image: "+c.testImage))
	var out exampleObjects
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		// Strictly, as the API types: a misspelt field fails.
		var err error
		switch tm.Kind {
		case "Pod":
			var p corev1.Pod
			err = yaml.UnmarshalStrict([]byte(doc), &p)
			p.Namespace = podNS
			if p.Labels == nil {
				p.Labels = map[string]string{}
			}
			p.Labels["app"] = "cdi-e2e-dra"
			out.pods = append(out.pods, p)
		case "ResourceClaim":
			var rc resourceapi.ResourceClaim
			err = yaml.UnmarshalStrict([]byte(doc), &rc)
			rc.Namespace = podNS
			out.claims = append(out.claims, rc)
		case "ResourceClaimTemplate":
			var rct resourceapi.ResourceClaimTemplate
			err = yaml.UnmarshalStrict([]byte(doc), &rct)
			rct.Namespace = podNS
			out.templates = append(out.templates, rct)
		default:
			t.Fatalf("%s: an object of kind %q", path, tm.Kind)
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	return out
}

// apply creates the example's claims and templates, then its pods.
func (c *cluster) apply(t *testing.T, ex exampleObjects) {
	t.Helper()
	ctx := context.Background()
	for i := range ex.claims {
		if _, err := c.cs.ResourceV1().ResourceClaims(podNS).Create(ctx, &ex.claims[i], metav1.CreateOptions{}); err != nil {
			t.Fatalf("create claim %s: %v", ex.claims[i].Name, err)
		}
	}
	for i := range ex.templates {
		if _, err := c.cs.ResourceV1().ResourceClaimTemplates(podNS).Create(ctx, &ex.templates[i], metav1.CreateOptions{}); err != nil {
			t.Fatalf("create claim template %s: %v", ex.templates[i].Name, err)
		}
	}
	for i := range ex.pods {
		c.createPod(t, &ex.pods[i])
	}
}

// removeExample deletes what apply created (the pods first, so that their
// claims are unprepared).
func (c *cluster) removeExample(t *testing.T, ex exampleObjects) {
	t.Helper()
	for i := range ex.pods {
		c.deletePod(t, ex.pods[i].Name)
	}
	ctx := context.Background()
	for _, rc := range ex.claims {
		if err := c.cs.ResourceV1().ResourceClaims(podNS).Delete(ctx, rc.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete claim %s: %v", rc.Name, err)
		}
	}
	for i := range ex.templates {
		name := ex.templates[i].Name
		if err := c.cs.ResourceV1().ResourceClaimTemplates(podNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete claim template %s: %v", name, err)
		}
	}
}

// Scenario D8: two of deploy/examples applied as a user would, rewritten
// for the suite's driver and image (example): shared-claim.yaml, one
// claim shared by two pods: both run, with the claim's one device in
// their DRA_DEVICES; cel-selector.yaml, a CEL selector on the numaNode
// attribute (the scheduler compiles and evaluates it): its pod runs with
// one device, which has no NUMA node or node 0.
func (c *cluster) scenarioDRAExamples(t *testing.T, node string) {
	c.deletePod(t, "d6") // D6's pod holds every device
	shared := c.example(t, "shared-claim.yaml")
	if len(shared.claims) != 1 || len(shared.pods) != 2 {
		t.Fatalf("shared-claim.yaml: %d claims, %d pods; want one claim, two pods", len(shared.claims), len(shared.pods))
	}
	c.apply(t, shared)
	var seen [][]string
	for i := range shared.pods {
		p := &shared.pods[i]
		c.waitReady(t, p.Name, 3*time.Minute)
		seen = append(seen, c.envDevices(t, p.Name, p.Spec.Containers[0].Name))
	}
	ids := c.allocatedIDs(t, node, c.claimOf(t, shared.pods[0].Name))
	if len(ids) != 1 || !slices.Equal(seen[0], ids) || !slices.Equal(seen[1], ids) {
		t.Fatalf("shared-claim.yaml: claim %s allocated %v; its pods see %v", shared.claims[0].Name, ids, seen)
	}
	t.Logf("shared-claim.yaml: pods %s and %s run with the claim's device %v", shared.pods[0].Name, shared.pods[1].Name, ids)
	c.removeExample(t, shared)

	cel := c.example(t, "cel-selector.yaml")
	if len(cel.pods) != 1 || len(cel.templates) != 1 {
		t.Fatalf("cel-selector.yaml: %d pods, %d templates; want one of each", len(cel.pods), len(cel.templates))
	}
	p := cel.pods[0]
	c.apply(t, cel)
	c.waitReady(t, p.Name, 3*time.Minute)
	rc := c.claimOf(t, p.Name)
	if rc.Status.Allocation == nil || len(rc.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("cel-selector.yaml: claim %s allocation %+v, want one device", rc.Name, rc.Status.Allocation)
	}
	name := rc.Status.Allocation.Devices.Results[0].Device
	sl, err := c.draSlices(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	numa := "none"
	for i := range sl {
		for j := range sl[i].Spec.Devices {
			if d := &sl[i].Spec.Devices[j]; d.Name == name {
				if n := attr(d, "numaNode"); n != "" {
					numa = n
				}
			}
		}
	}
	if numa != "none" && numa != "0" {
		t.Errorf("cel-selector.yaml: %s got %s, on NUMA node %s: the selector wants node 0 or none", p.Name, name, numa)
	}
	env := c.envDevices(t, p.Name, p.Spec.Containers[0].Name)
	if ids := c.allocatedIDs(t, node, rc); !slices.Equal(env, ids) {
		t.Errorf("cel-selector.yaml: %s sees %v, its claim allocated %v", p.Name, env, ids)
	}
	t.Logf("cel-selector.yaml: %s runs with %s (NUMA node: %s), %s", p.Name, name, numa, strings.Join(env, ","))
	c.removeExample(t, cel)
}
