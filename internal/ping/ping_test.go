package ping

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestAsk(t *testing.T) {
	for _, c := range []struct {
		name string
		// loop runs beside Ask on pings until stop is closed.
		loop func(pings chan chan struct{}, stop chan struct{})
		ok   bool
	}{
		{"a loop that closes the reply", func(pings chan chan struct{}, stop chan struct{}) {
			select {
			case r := <-pings:
				close(r)
			case <-stop:
			}
		}, true},
		{"a loop that takes no ping", func(_ chan chan struct{}, stop chan struct{}) { <-stop }, false},
		{"a loop that takes the ping but never answers", func(pings chan chan struct{}, stop chan struct{}) {
			select {
			case <-pings:
			case <-stop:
			}
			<-stop
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			pings, stop, done := make(chan chan struct{}), make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				c.loop(pings, stop)
			}()
			defer func() { close(stop); <-done }()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			err := Ask(ctx, pings, "the test loop")
			if c.ok != (err == nil) {
				t.Fatalf("Ask: %v, want ok %v", err, c.ok)
			}
			if err != nil && (!errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "the test loop does not answer: ")) {
				t.Errorf("Ask: %q, want the loop named and the context's error wrapped", err)
			}
		})
	}
}
