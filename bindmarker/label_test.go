package bindmarker

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestNodeValue(t *testing.T) {
	long := strings.Repeat("n", 64) + ".example.com"
	for _, c := range []struct{ node, want string }{
		{"n1", "n1"},
		{"ip-10-0-1-23.us-west-2.compute.internal", "ip-10-0-1-23.us-west-2.compute.internal"},
		{long, ""},
	} {
		got := NodeValue(c.node)
		if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
			t.Fatalf("%s: %q is no label value: %v", c.node, got, errs)
		}
		if c.want != "" && got != c.want {
			t.Errorf("%s: %q, want %q", c.node, got, c.want)
		}
		if c.want == "" && (!strings.HasPrefix(got, "h-") || got == NodeValue(long+"x")) {
			t.Errorf("%s: %q, want a digest of its own", c.node, got)
		}
	}
}

func TestNodeOfPool(t *testing.T) {
	for pool, want := range map[string]string{"n1/sim": "n1", "n1": "n1", "node.example.com/gpu": "node.example.com"} {
		if got := NodeOfPool(pool); got != want {
			t.Errorf("%s: %q, want %q", pool, got, want)
		}
	}
}
