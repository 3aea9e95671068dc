package device

import (
	"os"
	"strings"
	"testing"
)

func TestCauses(t *testing.T) {
	seen := map[string]Cause{}
	for _, c := range Causes() {
		l := c.String()
		if l == "" || l[0] == 'c' && l[:6] == "cause(" {
			t.Errorf("cause %d has no label", c)
		}
		if o, ok := seen[l]; ok {
			t.Errorf("causes %d and %d share the label %q", o, c, l)
		}
		seen[l] = c
	}
	for _, c := range []struct {
		p    Problem
		want string
		none bool
	}{
		{Problem{}, "", true},
		{Problem{Cause: CauseMissing}, "missing", false},
		{Problemf(CausePrepareFailed, "step %s: %s", "reset", "exit status 1"), "prestart: step reset: exit status 1", false},
	} {
		t.Run(c.want, func(t *testing.T) {
			if got := c.p.String(); got != c.want || c.p.None() != c.none {
				t.Fatalf("got %q (none %v), want %q (none %v)", got, c.p.None(), c.want, c.none)
			}
			var d Device
			d.SetProblem(c.p)
			if d.Healthy != c.none || d.Problem != c.p {
				t.Fatalf("SetProblem: healthy %v problem %+v", d.Healthy, d.Problem)
			}
		})
	}
}

// TestCausesDocumented: every cause is a documented value of the reason
// label (docs/operations.md, the health transitions metric).
func TestCausesDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, l := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(l, "| `cdi_device_plugin_device_health_transitions_total` |") {
			row = l
		}
	}
	if row == "" {
		t.Fatal("docs/operations.md has no row for cdi_device_plugin_device_health_transitions_total")
	}
	for _, c := range Causes() {
		if !strings.Contains(row, "`"+c.String()+"`") {
			t.Errorf("docs/operations.md does not list the reason %q", c)
		}
	}
}
