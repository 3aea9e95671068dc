package main

import (
	"bytes"
	"context"
	"slices"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestHelpListsItsOwnFlags: the plugin's -h lists the flags it reads and
// no other: not the DRA driver's own (--kubeconfig, the kubelet's
// registrar and plugins directories, --stale-claim-grace,
// --device-metadata, --device-status). --driver-name is the plugin's too:
// the driver's name, whose claims the claim guard recognises.
func TestHelpListsItsOwnFlags(t *testing.T) {
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, envOf(nil), &stderr); code != 0 {
		t.Fatalf("-h: exit %d, stderr %q", code, stderr.String())
	}
	want := []string{"cdi-dir", "config", "dev-root", "device-list-strategy", "device-plugin-dir", "driver-name",
		"fault-control", "log-format", "log-level", "metrics-address", "node-name", "pod-resources-socket", "proc-root", "state-dir",
		"sys-root", "version"}
	if got := testutil.HelpFlags(stderr.String()); !slices.Equal(got, want) {
		t.Errorf("-h lists %q, want %q:\n%s", got, want, stderr.String())
	}
}
