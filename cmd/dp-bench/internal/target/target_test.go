package target

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// loadFails writes body as a targets file named after name in dir, and
// checks that Load refuses it with an error that contains want.
func loadFails(t *testing.T, dir, name, body, want string) {
	t.Helper()
	p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want it to contain %q", err, want)
	}
}

func TestTargetsFile(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, body, want string
	}{
		{"unknown field", "targets:\n- name: a\n  command: [x]\n  sockDir: /x\n", `unknown field "sockDir"`},
		{"no command", "targets:\n- name: a\n", "targets[0]: command: empty"},
		{"file name", "targets:\n- name: a\n  command: [x]\n  files: {../x: y}\n", `files: "../x" must be a plain file name`},
		{"empty", "targets: []\n", "no targets"},
	} {
		t.Run(c.name, func(t *testing.T) { loadFails(t, dir, c.name, c.body, c.want) })
	}
}

// TestDRATargets: a DRA target names its driver and none of the device
// plugin's fields; a file holds one kind of target; the templates give
// the run's DRA directories and the cluster's kubeconfig and node.
func TestDRATargets(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, body, want string
	}{
		{"no driver", "targets:\n- name: a\n  command: [x]\n  dra: {devices: 8}\n", "dra.driver: empty"},
		{"devices", "targets:\n- name: a\n  command: [x]\n  dra: {driver: d, devices: -1}\n", "dra.devices=-1"},
		{"device plugin field", "targets:\n- name: a\n  command: [x]\n  ids: 8\n  dra: {driver: d}\n", "ids: not used for a DRA driver"},
		{"mixed", "targets:\n- name: a\n  command: [x]\n  dra: {driver: d}\n- name: b\n  command: [x]\n", "targets[1]: DRA drivers and device plugins in one file"},
	} {
		t.Run(c.name, func(t *testing.T) { loadFails(t, dir, c.name, c.body, c.want) })
	}
	ts, err := Load("../../bench-dra.yaml")
	if err != nil || !IsDRA(ts) {
		t.Fatalf("bench-dra.yaml: %v (DRA %v)", err, IsDRA(ts))
	}
	tg := Target{Name: "d", Command: []string{"drv", "{{.RegistrarDir}}", "{{.PluginsDir}}", "{{.PodResources}}", "{{.Kubeconfig}}", "{{.NodeName}}"},
		DRA: &DRATarget{Driver: "d.example.com", StepsEvidence: "{{.WorkDir}}/state/*"}}
	if _, err := tg.Prepare("", nil); err == nil {
		t.Error("a DRA target prepared without a cluster")
	}
	r, err := tg.Prepare("", &Cluster{Kubeconfig: "/k/config", NodeName: "node-7"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Cleanup()
	for _, d := range []string{r.Argv[1], r.Argv[2]} {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			t.Errorf("%s: not made: %v", d, err)
		}
	}
	if filepath.Dir(r.Argv[3]) != r.Host.SocketDir || r.Argv[4] != "/k/config" || r.Argv[5] != "node-7" {
		t.Errorf("argv %q", r.Argv)
	}
	if r.Evidence != r.Host.WorkDir+"/state/*" {
		t.Errorf("evidence %q", r.Evidence)
	}
}
