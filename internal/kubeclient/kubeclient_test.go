package kubeclient

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNewDRA: the driver's three clients come from one kubeconfig, each
// with a client-side rate limit of its own (a status write or a clean-up
// read never waits on the helper's limit, nor the other way round); a
// kubeconfig that cannot be read is an error naming the file.
func TestNewDRA(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := NewDRA(kc)
	if err != nil {
		t.Fatal(err)
	}
	helper := c.Client.ResourceV1().RESTClient().GetRateLimiter()
	status := c.Status.RESTClient().GetRateLimiter()
	cleanup := c.Cleanup.RESTClient().GetRateLimiter()
	if helper == nil || status == nil || cleanup == nil {
		t.Fatalf("a client without a rate limit: helper %v, status %v, clean-up %v", helper, status, cleanup)
	}
	if helper == status || helper == cleanup || status == cleanup {
		t.Fatal("two clients share one rate limit")
	}
	missing := filepath.Join(t.TempDir(), "none")
	if _, err := NewDRA(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("NewDRA(%s): %v, want an error naming the file", missing, err)
	}
}
