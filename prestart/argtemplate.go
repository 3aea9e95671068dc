package prestart

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/template/parse"
)

// argTemplate is an exec step's argument: text/template syntax in which
// the actions are the device's fields, {{.ID}} and the like, and nothing
// else. It is parsed by text/template's own parser and expanded here:
// text/template's evaluator looks methods up by name (reflect's
// MethodByName), and a binary that can do that keeps every exported method
// of every type it links, 2.2 MB of the plugin's 14.3 MB.
type argTemplate []argPart

// argPart is literal text (text, or a quoted string: {{"{{"}}), or a
// field when field is set.
type argPart struct {
	text  string
	field argField
}

type argField int

const (
	fieldNone argField = iota
	fieldID
	fieldHostPath
	fieldContainerPath
	fieldResource
	fieldIndex
	fieldStateDir
)

// argFields are the fields an argument may use, in the order errors list
// them.
var argFields = []struct {
	name  string
	field argField
}{
	{"ID", fieldID}, {"HostPath", fieldHostPath}, {"ContainerPath", fieldContainerPath},
	{"Resource", fieldResource}, {"Index", fieldIndex}, {"StateDir", fieldStateDir},
}

// errOnlyFields is wrapped by the error for any action that is not one
// field: functions, pipelines, variables, conditions, loops, templates.
var errOnlyFields = errors.New("an action may only be one of the fields")

func fieldNames() string {
	names := make([]string, len(argFields))
	for i, f := range argFields {
		names[i] = "{{." + f.name + "}}"
	}
	return strings.Join(names, ", ")
}

// parseArg parses one argument; the error names the action it cannot
// expand.
func parseArg(name, text string) (argTemplate, error) {
	trees, err := parse.Parse(name, text, "", "")
	if err != nil {
		return nil, err
	}
	for n := range trees {
		if n != name {
			return nil, fmt.Errorf("{{define %q}}: %w %s", n, errOnlyFields, fieldNames())
		}
	}
	var tpl argTemplate
	for _, node := range trees[name].Root.Nodes {
		switch n := node.(type) {
		case *parse.TextNode:
			tpl = append(tpl, argPart{text: string(n.Text)})
		case *parse.ActionNode:
			p, err := actionPart(n)
			if err != nil {
				return nil, err
			}
			tpl = append(tpl, p)
		default:
			return nil, fmt.Errorf("%s: %w %s", node, errOnlyFields, fieldNames())
		}
	}
	return tpl, nil
}

// actionPart is what an action stands for: {{.X}} with X a known field,
// or a quoted string.
func actionPart(n *parse.ActionNode) (argPart, error) {
	p := n.Pipe
	if len(p.Decl) == 0 && len(p.Cmds) == 1 && len(p.Cmds[0].Args) == 1 {
		switch a := p.Cmds[0].Args[0].(type) {
		case *parse.StringNode:
			return argPart{text: a.Text}, nil
		case *parse.FieldNode:
			if len(a.Ident) == 1 {
				for _, af := range argFields {
					if af.name == a.Ident[0] {
						return argPart{field: af.field}, nil
					}
				}
				return argPart{}, fmt.Errorf("%s: no such field; the fields are %s", n, fieldNames())
			}
		}
	}
	return argPart{}, fmt.Errorf("%s: %w %s", n, errOnlyFields, fieldNames())
}

// expand is the argument for the device t.
func (a argTemplate) expand(t *Target) string {
	var sb strings.Builder
	for _, p := range a {
		switch p.field {
		case fieldNone:
			sb.WriteString(p.text)
		case fieldID:
			sb.WriteString(t.ID)
		case fieldHostPath:
			sb.WriteString(t.HostPath)
		case fieldContainerPath:
			sb.WriteString(t.ContainerPath)
		case fieldResource:
			sb.WriteString(t.Resource)
		case fieldIndex:
			sb.WriteString(strconv.Itoa(t.Index))
		case fieldStateDir:
			sb.WriteString(t.Dir)
		}
	}
	return sb.String()
}
