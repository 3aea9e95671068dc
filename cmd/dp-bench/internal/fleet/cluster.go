package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/apiclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/audit"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/controlplane"
	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/proc"
)

// fleetCluster is a private control plane for one fleet phase: etcd and
// kube-apiserver (ControlPlane, with an audit log of every write), and
// kube-scheduler and kube-controller-manager, all on loopback ports.
//
// The controller-manager runs only the controllers a claim pod needs:
// resourceclaim-controller (a pod's claim from its template) and
// device-taint-eviction-controller (so that a NoExecute taint would
// evict, and a pod evicted counts as failed). The node lifecycle
// controller is not run: it would mark every node NotReady unless a
// kubelet renewed its Lease every 10 s, N writes every 10 s that are the
// kubelet's, not the driver's, and that a 2-core machine would pay for
// at N=100. The Node objects are made Ready once (status) and stay so.
type fleetCluster struct {
	cp       *controlplane.ControlPlane
	dir      string
	auditLog string
	others   []*proc.Proc // scheduler, controller-manager
}

// fleetNamespace holds the fleet's pods and claims.
const fleetNamespace = "fleet"

// startFleetCluster starts the control plane with fo's binaries.
func startFleetCluster(ctx context.Context, cpo controlplane.Options, fo *Options) (*fleetCluster, error) {
	dir, err := os.MkdirTemp("", "dpb-fleet")
	if err != nil {
		return nil, err
	}
	fc := &fleetCluster{dir: dir, auditLog: filepath.Join(dir, "audit.log")}
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(audit.Policy), 0o600); err != nil {
		fc.stop()
		return nil, err
	}
	// Blocking: each event is written before the request is answered.
	// The batch mode drops events when its buffer is full, and a figure
	// of writes would then be short without a word; a failed write is
	// counted in apiserver_audit_error_total (auditErrors).
	cpo.Args = append(cpo.Args, "--audit-policy-file", policy, "--audit-log-path", fc.auditLog, "--audit-log-maxsize", "0",
		"--audit-log-mode", "blocking")
	if fc.cp, err = controlplane.Start(ctx, cpo); err != nil {
		fc.stop()
		return nil, err
	}
	common := []string{"--kubeconfig", fc.cp.Kubeconfig, "--leader-elect=false", "--secure-port=0",
		"--kube-api-qps=5000", "--kube-api-burst=5000"}
	if cpo.FeatureGates != "" {
		common = append(common, "--feature-gates", cpo.FeatureGates)
	}
	for _, c := range []struct {
		bin  string
		args []string
	}{
		{fo.Scheduler, nil},
		{fo.ControllerManager, []string{"--controllers", "resourceclaim-controller,device-taint-eviction-controller", "--concurrent-resourceclaim-syncs", "50"}},
	} {
		if c.bin == "" {
			fc.stop()
			return nil, errors.New("-kube-scheduler and -kube-controller-manager are needed with -fleet")
		}
		p, err := controlplane.Run(c.bin, append(append([]string{}, common...), c.args...)...)
		if err != nil {
			fc.stop()
			return nil, fmt.Errorf("%s: %w", filepath.Base(c.bin), err)
		}
		fc.others = append(fc.others, p)
	}
	if err := fc.objects(ctx); err != nil {
		fc.stop()
		return nil, err
	}
	return fc, nil
}

func (fc *fleetCluster) stop() {
	for _, p := range fc.others {
		_, _ = p.Terminate(10 * time.Second)
	}
	if fc.cp != nil {
		fc.cp.Stop()
	}
	_ = os.RemoveAll(fc.dir)
}

// alive returns an error when the scheduler or controller-manager ended.
func (fc *fleetCluster) alive() error {
	for _, p := range fc.others {
		if p.Exited() {
			return fmt.Errorf("%s exited: %w: %s", p.Name(), p.Err(), p.LogTail(800))
		}
	}
	return nil
}

// objects makes the namespace and its default ServiceAccount (no
// controller makes it here).
func (fc *fleetCluster) objects(ctx context.Context) error {
	api := fc.cp.Client
	for _, o := range []struct {
		path string
		obj  any
	}{
		{apiclient.PathNamespaces, map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": fleetNamespace}}},
		{apiclient.PathNamespaces + "/" + fleetNamespace + "/serviceaccounts", map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "default"}}},
	} {
		if err := api.Do(ctx, http.MethodPost, o.path, o.obj, nil); err != nil && !apiclient.IsAlreadyExists(err) {
			return fmt.Errorf("%s: %w", o.path, err)
		}
	}
	return nil
}

// driverObjects makes the DeviceClass of driver and the claim template
// of 1 device of it; it returns the template's name.
func (fc *fleetCluster) driverObjects(ctx context.Context, driver string) (string, error) {
	class := "fleet." + driver
	tpl := "one-device"
	api := fc.cp.Client
	objs := []struct {
		path string
		obj  any
	}{
		{"/apis/resource.k8s.io/v1/deviceclasses", map[string]any{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
			"metadata": map[string]any{"name": class},
			"spec":     map[string]any{"selectors": []any{map[string]any{"cel": map[string]any{"expression": fmt.Sprintf("device.driver == %q", driver)}}}}}},
		{"/apis/resource.k8s.io/v1/namespaces/" + fleetNamespace + "/resourceclaimtemplates", map[string]any{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
			"metadata": map[string]any{"name": tpl},
			"spec": map[string]any{"spec": map[string]any{"devices": map[string]any{"requests": []any{map[string]any{"name": "dev",
				"exactly": map[string]any{"deviceClassName": class, "allocationMode": "ExactCount", "count": 1}}}}}}}},
	}
	for _, o := range objs {
		if err := api.Do(ctx, http.MethodPost, o.path, o.obj, nil); err != nil && !apiclient.IsAlreadyExists(err) {
			return "", fmt.Errorf("%s: %w", o.path, err)
		}
	}
	return tpl, nil
}

// makeNode creates a Node object and makes it Ready, with room for 110
// pods, as a kubelet's first status would, and untainted.
func (fc *fleetCluster) makeNode(ctx context.Context, name string) error {
	api := fc.cp.Client
	n := map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": name,
		"labels": map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}}}
	if err := api.Do(ctx, http.MethodPost, apiclient.PathNodes, n, nil); err != nil && !apiclient.IsAlreadyExists(err) {
		return fmt.Errorf("node %s: %w", name, err)
	}
	now := time.Now().UTC().Format(time.RFC3339)
	res := map[string]string{"cpu": "64", "memory": "256Gi", "pods": "110"}
	status := map[string]any{"status": map[string]any{"capacity": res, "allocatable": res,
		"conditions": []any{map[string]any{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "dp-bench fleet",
			"lastHeartbeatTime": now, "lastTransitionTime": now}}}}
	if err := api.MergePatch(ctx, apiclient.PathNodes+"/"+name+"/status", status); err != nil {
		return fmt.Errorf("node %s status: %w", name, err)
	}
	// The TaintNodesByCondition admission put node.kubernetes.io/not-ready
	// on the new node; the node lifecycle controller (not run) would take
	// it off once the node is Ready.
	if err := api.MergePatch(ctx, apiclient.PathNodes+"/"+name, map[string]any{"spec": map[string]any{"taints": nil}}); err != nil {
		return fmt.Errorf("node %s taints: %w", name, err)
	}
	return nil
}

// nodeKubeconfig writes a kubeconfig for node's driver: the control
// plane's, impersonating fleet:<node> (of the group system:masters), so
// that the audit log names the node of every write.
func (fc *fleetCluster) nodeKubeconfig(node string) (string, error) {
	return fc.userKubeconfig(audit.UserPrefix + node)
}

// userKubeconfig writes a kubeconfig that impersonates user (of the group
// system:masters).
func (fc *fleetCluster) userKubeconfig(as string) (string, error) {
	b, err := os.ReadFile(fc.cp.Kubeconfig)
	if err != nil {
		return "", err
	}
	const user = "users:\n- name: dp-bench\n  user:\n"
	s := string(b)
	if !strings.Contains(s, user) {
		return "", errors.New("the control plane's kubeconfig has no user dp-bench")
	}
	s = strings.Replace(s, user, user+"    as: "+as+"\n    as-groups: [system:masters]\n", 1)
	path := filepath.Join(fc.dir, "kubeconfig-"+strings.ReplaceAll(as, ":", "-"))
	return path, os.WriteFile(path, []byte(s), 0o600)
}

// metrics scrapes apiserver_request_total.
func (fc *fleetCluster) metrics(ctx context.Context) ([]audit.RequestCount, error) {
	var body string
	if err := fc.cp.Client.Do(ctx, http.MethodGet, "/metrics", nil, &body); err != nil {
		return nil, err
	}
	return audit.ParseRequestTotals(strings.NewReader(body))
}

// audit reads the audit log's writes so far, once the API server says
// that it lost no event (auditErrors).
func (fc *fleetCluster) audit(ctx context.Context) ([]audit.Write, error) {
	if err := fc.auditErrors(ctx); err != nil {
		return nil, err
	}
	f, err := os.Open(fc.auditLog)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return audit.Parse(f)
}

// counters scrapes the series of the counter name.
func (fc *fleetCluster) counters(ctx context.Context, name string) ([]audit.Counter, error) {
	var body string
	if err := fc.cp.Client.Do(ctx, http.MethodGet, "/metrics", nil, &body); err != nil {
		return nil, err
	}
	return audit.ParseCounters(strings.NewReader(body), name)
}

// auditErrors is an error when the API server counted an audit event it
// failed to write or dropped (apiserver_audit_error_total above 0): the
// audit log then lacks writes, and every figure read from it is wrong.
func (fc *fleetCluster) auditErrors(ctx context.Context) error {
	cs, err := fc.counters(ctx, "apiserver_audit_error_total")
	if err != nil {
		return err
	}
	if n := audit.Sum(cs); n > 0 {
		return fmt.Errorf("the API server failed to write or dropped %g audit events (apiserver_audit_error_total %v): the audit log's counts would be short", n, cs)
	}
	return nil
}

// apiserverRSS is the API server's resident memory, bytes.
func (fc *fleetCluster) apiserverRSS() int64 {
	s, err := proc.Read(fc.cp.APIServer.Pid())
	if err != nil {
		return 0
	}
	return s.RSS
}

// fleetNodeName is node i's name.
func fleetNodeName(i int) string { return "fleet-node-" + strconv.Itoa(i) }
