// Package latest hands the newest value to a consumer that may be slower
// than its producer: what it has not taken yet is replaced.
package latest

// Send puts v on a channel of capacity >= 1, replacing a value the
// consumer has not taken yet; it never blocks. Only one goroutine may send.
func Send[T any](ch chan T, v T) {
	for {
		select {
		case ch <- v:
			return
		default:
		}
		// Full: drop the stale value (if the consumer takes it first, the
		// next send succeeds).
		select {
		case <-ch:
		default:
		}
	}
}
