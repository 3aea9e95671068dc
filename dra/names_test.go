package dra

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
)

// TestCheckDeviceNamesAsPublished: two resources whose
// devices the slices would publish under one name are refused at start,
// the error naming both resources and the name; the names compared are
// the published ones, after the cut to a DNS label, at every index.
func TestCheckDeviceNamesAsPublished(t *testing.T) {
	long := strings.Repeat("a", 70)
	two := 2
	res := func(name, prefix string) config.Resource {
		return config.Resource{Name: "example.com/" + name, IDPrefix: prefix, Domain: "example.com", Class: name}
	}
	for _, c := range []struct {
		name  string
		res   []config.Resource
		field string // "": no error
		want  []string
	}{
		{"long prefixes differing only at the end", []config.Resource{res("x", long+"x"), res("y", long+"y")}, "resources[1].idPrefix",
			[]string{"resources[0] (example.com/x", "resources[1] (example.com/y)", `"` + DeviceName(long, 0) + `"`}},
		{"case and punctuation", []config.Resource{res("x", "GPU.x"), res("y", "gpu_x")}, "resources[1].idPrefix",
			[]string{"resources[0] (example.com/x", "resources[1] (example.com/y)", `"gpu-x-0"`}},
		{"the third against the first", []config.Resource{res("x", "sim"), res("y", "other"), res("z", "SIM")}, "resources[2].idPrefix",
			[]string{"resources[0] (example.com/x", "resources[2] (example.com/z)", `"sim-0"`}},
		// Prefixes alike in the characters a name with a 19-digit
		// index keeps: those indexes would collide.
		{"alike up to the longest index's cut", []config.Resource{res("x", strings.Repeat("b", 43)+"x"), res("y", strings.Repeat("b", 43)+"y")},
			"resources[1].idPrefix", []string{`"` + DeviceName(strings.Repeat("b", 43), 1_000_000_000_000_000_000) + `"`}},
		{"distinct at the longest bound", []config.Resource{res("x", strings.Repeat("b", config.MaxIDPrefix-1)+"x"), res("y", strings.Repeat("b", config.MaxIDPrefix-1)+"y")}, "", nil},
		{"a prefix and a longer one", []config.Resource{res("x", "sim"), res("y", "sim-1")}, "", nil},
		// A resource with replicas is published too, as shared devices.
		{"one with replicas", []config.Resource{res("x", "sim"), {Name: "example.com/y", IDPrefix: "SIM", Domain: "example.com", Class: "y", Replicas: &two}},
			"resources[1].idPrefix", []string{"resources[0] (example.com/x", "resources[1] (example.com/y)", `"sim-0"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := CheckDeviceNames(&config.Config{ConfigFile: "x", Resources: c.res})
			if c.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var fe *config.FieldError
			if !asFieldError(err, &fe) || fe.Field != c.field {
				t.Fatalf("want a FieldError naming %s: %v", c.field, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %s", err, w)
				}
			}
		})
	}
}

// TestIDPrefixBound: config.MaxIDPrefix leaves room for
// the longest index: a prefix at the bound is never cut, at any index.
func TestIDPrefixBound(t *testing.T) {
	p := strings.Repeat("a", config.MaxIDPrefix)
	for _, i := range []int{0, 4095, math.MaxInt64} {
		if got, want := DeviceName(p, i), p+"-"+strconv.Itoa(i); got != want {
			t.Errorf("index %d: %q, want %q (cut)", i, got, want)
		}
	}
	if DeviceName(p+"a", math.MaxInt64) == p+"a-"+strconv.Itoa(math.MaxInt64) {
		t.Errorf("the bound %d is not the longest prefix that fits", config.MaxIDPrefix)
	}
}
