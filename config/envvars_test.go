package config

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestEnvVarsDocumentedAndDeployable: EnvVars is the one list of the
// environment variables the plugin reads. docs/configuration.md's
// tables name each of them, and deploy/deploy.sh passes on each one a user
// sets (all but those the DaemonSet sets itself), and no other.
func TestEnvVarsDocumentedAndDeployable(t *testing.T) {
	deploy, err := os.ReadFile("../deploy/deploy.sh")
	if err != nil {
		t.Fatal(err)
	}
	tableRows := docTableRows(t)
	m := regexp.MustCompile(`(?s)ENV_VARS=\((.*?)\)`).FindSubmatch(deploy)
	if m == nil {
		t.Fatal("no ENV_VARS=(...) in deploy/deploy.sh")
	}
	deployed := strings.Fields(string(m[1]))
	// Set by the DaemonSet itself (paths in step with its volumes, the
	// downward API) or by deploy.sh from PLUGIN_CONFIG.
	bySelf := []string{"CONFIG_FILE", "DEVICE_PLUGIN_DIR", "CDI_DIR", "DEV_ROOT", "STATE_DIR", "NODE_NAME", "POD_NAMESPACE",
		"METRICS_ADDRESS", "POD_RESOURCES_SOCKET"}
	var names []string
	for _, e := range EnvVars() {
		names = append(names, e.Name)
		if !slices.ContainsFunc(tableRows, func(r string) bool { return strings.Contains(r, "`"+e.Name+"`") }) {
			t.Errorf("%s is not in a configuration table of docs/configuration.md", e.Name)
		}
		if !slices.Contains(bySelf, e.Name) && !slices.Contains(deployed, e.Name) {
			t.Errorf("%s is missing from ENV_VARS in deploy/deploy.sh", e.Name)
		}
	}
	for _, d := range deployed {
		if !slices.Contains(names, d) {
			t.Errorf("deploy/deploy.sh passes %s, which the plugin does not read", d)
		}
	}
}
