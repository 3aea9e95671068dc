// Package deploy_test checks that the two ways to install the plugin, the
// kustomize base (deploy/base, what deploy/deploy.sh renders) and the Helm
// chart (deploy/helm/cdi-device-plugin), agree on what matters for running
// it safely: security contexts, volumes and mounts, probes, ports,
// resources, environment, update strategy, priority and tolerations.
package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// helm returns the helm binary: $HELM (make test sets it to the pinned
// build), else helm in PATH; the test is skipped without one.
func helm(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		if _, err := os.Stat(h); err == nil {
			return h
		}
		t.Skipf("HELM=%s does not exist: build it with make helm", h)
	}
	h, err := exec.LookPath("helm")
	if err != nil {
		t.Skip("helm is not built: run make helm (make test does), or set HELM")
	}
	return h
}

type object struct {
	Kind string `json:"kind"`
}

// objects decodes a multi-document YAML stream into its DaemonSets and
// ConfigMaps.
func objects(t *testing.T, y []byte) ([]appsv1.DaemonSet, []corev1.ConfigMap) {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(y), 4096)
	var dss []appsv1.DaemonSet
	var cms []corev1.ConfigMap
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode: %v\n%s", err, y)
		}
		var o object
		if err := json.Unmarshal(raw, &o); err != nil {
			t.Fatal(err)
		}
		switch o.Kind {
		case "DaemonSet":
			var ds appsv1.DaemonSet
			if err := json.Unmarshal(raw, &ds); err != nil {
				t.Fatal(err)
			}
			dss = append(dss, ds)
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := json.Unmarshal(raw, &cm); err != nil {
				t.Fatal(err)
			}
			cms = append(cms, cm)
		}
	}
	return dss, cms
}

func one(t *testing.T, what string, dss []appsv1.DaemonSet) *appsv1.DaemonSet {
	t.Helper()
	if len(dss) != 1 {
		t.Fatalf("%s renders %d DaemonSets, want 1", what, len(dss))
	}
	return &dss[0]
}

func kustomizeRender(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), "base")
	if err != nil {
		t.Fatalf("kustomize build deploy/base: %v", err)
	}
	y, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	dss, _ := objects(t, y)
	return one(t, "deploy/base", dss)
}

func helmRender(t *testing.T, args ...string) (*appsv1.DaemonSet, []corev1.ConfigMap) {
	t.Helper()
	h := helm(t)
	cmd := exec.Command(h, append([]string{"template", "cdi-device-plugin", filepath.Join("helm", "cdi-device-plugin"), "--namespace", "ns"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	y, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	dss, cms := objects(t, y)
	return one(t, "the chart", dss), cms
}

func asJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// TestHelmMatchesKustomize renders both with their defaults and compares
// the parts of the DaemonSet that must not drift apart.
func TestHelmMatchesKustomize(t *testing.T) {
	k := kustomizeRender(t)
	h, cms := helmRender(t)
	if len(cms) != 0 {
		t.Errorf("the chart renders %d ConfigMaps without a config, want none", len(cms))
	}
	kp, hp := &k.Spec.Template.Spec, &h.Spec.Template.Spec
	if len(kp.Containers) != 1 || len(hp.Containers) != 1 {
		t.Fatalf("containers: kustomize %d, helm %d, want 1", len(kp.Containers), len(hp.Containers))
	}
	kc, hc := &kp.Containers[0], &hp.Containers[0]
	for _, f := range []struct {
		name string
		k, h any
	}{
		{"pod securityContext", kp.SecurityContext, hp.SecurityContext},
		{"container securityContext", kc.SecurityContext, hc.SecurityContext},
		{"volumes", kp.Volumes, hp.Volumes},
		{"volumeMounts", kc.VolumeMounts, hc.VolumeMounts},
		{"livenessProbe", kc.LivenessProbe, hc.LivenessProbe},
		{"readinessProbe", kc.ReadinessProbe, hc.ReadinessProbe},
		{"ports", kc.Ports, hc.Ports},
		{"resources", kc.Resources, hc.Resources},
		{"env", kc.Env, hc.Env},
		{"image pull policy", kc.ImagePullPolicy, hc.ImagePullPolicy},
		{"automountServiceAccountToken", kp.AutomountServiceAccountToken, hp.AutomountServiceAccountToken},
		{"priorityClassName", kp.PriorityClassName, hp.PriorityClassName},
		{"tolerations", kp.Tolerations, hp.Tolerations},
		{"nodeSelector", kp.NodeSelector, hp.NodeSelector},
		{"hostNetwork", kp.HostNetwork, hp.HostNetwork},
		{"updateStrategy", k.Spec.UpdateStrategy, h.Spec.UpdateStrategy},
		{"pod annotations", k.Spec.Template.Annotations, h.Spec.Template.Annotations},
	} {
		if !equality.Semantic.DeepEqual(f.k, f.h) {
			t.Errorf("%s differ:\nkustomize: %s\nhelm:      %s", f.name, asJSON(f.k), asJSON(f.h))
		}
	}
	// And both are what the e2e suite asserts of the running pod.
	sc := hc.SecurityContext
	if sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil ||
		len(sc.Capabilities.Add) != 1 || sc.Capabilities.Add[0] != "MKNOD" {
		t.Errorf("container securityContext is not the unprivileged one: %s", asJSON(sc))
	}
}

// TestHelmValues: the values the chart documents reach the DaemonSet.
func TestHelmValues(t *testing.T) {
	h, cms := helmRender(t, "--set", "image.repository=reg.example/cdp", "--set", "image.tag=v1",
		"--set-string", "env.NUMBER_DEVICES=8", "--set", "nodeSelector.gpu=yes",
		"--set", "resources.requests.memory=64Mi", "--set-file", "config=testdata/config.yaml")
	c := &h.Spec.Template.Spec.Containers[0]
	if c.Image != "reg.example/cdp:v1" {
		t.Errorf("image %q", c.Image)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["NUMBER_DEVICES"] != "8" || env["CONFIG_FILE"] != "/etc/cdi-device-plugin/config.yaml" || env["METRICS_ADDRESS"] != ":9400" {
		t.Errorf("env %v", env)
	}
	if h.Spec.Template.Spec.NodeSelector["gpu"] != "yes" {
		t.Errorf("nodeSelector %v", h.Spec.Template.Spec.NodeSelector)
	}
	if q := c.Resources.Requests[corev1.ResourceMemory]; q.String() != "64Mi" {
		t.Errorf("memory request %s", q.String())
	}
	want, err := os.ReadFile("testdata/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(cms) != 1 || cms[0].Data["config.yaml"] != string(want) {
		t.Fatalf("ConfigMaps %s, want one holding testdata/config.yaml", asJSON(cms))
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || (m.MountPath == "/etc/cdi-device-plugin" && m.ReadOnly)
	}
	if !mounted {
		t.Errorf("the config is not mounted read-only at /etc/cdi-device-plugin: %s", asJSON(c.VolumeMounts))
	}
}

// TestHelmLint: helm lint passes on the chart.
func TestHelmLint(t *testing.T) {
	h := helm(t)
	out, err := exec.Command(h, "lint", "--strict", filepath.Join("helm", "cdi-device-plugin")).CombinedOutput()
	if err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
}
