package device

import "testing"

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
