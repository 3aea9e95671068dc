package target

import (
	"fmt"
	"os/exec"
)

// ChangeDevices runs the target's Uevent.Change, expanded: it alters the
// device tree that a uevent then makes the plugin read again.
func (r *Run) ChangeDevices() error { return sh("uevent.change", r.Change) }

// sh runs the shell script of the target's field (sh -c); an error names
// the field and holds what the script wrote.
func sh(field, script string) error {
	if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", field, err, out)
	}
	return nil
}
