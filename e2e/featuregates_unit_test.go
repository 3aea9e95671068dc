//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// metricsOf is a component's /metrics with kubernetes_feature_enabled
// samples for the gates given (name: "1" or "0"), stage BETA, beside others.
func metricsOf(gates map[string]string) string { return metricsGA(gates) }

// metricsGA is metricsOf with the gates named in ga at stage GA (stage="",
// as Kubernetes 1.37 reports DRAExtendedResource and DRADeviceTaints).
func metricsGA(gates map[string]string, ga ...string) string {
	var b strings.Builder
	b.WriteString("# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.\n")
	b.WriteString("# TYPE kubernetes_feature_enabled gauge\n")
	b.WriteString(`kubernetes_feature_enabled{name="AllAlpha",stage="ALPHA"} 0` + "\n")
	for name, v := range gates {
		stage := "BETA"
		if slices.Contains(ga, name) {
			stage = ""
		}
		b.WriteString(`kubernetes_feature_enabled{name="` + name + `",stage="` + stage + `"} ` + v + "\n")
	}
	b.WriteString(`kubernetes_feature_enabled{name="DynamicResourceAllocation",stage=""} 1` + "\n")
	b.WriteString(`apiserver_request_total{code="200",verb="GET"} 12` + "\n")
	return b.String()
}

// TestFeatureGatesEnabled: the check the DRA scenarios make first, against
// a fake API server (its /metrics, one node's kubelet behind the node proxy).
func TestFeatureGatesEnabled(t *testing.T) {
	on := map[string]string{"DRAExtendedResource": "1", "DRADeviceTaints": "1", "ResourceHealthStatus": "1", "DRAConsumableCapacity": "1"}
	with := func(name, v string) map[string]string {
		m := map[string]string{}
		for k, x := range on {
			m[k] = x
		}
		if v == "" {
			delete(m, name)
		} else {
			m[name] = v
		}
		return m
	}
	const beta = "DRAExtendedResource=beta DRADeviceTaints=beta ResourceHealthStatus=beta DRAConsumableCapacity=beta"
	for _, c := range []struct {
		name               string
		apiserver, kubelet string
		wantErr            string // "" for none
		stages             string // without wantErr: each component's line of stages
	}{
		{"all on", metricsOf(on), metricsOf(on), "", beta},
		// Kubernetes 1.37: DRAExtendedResource (locked) and DRADeviceTaints
		// are GA, on without being set; ResourceHealthStatus is still beta.
		{"GA in 1.37", metricsGA(on, "DRAExtendedResource", "DRADeviceTaints"), metricsGA(on, "DRAExtendedResource", "DRADeviceTaints"), "",
			"DRAExtendedResource=ga DRADeviceTaints=ga ResourceHealthStatus=beta DRAConsumableCapacity=beta"},
		{"GA but off in the kubelet", metricsOf(on), metricsGA(with("DRADeviceTaints", "0"), "DRADeviceTaints"),
			`kubelet of n1 runs with DRADeviceTaints disabled (kubernetes_feature_enabled{name="DRADeviceTaints",stage=""} 0)`, ""},
		{"off in the API server", metricsOf(with("DRAExtendedResource", "0")), metricsOf(on),
			`kube-apiserver runs with DRAExtendedResource disabled (kubernetes_feature_enabled{name="DRAExtendedResource",stage="BETA"} 0)`, ""},
		{"off in the kubelet", metricsOf(on), metricsOf(with("ResourceHealthStatus", "0")), "kubelet of n1 runs with ResourceHealthStatus disabled", ""},
		{"unknown to the kubelet", metricsOf(on), metricsOf(with("DRADeviceTaints", "")), "kubelet of n1 does not know the feature gate DRADeviceTaints", ""},
		{"no samples", "apiserver_request_total 1\n", metricsOf(on), "kube-apiserver: no kubernetes_feature_enabled samples", ""},
		{"odd value", metricsOf(with("DRAExtendedResource", "2")), metricsOf(on), `kubernetes_feature_enabled of DRAExtendedResource is "2"`, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/metrics":
					_, _ = w.Write([]byte(c.apiserver))
				case "/api/v1/nodes/n1/proxy/metrics":
					_, _ = w.Write([]byte(c.kubelet))
				case "/api/v1/nodes":
					w.Header().Set("Content-Type", "application/json")
					_ = json.NewEncoder(w).Encode(&corev1.NodeList{
						TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"},
						Items:    []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}},
					})
				default:
					http.NotFound(w, r)
				}
			}))
			defer srv.Close()
			cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			seen, err := featureGatesEnabled(context.Background(), cs, draFeatureGates...)
			if c.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				want := "kube-apiserver: " + c.stages + "\nkubelet of n1: " + c.stages
				if seen != want {
					t.Errorf("seen %q, want %q", seen, want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("error %v, want one saying %q", err, c.wantErr)
			}
		})
	}
}
