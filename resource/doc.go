// Package resource is the core the device plugin and the DRA driver share:
// one configured resource's parts, and the gate between them.
//
// Build makes a resource's device source (simulated nodes, globs, PCI or
// USB devices by identity), its prestart runner, and its CDI spec, whose
// writes first give every device its state directory (StateSpec); Prepare
// readies them (nodes, device state, faults an earlier run recorded). Both
// commands build a resource the same way, so they describe the same
// devices with the same spec file and prepare them with the same steps and
// state.
//
// The Follower keeps the spec in step with the device set and hands on
// only what the spec on disk describes: a device is published healthy (to
// the device plugin's ListAndWatch, or in the DRA driver's ResourceSlice)
// only once the spec describes it, so every CDI name handed out resolves.
// It also yields the spec to a newer process that took it over, and takes
// it back once that process is gone.
package resource
