package claimqueue

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// call is one sync: the key, and whether the claim was there.
type call struct {
	key     types.NamespacedName
	present bool
}

func claim(name string, labels map[string]string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels}}
}

// TestQueue runs a queue against a fake API server: wanted claims reach
// sync as they are, deleted ones as nil, a failed sync is tried again, a
// key Started adds is worked on, and Run returns once ctx is done.
func TestQueue(t *testing.T) {
	client := fake.NewClientset(claim("wanted", nil), claim("unwanted", map[string]string{"skip": "yes"}))
	var mu sync.Mutex
	var calls []call
	var failed []types.NamespacedName
	fails := 1
	q := Queue{
		Client: client, Name: "test",
		Want: func(c *resourceapi.ResourceClaim) bool { return c.Labels["skip"] == "" },
		Sync: func(_ context.Context, key types.NamespacedName, c *resourceapi.ResourceClaim) error {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, call{key, c != nil})
			if key.Name == "flaky" && fails > 0 {
				fails--
				return errors.New("not yet")
			}
			return nil
		},
		Started: func(add func(types.NamespacedName)) {
			add(types.NamespacedName{Namespace: "ns", Name: "from-checkpoint"})
		},
		Failed: func(key types.NamespacedName, _ error) {
			mu.Lock()
			defer mu.Unlock()
			failed = append(failed, key)
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()

	seen := func(want call) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range calls {
			if c == want {
				return true
			}
		}
		return false
	}
	wait := func(want call) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !seen(want) {
			if time.Now().After(deadline) {
				mu.Lock()
				got := append([]call(nil), calls...)
				mu.Unlock()
				t.Fatalf("no sync %+v; syncs: %+v", want, got)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	key := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: name} }

	wait(call{key("wanted"), true})
	wait(call{key("from-checkpoint"), false})
	if _, err := client.ResourceV1().ResourceClaims("ns").Create(ctx, claim("flaky", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(call{key("flaky"), true})
	if err := client.ResourceV1().ResourceClaims("ns").Delete(ctx, "wanted", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(call{key("wanted"), false})
	// The failed sync of flaky is tried again: two syncs of it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := 0
		for _, c := range calls {
			if c.key == key("flaky") {
				n++
			}
		}
		mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("flaky synced %d times, want 2", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen := seenKey(calls, key("unwanted")); seen {
		t.Errorf("unwanted claim synced: %+v", calls)
	}
	if len(failed) != 1 || failed[0] != key("flaky") {
		t.Errorf("failed = %v, want [ns/flaky]", failed)
	}
}

func seenKey(calls []call, key types.NamespacedName) bool {
	for _, c := range calls {
		if c.key == key {
			return true
		}
	}
	return false
}

// TestQueueLabelSelector: only the claims the selector picks are watched.
func TestQueueLabelSelector(t *testing.T) {
	client := fake.NewClientset(claim("mine", map[string]string{"node": "a"}), claim("theirs", map[string]string{"node": "b"}))
	synced := make(chan types.NamespacedName, 4)
	q := Queue{Client: client, Name: "test", LabelSelector: "node=a",
		Sync: func(_ context.Context, key types.NamespacedName, _ *resourceapi.ResourceClaim) error {
			synced <- key
			return nil
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()
	select {
	case k := <-synced:
		if k.Name != "mine" {
			t.Errorf("synced %v, want ns/mine", k)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing synced")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	close(synced)
	for k := range synced {
		t.Errorf("also synced %v", k)
	}
}
