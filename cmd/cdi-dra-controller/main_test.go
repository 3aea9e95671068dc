package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/cdi-device-plugin/cdi-device-plugin/bindmarker"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/testutil"
)

func envOf(m map[string]string) config.Env {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// TestBadSettings: a driver name the driver would refuse, a bad log level
// or format, exit 2 naming the flag and the value, before any API call.
func TestBadSettings(t *testing.T) {
	called := false
	client := func(string) (kubernetes.Interface, error) { called = true; return fake.NewClientset(), nil }
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no driver name", nil, nil, "driver-name"},
		{"bad driver name", []string{"--driver-name", "Not_A.Name"}, nil, "Not_A.Name"},
		{"bad log level", []string{"--driver-name", "sim.example.com"}, map[string]string{"LOG_LEVEL": "loud"}, `log-level="loud"`},
		{"bad log format", []string{"--driver-name", "sim.example.com", "--log-format", "xml"}, nil, `log-format="xml"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run(context.Background(), c.args, envOf(c.env), &stderr, client); code != 2 || !strings.Contains(stderr.String(), c.want) {
				t.Fatalf("exit %d, stderr %q; want 2 naming %s", code, stderr.String(), c.want)
			}
		})
	}
	if called {
		t.Error("an API client was made for bad settings")
	}
}

// TestRunMarks: the controller labels a claim allocated the driver's
// devices with binding conditions with their node, and stops cleanly.
func TestRunMarks(t *testing.T) {
	const driver = "sim.example.com"
	cs := fake.NewClientset(&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "r", Driver: driver, Pool: "n1/sim", Device: "sim-0",
				BindingConditions: []string{driver + "/prepared"}}}}}}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var stderr syncBuffer
	go func() {
		done <- run(ctx, nil, envOf(map[string]string{"DRIVER_NAME": driver}), &stderr, func(string) (kubernetes.Interface, error) { return cs, nil })
	}()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := cs.ResourceV1().ResourceClaims("ns").Get(context.Background(), "c", metav1.GetOptions{})
		if err == nil && c.Labels[bindmarker.NodeLabel(driver)] == "n1" {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("claim not labelled within 10s (%v); log:\n%s", err, stderr.String())
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d; log:\n%s", code, stderr.String())
	}
}

// syncBuffer is a goroutine-safe log sink (testutil.SyncBuffer).
type syncBuffer = testutil.SyncBuffer
