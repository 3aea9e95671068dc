// Package cdiresolve resolves the CDI device names a plugin or driver
// returns as containerd resolves them: both sessions' check that the
// names resolve.
package cdiresolve

import (
	"fmt"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
)

// Inject resolves CDI device names as containerd does: a fresh cache
// over dir, InjectDevices into an empty OCI spec. It returns the number
// of device nodes injected.
func Inject(dir string, names []string) (int, error) {
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return 0, fmt.Errorf("CDI cache of %s: %w", dir, err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, names...); err != nil {
		return 0, fmt.Errorf("InjectDevices %v: unresolved %v: %w", names, unresolved, err)
	}
	return len(spec.Linux.Devices), nil
}

// Check resolves names in dir (Inject) for check id of res: a pass that
// counts the names (of the kind noun) and the device nodes injected, or a
// failure that says why.
func Check(res *report.RunResult, id, dir string, names []string, noun string) {
	n, err := Inject(dir, names)
	if err != nil {
		res.Fail(id, "%v", err)
		return
	}
	res.Pass(id, "%d %s, %d device nodes injected", len(names), noun, n)
}
