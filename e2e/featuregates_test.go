//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// draFeatureGates are the gates the DRA scenarios need: extendedResourceName,
// the driver's taints, device health in the pod's status, shared devices
// (replicas). e2e/versions.env pins those not GA in the cluster's
// Kubernetes (FEATURE_GATES_1_36: all four; FEATURE_GATES_1_37:
// ResourceHealthStatus and DRAConsumableCapacity, as 1.37 made the others
// GA); the check wants them all on either way.
var draFeatureGates = []string{"DRAExtendedResource", "DRADeviceTaints", "ResourceHealthStatus", "DRAConsumableCapacity"}

// featureGate is one kubernetes_feature_enabled sample of a component.
type featureGate struct {
	stage   string // ALPHA, BETA, "" for GA, DEPRECATED
	enabled bool
}

// stageName is the stage as the check logs it: alpha, beta, ga, deprecated.
func (g featureGate) stageName() string {
	if g.stage == "" {
		return "ga"
	}
	return strings.ToLower(g.stage)
}

var (
	featureSample = regexp.MustCompile(`^kubernetes_feature_enabled\{([^}]*)\}\s+(\S+)`)
	metricLabel   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
)

// parseFeatureGates reads the kubernetes_feature_enabled samples of a
// component's /metrics (Prometheus text format), by the name label.
func parseFeatureGates(metrics string) (map[string]featureGate, error) {
	gates := map[string]featureGate{}
	for _, line := range strings.Split(metrics, "\n") {
		m := featureSample.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range metricLabel.FindAllStringSubmatch(m[1], -1) {
			labels[l[1]] = l[2]
		}
		name, ok := labels["name"]
		if !ok {
			return nil, fmt.Errorf("a kubernetes_feature_enabled sample without a name label: %q", line)
		}
		switch m[2] {
		case "1":
			gates[name] = featureGate{stage: labels["stage"], enabled: true}
		case "0":
			gates[name] = featureGate{stage: labels["stage"], enabled: false}
		default:
			return nil, fmt.Errorf("kubernetes_feature_enabled of %s is %q, not 0 or 1", name, m[2])
		}
	}
	if len(gates) == 0 {
		return nil, fmt.Errorf("no kubernetes_feature_enabled samples")
	}
	return gates, nil
}

// featureGatesEnabled checks that the API server (its /metrics) and the
// kubelet of every node (/metrics through the API server's node proxy)
// report each of names enabled; it returns the gates' stages as seen, one
// line per component, or what is wrong.
func featureGatesEnabled(ctx context.Context, cs kubernetes.Interface, names ...string) (string, error) {
	type component struct{ name, path string }
	comps := []component{{"kube-apiserver", "/metrics"}}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("list nodes: %w", err)
	}
	for i := range nodes.Items {
		n := nodes.Items[i].Name
		comps = append(comps, component{"kubelet of " + n, "/api/v1/nodes/" + n + "/proxy/metrics"})
	}
	var seen, wrong []string
	for _, c := range comps {
		raw, err := cs.CoreV1().RESTClient().Get().AbsPath(c.path).DoRaw(ctx)
		if err != nil {
			return "", fmt.Errorf("%s: GET %s: %w", c.name, c.path, err)
		}
		gates, err := parseFeatureGates(string(raw))
		if err != nil {
			return "", fmt.Errorf("%s: %w", c.name, err)
		}
		var line []string
		for _, name := range names {
			g, ok := gates[name]
			switch {
			case !ok:
				wrong = append(wrong, fmt.Sprintf("%s does not know the feature gate %s", c.name, name))
			case !g.enabled:
				wrong = append(wrong, fmt.Sprintf("%s runs with %s disabled (kubernetes_feature_enabled{name=%q,stage=%q} 0)", c.name, name, name, g.stage))
			default:
				line = append(line, fmt.Sprintf("%s=%s", name, g.stageName()))
			}
		}
		seen = append(seen, c.name+": "+strings.Join(line, " "))
	}
	if len(wrong) > 0 {
		return "", fmt.Errorf("feature gates (e2e/versions.env FEATURE_GATES_<major>_<minor>): %s", strings.Join(wrong, "; "))
	}
	return strings.Join(seen, "\n"), nil
}

// requireFeatureGates fails the test at once unless the API server and
// every kubelet run with the DRA feature gates on (kubernetes_feature_enabled
// {name="DRAExtendedResource",stage="BETA"} 1 and the others; stage="" for a
// GA gate, as 1.37 reports DRAExtendedResource): a cluster
// without them fails the DRA scenarios for reasons far from their cause.
// The DRA scenarios call it first.
func (c *cluster) requireFeatureGates(t *testing.T, names ...string) {
	t.Helper()
	seen, err := featureGatesEnabled(ctxT(t, 30*time.Second), c.cs, names...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("feature gates on:\n%s", seen)
}
