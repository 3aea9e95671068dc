package dra

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// checkOpaqueConfig refuses a claim whose allocation carries opaque
// configuration addressed to the driver (status.allocation.devices.config
// entries whose opaque.driver is the driver's name, copied there from the
// DeviceClass or the claim): the driver has no parameters, and preparing
// the devices while ignoring what the user asked for would hand out
// something else than was asked. Configuration for other drivers is
// theirs and is left alone. The error says where the configuration came
// from and which requests it applies to.
func checkOpaqueConfig(driver string, c *resourceapi.ResourceClaim) error {
	for _, cfg := range c.Status.Allocation.Devices.Config {
		if cfg.Opaque == nil || cfg.Opaque.Driver != driver {
			continue
		}
		from := "the claim"
		if cfg.Source == resourceapi.AllocationConfigSourceClass {
			from = "the class"
		}
		reqs := "all requests"
		if len(cfg.Requests) > 0 {
			reqs = "requests " + strings.Join(cfg.Requests, ",")
		}
		return fmt.Errorf("opaque configuration for %s from %s (%s): %w: remove it from the DeviceClass or the claim", driver, from, reqs, ErrOpaqueConfig)
	}
	return nil
}
