// Package ping asks a loop whether it still answers: the asker sends a
// reply channel on the loop's pings channel, and the loop, between its
// other work, closes it. A loop stuck in a blocking call takes no ping,
// so a liveness probe built on it tells a hung process from a busy one.
package ping

import (
	"context"
	"fmt"
)

// Ask sends a reply channel on pings and waits until the loop closes it,
// within ctx; loop names the loop in the error ("the spec loop").
func Ask(ctx context.Context, pings chan<- chan struct{}, loop string) error {
	reply := make(chan struct{})
	select {
	case pings <- reply:
	case <-ctx.Done():
		return fmt.Errorf("%s does not answer: %w", loop, ctx.Err())
	}
	select {
	case <-reply:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s does not answer: %w", loop, ctx.Err())
	}
}
