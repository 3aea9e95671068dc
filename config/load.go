package config

import (
	"flag"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Load parses args (without the program name), the environment and the
// config file they name, applies defaults and validates the result, with
// the device plugin's flags (it takes every setting).
// flag.ErrHelp is returned as is for -h, ErrVersion for --version.
func Load(args []string, env Env, output io.Writer) (*Config, error) {
	return LoadWith(DevicePlugin, args, env, output)
}

// Extra is a flag that one command reads beside the shared ones (the DRA
// driver's), with its environment variable. LoadWith sets *Value from the
// flag, else the environment, else Default; checking it is the command's.
type Extra struct {
	Name, Env, Usage, Default string
	Value                     *string
}

// LoadWith is Load for the command cmd: the settings it takes, as its -h
// words them (a setting it does not take keeps its file value or
// default), and its own flags extra.
func LoadWith(cmd Command, args []string, env Env, output io.Writer, extra ...Extra) (*Config, error) {
	fs := flag.NewFlagSet(string(cmd), flag.ContinueOnError)
	fs.SetOutput(output)
	vals := map[string]*string{}
	var taken []flagDef
	for _, f := range flagDefs {
		if f.usage(cmd) != "" {
			taken = append(taken, f)
		}
	}
	for _, f := range append([]flagDef{configFlag}, taken...) {
		vals[f.name] = fs.String(f.name, "", f.usage(cmd)+" [$"+f.env+"]")
	}
	for _, e := range extra {
		vals[e.Name] = fs.String(e.Name, "", e.Usage+" [$"+e.Env+"]")
	}
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fieldErr("args", strings.Join(fs.Args(), " "), "unexpected positional arguments")
	}
	if *version {
		return nil, ErrVersion
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// pick returns the flag's value if given, else the environment's.
	pick := func(f flagDef) (string, bool) {
		if set[f.name] {
			return *vals[f.name], true
		}
		return env(f.env)
	}
	for _, e := range extra {
		v, ok := pick(flagDef{name: e.Name, env: e.Env})
		if !ok || v == "" {
			v = e.Default
		}
		*e.Value = v
	}

	cfg := &Config{}
	if path, ok := pick(configFlag); ok && path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, &FieldError{Field: "config", Value: path, Reason: err.Error()}
		}
		if err := yaml.UnmarshalStrict(data, cfg); err != nil {
			return nil, &FieldError{Field: "config", Value: path, Reason: err.Error()}
		}
		if cfg.Version != "" && cfg.Version != Version {
			return nil, fieldErr("version", cfg.Version, "unknown configuration version; this plugin reads %s", Version)
		}
		if len(cfg.Resources) == 0 {
			return nil, fieldErr("resources", path, "the config file lists no resources")
		}
		cfg.ConfigFile = path
	}
	cfg.Version = Version
	for _, f := range taken {
		if v, ok := pick(f); ok {
			f.set(cfg, v)
		}
	}
	if v, ok := env(envPluginName); ok && v != "" {
		cfg.PluginName = v
	}
	if v, ok := env(envPodNamespace); ok {
		cfg.Namespace = v
	}
	if cfg.ConfigFile == "" {
		r, err := resourceFromEnv(env)
		if err != nil {
			return nil, err
		}
		cfg.Resources = []Resource{r}
	}
	if err := cfg.defaultAndValidate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// resourceFromEnv builds the single resource of the simple device plugin's
// environment variables.
func resourceFromEnv(env Env) (Resource, error) {
	get := func(k string) string {
		if v, ok := env(k); ok && v != "" {
			return v
		}
		for _, e := range simpleEnv {
			if e.Name == k {
				return e.Default
			}
		}
		return ""
	}
	r := Resource{
		Name:             get("RESOURCE_NAME"),
		IDPrefix:         get("DEVICE_ID_PREFIX"),
		DeviceFilePrefix: get("DEVICE_FILE_PREFIX"),
		EnvPrefix:        get("ENV_PREFIX"),
		AnnotationPrefix: get("ANNOTATION_PREFIX"),
	}
	v := get("NUMBER_DEVICES")
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return r, fieldErr("NUMBER_DEVICES", v, "not an integer")
	}
	r.Count = &n
	steps := get("PRESTART_STEPS")
	if steps == "none" {
		return r, nil
	}
	p := &Prestart{}
	if v := get("PRESTART_BUDGET"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return r, fieldErr("PRESTART_BUDGET", v, "not a duration like 25s")
		}
		p.Budget.Duration = d
	}
	for _, t := range splitList(steps) {
		st := Step{Type: StepType(t)}
		if st.Type == StepReprogram {
			st.Image, st.SHA256 = get("FIRMWARE_IMAGE"), get("FIRMWARE_SHA256")
		}
		p.Steps = append(p.Steps, st)
	}
	r.Prestart = p
	return r, nil
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
