package prestart

import (
	"errors"
	"strings"
	"testing"
	"text/template"
)

// TestArgTemplate: what an exec argument accepts expands as text/template
// expands it; any other action is refused when the step is built, with the
// action named.
func TestArgTemplate(t *testing.T) {
	tg := &Target{ID: "sim-1", Index: 12, HostPath: "/dev/sim-1", ContainerPath: "/dev/c-1",
		Resource: "example.com/sim", Dir: "/var/lib/cdi-device-plugin/devices/sim-1"}
	for _, c := range []struct{ name, arg string }{
		{"empty", ""},
		{"plain", "--force"},
		{"every field", "{{.ID}} {{.HostPath}} {{.ContainerPath}} {{.Resource}} {{.Index}} {{.StateDir}}"},
		{"inside text", "--dev={{.HostPath}},idx={{.Index}}"},
		{"spaces in the action", "{{ .ID }}"},
		{"trim markers", "a {{- .ID -}} b"},
		{"comment", "{{/* the device */}}{{.ID}}"},
		{"quoted string", `{{"{{"}}.ID}}`},
		{"twice", "{{.ID}}{{.ID}}"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, err := parseArg("0", c.arg)
			if err != nil {
				t.Fatal(err)
			}
			var want strings.Builder
			std := template.Must(template.New("0").Option("missingkey=error").Parse(c.arg))
			data := struct {
				ID, HostPath, ContainerPath, Resource, StateDir string
				Index                                           int
			}{tg.ID, tg.HostPath, tg.ContainerPath, tg.Resource, tg.Dir, tg.Index}
			if err := std.Execute(&want, data); err != nil {
				t.Fatal(err)
			}
			if got := a.expand(tg); got != want.String() {
				t.Fatalf("%q expands to %q, text/template gives %q", c.arg, got, want.String())
			}
		})
	}
	for _, c := range []struct {
		name, arg, want string
		only            bool // refused as not one field (errOnlyFields)
	}{
		{"unknown field", "{{.Serial}}", "{{.Serial}}: no such field; the fields are {{.ID}}, {{.HostPath}}", false},
		{"field of a field", "{{.ID.Len}}", "{{.ID.Len}}", true},
		{"dot", "{{.}}", "{{.}}", true},
		{"function", `{{printf "%03d" .Index}}`, `function "printf" not defined`, false},
		{"pipeline", "{{.ID | len}}", `function "len" not defined`, false},
		{"variable", "{{$d := .ID}}{{$d}}", "{{$d := .ID}}", true},
		{"condition", "{{if .ID}}x{{end}}", "{{if .ID}}x{{end}}", true},
		{"loop", "{{range .ID}}x{{end}}", "{{range .ID}}", true},
		{"with", "{{with .ID}}x{{end}}", "{{with .ID}}", true},
		{"define", `{{define "x"}}y{{end}}`, `{{define "x"}}`, true},
		{"template", `{{template "x"}}`, `{{template "x"}}`, true},
		{"number", "{{7}}", "{{7}}", true},
		{"unclosed", "{{.ID", "unclosed action", false},
	} {
		t.Run("refused/"+c.name, func(t *testing.T) {
			_, err := parseArg("0", c.arg)
			if err == nil {
				t.Fatalf("%q accepted", c.arg)
			}
			if !strings.Contains(err.Error(), c.want) || errors.Is(err, errOnlyFields) != c.only {
				t.Fatalf("%q: error %q, want it to name %q (only fields: %v)", c.arg, err, c.want, c.only)
			}
		})
	}
}
