package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDeployScriptPassesTheDriverFlags: deploy/deploy.sh's DRIVER_VARS,
// the variables it copies into the driver's container alone, are the
// environment variables of the driver's own flags, but for those the
// DaemonSet sets itself: DRIVER_NAME (deploy.sh's own setting), the
// kubelet's directories (the DaemonSet's args, in step with its mounts)
// and KUBECONFIG (in a pod the driver uses its service account).
func TestDeployScriptPassesTheDriverFlags(t *testing.T) {
	b, err := os.ReadFile("../../deploy/deploy.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^DRIVER_VARS=\(([^)]*)\)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("deploy/deploy.sh has no DRIVER_VARS=(...)")
	}
	got := strings.Fields(string(m[1]))
	// Set by deploy.sh on its own terms, or by the manifests: POD_UID
	// comes from the downward API (the pod's UID), never from the script.
	bySelf := []string{"DRIVER_NAME", "KUBELET_REGISTRAR_DIR", "KUBELET_PLUGINS_DIR", "KUBECONFIG", "POD_UID"}
	var want []string
	for _, e := range (&flags{}).extra() {
		if !slices.Contains(bySelf, e.Env) {
			want = append(want, e.Env)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("deploy.sh's DRIVER_VARS %v, want the driver's own flags' variables %v", got, want)
	}
}
