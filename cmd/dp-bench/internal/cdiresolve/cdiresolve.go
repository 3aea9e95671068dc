// Package cdiresolve resolves the CDI device names a plugin or driver
// returns as containerd resolves them, for both sessions' checks.
package cdiresolve

import (
	"fmt"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
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
