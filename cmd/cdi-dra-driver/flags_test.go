package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

// TestHelpListsItsOwnFlags: the driver's -h lists the flags it reads and
// no other: not the device plugin's own (--device-plugin-dir,
// --device-list-strategy), which the driver does not use; given, such a
// flag is refused as any unknown one.
func TestHelpListsItsOwnFlags(t *testing.T) {
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, envOf(nil), &stderr, clientsOf(fakeClient())); code != 0 {
		t.Fatalf("-h: exit %d, stderr %q", code, stderr.String())
	}
	want := []string{"cdi-dir", "config", "dev-root", "device-metadata", "device-status", "driver-name", "fault-control", "kubeconfig",
		"kubelet-plugins-dir", "kubelet-registrar-dir", "log-format", "log-level", "metrics-address", "node-name",
		"pod-resources-socket", "pod-uid", "proc-root", "stale-claim-grace", "state-dir", "sys-root", "version"}
	if got := testutil.HelpFlags(stderr.String()); !slices.Equal(got, want) {
		t.Errorf("-h lists %q, want %q:\n%s", got, want, stderr.String())
	}
	for _, own := range []string{"device-plugin-dir", "device-list-strategy"} {
		stderr.Reset()
		code := run(context.Background(), newDirs(t).args("--"+own, "x"), envOf(map[string]string{"NODE_NAME": "n1"}), &stderr, clientsOf(fakeClient()))
		if code != 2 || !strings.Contains(stderr.String(), "flag provided but not defined: -"+own) {
			t.Errorf("--%s: exit %d, stderr %q; want 2, not defined", own, code, stderr.String())
		}
	}
}
