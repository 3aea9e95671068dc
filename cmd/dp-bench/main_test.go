package main

import (
	"bytes"
	"strings"
	"testing"
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
