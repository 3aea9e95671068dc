package main

import (
	"bytes"
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/target"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

func TestFlags(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"runs", []string{"-runs", "0", "--", "x"}, `-runs=0: must be at least 1`},
		{"calls", []string{"-calls", "-1", "--", "x"}, `-calls=-1: must be at least 1`},
		{"idle", []string{"-idle", "-1s", "--", "x"}, `-idle=-1s: must not be negative`},
		{"prompt", []string{"-prompt", "0s", "--", "x"}, `-prompt=0s: must be above 0`},
		{"socket-dir", []string{"-socket-dir", "rel/dir", "--", "x"}, `-socket-dir="rel/dir": must be a clean absolute path`},
		{"cdi-dir", []string{"-cdi-dir", "/", "--", "x"}, `-cdi-dir="/": must be a clean absolute path`},
		{"device-files", []string{"-device-files", "-2", "--", "x"}, `-device-files=-2`},
		{"no plugin", nil, "no plugin"},
		{"both", []string{"-targets", "t.yaml", "--", "x"}, `-targets="t.yaml" and a plugin command "x"`},
		{"targets missing", []string{"-targets", "/nonexistent/t.yaml"}, `-targets="/nonexistent/t.yaml": open /nonexistent/t.yaml`},
		{"must-pass", []string{"-must-pass", "nope", "--", "x"}, `-must-pass="nope": no target named "nope"`},
		{"compare", []string{"-compare", "nope", "--", "x"}, `-compare="nope": no target of that name`},
		{"render", []string{"-render", "r.json", "--", "x"}, `-render="r.json": runs nothing, give no targets`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			_, err := parseFlags(c.args, &stderr)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to contain %q", err, c.want)
			}
		})
	}
}

// TestDRANoAPIServer: without the API server's binaries the DRA targets
// are reported as not run, with the reason, and nothing is started.
func TestDRANoAPIServer(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-targets", "bench-dra.yaml", "-runs", "1", "-etcd", "/nonexistent/etcd"}, &stdout, &stderr)
	if code != 1 {
		t.Errorf("exit %d, want 1 (targets must pass)", code)
	}
	for _, want := range []string{"| publishes its devices in ResourceSlices of the node's pools | not run | not run | not run |",
		"- cdi-dra-driver (8 devices, no steps, no metadata): not run: no API server: -kube-apiserver: not given"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("missing %q in:\n%s\nstderr:\n%s", want, stdout.String(), stderr.String())
		}
	}
}

// TestLinksNoKubeClient: dp-bench links neither client-go nor k8s.io/api:
// every baseline process is dp-bench itself, and they would double its
// start-up and its memory (internal/apiclient's package doc).
func TestLinksNoKubeClient(t *testing.T) {
	for _, dep := range testutil.Deps(t, ".") {
		for _, banned := range []string{"k8s.io/client-go/", "k8s.io/api/", "k8s.io/apimachinery/pkg/apis/", "k8s.io/apimachinery/pkg/runtime/"} {
			if strings.HasPrefix(dep+"/", banned) {
				t.Errorf("dp-bench links %s", dep)
			}
		}
	}
}

func TestFleetFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-fleet", "-1"}, "-fleet=-1"},
		{[]string{"-fleet", "2", "-fleet-fill", "1.5"}, "-fleet-fill=1.5"},
		{[]string{"-fleet", "2", "-fleet-steady", "0s"}, "-fleet-steady=0s"},
		{[]string{"-fleet", "2", "-fleet-storm-rate", "0"}, "-fleet-storm-rate=0"},
		{[]string{"-fleet", "2", "-fleet-rounds", "0"}, "-fleet-rounds=0"},
		{[]string{"-fleet", "2", "-fleet-rollout", "sideways"}, `"sideways" for flag -fleet-rollout: "sideways": want surge or restart`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := parseFlags(append(tc.args, "-targets", "fleet.yaml"), &strings.Builder{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// TestFleetTargetsLikeForLike: the fleet runs each of our columns beside
// a peer column of the same kind: ours as deployed writes each prepared
// claim's status.devices, and so does the peer with --gpu-device-status;
// ours with --device-status=false, and the peer by default, do not.
func TestFleetTargetsLikeForLike(t *testing.T) {
	ts, err := target.Load("fleet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]map[bool]bool{} // name -> writes the status -> present
	for _, tg := range ts {
		on := writesStatus(tg)
		if status[tg.Name] == nil {
			status[tg.Name] = map[bool]bool{}
		}
		status[tg.Name][on] = true
	}
	for _, name := range []string{"cdi-dra-driver", "dra-example-driver"} {
		if !status[name][true] || !status[name][false] {
			t.Errorf("%s: with the claim status %v, without %v; want both", name, status[name][true], status[name][false])
		}
	}
}

// writesStatus reports whether a fleet target writes each prepared
// claim's status.devices: ours unless --device-status=false, the peer
// with --gpu-device-status.
func writesStatus(tg target.Target) bool {
	switch tg.Name {
	case "cdi-dra-driver":
		return !slices.Contains(tg.Env, "DEVICE_STATUS=false")
	case "dra-example-driver":
		return slices.Contains(tg.Command, "--gpu-device-status")
	}
	return true
}

// TestFleetGoalTargets: fleet-goals.yaml is the like-for-like pair of
// fleet.yaml as it stands there: ours as deployed, the peer with its
// status on.
func TestFleetGoalTargets(t *testing.T) {
	all, err := target.Load("fleet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	goals, err := target.Load("fleet-goals.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var want []target.Target
	for _, tg := range all {
		if writesStatus(tg) {
			want = append(want, tg)
		}
	}
	if len(want) != 2 || !reflect.DeepEqual(goals, want) {
		t.Errorf("fleet-goals.yaml:\n%+v\nwant fleet.yaml's pair:\n%+v", goals, want)
	}
}

// TestFleetPrebindTargets: the prepare-before-bind fleet and the one
// without differ only in prepareBeforeBind and the controller that
// labels the claims: the same driver, resource and step.
func TestFleetPrebindTargets(t *testing.T) {
	ts, err := target.Load("fleet-prebind.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 {
		t.Fatalf("%d targets, want 2", len(ts))
	}
	pbb, plain := ts[0], ts[1]
	if len(pbb.DRA.Controller) == 0 || len(plain.DRA.Controller) != 0 {
		t.Errorf("controllers %v and %v, want one for the first only", pbb.DRA.Controller, plain.DRA.Controller)
	}
	if !slices.Contains(pbb.DRA.Controller, pbb.DRA.Driver) {
		t.Errorf("the controller %v does not name the driver %s", pbb.DRA.Controller, pbb.DRA.Driver)
	}
	a, b := pbb.Files["config.yaml"], plain.Files["config.yaml"]
	if !strings.Contains(a, "prepareBeforeBind: true") || strings.Replace(a, "  prepareBeforeBind: true\n", "", 1) != b {
		t.Errorf("configs differ by more than prepareBeforeBind:\n%s\n---\n%s", a, b)
	}
	if !slices.Equal(pbb.Command, plain.Command) || pbb.DRA.Driver != plain.DRA.Driver {
		t.Errorf("commands or drivers differ: %v %v", pbb.Command, plain.Command)
	}
}
