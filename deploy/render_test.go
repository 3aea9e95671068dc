// Package deploy_test checks what the three ways to install the plugin
// render: the kustomize directories (deploy/base and the modes of
// deploy/modes), deploy/deploy.sh (an overlay of the same directories) and
// the Helm chart (deploy/helm/cdi-device-plugin). For every mode
// (device-plugin, dra, per-node) they must render the same objects where it
// matters for running them safely: security contexts, volumes and mounts,
// probes, ports, resources, environment, update strategy, priority,
// tolerations and node selectors of the DaemonSets; the DRA driver's RBAC,
// admission policy and DeviceClasses; the DRA controller's Deployment and
// RBAC.
package deploy_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// TestMain lets the test binary stand in for "kustomize build DIR" when
// deploy.sh calls it (KUSTOMIZE), so that deploy.sh is tested with the
// kustomize library this module pins, with or without kubectl.
func TestMain(m *testing.M) {
	if os.Getenv("DEPLOY_TEST_KUSTOMIZE") == "1" {
		os.Exit(kustomizeBuild(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func kustomizeBuild(args []string) int {
	if len(args) != 2 || args[0] != "build" {
		fmt.Fprintf(os.Stderr, "usage: build DIR (got %q)\n", args)
		return 2
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	y, err := m.AsYaml()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_, _ = os.Stdout.Write(y)
	return 0
}

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

// objects is what a render holds, by kind.
type objects struct {
	raw                 []byte
	DaemonSets          []appsv1.DaemonSet
	Deployments         []appsv1.Deployment
	ConfigMaps          []corev1.ConfigMap
	Namespaces          []corev1.Namespace
	ServiceAccounts     []corev1.ServiceAccount
	ClusterRoles        []rbacv1.ClusterRole
	ClusterRoleBindings []rbacv1.ClusterRoleBinding
	Policies            []admissionv1.ValidatingAdmissionPolicy
	PolicyBindings      []admissionv1.ValidatingAdmissionPolicyBinding
	DeviceClasses       []resourcev1.DeviceClass
}

// decodeStrict decodes raw into v and fails on a field v does not have: a
// misspelt field in a manifest (extendedResourceName, matchConditions)
// would otherwise pass unnoticed here and be dropped by the API server.
func decodeStrict(raw []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

// document is one object of a YAML stream, as JSON, with its type.
type document struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	raw        json.RawMessage
}

// documents splits a multi-document YAML stream into its objects, leaving
// out empty documents.
func documents(t *testing.T, y []byte) []document {
	t.Helper()
	var out []document
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(y), 4096)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("decode: %v\n%s", err, y)
		}
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		d := document{raw: raw}
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
}

// decode splits a multi-document YAML stream into its objects; a kind
// this package does not expect fails the test.
func decode(t *testing.T, y []byte) *objects {
	t.Helper()
	o := &objects{raw: y}
	for _, d := range documents(t, y) {
		raw := d.raw
		var err error
		switch d.Kind {
		case "DaemonSet":
			err = decodeInto(raw, &o.DaemonSets)
		case "Deployment":
			err = decodeInto(raw, &o.Deployments)
		case "ConfigMap":
			err = decodeInto(raw, &o.ConfigMaps)
		case "Namespace":
			err = decodeInto(raw, &o.Namespaces)
		case "ServiceAccount":
			err = decodeInto(raw, &o.ServiceAccounts)
		case "ClusterRole":
			err = decodeInto(raw, &o.ClusterRoles)
		case "ClusterRoleBinding":
			err = decodeInto(raw, &o.ClusterRoleBindings)
		case "ValidatingAdmissionPolicy":
			err = decodeInto(raw, &o.Policies)
		case "ValidatingAdmissionPolicyBinding":
			err = decodeInto(raw, &o.PolicyBindings)
		case "DeviceClass":
			err = decodeInto(raw, &o.DeviceClasses)
		default:
			t.Fatalf("unexpected kind %q rendered:\n%s", d.Kind, raw)
		}
		if err != nil {
			t.Fatalf("%s: %v\n%s", d.Kind, err, raw)
		}
	}
	return o
}

func decodeInto[T any](raw []byte, list *[]T) error {
	var v T
	if err := decodeStrict(raw, &v); err != nil {
		return err
	}
	*list = append(*list, v)
	return nil
}

// daemonSet returns the DaemonSet whose only container is named container
// (cdi-device-plugin or cdi-dra-driver: the DaemonSets' names differ between
// kustomize and Helm, their containers' do not), or nil.
func (o *objects) daemonSet(t *testing.T, container string) *appsv1.DaemonSet {
	t.Helper()
	var found *appsv1.DaemonSet
	for i := range o.DaemonSets {
		cs := o.DaemonSets[i].Spec.Template.Spec.Containers
		if len(cs) != 1 {
			t.Fatalf("DaemonSet %s has %d containers, want 1", o.DaemonSets[i].Name, len(cs))
		}
		if cs[0].Name == container {
			if found != nil {
				t.Fatalf("two DaemonSets run %s", container)
			}
			found = &o.DaemonSets[i]
		}
	}
	return found
}

// appObjects are the objects of one app (app.kubernetes.io/name) that
// talk to the API server: its account, what the account may do, and the
// Deployment that runs it.
type appObjects struct {
	accounts    []corev1.ServiceAccount
	roles       []rbacv1.ClusterRole
	bindings    []rbacv1.ClusterRoleBinding
	deployments []appsv1.Deployment
}

// of returns the objects labelled app.kubernetes.io/name=app
// (driverApp, controllerApp), in the order rendered.
func (o *objects) of(app string) appObjects {
	var a appObjects
	is := func(m metav1.ObjectMeta) bool { return m.Labels["app.kubernetes.io/name"] == app }
	for _, x := range o.ServiceAccounts {
		if is(x.ObjectMeta) {
			a.accounts = append(a.accounts, x)
		}
	}
	for _, x := range o.ClusterRoles {
		if is(x.ObjectMeta) {
			a.roles = append(a.roles, x)
		}
	}
	for _, x := range o.ClusterRoleBindings {
		if is(x.ObjectMeta) {
			a.bindings = append(a.bindings, x)
		}
	}
	for i := range o.Deployments {
		if is(o.Deployments[i].ObjectMeta) {
			a.deployments = append(a.deployments, o.Deployments[i])
		}
	}
	return a
}

// envValue returns the value of container c's variable name, and whether it
// is set.
func envValue(c *corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

const (
	pluginContainer = "cdi-device-plugin"
	driverContainer = "cdi-dra-driver"
	// The apps of the DRA driver's DaemonSet and of its controller's
	// Deployment, and the controller's container.
	driverApp       = "cdi-dra-driver"
	controllerApp   = "cdi-dra-controller"
	modeLabel       = "cdi-device-plugin/mode"
	defaultResource = "example.com/simple-device"
	defaultDriver   = "simple-device.example.com"
)

var modes = []string{"device-plugin", "dra", "per-node"}

// A renderer renders one mode with extra settings: VAR=VALUE for
// deploy.sh, helm arguments for helm; the kustomize directories take none.
type renderer struct {
	name string
	// namespace the objects are rendered for, the DRA driver's account and
	// its controller's.
	namespace, account, controllerAccount string
	render                                func(t *testing.T, mode string, extra ...string) *objects
}

func renderers() []renderer {
	return []renderer{
		{"kustomize", "simple-device-plugin", "cdi-dra-driver", "cdi-dra-controller", func(t *testing.T, mode string, extra ...string) *objects {
			if len(extra) != 0 {
				t.Fatalf("the kustomize directories take no settings: %q", extra)
			}
			return kustomizeRender(t, filepath.Join("modes", mode))
		}},
		{"deploy.sh", "ns", "cdi-dra-driver", "cdi-dra-controller", func(t *testing.T, mode string, extra ...string) *objects {
			out, err := deployScript(t, append([]string{"MODE=" + mode, "NAMESPACE=ns"}, extra...)...)
			if err != nil {
				t.Fatalf("deploy.sh render: %v\n%s", err, out)
			}
			return decode(t, out)
		}},
		{"helm", "ns", "r-dra-driver", "r-dra-controller", func(t *testing.T, mode string, extra ...string) *objects {
			return helmRender(t, append([]string{"--set", "mode=" + mode}, extra...)...)
		}},
	}
}

func kustomizeRender(t *testing.T, dir string) *objects {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	y, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, y)
}

func helmRender(t *testing.T, args ...string) *objects {
	t.Helper()
	out, err := helmTemplate(t, args...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	return decode(t, out)
}

// helmTemplate renders the chart as release r in namespace ns, for the
// Kubernetes version the e2e suite runs (the chart's kubeVersion refuses
// the helm build's default, 1.20, offline); a --kube-version in args wins.
// On failure the output is stderr.
func helmTemplate(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(helm(t), append([]string{"template", "r", filepath.Join("helm", "cdi-device-plugin"), "--namespace", "ns",
		"--kube-version", scriptValue(t, versionsEnv, "K8S_VERSION")}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	y, err := cmd.Output()
	if err != nil {
		return stderr.Bytes(), err
	}
	return y, nil
}

// deployScript runs deploy.sh render with the variables given (and none of
// the caller's that it reads), kustomize being this test binary.
func deployScript(t *testing.T, vars ...string) ([]byte, error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "deploy.sh", "render")
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(),
		"KUBECTL=no-kubectl-in-this-test", "KUSTOMIZE=" + self, "DEPLOY_TEST_KUSTOMIZE=1"}, vars...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return stderr.Bytes(), err
	}
	return out, nil
}

func asJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// TestModes: each mode renders its objects and no others, cluster-wide
// objects carry no namespace, and the driver's objects refer to each
// other, as do its controller's: with the driver, one controller in the
// cluster (a Deployment), with its own account and ClusterRole.
func TestModes(t *testing.T) {
	for _, r := range renderers() {
		for _, mode := range modes {
			t.Run(r.name+"/"+mode, func(t *testing.T) {
				o := r.render(t, mode)
				dp, drv := o.daemonSet(t, pluginContainer), o.daemonSet(t, driverContainer)
				if (dp != nil) != (mode != "dra") {
					t.Errorf("device plugin DaemonSet rendered: %v, want %v", dp != nil, mode != "dra")
				}
				if (drv != nil) != (mode != "device-plugin") {
					t.Errorf("DRA driver DaemonSet rendered: %v, want %v", drv != nil, mode != "device-plugin")
				}
				n := 0
				if mode != "device-plugin" {
					n = 1
				}
				d, ctl := o.of(driverApp), o.of(controllerApp)
				for _, c := range []struct {
					kind string
					got  int
				}{
					{"ServiceAccount", len(d.accounts)},
					{"ClusterRole", len(d.roles)},
					{"ClusterRoleBinding", len(d.bindings)},
					{"ValidatingAdmissionPolicy", len(o.Policies)},
					{"ValidatingAdmissionPolicyBinding", len(o.PolicyBindings)},
					{"DeviceClass", len(o.DeviceClasses)},
					{"controller's ServiceAccount", len(ctl.accounts)},
					{"controller's ClusterRole", len(ctl.roles)},
					{"controller's ClusterRoleBinding", len(ctl.bindings)},
					{"controller's Deployment", len(ctl.deployments)},
				} {
					if c.got != n {
						t.Errorf("%d %s rendered, want %d", c.got, c.kind, n)
					}
				}
				// Nothing but these: every account, role, binding and
				// Deployment is the driver's or the controller's.
				for _, c := range []struct {
					kind      string
					got, want int
				}{
					{"ServiceAccounts", len(o.ServiceAccounts), 2 * n},
					{"ClusterRoles", len(o.ClusterRoles), 2 * n},
					{"ClusterRoleBindings", len(o.ClusterRoleBindings), 2 * n},
					{"Deployments", len(o.Deployments), n},
				} {
					if c.got != c.want {
						t.Errorf("%d %s rendered, want %d", c.got, c.kind, c.want)
					}
				}
				// kustomize's built-in schema does not know DeviceClass and
				// the admission policies to be cluster-scoped: a namespace
				// transformer over them would give them one.
				for _, m := range clusterWide(o) {
					if m.ns != "" {
						t.Errorf("%s %s has namespace %q", m.kind, m.name, m.ns)
					}
				}
				for _, ds := range o.DaemonSets {
					if r.name != "helm" && ds.Namespace != r.namespace {
						t.Errorf("DaemonSet %s in namespace %q, want %q", ds.Name, ds.Namespace, r.namespace)
					}
				}
				for _, dep := range o.Deployments {
					if r.name != "helm" && dep.Namespace != r.namespace {
						t.Errorf("Deployment %s in namespace %q, want %q", dep.Name, dep.Namespace, r.namespace)
					}
				}
				if drv == nil {
					return
				}
				sa, crb, vap, vapb := d.accounts[0], d.bindings[0], o.Policies[0], o.PolicyBindings[0]
				if got := drv.Spec.Template.Spec.ServiceAccountName; got != sa.Name || got != r.account {
					t.Errorf("driver's serviceAccountName %q, ServiceAccount %q, want %q", got, sa.Name, r.account)
				}
				want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: r.account, Namespace: r.namespace}}
				if !equality.Semantic.DeepEqual(crb.Subjects, want) {
					t.Errorf("ClusterRoleBinding subjects %s, want %s", asJSON(crb.Subjects), asJSON(want))
				}
				if crb.RoleRef.Kind != "ClusterRole" || crb.RoleRef.Name != d.roles[0].Name {
					t.Errorf("ClusterRoleBinding refers to %s, not to the ClusterRole %s", asJSON(crb.RoleRef), d.roles[0].Name)
				}
				if vapb.Spec.PolicyName != vap.Name {
					t.Errorf("the policy binding names policy %q, not %q", vapb.Spec.PolicyName, vap.Name)
				}
				// The controller's objects, as the driver's (their
				// numbers are checked above).
				if len(ctl.accounts) != 1 || len(ctl.roles) != 1 || len(ctl.bindings) != 1 || len(ctl.deployments) != 1 {
					return
				}
				csa, ccrb, dep := ctl.accounts[0], ctl.bindings[0], ctl.deployments[0]
				if got := dep.Spec.Template.Spec.ServiceAccountName; got != csa.Name || got != r.controllerAccount {
					t.Errorf("controller's serviceAccountName %q, ServiceAccount %q, want %q", got, csa.Name, r.controllerAccount)
				}
				want = []rbacv1.Subject{{Kind: "ServiceAccount", Name: r.controllerAccount, Namespace: r.namespace}}
				if !equality.Semantic.DeepEqual(ccrb.Subjects, want) {
					t.Errorf("controller's ClusterRoleBinding subjects %s, want %s", asJSON(ccrb.Subjects), asJSON(want))
				}
				if ccrb.RoleRef.Kind != "ClusterRole" || ccrb.RoleRef.Name != ctl.roles[0].Name {
					t.Errorf("controller's ClusterRoleBinding refers to %s, not to the ClusterRole %s", asJSON(ccrb.RoleRef), ctl.roles[0].Name)
				}
				if ctl.roles[0].Name == d.roles[0].Name || csa.Name == sa.Name {
					t.Errorf("the controller shares the driver's ClusterRole %q or account %q", d.roles[0].Name, sa.Name)
				}
			})
		}
	}
}

type objMeta struct{ kind, name, ns string }

func clusterWide(o *objects) []objMeta {
	var ms []objMeta
	for _, x := range o.ClusterRoles {
		ms = append(ms, objMeta{"ClusterRole", x.Name, x.Namespace})
	}
	for _, x := range o.ClusterRoleBindings {
		ms = append(ms, objMeta{"ClusterRoleBinding", x.Name, x.Namespace})
	}
	for _, x := range o.Policies {
		ms = append(ms, objMeta{"ValidatingAdmissionPolicy", x.Name, x.Namespace})
	}
	for _, x := range o.PolicyBindings {
		ms = append(ms, objMeta{"ValidatingAdmissionPolicyBinding", x.Name, x.Namespace})
	}
	for _, x := range o.DeviceClasses {
		ms = append(ms, objMeta{"DeviceClass", x.Name, x.Namespace})
	}
	return ms
}

// TestDriverRBAC: the driver's account may do what the driver needs and
// nothing more. Slices: the ResourceSlice controller lists and watches
// them and creates, updates and deletes its own, and the first publish
// lists and creates; nothing gets or patches one. Claims: the kubeletplugin helper GETs each claim the
// kubelet asks it to prepare, and the prepare-before-bind informer lists
// and watches those labelled for its node (a label selector, which RBAC
// cannot express: the grant is for every claim); the driver writes its entries of their status.devices by server-side apply
// (a PATCH of the status), which Kubernetes 1.36 authorizes per driver
// (resourceclaims/driver, associated-node:patch, the driver's own name
// only).
func TestDriverRBAC(t *testing.T) {
	want := func(driver string) []rbacv1.PolicyRule {
		return []rbacv1.PolicyRule{
			{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"list", "watch", "create", "update", "delete"}},
			{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/status"}, Verbs: []string{"patch"}},
			{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/driver"}, ResourceNames: []string{driver}, Verbs: []string{"associated-node:patch"}},
		}
	}
	check := func(t *testing.T, o *objects, driver string) {
		t.Helper()
		roles := o.of(driverApp).roles
		if len(roles) != 1 {
			t.Fatalf("%d ClusterRoles of the driver", len(roles))
		}
		if got := roles[0].Rules; !equality.Semantic.DeepEqual(got, want(driver)) {
			t.Errorf("rules %s\nwant %s", asJSON(got), asJSON(want(driver)))
		}
	}
	for _, r := range renderers() {
		t.Run(r.name, func(t *testing.T) {
			o := r.render(t, "dra")
			check(t, o, defaultDriver)
			if sa := o.of(driverApp).accounts[0]; sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
				t.Errorf("the ServiceAccount mounts its token into every pod that uses it; only the driver's pod should ask for it")
			}
		})
	}
	// Another driver name: the status rule names it.
	t.Run("deploy.sh/DRIVER_NAME", func(t *testing.T) {
		check(t, renderers()[1].render(t, "per-node", "RESOURCE_NAME=e2e.cdi.dev/sim", "DRIVER_NAME=gpu.example.com"), "gpu.example.com")
	})
	t.Run("helm/dra.driverName", func(t *testing.T) {
		check(t, renderers()[2].render(t, "dra", "--set", "env.RESOURCE_NAME=e2e.cdi.dev/sim", "--set", "dra.driverName=gpu.example.com"), "gpu.example.com")
	})
}

// controllerRules are what the DRA controller's account may do, and
// nothing more: its informer lists and watches every ResourceClaim (the
// one watch of all claims in the cluster), and it labels a claim with a
// merge patch of its metadata; get, for a claim read by name. Nothing
// else: no status, no slices, no nodes, no events.
var controllerRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get", "list", "watch", "patch"}},
}

// TestControllerRBAC: the controller's ClusterRole grants controllerRules
// exactly, in every mode that has a driver and whatever the driver's
// name; its account mounts its token only into the controller's pod. Its
// ClusterRole and binding are named per installation, as the driver's:
// deploy.sh suffixes them with the namespace, the chart names them after
// the release and the namespace.
func TestControllerRBAC(t *testing.T) {
	names := map[string]string{"kustomize": "cdi-dra-controller", "deploy.sh": "cdi-dra-controller-ns", "helm": "r-dra-controller-ns"}
	check := func(t *testing.T, o *objects, renderer string) {
		t.Helper()
		c := o.of(controllerApp)
		if len(c.roles) != 1 || len(c.accounts) != 1 || len(c.bindings) != 1 {
			t.Fatalf("%d ClusterRoles, %d ServiceAccounts, %d ClusterRoleBindings of the controller, want 1 each", len(c.roles), len(c.accounts), len(c.bindings))
		}
		if want := names[renderer]; c.roles[0].Name != want || c.bindings[0].Name != want {
			t.Errorf("the controller's ClusterRole %q and binding %q, want %q", c.roles[0].Name, c.bindings[0].Name, want)
		}
		if got := c.roles[0].Rules; !equality.Semantic.DeepEqual(got, controllerRules) {
			t.Errorf("rules %s\nwant %s", asJSON(got), asJSON(controllerRules))
		}
		if sa := c.accounts[0]; sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			t.Errorf("the controller's ServiceAccount mounts its token into every pod that uses it; only the controller's pod should ask for it")
		}
	}
	for _, r := range renderers() {
		for _, mode := range []string{"dra", "per-node"} {
			t.Run(r.name+"/"+mode, func(t *testing.T) { check(t, r.render(t, mode), r.name) })
		}
	}
	t.Run("deploy.sh/DRIVER_NAME", func(t *testing.T) {
		check(t, renderers()[1].render(t, "per-node", "RESOURCE_NAME=e2e.cdi.dev/sim", "DRIVER_NAME=gpu.example.com"), "deploy.sh")
	})
	t.Run("helm/dra.driverName", func(t *testing.T) {
		check(t, renderers()[2].render(t, "dra", "--set", "dra.driverName=gpu.example.com"), "helm")
	})
}

// rbacDocs are the documents that list the driver's API access.
var rbacDocs = []string{"README.md", "../docs/configuration.md", "../docs/host-install.md"}

// rbacVerb is an RBAC verb as a document writes it, in backquotes or not.
const rbacVerb = "`?((?:associated|arbitrary)-node:[a-z]+|get|list|watch|create|update|patch|delete|deletecollection)\\b`?"

// docVerbs finds, in a document, the lists of verbs it gives a resource:
// "`resource` verb, verb, ..." or "`resource` (verb, verb, ...)".
func docVerbs(doc, resource string) [][]string {
	list := regexp.MustCompile("`" + regexp.QuoteMeta(resource) + "`\\s*\\(?\\s*(" + rbacVerb + "(?:,\\s*" + rbacVerb + ")*)")
	verb := regexp.MustCompile(rbacVerb)
	var out [][]string
	for _, m := range list.FindAllStringSubmatch(doc, -1) {
		var vs []string
		for _, v := range verb.FindAllStringSubmatch(m[1], -1) {
			vs = append(vs, v[1])
		}
		slices.Sort(vs)
		out = append(out, vs)
	}
	return out
}

// controllerParagraph tells a paragraph that gives the DRA controller's
// API access (it names the controller's account) from the driver's.
var controllerParagraph = regexp.MustCompile(`controller's\s+account`)

// TestRBACDocs: every document that lists the driver's API access lists
// the verbs the ClusterRole grants: those of resourceslices, resourceclaims
// and nodes, and the two rules of the claims' status (a host-process
// driver needs them too). Each lists the controller's too, in a paragraph
// that names the controller's account: the verbs of its ClusterRole, and
// no access to what only the driver has.
func TestRBACDocs(t *testing.T) {
	o := kustomizeRender(t, filepath.Join("modes", "dra"))
	d, c := o.of(driverApp).roles, o.of(controllerApp).roles
	if len(d) != 1 || len(c) != 1 {
		t.Fatalf("%d ClusterRoles of the driver, %d of the controller", len(d), len(c))
	}
	controllerHas := map[string]bool{}
	for _, r := range c[0].Rules {
		controllerHas[r.Resources[0]] = true
	}
	for _, doc := range rbacDocs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		var driverText, controllerText strings.Builder
		for _, p := range strings.Split(string(b), "\n\n") {
			if controllerParagraph.MatchString(p) {
				controllerText.WriteString(p + "\n\n")
			} else {
				driverText.WriteString(p + "\n\n")
			}
		}
		for _, who := range []struct {
			name, text string
			rules      []rbacv1.PolicyRule
		}{{"driver", driverText.String(), d[0].Rules}, {"controller", controllerText.String(), c[0].Rules}} {
			for _, r := range who.rules {
				res := r.Resources[0]
				want := slices.Clone(r.Verbs)
				slices.Sort(want)
				said := docVerbs(who.text, res)
				if len(said) == 0 {
					t.Errorf("%s does not list the %s's verbs on %s (%v)", doc, who.name, res, want)
				}
				for _, vs := range said {
					if !slices.Equal(vs, want) {
						t.Errorf("%s lists the %s's %s %v; its ClusterRole grants %v", doc, who.name, res, vs, want)
					}
				}
			}
		}
		for _, r := range d[0].Rules {
			if res := r.Resources[0]; !controllerHas[res] {
				if said := docVerbs(controllerText.String(), res); len(said) > 0 {
					t.Errorf("%s gives the controller's account %s %v; its ClusterRole grants none", doc, res, said)
				}
			}
		}
	}
}

// disjoint: no node can carry labels that both selectors select (a key
// both name, with two values).
func disjoint(a, b map[string]string) bool {
	for k, v := range a {
		if w, ok := b[k]; ok && w != v {
			return true
		}
	}
	return false
}

// TestPerNodeSelectors: in per-node mode each DaemonSet runs only on the
// nodes labelled for it, and no node runs both; in the other modes the
// DaemonSet runs on every node.
func TestPerNodeSelectors(t *testing.T) {
	for _, r := range renderers() {
		for _, mode := range modes {
			t.Run(r.name+"/"+mode, func(t *testing.T) {
				o := r.render(t, mode)
				for _, c := range []struct {
					container, value string
				}{{pluginContainer, "device-plugin"}, {driverContainer, "dra"}} {
					ds := o.daemonSet(t, c.container)
					if ds == nil {
						continue
					}
					sel := ds.Spec.Template.Spec.NodeSelector
					if mode == "per-node" && (len(sel) != 1 || sel[modeLabel] != c.value) {
						t.Errorf("%s nodeSelector %v, want {%s: %s}", c.container, sel, modeLabel, c.value)
					}
					if mode != "per-node" && len(sel) != 0 {
						t.Errorf("%s nodeSelector %v in mode %s, want none", c.container, sel, mode)
					}
					if ds.Spec.Template.Spec.Affinity != nil {
						t.Errorf("%s has an affinity, which would narrow the nodes further: %s", c.container, asJSON(ds.Spec.Template.Spec.Affinity))
					}
				}
				if mode != "per-node" {
					return
				}
				a := o.daemonSet(t, pluginContainer).Spec.Template.Spec.NodeSelector
				b := o.daemonSet(t, driverContainer).Spec.Template.Spec.NodeSelector
				if !disjoint(a, b) {
					t.Errorf("a node can match both %v and %v", a, b)
				}
			})
		}
	}
	// The chart's own nodeSelector narrows both; the mode label stays.
	t.Run("helm/per-node/nodeSelector", func(t *testing.T) {
		o := helmRender(t, "--set", "mode=per-node", "--set", "nodeSelector.gpu=yes", "--set", "nodeSelector.cdi-device-plugin/mode=both")
		for _, c := range []struct{ container, value string }{{pluginContainer, "device-plugin"}, {driverContainer, "dra"}} {
			want := map[string]string{"gpu": "yes", modeLabel: c.value}
			if got := o.daemonSet(t, c.container).Spec.Template.Spec.NodeSelector; !equality.Semantic.DeepEqual(got, want) {
				t.Errorf("%s nodeSelector %v, want %v", c.container, got, want)
			}
		}
	})
}

// pluginDir is the driver's own directory below the kubelet's plugins
// directory: its dra.sock goes there.
func pluginDir(driver string) string { return "/var/lib/kubelet/plugins/" + driver }

// checkDriver checks the DRA driver's DaemonSet against what the driver
// needs and no more, for the driver named driver: its binary, flags, env,
// probes, host paths (each mounted at its own path: the driver tells the
// kubelet host paths) and the device plugin's unprivileged security
// context, given as dp.
func checkDriver(t *testing.T, ds *appsv1.DaemonSet, driver string, dp *corev1.Container, config bool) {
	t.Helper()
	ps := &ds.Spec.Template.Spec
	c := &ps.Containers[0]
	if !slices.Equal(c.Command, []string{"/cdi-dra-driver"}) {
		t.Errorf("command %q, want the image's second binary /cdi-dra-driver", c.Command)
	}
	if want := []string{"--kubelet-registrar-dir=/var/lib/kubelet/plugins_registry", "--kubelet-plugins-dir=/var/lib/kubelet/plugins"}; !slices.Equal(c.Args, want) {
		t.Errorf("args %q, want %q", c.Args, want)
	}
	if ps.AutomountServiceAccountToken == nil || !*ps.AutomountServiceAccountToken || ps.ServiceAccountName == "" {
		t.Errorf("the driver needs its service account's token (in-cluster client): automount %v, account %q", ps.AutomountServiceAccountToken, ps.ServiceAccountName)
	}
	if ps.HostNetwork || ps.HostPID || ps.HostIPC {
		t.Errorf("host namespaces: network %v, pid %v, ipc %v", ps.HostNetwork, ps.HostPID, ps.HostIPC)
	}
	// The same unprivileged context as the device plugin's: CAP_MKNOD for
	// the simulated device nodes, nothing else.
	if !equality.Semantic.DeepEqual(c.SecurityContext, dp.SecurityContext) {
		t.Errorf("securityContext %s\nwant the device plugin's %s", asJSON(c.SecurityContext), asJSON(dp.SecurityContext))
	}
	if ps.SecurityContext == nil || ps.SecurityContext.SeccompProfile == nil || ps.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %s, want seccomp RuntimeDefault", asJSON(ps.SecurityContext))
	}

	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		if _, dup := env[e.Name]; dup {
			t.Errorf("env %s set twice", e.Name)
		}
		env[e.Name] = e
	}
	for name, field := range map[string]string{"NODE_NAME": "spec.nodeName", "POD_NAMESPACE": "metadata.namespace"} {
		if e := env[name]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != field {
			t.Errorf("env %s = %s, want the downward API's %s", name, asJSON(e), field)
		}
	}
	wantEnv := map[string]string{
		"DRIVER_NAME":          driver,
		"CDI_DIR":              "/var/run/cdi",
		"DEV_ROOT":             "/dev",
		"STATE_DIR":            "/var/lib/cdi-device-plugin",
		"POD_RESOURCES_SOCKET": "/var/lib/kubelet/pod-resources/kubelet.sock",
		"METRICS_ADDRESS":      ":9400",
	}
	if config {
		wantEnv["CONFIG_FILE"] = "/etc/cdi-device-plugin/config.yaml"
	}
	for k, v := range wantEnv {
		if got, ok := env[k]; !ok || got.Value != v {
			t.Errorf("env %s = %q (set: %v), want %q", k, got.Value, ok, v)
		}
	}
	if _, ok := env["DEVICE_PLUGIN_DIR"]; ok {
		t.Errorf("the driver is given the device plugin directory")
	}

	if len(c.Ports) != 1 || c.Ports[0].Name != "metrics" || c.Ports[0].ContainerPort != 9400 || c.Ports[0].HostPort != 0 {
		t.Errorf("ports %s, want metrics 9400 (no host port)", asJSON(c.Ports))
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s probe %s, want GET %s on port metrics", p.name, asJSON(p.probe), p.path)
		}
	}

	volumes := map[string]corev1.Volume{}
	for _, v := range ps.Volumes {
		volumes[v.Name] = v
	}
	type mount struct {
		hostType corev1.HostPathType
		readOnly bool
	}
	want := map[string]mount{
		"/var/lib/kubelet/plugins_registry": {corev1.HostPathDirectory, false},
		pluginDir(driver):                   {corev1.HostPathDirectoryOrCreate, false},
		"/var/lib/kubelet/pod-resources":    {"", true},
		"/var/run/cdi":                      {corev1.HostPathDirectoryOrCreate, false},
		"/dev":                              {corev1.HostPathDirectory, false},
		"/var/lib/cdi-device-plugin":        {corev1.HostPathDirectoryOrCreate, false},
	}
	got := map[string]bool{}
	for _, m := range c.VolumeMounts {
		got[m.MountPath] = true
		v, ok := volumes[m.Name]
		if !ok {
			t.Errorf("mount %s names no volume %q", m.MountPath, m.Name)
			continue
		}
		if config && m.MountPath == "/etc/cdi-device-plugin" {
			if v.ConfigMap == nil || !m.ReadOnly {
				t.Errorf("the config mount %s is not a read-only ConfigMap: %s", asJSON(m), asJSON(v))
			}
			continue
		}
		w, ok := want[m.MountPath]
		if !ok {
			t.Errorf("unexpected mount %s (volume %s)", m.MountPath, asJSON(v))
			continue
		}
		if v.HostPath == nil || v.HostPath.Path != m.MountPath {
			t.Errorf("mount %s is not the host's %s: %s", m.MountPath, m.MountPath, asJSON(v))
			continue
		}
		var typ corev1.HostPathType
		if v.HostPath.Type != nil {
			typ = *v.HostPath.Type
		}
		if typ != w.hostType || m.ReadOnly != w.readOnly {
			t.Errorf("mount %s: type %q read-only %v, want %q %v", m.MountPath, typ, m.ReadOnly, w.hostType, w.readOnly)
		}
	}
	for p := range want {
		if !got[p] {
			t.Errorf("%s is not mounted", p)
		}
	}
	if config && !got["/etc/cdi-device-plugin"] {
		t.Errorf("the config is not mounted")
	}
	if len(ps.Volumes) != len(c.VolumeMounts) {
		t.Errorf("%d volumes for %d mounts", len(ps.Volumes), len(c.VolumeMounts))
	}
	// A surge: the new pod beside the old one, each naming its sockets
	// after its pod UID (two drivers with the same sockets would take each
	// other's place with the kubelet).
	if u := ds.Spec.UpdateStrategy.RollingUpdate; u == nil || u.MaxSurge == nil || u.MaxSurge.IntValue() != 1 ||
		u.MaxUnavailable == nil || u.MaxUnavailable.IntValue() != 0 {
		t.Errorf("update strategy %s: want maxSurge 1, maxUnavailable 0 (no gap in which no claim can be prepared)", asJSON(ds.Spec.UpdateStrategy))
	}
	if i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_UID" }); i < 0 ||
		c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != "metadata.uid" {
		t.Errorf("no POD_UID from the downward API's metadata.uid: two pods of a surge would share their sockets")
	}
}

// devicePluginContainer is deploy/base's container, the reference for the
// security context.
func devicePluginContainer(t *testing.T) *corev1.Container {
	t.Helper()
	ds := kustomizeRender(t, "base").daemonSet(t, pluginContainer)
	if ds == nil {
		t.Fatal("deploy/base renders no device plugin")
	}
	return &ds.Spec.Template.Spec.Containers[0]
}

// TestDriverDaemonSet: the DRA driver's DaemonSet in modes dra and
// per-node, with the default resource and with others: the driver's name,
// and the directory named after it, follow the resource.
func TestDriverDaemonSet(t *testing.T) {
	dp := devicePluginContainer(t)
	for _, r := range renderers() {
		for _, mode := range []string{"dra", "per-node"} {
			t.Run(r.name+"/"+mode, func(t *testing.T) {
				checkDriver(t, r.render(t, mode).daemonSet(t, driverContainer), defaultDriver, dp, false)
			})
		}
	}
	for _, c := range []struct {
		name, driver string
		config       bool
		render       func(t *testing.T) *objects
	}{
		{"deploy.sh/RESOURCE_NAME", "sim.e2e.cdi.dev", false, func(t *testing.T) *objects {
			return renderers()[1].render(t, "per-node", "RESOURCE_NAME=e2e.cdi.dev/sim")
		}},
		{"deploy.sh/DRIVER_NAME", "gpu.example.com", false, func(t *testing.T) *objects {
			return renderers()[1].render(t, "dra", "RESOURCE_NAME=e2e.cdi.dev/sim", "DRIVER_NAME=gpu.example.com")
		}},
		{"deploy.sh/PLUGIN_CONFIG", "sim.example.com", true, func(t *testing.T) *objects {
			return renderers()[1].render(t, "dra", "PLUGIN_CONFIG=testdata/config.yaml", "DRA_RESOURCES=example.com/sim")
		}},
		{"helm/env.RESOURCE_NAME", "sim.e2e.cdi.dev", false, func(t *testing.T) *objects {
			return renderers()[2].render(t, "per-node", "--set", "env.RESOURCE_NAME=e2e.cdi.dev/sim")
		}},
		{"helm/dra.driverName", "gpu.example.com", false, func(t *testing.T) *objects {
			return renderers()[2].render(t, "dra", "--set", "env.RESOURCE_NAME=e2e.cdi.dev/sim", "--set", "dra.driverName=gpu.example.com")
		}},
		{"helm/config", "sim.example.com", true, func(t *testing.T) *objects {
			return renderers()[2].render(t, "dra", "--set-file", "config=testdata/config.yaml")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkDriver(t, c.render(t).daemonSet(t, driverContainer), c.driver, dp, c.config)
		})
	}
}

// controllerEnv are the variables cmd/cdi-dra-controller reads (but
// KUBECONFIG: in a pod, the in-cluster configuration), and client-go's
// KUBERNETES_SERVICE_HOST and _PORT: all its Deployment may set.
var controllerEnv = []string{"DRIVER_NAME", "LOG_LEVEL", "LOG_FORMAT", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}

// controllerSecurity is the controller's container security context: it
// only talks to the API server, so it runs as a user of its own, with no
// capability, no privilege escalation and a read-only root.
var controllerSecurity = &corev1.SecurityContext{
	Privileged:               ptr(false),
	RunAsUser:                ptr(int64(65532)),
	RunAsGroup:               ptr(int64(65532)),
	RunAsNonRoot:             ptr(true),
	AllowPrivilegeEscalation: ptr(false),
	ReadOnlyRootFilesystem:   ptr(true),
	Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
}

// controllerTolerations lets the controller run on a control-plane node
// as on any other: it needs no node's devices.
var controllerTolerations = []corev1.Toleration{
	{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
}

func ptr[T any](v T) *T { return &v }

// checkController checks the DRA controller's Deployment beside the
// driver's DaemonSet of the same render: one replica, replaced by
// deleting it first (never two markers), the driver's image and name
// (DRIVER_NAME), its settings of the API server and the log, as the
// driver has them, an unprivileged pod with no host access, and
// cluster-critical.
func checkController(t *testing.T, o *objects) {
	t.Helper()
	ds := o.daemonSet(t, driverContainer)
	deps := o.of(controllerApp).deployments
	if ds == nil || len(deps) != 1 {
		t.Fatalf("the driver's DaemonSet rendered: %v; %d Deployments of the controller, want 1", ds != nil, len(deps))
	}
	dep, drv := &deps[0], &ds.Spec.Template.Spec.Containers[0]
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
		t.Errorf("replicas %v, want 1: the controller runs once in the cluster", dep.Spec.Replicas)
	}
	if dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType || dep.Spec.Strategy.RollingUpdate != nil {
		t.Errorf("strategy %s, want Recreate: the old controller goes before the new one starts", asJSON(dep.Spec.Strategy))
	}
	sel := dep.Spec.Selector
	if sel == nil || len(sel.MatchLabels) == 0 || len(sel.MatchExpressions) != 0 {
		t.Fatalf("selector %s", asJSON(sel))
	}
	for k, v := range sel.MatchLabels {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("the selector's %s=%s is not the pod template's (%q)", k, v, dep.Spec.Template.Labels[k])
		}
	}
	if got := dep.Spec.Template.Labels["app.kubernetes.io/name"]; got != controllerApp {
		t.Errorf("the pod's app.kubernetes.io/name %q, want %q (not the driver's: its pods are listed by it)", got, controllerApp)
	}
	ps := &dep.Spec.Template.Spec
	if len(ps.Containers) != 1 || len(ps.InitContainers) != 0 {
		t.Fatalf("%d containers, %d init containers, want 1 and none", len(ps.Containers), len(ps.InitContainers))
	}
	c := &ps.Containers[0]
	if c.Name != controllerApp || !slices.Equal(c.Command, []string{"/cdi-dra-controller"}) || len(c.Args) != 0 {
		t.Errorf("container %s: command %q args %q, want the image's /cdi-dra-controller", c.Name, c.Command, c.Args)
	}
	if c.Image != drv.Image || c.ImagePullPolicy != drv.ImagePullPolicy {
		t.Errorf("image %s (%s), want the driver's %s (%s)", c.Image, c.ImagePullPolicy, drv.Image, drv.ImagePullPolicy)
	}
	seen := map[string]bool{}
	for _, e := range c.Env {
		if seen[e.Name] {
			t.Errorf("env %s set twice", e.Name)
		}
		seen[e.Name] = true
		if !slices.Contains(controllerEnv, e.Name) || e.ValueFrom != nil {
			t.Errorf("env %s: the controller reads only %v, as values", asJSON(e), controllerEnv)
		}
	}
	for _, name := range controllerEnv {
		want, set := envValue(drv, name)
		if got, ok := envValue(c, name); got != want || ok != set {
			t.Errorf("env %s = %q (set: %v); the driver's %q (set: %v)", name, got, ok, want, set)
		}
	}
	if name, _ := envValue(c, "DRIVER_NAME"); name == "" {
		t.Errorf("no DRIVER_NAME")
	}
	if ps.AutomountServiceAccountToken == nil || !*ps.AutomountServiceAccountToken || ps.ServiceAccountName == "" {
		t.Errorf("the controller needs its service account's token (in-cluster client): automount %v, account %q", ps.AutomountServiceAccountToken, ps.ServiceAccountName)
	}
	if ps.HostNetwork || ps.HostPID || ps.HostIPC || len(ps.Volumes) != 0 || len(c.VolumeMounts) != 0 || len(c.Ports) != 0 {
		t.Errorf("host namespaces (network %v, pid %v, ipc %v), volumes %s, mounts %s, ports %s: want none",
			ps.HostNetwork, ps.HostPID, ps.HostIPC, asJSON(ps.Volumes), asJSON(c.VolumeMounts), asJSON(c.Ports))
	}
	if ps.SecurityContext == nil || ps.SecurityContext.SeccompProfile == nil || ps.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %s, want seccomp RuntimeDefault", asJSON(ps.SecurityContext))
	}
	if !equality.Semantic.DeepEqual(c.SecurityContext, controllerSecurity) {
		t.Errorf("securityContext %s\nwant %s", asJSON(c.SecurityContext), asJSON(controllerSecurity))
	}
	if ps.PriorityClassName != "system-cluster-critical" {
		t.Errorf("priorityClassName %q, want system-cluster-critical: no claim with binding conditions is bound while it is away", ps.PriorityClassName)
	}
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, hasReq := c.Resources.Requests[res]
		lim, hasLim := c.Resources.Limits[res]
		if !hasReq || !hasLim || req.Cmp(lim) > 0 {
			t.Errorf("%s: request %s (set: %v), limit %s (set: %v), want both, the request at most the limit", res, req.String(), hasReq, lim.String(), hasLim)
		}
	}
	if len(ps.NodeSelector) != 0 || ps.Affinity != nil {
		t.Errorf("nodeSelector %v, affinity %s: the controller runs on any node, whatever the mode", ps.NodeSelector, asJSON(ps.Affinity))
	}
	// Never a toleration of every taint, as the DaemonSets have: a
	// NoExecute one (unreachable, not-ready) would keep the one
	// controller on a lost node instead of starting it on another.
	for _, tol := range ps.Tolerations {
		if tol.Key == "" || tol.Effect != corev1.TaintEffectNoSchedule {
			t.Errorf("toleration %s: want only NoSchedule taints of a key", asJSON(tol))
		}
	}
}

// TestControllerDeployment: the DRA controller's Deployment in modes dra
// and per-node, with the defaults and with other drivers' names, settings
// of the log and of the API server: checkController.
func TestControllerDeployment(t *testing.T) {
	for _, r := range renderers() {
		for _, mode := range []string{"dra", "per-node"} {
			t.Run(r.name+"/"+mode, func(t *testing.T) {
				o := r.render(t, mode)
				checkController(t, o)
				if got := o.of(controllerApp).deployments[0].Spec.Template.Spec.Tolerations; !equality.Semantic.DeepEqual(got, controllerTolerations) {
					t.Errorf("tolerations %s, want %s", asJSON(got), asJSON(controllerTolerations))
				}
			})
		}
	}
	deploySh, helmR := renderers()[1], renderers()[2]
	for _, c := range []struct {
		name, driver string
		render       func(t *testing.T) *objects
	}{
		{"deploy.sh/RESOURCE_NAME", "sim.e2e.cdi.dev", func(t *testing.T) *objects {
			return deploySh.render(t, "per-node", "RESOURCE_NAME=e2e.cdi.dev/sim")
		}},
		{"deploy.sh/DRIVER_NAME", "gpu.example.com", func(t *testing.T) *objects {
			return deploySh.render(t, "dra", "RESOURCE_NAME=e2e.cdi.dev/sim", "DRIVER_NAME=gpu.example.com")
		}},
		{"deploy.sh/PLUGIN_CONFIG", "sim.example.com", func(t *testing.T) *objects {
			return deploySh.render(t, "dra", "PLUGIN_CONFIG=testdata/config.yaml", "DRA_RESOURCES=example.com/sim")
		}},
		{"deploy.sh/settings", defaultDriver, func(t *testing.T) *objects {
			return deploySh.render(t, "per-node", "LOG_LEVEL=debug", "LOG_FORMAT=json", "API_SERVER_HOST=10.0.0.9", "API_SERVER_PORT=16443",
				"DEVICE_STATUS=true", "NUMBER_DEVICES=4", "IMAGE=reg.example:5000/cdp:v1")
		}},
		{"helm/env.RESOURCE_NAME", "sim.e2e.cdi.dev", func(t *testing.T) *objects {
			return helmR.render(t, "per-node", "--set", "env.RESOURCE_NAME=e2e.cdi.dev/sim")
		}},
		{"helm/dra.driverName", "gpu.example.com", func(t *testing.T) *objects {
			return helmR.render(t, "dra", "--set", "env.RESOURCE_NAME=e2e.cdi.dev/sim", "--set", "dra.driverName=gpu.example.com")
		}},
		{"helm/config", "sim.example.com", func(t *testing.T) *objects {
			return helmR.render(t, "dra", "--set-file", "config=testdata/config.yaml")
		}},
		{"helm/settings", defaultDriver, func(t *testing.T) *objects {
			return helmR.render(t, "per-node", "--set", "env.LOG_LEVEL=debug", "--set", "env.LOG_FORMAT=json",
				"--set", "dra.apiServer.host=10.0.0.9", "--set-string", "dra.apiServer.port=16443",
				"--set-string", "env.DEVICE_STATUS=true", "--set-string", "env.NUMBER_DEVICES=4",
				"--set", "image.repository=reg.example/cdp", "--set", "image.tag=v1")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := c.render(t)
			checkController(t, o)
			if got, _ := envValue(&o.of(controllerApp).deployments[0].Spec.Template.Spec.Containers[0], "DRIVER_NAME"); got != c.driver {
				t.Errorf("the controller's DRIVER_NAME %q, want %q", got, c.driver)
			}
		})
	}
}

// celFor is the DeviceClass selector for resource's devices of driver.
func celFor(driver, resource string) string {
	return fmt.Sprintf(`device.driver == %q && device.attributes[%q].resource == %q`, driver, driver, resource)
}

type class struct {
	name, cel, extended string // extended: "" for none
}

func classes(t *testing.T, o *objects) []class {
	t.Helper()
	var cs []class
	for _, dc := range o.DeviceClasses {
		if len(dc.Spec.Selectors) != 1 || dc.Spec.Selectors[0].CEL == nil {
			t.Fatalf("DeviceClass %s: selectors %s, want one CEL selector", dc.Name, asJSON(dc.Spec.Selectors))
		}
		if len(dc.Spec.Config) != 0 {
			t.Errorf("DeviceClass %s has config", dc.Name)
		}
		c := class{name: dc.Name, cel: dc.Spec.Selectors[0].CEL.Expression}
		if dc.Spec.ExtendedResourceName != nil {
			c.extended = *dc.Spec.ExtendedResourceName
		}
		cs = append(cs, c)
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].name < cs[j].name })
	return cs
}

// noExtendedResource renders deploy/modes/dra with the component that
// leaves out extendedResourceName, from an overlay as a user writes it.
func noExtendedResource(t *testing.T) *objects {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// kustomize takes other kustomizations by relative path only.
	rel, err := filepath.Rel(dir, wd)
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("resources:\n  - %s/modes/dra\ncomponents:\n  - %s/components/no-extended-resource\n", rel, rel)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return kustomizeRender(t, dir)
}

// TestDeviceClasses: one DeviceClass per resource, named <class>.<domain>,
// selecting the driver's devices of that resource, with the resource as
// extendedResourceName unless turned off; the driver it selects is the one
// the DaemonSet runs.
func TestDeviceClasses(t *testing.T) {
	def := class{defaultDriver, celFor(defaultDriver, defaultResource), defaultResource}
	sim := class{"sim.e2e.cdi.dev", celFor("sim.e2e.cdi.dev", "e2e.cdi.dev/sim"), "e2e.cdi.dev/sim"}
	noExt := func(c class) class { c.extended = ""; return c }
	deploySh, helmR := renderers()[1], renderers()[2]
	for _, c := range []struct {
		name   string
		render func(t *testing.T) *objects
		want   []class
	}{
		{"kustomize", func(t *testing.T) *objects { return kustomizeRender(t, "modes/dra") }, []class{def}},
		{"kustomize/per-node", func(t *testing.T) *objects { return kustomizeRender(t, "modes/per-node") }, []class{def}},
		{"kustomize/no-extended-resource", noExtendedResource, []class{noExt(def)}},
		{"deploy.sh", func(t *testing.T) *objects { return deploySh.render(t, "dra") }, []class{def}},
		{"deploy.sh/RESOURCE_NAME", func(t *testing.T) *objects {
			return deploySh.render(t, "per-node", "RESOURCE_NAME=e2e.cdi.dev/sim")
		}, []class{sim}},
		{"deploy.sh/DRA_EXTENDED_RESOURCE=false", func(t *testing.T) *objects {
			return deploySh.render(t, "dra", "RESOURCE_NAME=e2e.cdi.dev/sim", "DRA_EXTENDED_RESOURCE=false")
		}, []class{noExt(sim)}},
		{"deploy.sh/DRA_RESOURCES", func(t *testing.T) *objects {
			return deploySh.render(t, "dra", "PLUGIN_CONFIG=testdata/config.yaml", "DRA_RESOURCES=example.com/sim,example.com/fpga", "DRIVER_NAME=cdp.example.com")
		}, []class{
			{"fpga.example.com", celFor("cdp.example.com", "example.com/fpga"), "example.com/fpga"},
			{"sim.example.com", celFor("cdp.example.com", "example.com/sim"), "example.com/sim"},
		}},
		{"helm", func(t *testing.T) *objects { return helmR.render(t, "dra") }, []class{def}},
		{"helm/env.RESOURCE_NAME", func(t *testing.T) *objects {
			return helmR.render(t, "per-node", "--set", "env.RESOURCE_NAME=e2e.cdi.dev/sim")
		}, []class{sim}},
		{"helm/extendedResourceName=false", func(t *testing.T) *objects {
			return helmR.render(t, "dra", "--set", "env.RESOURCE_NAME=e2e.cdi.dev/sim", "--set", "dra.extendedResourceName=false")
		}, []class{noExt(sim)}},
		{"helm/config", func(t *testing.T) *objects {
			return helmR.render(t, "dra", "--set-file", "config=testdata/config.yaml")
		}, []class{{"sim.example.com", celFor("sim.example.com", "example.com/sim"), "example.com/sim"}}},
		// A resource with replicas is published as shared devices: it
		// gets its DeviceClass too, and the driver is named after the
		// first resource without replicas, as the binaries' default
		// (internal/dranames).
		{"helm/config with replicas", func(t *testing.T) *objects {
			cfg := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(cfg, []byte("resources:\n  - name: example.com/shared\n    replicas: 2\n  - name: example.com/sim\n    idPrefix: sim\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			return helmR.render(t, "dra", "--set-file", "config="+cfg)
		}, []class{
			{"shared.example.com", celFor("sim.example.com", "example.com/shared"), "example.com/shared"},
			{"sim.example.com", celFor("sim.example.com", "example.com/sim"), "example.com/sim"},
		}},
		// Every resource with replicas: the driver is named after the
		// first, as the binaries' default.
		{"helm/config all with replicas", func(t *testing.T) *objects {
			return helmR.render(t, "dra", "--set-string", "config=resources: [{name: example.com/shared\\, replicas: 2}]")
		}, []class{{"shared.example.com", celFor("shared.example.com", "example.com/shared"), "example.com/shared"}}},
		{"helm/resourceNames", func(t *testing.T) *objects {
			return helmR.render(t, "dra", "--set-file", "config=testdata/config.yaml",
				"--set", "dra.resourceNames={example.com/sim,example.com/fpga}", "--set", "dra.driverName=cdp.example.com")
		}, []class{
			{"fpga.example.com", celFor("cdp.example.com", "example.com/fpga"), "example.com/fpga"},
			{"sim.example.com", celFor("cdp.example.com", "example.com/sim"), "example.com/sim"},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := c.render(t)
			if got := classes(t, o); !slices.Equal(got, c.want) {
				t.Errorf("DeviceClasses\n%+v\nwant\n%+v", got, c.want)
			}
			// The classes select the driver that runs.
			ds := o.daemonSet(t, driverContainer)
			driver := ""
			for _, e := range ds.Spec.Template.Spec.Containers[0].Env {
				if e.Name == "DRIVER_NAME" {
					driver = e.Value
				}
			}
			for _, dc := range c.want {
				if !strings.HasPrefix(dc.cel, fmt.Sprintf("device.driver == %q ", driver)) {
					t.Errorf("DeviceClass %s selects another driver than DRIVER_NAME=%q", dc.name, driver)
				}
			}
		})
	}
}

// The admission policy's expressions; deploy/README.md explains them.
// driver is the DRA driver's name, as its DaemonSet's DRIVER_NAME.
func policyVariables(driver string) []admissionv1.Variable {
	return []admissionv1.Variable{
		{Name: "podNode", Expression: `request.userInfo.?extra[?"authentication.kubernetes.io/node-name"][?0].orValue("")`},
		{Name: "newNode", Expression: `request.operation == "DELETE" ? "" : object.spec.?nodeName.orValue("")`},
		{Name: "oldNode", Expression: `request.operation == "CREATE" ? "" : oldObject.spec.?nodeName.orValue("")`},
		{Name: "driver", Expression: strconv.Quote(driver)},
		{Name: "newDriver", Expression: `request.operation == "DELETE" ? "" : object.spec.?driver.orValue("")`},
		{Name: "oldDriver", Expression: `request.operation == "CREATE" ? "" : oldObject.spec.?driver.orValue("")`},
	}
}

var policyValidations = []string{
	`variables.podNode != ""`,
	`request.operation == "DELETE" || variables.newNode == variables.podNode`,
	`request.operation == "CREATE" || variables.oldNode == variables.podNode`,
	`request.operation == "DELETE" || variables.newDriver == variables.driver`,
	`request.operation == "CREATE" || variables.oldDriver == variables.driver`,
}

// TestAdmissionPolicy: the driver's account may create, update and delete
// only ResourceSlices whose spec.nodeName is the node its token names and
// whose spec.driver is its driver's name, before and after the write. The kustomize directories match the account by name
// in any namespace (a namespace overlay cannot rewrite a CEL string), the
// chart by its exact username.
func TestAdmissionPolicy(t *testing.T) {
	for _, r := range renderers() {
		t.Run(r.name, func(t *testing.T) {
			o := r.render(t, "dra")
			if len(o.Policies) != 1 || len(o.PolicyBindings) != 1 {
				t.Fatalf("%d policies, %d bindings", len(o.Policies), len(o.PolicyBindings))
			}
			p, b := o.Policies[0].Spec, o.PolicyBindings[0].Spec
			if p.FailurePolicy == nil || *p.FailurePolicy != admissionv1.Fail {
				t.Errorf("failurePolicy %v, want Fail", p.FailurePolicy)
			}
			if !slices.Equal(b.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) || b.MatchResources != nil || b.ParamRef != nil {
				t.Errorf("binding %s, want Deny for every ResourceSlice", asJSON(b))
			}
			wantRules := []admissionv1.NamedRuleWithOperations{{RuleWithOperations: admissionv1.RuleWithOperations{
				Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update, admissionv1.Delete},
				Rule:       admissionv1.Rule{APIGroups: []string{"resource.k8s.io"}, APIVersions: []string{"*"}, Resources: []string{"resourceslices"}},
			}}}
			if p.MatchConstraints == nil || !equality.Semantic.DeepEqual(p.MatchConstraints.ResourceRules, wantRules) {
				t.Errorf("matchConstraints %s", asJSON(p.MatchConstraints))
			}
			user := `request.userInfo.username.startsWith("system:serviceaccount:") && request.userInfo.username.endsWith(":cdi-dra-driver")`
			if r.name == "helm" {
				user = `request.userInfo.username == "system:serviceaccount:ns:r-dra-driver"`
			}
			if len(p.MatchConditions) != 1 || p.MatchConditions[0].Expression != user {
				t.Errorf("matchConditions %s, want %s", asJSON(p.MatchConditions), user)
			}
			if !strings.Contains(user, ":"+o.daemonSet(t, driverContainer).Spec.Template.Spec.ServiceAccountName+`"`) {
				t.Errorf("the policy does not match the driver's account %s", o.daemonSet(t, driverContainer).Spec.Template.Spec.ServiceAccountName)
			}
			if !equality.Semantic.DeepEqual(p.Variables, policyVariables(defaultDriver)) {
				t.Errorf("variables %s", asJSON(p.Variables))
			}
			var got []string
			for _, v := range p.Validations {
				got = append(got, v.Expression)
				if v.Message == "" && v.MessageExpression == "" {
					t.Errorf("validation %q says nothing when it refuses", v.Expression)
				}
			}
			if !slices.Equal(got, policyValidations) {
				t.Errorf("validations %q\nwant %q", got, policyValidations)
			}
		})
	}
}

// TestAdmissionPolicyDriver: the policy binds the
// driver's account to its driver's name, the one its DaemonSet gets
// (DRIVER_NAME): the kustomize directories', and the name deploy.sh and
// the chart are given or derive, in every mode with a driver.
func TestAdmissionPolicyDriver(t *testing.T) {
	deploySh, helm := renderers()[1], renderers()[2]
	for _, c := range []struct {
		name   string
		render func(t *testing.T) *objects
		want   string
	}{
		{"kustomize dra", func(t *testing.T) *objects { return kustomizeRender(t, filepath.Join("modes", "dra")) }, defaultDriver},
		{"kustomize per-node", func(t *testing.T) *objects { return kustomizeRender(t, filepath.Join("modes", "per-node")) }, defaultDriver},
		{"deploy.sh dra", func(t *testing.T) *objects { return deploySh.render(t, "dra") }, defaultDriver},
		{"deploy.sh dra, DRIVER_NAME", func(t *testing.T) *objects { return deploySh.render(t, "dra", "DRIVER_NAME=gpu.example.com") }, "gpu.example.com"},
		{"deploy.sh per-node, DRIVER_NAME", func(t *testing.T) *objects { return deploySh.render(t, "per-node", "DRIVER_NAME=gpu.example.com") }, "gpu.example.com"},
		{"deploy.sh dra, RESOURCE_NAME", func(t *testing.T) *objects { return deploySh.render(t, "dra", "RESOURCE_NAME=e2e.cdi.dev/sim") }, "sim.e2e.cdi.dev"},
		{"helm dra", func(t *testing.T) *objects { return helm.render(t, "dra") }, defaultDriver},
		{"helm per-node, dra.driverName", func(t *testing.T) *objects {
			return helm.render(t, "per-node", "--set", "dra.driverName=gpu.example.com")
		}, "gpu.example.com"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := c.render(t)
			var env string
			for _, e := range o.daemonSet(t, driverContainer).Spec.Template.Spec.Containers[0].Env {
				if e.Name == "DRIVER_NAME" {
					env = e.Value
				}
			}
			if env != c.want {
				t.Fatalf("the driver's DRIVER_NAME %q, want %q", env, c.want)
			}
			if len(o.Policies) != 1 {
				t.Fatalf("%d policies", len(o.Policies))
			}
			p := o.Policies[0].Spec
			if !equality.Semantic.DeepEqual(p.Variables, policyVariables(c.want)) {
				t.Errorf("variables %s\nwant %s", asJSON(p.Variables), asJSON(policyVariables(c.want)))
			}
			var got []string
			for _, v := range p.Validations {
				got = append(got, v.Expression)
				if strings.Contains(v.Expression, "variables.driver") && !strings.Contains(v.MessageExpression, "variables.driver") {
					t.Errorf("validation %q does not name the driver when it refuses: %q", v.Expression, v.MessageExpression)
				}
			}
			if !slices.Equal(got, policyValidations) {
				t.Errorf("validations %q\nwant %q", got, policyValidations)
			}
		})
	}
}

// podField is a part of two renders' objects that must not drift apart.
type podField struct {
	name string
	k, h any
}

// podFields are the parts of two renders' pod templates (one container
// each) that must not drift apart.
func podFields(k, h *corev1.PodTemplateSpec) []podField {
	kp, hp := &k.Spec, &h.Spec
	kc, hc := &kp.Containers[0], &hp.Containers[0]
	return []podField{
		{"pod securityContext", kp.SecurityContext, hp.SecurityContext},
		{"container securityContext", kc.SecurityContext, hc.SecurityContext},
		{"container name", kc.Name, hc.Name},
		{"command", kc.Command, hc.Command},
		{"args", kc.Args, hc.Args},
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
		{"affinity", kp.Affinity, hp.Affinity},
		{"hostNetwork", kp.HostNetwork, hp.HostNetwork},
		{"pod annotations", k.Annotations, h.Annotations},
	}
}

// compareFields reports each field whose two renders differ.
func compareFields(t *testing.T, what string, fields []podField) {
	t.Helper()
	for _, f := range fields {
		if !equality.Semantic.DeepEqual(f.k, f.h) {
			t.Errorf("%s: %s differ:\nkustomize: %s\nhelm:      %s", what, f.name, asJSON(f.k), asJSON(f.h))
		}
	}
}

// compareDaemonSets compares the parts of two renders' DaemonSets that
// must not drift apart.
func compareDaemonSets(t *testing.T, what string, k, h *appsv1.DaemonSet) {
	t.Helper()
	if (k == nil) != (h == nil) {
		t.Errorf("%s: rendered by kustomize %v, by helm %v", what, k != nil, h != nil)
		return
	}
	if k == nil {
		return
	}
	compareFields(t, what, append(podFields(&k.Spec.Template, &h.Spec.Template),
		podField{"updateStrategy", k.Spec.UpdateStrategy, h.Spec.UpdateStrategy}))
}

// compareDeployments compares the parts of two renders' controller
// Deployments that must not drift apart.
func compareDeployments(t *testing.T, k, h []appsv1.Deployment) {
	t.Helper()
	if len(k) != len(h) {
		t.Errorf("the controller's Deployments: kustomize renders %d, helm %d", len(k), len(h))
		return
	}
	for i := range k {
		compareFields(t, "the controller's Deployment", append(podFields(&k[i].Spec.Template, &h[i].Spec.Template),
			podField{"replicas", k[i].Spec.Replicas, h[i].Spec.Replicas},
			podField{"strategy", k[i].Spec.Strategy, h[i].Spec.Strategy}))
	}
}

// TestHelmMatchesKustomize renders each mode both ways with their defaults
// and compares what must not drift apart.
func TestHelmMatchesKustomize(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			k := kustomizeRender(t, filepath.Join("modes", mode))
			h := helmRender(t, "--set", "mode="+mode)
			if len(h.ConfigMaps) != 0 {
				t.Errorf("the chart renders %d ConfigMaps without a config, want none", len(h.ConfigMaps))
			}
			for _, c := range []string{pluginContainer, driverContainer} {
				compareDaemonSets(t, c, k.daemonSet(t, c), h.daemonSet(t, c))
			}
			if !slices.Equal(classes(t, k), classes(t, h)) {
				t.Errorf("DeviceClasses differ:\nkustomize: %+v\nhelm:      %+v", classes(t, k), classes(t, h))
			}
			if len(k.ClusterRoles) != len(h.ClusterRoles) || len(k.Policies) != len(h.Policies) ||
				len(k.PolicyBindings) != len(h.PolicyBindings) || len(k.ServiceAccounts) != len(h.ServiceAccounts) {
				t.Fatalf("kustomize renders %d ClusterRoles, %d policies, %d bindings, %d accounts; helm %d, %d, %d, %d",
					len(k.ClusterRoles), len(k.Policies), len(k.PolicyBindings), len(k.ServiceAccounts),
					len(h.ClusterRoles), len(h.Policies), len(h.PolicyBindings), len(h.ServiceAccounts))
			}
			compareDeployments(t, k.of(controllerApp).deployments, h.of(controllerApp).deployments)
			for i := range k.Policies {
				// All but whose account: see TestAdmissionPolicy.
				kp, hp := k.Policies[i].Spec, h.Policies[i].Spec
				kp.MatchConditions, hp.MatchConditions = nil, nil
				if !equality.Semantic.DeepEqual(kp, hp) {
					t.Errorf("admission policies differ:\nkustomize: %s\nhelm:      %s", asJSON(kp), asJSON(hp))
				}
				if !slices.Equal(k.PolicyBindings[i].Spec.ValidationActions, h.PolicyBindings[i].Spec.ValidationActions) {
					t.Errorf("policy bindings' actions differ")
				}
			}
			// Each app's ClusterRoles and accounts, the driver's and the
			// controller's: the two renders need not order them alike.
			for _, app := range []string{driverApp, controllerApp} {
				ko, ho := k.of(app), h.of(app)
				if len(ko.roles) != len(ho.roles) || len(ko.accounts) != len(ho.accounts) {
					t.Errorf("the %s's ClusterRoles and accounts: kustomize renders %d and %d, helm %d and %d",
						app, len(ko.roles), len(ko.accounts), len(ho.roles), len(ho.accounts))
					continue
				}
				for i := range ko.roles {
					if !equality.Semantic.DeepEqual(ko.roles[i].Rules, ho.roles[i].Rules) {
						t.Errorf("%s's ClusterRole rules differ:\nkustomize: %s\nhelm:      %s", app, asJSON(ko.roles[i].Rules), asJSON(ho.roles[i].Rules))
					}
				}
				for i := range ko.accounts {
					if !equality.Semantic.DeepEqual(ko.accounts[i].AutomountServiceAccountToken, ho.accounts[i].AutomountServiceAccountToken) {
						t.Errorf("%s's ServiceAccounts' automountServiceAccountToken differ", app)
					}
				}
			}
		})
	}
}

// TestDeployScriptMatchesKustomize: deploy.sh with no settings renders
// what the kustomize directories do, in its namespace, its cluster-wide
// objects named after it; without MODE exactly what MODE=device-plugin
// renders, as before modes existed.
func TestDeployScriptMatchesKustomize(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			out, err := deployScript(t, "MODE="+mode)
			if err != nil {
				t.Fatalf("deploy.sh render: %v\n%s", err, out)
			}
			d, k := decode(t, out), kustomizeRender(t, filepath.Join("modes", mode))
			for _, c := range []string{pluginContainer, driverContainer} {
				kd, dd := k.daemonSet(t, c), d.daemonSet(t, c)
				if (kd == nil) != (dd == nil) {
					t.Fatalf("%s: kustomize %v, deploy.sh %v", c, kd != nil, dd != nil)
				}
				// deploy.sh's patches put the entries they set first.
				if kd != nil && !equality.Semantic.DeepEqual(sorted(kd), sorted(dd)) {
					t.Errorf("%s differs:\nkustomize: %s\ndeploy.sh: %s", c, asJSON(kd), asJSON(dd))
				}
			}
			kc, dc := k.of(controllerApp).deployments, d.of(controllerApp).deployments
			if len(kc) != len(dc) {
				t.Fatalf("the controller's Deployments: kustomize %d, deploy.sh %d", len(kc), len(dc))
			}
			for i := range kc {
				kd, dd := kc[i].DeepCopy(), dc[i].DeepCopy()
				for _, x := range []*appsv1.Deployment{kd, dd} {
					cs := x.Spec.Template.Spec.Containers
					slices.SortFunc(cs[0].Env, func(a, b corev1.EnvVar) int { return strings.Compare(a.Name, b.Name) })
				}
				if !equality.Semantic.DeepEqual(kd, dd) {
					t.Errorf("the controller's Deployment differs:\nkustomize: %s\ndeploy.sh: %s", asJSON(kd), asJSON(dd))
				}
				if kc[i].Namespace != "simple-device-plugin" || dc[i].Namespace != "simple-device-plugin" {
					t.Errorf("the controller's Deployment in namespace %q (kustomize), %q (deploy.sh), want simple-device-plugin", kc[i].Namespace, dc[i].Namespace)
				}
			}
			if !slices.Equal(classes(t, k), classes(t, d)) {
				t.Errorf("DeviceClasses differ: %+v, %+v", classes(t, k), classes(t, d))
			}
			km, dm := clusterWide(k), clusterWide(d)
			if len(km) != len(dm) {
				t.Fatalf("cluster-wide objects: kustomize %v, deploy.sh %v", km, dm)
			}
			for i := range km {
				want := km[i].name
				if km[i].kind != "DeviceClass" {
					want += "-simple-device-plugin"
				}
				if dm[i].kind != km[i].kind || dm[i].name != want {
					t.Errorf("deploy.sh renders %s %s, want %s %s", dm[i].kind, dm[i].name, km[i].kind, want)
				}
			}
			if mode == "dra" {
				return
			}
			if mode == "device-plugin" {
				unset, err := deployScript(t)
				if err != nil {
					t.Fatalf("deploy.sh render: %v\n%s", err, unset)
				}
				if !bytes.Equal(unset, out) {
					t.Errorf("without MODE deploy.sh renders\n%s\nwith MODE=device-plugin\n%s", unset, out)
				}
			}
		})
	}
}

// sorted returns a copy of ds with its env, mounts and volumes sorted,
// whose order means nothing here (no env entry refers to another).
func sorted(ds *appsv1.DaemonSet) *appsv1.DaemonSet {
	ds = ds.DeepCopy()
	ps := &ds.Spec.Template.Spec
	for i := range ps.Containers {
		c := &ps.Containers[i]
		slices.SortFunc(c.Env, func(a, b corev1.EnvVar) int { return strings.Compare(a.Name, b.Name) })
		slices.SortFunc(c.VolumeMounts, func(a, b corev1.VolumeMount) int { return strings.Compare(a.MountPath, b.MountPath) })
	}
	slices.SortFunc(ps.Volumes, func(a, b corev1.Volume) int { return strings.Compare(a.Name, b.Name) })
	return ds
}

// TestDeployScriptSettings: the settings reach both DaemonSets of
// per-node, the DRA-only ones the driver alone.
func TestDeployScriptSettings(t *testing.T) {
	out, err := deployScript(t, "MODE=per-node", "NAMESPACE=ns", "IMAGE=reg.example:5000/cdp:v1", "NUMBER_DEVICES=4", "ENV_PREFIX=",
		"PLUGIN_CONFIG=testdata/config.yaml", "DRA_RESOURCES=example.com/sim", "API_SERVER_HOST=10.0.0.9", "API_SERVER_PORT=16443")
	if err != nil {
		t.Fatalf("deploy.sh render: %v\n%s", err, out)
	}
	o := decode(t, out)
	if len(o.ConfigMaps) != 1 || !strings.HasPrefix(o.ConfigMaps[0].Name, "cdi-device-plugin-config-") {
		t.Fatalf("ConfigMaps %s", asJSON(o.ConfigMaps))
	}
	for _, c := range []string{pluginContainer, driverContainer} {
		ds := o.daemonSet(t, c)
		ct := ds.Spec.Template.Spec.Containers[0]
		if ct.Image != "reg.example:5000/cdp:v1" {
			t.Errorf("%s: image %q", c, ct.Image)
		}
		env := map[string]string{}
		for _, e := range ct.Env {
			env[e.Name] = e.Value
		}
		// Both know the driver by its name (the plugin's claim guard too).
		want := map[string]string{"NUMBER_DEVICES": "4", "ENV_PREFIX": "", "CONFIG_FILE": "/etc/cdi-device-plugin/config.yaml", "DRIVER_NAME": "sim.example.com"}
		if c == driverContainer {
			want["KUBERNETES_SERVICE_HOST"], want["KUBERNETES_SERVICE_PORT"] = "10.0.0.9", "16443"
		}
		for k, v := range want {
			if got, ok := env[k]; !ok || got != v {
				t.Errorf("%s: env %s = %q (set: %v), want %q", c, k, got, ok, v)
			}
		}
		if c == pluginContainer {
			if _, ok := env["KUBERNETES_SERVICE_HOST"]; ok {
				t.Errorf("the device plugin gets KUBERNETES_SERVICE_HOST")
			}
		}
		found := false
		for _, v := range ds.Spec.Template.Spec.Volumes {
			found = found || (v.ConfigMap != nil && v.ConfigMap.Name == o.ConfigMaps[0].Name)
		}
		if !found {
			t.Errorf("%s does not mount ConfigMap %s", c, o.ConfigMaps[0].Name)
		}
	}
}

// scriptList is the words of the bash array NAME=( ... ) of deploy.sh.
func scriptList(t *testing.T, name string) []string {
	t.Helper()
	b, err := os.ReadFile("deploy.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + name + `=\(([^)]*)\)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("deploy.sh has no %s=(...)", name)
	}
	return strings.Fields(string(m[1]))
}

// TestDeployScriptDriverVars: the DRA driver's own settings the docs
// recommend (DEVICE_STATUS, DEVICE_METADATA, STALE_CLAIM_GRACE) reach the
// driver's container when set, and not the device plugin's, which does
// not read them.
func TestDeployScriptDriverVars(t *testing.T) {
	want := map[string]string{"DEVICE_STATUS": "false", "DEVICE_METADATA": "false", "STALE_CLAIM_GRACE": "10m"}
	vars := []string{"MODE=per-node"}
	for k, v := range want {
		vars = append(vars, k+"="+v)
	}
	out, err := deployScript(t, vars...)
	if err != nil {
		t.Fatalf("deploy.sh render: %v\n%s", err, out)
	}
	o := decode(t, out)
	env := func(c string) map[string]string {
		got := map[string]string{}
		for _, e := range o.daemonSet(t, c).Spec.Template.Spec.Containers[0].Env {
			got[e.Name] = e.Value
		}
		return got
	}
	drv, dp := env(driverContainer), env(pluginContainer)
	for k, v := range want {
		if got, ok := drv[k]; !ok || got != v {
			t.Errorf("the driver's env %s = %q (set: %v), want %q", k, got, ok, v)
		}
		if got, ok := dp[k]; ok {
			t.Errorf("the device plugin's env has %s = %q: only the driver reads it", k, got)
		}
	}
}

// TestDeployScriptVarsDocumented: every variable deploy.sh passes to the
// containers has a row in deploy/README.md's tables.
func TestDeployScriptVarsDocumented(t *testing.T) {
	doc, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, list := range []string{"ENV_VARS", "DRIVER_VARS"} {
		for _, v := range scriptList(t, list) {
			if !regexp.MustCompile("(?m)^\\| (`[A-Z_]+`, )*`" + v + "`[ ,]").Match(doc) {
				t.Errorf("deploy/README.md has no row for %s (deploy.sh's %s)", v, list)
			}
		}
	}
}

// TestDeployScriptRefuses: bad settings fail before anything is rendered,
// with a message naming the setting.
func TestDeployScriptRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		vars []string
		want string
	}{
		{"unknown mode", []string{"MODE=both"}, "MODE must be device-plugin, dra or per-node"},
		{"config without resources", []string{"MODE=dra", "PLUGIN_CONFIG=testdata/config.yaml"}, "set DRA_RESOURCES"},
		{"not a resource", []string{"MODE=dra", `DRA_RESOURCES=example.com/a,"x`}, `'"x'`},
		{"class not a DNS name", []string{"MODE=per-node", "RESOURCE_NAME=example.com/Sim"}, "not a DNS subdomain"},
		{"resource twice", []string{"MODE=dra", "DRA_RESOURCES=example.com/a,example.com/a"}, "listed twice"},
		{"bad driver", []string{"MODE=dra", "DRIVER_NAME=a_b"}, "invalid driver name"},
		{"extended resource", []string{"MODE=dra", "DRA_EXTENDED_RESOURCE=yes"}, "DRA_EXTENDED_RESOURCE must be true or false"},
		{"host without port", []string{"MODE=dra", "API_SERVER_HOST=10.0.0.1"}, "API_SERVER_HOST and API_SERVER_PORT go together"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := deployScript(t, c.vars...)
			if err == nil {
				t.Fatalf("deploy.sh rendered:\n%s", out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Errorf("deploy.sh failed without saying %q:\n%s", c.want, out)
			}
		})
	}
}

// TestHelmValues: the values the chart documents reach the DaemonSet.
func TestHelmValues(t *testing.T) {
	o := helmRender(t, "--set", "image.repository=reg.example/cdp", "--set", "image.tag=v1",
		"--set-string", "env.NUMBER_DEVICES=8", "--set", "nodeSelector.gpu=yes",
		"--set", "resources.requests.memory=64Mi", "--set-file", "config=testdata/config.yaml")
	h, cms := o.daemonSet(t, pluginContainer), o.ConfigMaps
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

// TestHelmConfigRollsTheDriver: the chart's ConfigMap has a fixed name,
// so helm upgrade with another config changes no pod template by itself.
// The device plugin reloads the mounted file live; the DRA driver reads
// it only at start, so its pod template carries the config's checksum
// (checksum/config) and a new config rolls it. The plugin's template
// carries none: a roll would restart it for nothing. Without a config
// neither has one (TestHelmMatchesKustomize compares the annotations).
func TestHelmConfigRollsTheDriver(t *testing.T) {
	const key = "checksum/config"
	other := "resources:\n  - name: example.com/sim\n    count: 3\n    idPrefix: sim\n"
	file, err := os.ReadFile("testdata/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sum := func(s string) string {
		h := sha256.Sum256([]byte(s))
		return hex.EncodeToString(h[:])
	}
	annotations := func(t *testing.T, args ...string) (plugin, driver map[string]string) {
		t.Helper()
		o := helmRender(t, append([]string{"--set", "mode=per-node"}, args...)...)
		return o.daemonSet(t, pluginContainer).Spec.Template.Annotations, o.daemonSet(t, driverContainer).Spec.Template.Annotations
	}
	p1, d1 := annotations(t, "--set-file", "config=testdata/config.yaml")
	p2, d2 := annotations(t, "--set-string", "config="+other)
	if d1[key] != sum(string(file)) || d2[key] != sum(other) {
		t.Errorf("the driver's %s is %q and %q, want the configs' sha256 %s and %s", key, d1[key], d2[key], sum(string(file)), sum(other))
	}
	if d1[key] == d2[key] {
		t.Errorf("the driver's pod template is the same with two configs (%s %q): helm upgrade would not roll it", key, d1[key])
	}
	for _, p := range []map[string]string{p1, p2} {
		if v, ok := p[key]; ok {
			t.Errorf("the device plugin's pod template has %s %q: it reloads its config live, a roll restarts it for nothing", key, v)
		}
	}
	p0, d0 := annotations(t)
	for what, a := range map[string]map[string]string{"plugin": p0, "driver": d0} {
		if v, ok := a[key]; ok {
			t.Errorf("without a config the %s's pod template has %s %q", what, key, v)
		}
	}
}

// TestHelmController: the chart renders the DRA controller with the
// driver (dra.controller.enabled, true by default), and not at all when
// turned off (one installed by another release serves the driver's
// claims, or prepareBeforeBind is not used): no account, role, binding or
// Deployment, the driver's objects unchanged. Its values reach it.
func TestHelmController(t *testing.T) {
	for _, mode := range []string{"dra", "per-node"} {
		t.Run(mode, func(t *testing.T) {
			on, off := helmRender(t, "--set", "mode="+mode), helmRender(t, "--set", "mode="+mode, "--set", "dra.controller.enabled=false")
			if c := on.of(controllerApp); len(c.deployments) != 1 || len(c.accounts) != 1 || len(c.roles) != 1 || len(c.bindings) != 1 {
				t.Errorf("by default: %d Deployments, %d accounts, %d roles, %d bindings of the controller, want 1 each",
					len(c.deployments), len(c.accounts), len(c.roles), len(c.bindings))
			}
			if c := off.of(controllerApp); len(c.deployments)+len(c.accounts)+len(c.roles)+len(c.bindings) != 0 {
				t.Errorf("dra.controller.enabled=false: %d Deployments, %d accounts, %d roles, %d bindings of the controller, want none",
					len(c.deployments), len(c.accounts), len(c.roles), len(c.bindings))
			}
			if len(off.Deployments) != 0 {
				t.Errorf("dra.controller.enabled=false: %d Deployments", len(off.Deployments))
			}
			a, b := on.of(driverApp), off.of(driverApp)
			if !equality.Semantic.DeepEqual(a.accounts, b.accounts) || !equality.Semantic.DeepEqual(a.roles, b.roles) ||
				!equality.Semantic.DeepEqual(a.bindings, b.bindings) ||
				!equality.Semantic.DeepEqual(on.daemonSet(t, driverContainer), off.daemonSet(t, driverContainer)) {
				t.Errorf("dra.controller.enabled=false changes the driver's objects")
			}
		})
	}
	t.Run("values", func(t *testing.T) {
		o := helmRender(t, "--set", "mode=dra", "--set", "dra.controller.resources.limits.memory=512Mi",
			"--set", "dra.controller.nodeSelector.pool=infra", "--set", "dra.controller.priorityClassName=infra-critical",
			"--set", "dra.controller.tolerations[0].key=infra", "--set", "dra.controller.tolerations[0].operator=Exists",
			"--set", "dra.controller.tolerations[0].effect=NoSchedule")
		ps := &o.of(controllerApp).deployments[0].Spec.Template.Spec
		if q := ps.Containers[0].Resources.Limits[corev1.ResourceMemory]; q.String() != "512Mi" {
			t.Errorf("memory limit %s, want 512Mi", q.String())
		}
		if !equality.Semantic.DeepEqual(ps.NodeSelector, map[string]string{"pool": "infra"}) || ps.PriorityClassName != "infra-critical" {
			t.Errorf("nodeSelector %v, priorityClassName %q", ps.NodeSelector, ps.PriorityClassName)
		}
		want := []corev1.Toleration{{Key: "infra", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
		if !equality.Semantic.DeepEqual(ps.Tolerations, want) {
			t.Errorf("tolerations %s, want %s", asJSON(ps.Tolerations), asJSON(want))
		}
		// The DaemonSets' own placement values are not the controller's.
		if ds := o.daemonSet(t, driverContainer); ds.Spec.Template.Spec.PriorityClassName != "system-node-critical" {
			t.Errorf("the driver's priorityClassName %q", ds.Spec.Template.Spec.PriorityClassName)
		}
	})
}

// TestHelmRefuses: bad values fail the render with a message naming them.
func TestHelmRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown mode", []string{"--set", "mode=both"}, "mode must be device-plugin, dra or per-node"},
		{"class not a DNS name", []string{"--set", "mode=dra", "--set", "env.RESOURCE_NAME=example.com/Sim"}, "not a DNS subdomain"},
		{"bad driver", []string{"--set", "mode=dra", "--set", "dra.driverName=a_b"}, "invalid driver name"},
		{"config not YAML", []string{"--set", "mode=dra", "--set", "config=[: x"}, "config is not YAML"},
		{"config without resources", []string{"--set", "mode=dra", "--set-string", "config=resources: []"},
			"no resource to serve through DRA: the config lists none; set dra.resourceNames"},
		{"host without port", []string{"--set", "mode=dra", "--set", "dra.apiServer.host=10.0.0.1"}, "set host and port together"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := helmTemplate(t, c.args...)
			if err == nil {
				t.Fatalf("helm template rendered:\n%s", out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Errorf("helm template failed without saying %q:\n%s", c.want, out)
			}
		})
	}
}

// versionsEnv pins the Kubernetes versions the project supports, among
// others, relative to this package.
const versionsEnv = "../e2e/versions.env"

// TestHelmLint: helm lint passes on the chart, in every mode.
func TestHelmLint(t *testing.T) {
	h := helm(t)
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			out, err := exec.Command(h, "lint", "--strict", filepath.Join("helm", "cdi-device-plugin"), "--set", "mode="+mode).CombinedOutput()
			if err != nil {
				t.Fatalf("helm lint: %v\n%s", err, out)
			}
		})
	}
}

// chartMeta is what Chart.yaml says of the versions.
type chartMeta struct {
	AppVersion  string `json:"appVersion"`
	KubeVersion string `json:"kubeVersion"`
}

// TestChartVersions: the chart deploys the image tagged with its pinned
// appVersion unless image.tag says another, and its kubeVersion is the
// range of Kubernetes minors the project supports (e2e/versions.env:
// K8S_VERSION's to K8S_NEXT_VERSION's): helm refuses a version outside
// it, the minors before and after, and takes both pinned versions.
func TestChartVersions(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("helm", "cdi-device-plugin", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var meta chartMeta
	if err := yaml.Unmarshal(b, &meta); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(meta.AppVersion) {
		t.Errorf("Chart.yaml appVersion %q: want a pinned version (x.y.z), not a moving tag", meta.AppVersion)
	}
	images := func(t *testing.T, args ...string) []string {
		t.Helper()
		o := helmRender(t, append([]string{"--set", "mode=per-node"}, args...)...)
		return []string{o.daemonSet(t, pluginContainer).Spec.Template.Spec.Containers[0].Image,
			o.daemonSet(t, driverContainer).Spec.Template.Spec.Containers[0].Image,
			o.of(controllerApp).deployments[0].Spec.Template.Spec.Containers[0].Image}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "cdi-device-plugin:" + meta.AppVersion},
		{[]string{"--set", "image.repository=reg.example/cdp", "--set", "image.tag=v9"}, "reg.example/cdp:v9"},
	} {
		for _, got := range images(t, c.args...) {
			if got != c.want {
				t.Errorf("with %q the image is %s, want %s", c.args, got, c.want)
			}
		}
	}

	minor := func(name string) int {
		v := scriptValue(t, versionsEnv, name)
		m := regexp.MustCompile(`^v1\.(\d+)\.\d+$`).FindStringSubmatch(v)
		if m == nil {
			t.Fatalf("%s %s=%s: not v1.<minor>.<patch>", versionsEnv, name, v)
		}
		n, err := strconv.Atoi(m[1])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	lo, hi := minor("K8S_VERSION"), minor("K8S_NEXT_VERSION")
	if want := fmt.Sprintf(">=1.%d.0-0 <1.%d.0-0", lo, hi+1); meta.KubeVersion != want {
		t.Errorf("Chart.yaml kubeVersion %q, want %q (%s)", meta.KubeVersion, want, versionsEnv)
	}
	for _, c := range []struct {
		version string
		ok      bool
	}{
		{fmt.Sprintf("v1.%d.9", lo-1), false},
		{scriptValue(t, versionsEnv, "K8S_VERSION"), true},
		{scriptValue(t, versionsEnv, "K8S_NEXT_VERSION"), true},
		{fmt.Sprintf("v1.%d.0", hi+1), false},
	} {
		out, err := helmTemplate(t, "--kube-version", c.version)
		if (err == nil) != c.ok {
			t.Errorf("helm template for Kubernetes %s: %v, want it to pass: %v\n%s", c.version, err, c.ok, out)
		}
		if !c.ok && !strings.Contains(string(out), "incompatible") {
			t.Errorf("helm template for Kubernetes %s failed without saying it is incompatible:\n%s", c.version, out)
		}
	}
}

// lintValues are value files of the settings the e2e suite and the docs
// install the chart with; make lint-chart lints the chart with each.
func lintValues(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "helm-lint", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/helm-lint/*.yaml (%v)", err)
	}
	return files
}

// TestHelmSchema: values.schema.json takes the chart's defaults and the
// values the e2e suite and the docs use (every mode), and refuses a
// misspelt key anywhere, naming it: a key the chart does not read would
// otherwise be ignored. Its env names are the variables deploy.sh
// passes (ENV_VARS, DRIVER_VARS), DRIVER_NAME and the Go runtime's.
func TestHelmSchema(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("helm", "cdi-device-plugin", "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Env struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"env"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range schema.Properties.Env.Properties {
		got = append(got, k)
	}
	want := append(append(scriptList(t, "ENV_VARS"), scriptList(t, "DRIVER_VARS")...), "DRIVER_NAME")
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("values.schema.json's env names %v, want deploy.sh's variables and DRIVER_NAME %v", got, want)
	}

	for _, mode := range modes {
		for _, f := range append([]string{""}, lintValues(t)...) {
			args := []string{"--set", "mode=" + mode}
			if f != "" {
				args = append(args, "-f", f)
			}
			if out, err := helmTemplate(t, args...); err != nil {
				t.Errorf("helm template %q: %v\n%s", args, err, out)
			}
		}
	}
	for _, c := range []struct{ set, key string }{
		{"imag.tag=v1", "imag"},
		{"image.tga=v1", "tga"},
		{"env.NUMBER_DEVICE=8", "NUMBER_DEVICE"},
		{"metrics.prot=9500", "prot"},
		{"dra.driverNam=gpu.example.com", "driverNam"},
		{"dra.apiServer.hots=10.0.0.1", "hots"},
		{"resources.request.cpu=1", "request"},
		{"tolerations[0].operater=Exists", "operater"},
		{"dra.controller.enabld=false", "enabld"},
		{"dra.controller.resources.limit.cpu=1", "limit"},
	} {
		out, err := helmTemplate(t, "--set", "mode=dra", "--set", c.set)
		if err == nil {
			t.Errorf("--set %s rendered", c.set)
			continue
		}
		if !strings.Contains(string(out), "'"+c.key+"' not allowed") {
			t.Errorf("--set %s failed without naming %s:\n%s", c.set, c.key, out)
		}
	}
}

// TestPluginKnowsTheDriver: the device plugin's claim guard knows the DRA
// driver's claims by the driver's name, so the plugin gets the driver's
// DRIVER_NAME wherever it is not its own default: per-node, both
// DaemonSets carry the same name, the default one or one given, and so
// does the controller's Deployment; with only the device plugin
// installed, the name given reaches it, and no controller is installed.
func TestPluginKnowsTheDriver(t *testing.T) {
	env := func(t *testing.T, o *objects, c string) (string, bool) {
		t.Helper()
		ds := o.daemonSet(t, c)
		if ds == nil {
			t.Fatalf("no %s DaemonSet", c)
		}
		for _, e := range ds.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "DRIVER_NAME" {
				return e.Value, true
			}
		}
		return "", false
	}
	render := func(t *testing.T, args ...string) *objects {
		t.Helper()
		out, err := deployScript(t, args...)
		if err != nil {
			t.Fatalf("deploy.sh render: %v\n%s", err, out)
		}
		return decode(t, out)
	}
	for _, c := range []struct {
		name   string
		render func(t *testing.T) *objects
		want   string // the plugin's DRIVER_NAME; "" for none
		driver bool   // a driver DaemonSet whose DRIVER_NAME must equal it
	}{
		{"kustomize per-node", func(t *testing.T) *objects { return kustomizeRender(t, filepath.Join("modes", "per-node")) }, "simple-device.example.com", true},
		{"deploy.sh per-node", func(t *testing.T) *objects { return render(t, "MODE=per-node") }, "simple-device.example.com", true},
		{"deploy.sh per-node, DRA_RESOURCES", func(t *testing.T) *objects {
			return render(t, "MODE=per-node", "PLUGIN_CONFIG=testdata/config.yaml", "DRA_RESOURCES=example.com/sim")
		}, "sim.example.com", true},
		{"deploy.sh per-node, DRIVER_NAME", func(t *testing.T) *objects { return render(t, "MODE=per-node", "DRIVER_NAME=gpu.example.com") }, "gpu.example.com", true},
		{"deploy.sh device-plugin, DRIVER_NAME", func(t *testing.T) *objects { return render(t, "MODE=device-plugin", "DRIVER_NAME=gpu.example.com") }, "gpu.example.com", false},
		{"deploy.sh device-plugin", func(t *testing.T) *objects { return render(t, "MODE=device-plugin") }, "", false},
		{"helm per-node", func(t *testing.T) *objects { return helmRender(t, "--set", "mode=per-node") }, "simple-device.example.com", true},
		{"helm per-node, driverName", func(t *testing.T) *objects {
			return helmRender(t, "--set", "mode=per-node", "--set", "dra.driverName=gpu.example.com")
		}, "gpu.example.com", true},
		{"helm device-plugin, driverName", func(t *testing.T) *objects {
			return helmRender(t, "--set", "mode=device-plugin", "--set", "dra.driverName=gpu.example.com")
		}, "gpu.example.com", false},
		{"helm device-plugin", func(t *testing.T) *objects { return helmRender(t, "--set", "mode=device-plugin") }, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := c.render(t)
			got, ok := env(t, o, pluginContainer)
			if got != c.want || ok != (c.want != "") {
				t.Errorf("the plugin's DRIVER_NAME %q (set: %v), want %q", got, ok, c.want)
			}
			if c.driver {
				if d, _ := env(t, o, driverContainer); d != got {
					t.Errorf("the driver's DRIVER_NAME %q, the plugin's %q", d, got)
				}
				deps := o.of(controllerApp).deployments
				if len(deps) != 1 {
					t.Fatalf("%d Deployments of the controller, want 1", len(deps))
				}
				if d, _ := envValue(&deps[0].Spec.Template.Spec.Containers[0], "DRIVER_NAME"); d != got {
					t.Errorf("the controller's DRIVER_NAME %q, the plugin's %q", d, got)
				}
			} else if n := len(o.Deployments); n != 0 {
				t.Errorf("%d Deployments without the driver: its controller has nothing to mark", n)
			}
		})
	}
}

// rollingUpdateDoc finds what README.md says a DaemonSet's rolling update
// is: "the plugin's (driver's) rolling update `maxX: N`, `maxY: M`" (the
// tried surge it explains is not introduced so).
var rollingUpdateDoc = regexp.MustCompile("(?i)(?:(plugin|driver)'s\\s+)?rolling updates?\\s+`max(Surge|Unavailable): (\\d+)`,\\s+`max(Surge|Unavailable): (\\d+)`")

// TestREADMERollingUpdate: every rolling update README.md states is the
// one of the DaemonSet it names, the plugin's or the driver's (they differ:
// the driver's surges), as kustomize renders them (the chart's are the
// same: TestHelmMatchesKustomize).
func TestREADMERollingUpdate(t *testing.T) {
	doc, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	said := rollingUpdateDoc.FindAllStringSubmatch(string(doc), -1)
	if len(said) == 0 {
		t.Fatal("README.md states no rolling update")
	}
	objs := kustomizeRender(t, filepath.Join("modes", "per-node"))
	sets := map[string]map[string]string{}
	for who, c := range map[string]string{"plugin": pluginContainer, "driver": driverContainer} {
		ds := objs.daemonSet(t, c)
		u := ds.Spec.UpdateStrategy.RollingUpdate
		if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || u == nil || u.MaxSurge == nil || u.MaxUnavailable == nil {
			t.Fatalf("%s: update strategy %s, want a rolling update with both settings", c, asJSON(ds.Spec.UpdateStrategy))
		}
		sets[who] = map[string]string{"Surge": u.MaxSurge.String(), "Unavailable": u.MaxUnavailable.String()}
	}
	for _, m := range said {
		stated := strings.Join(strings.Fields(m[0]), " ")
		who := strings.ToLower(m[1])
		if who == "" {
			t.Errorf("README.md says %q without naming whose (the plugin's or the driver's): they differ", stated)
			continue
		}
		set := sets[who]
		if m[2] == m[4] || set[m[2]] != m[3] || set[m[4]] != m[5] {
			t.Errorf("README.md says %q; the %s's DaemonSet has maxSurge: %s, maxUnavailable: %s", stated, who, set["Surge"], set["Unavailable"])
		}
	}
}
