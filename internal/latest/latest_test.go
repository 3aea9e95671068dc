package latest

import "testing"

func TestSend(t *testing.T) {
	ch := make(chan int, 1)
	for i := 1; i <= 5; i++ {
		Send(ch, i)
	}
	if v := <-ch; v != 5 {
		t.Fatalf("got %d, want the latest", v)
	}
	select {
	case v := <-ch:
		t.Fatalf("a second value %d", v)
	default:
	}
}
