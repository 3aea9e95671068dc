package inotify

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// next receives one batch or fails after a second.
func next(t *testing.T, s *Stream) []Event {
	t.Helper()
	select {
	case evs, ok := <-s.Events():
		if !ok {
			t.Fatalf("stream ended: %v", s.Err())
		}
		return evs
	case <-time.After(time.Second):
		t.Fatal("no events within 1s")
		return nil
	}
}

func TestStream(t *testing.T) {
	dir := t.TempDir()
	t.Run("events of each watched dir", func(t *testing.T) {
		other := t.TempDir()
		s, err := Watch(context.Background(), EntryChanges, dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Add(other); err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{dir, other} {
			if err := os.WriteFile(filepath.Join(d, "f"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			evs := next(t, s)
			if evs[0].Dir != d || evs[0].Name != "f" || evs[0].Mask&unix.IN_CREATE == 0 {
				t.Fatalf("got %+v, want the creation of %s/f", evs, d)
			}
		}
	})
	t.Run("no IN_MODIFY flood", func(t *testing.T) {
		s, err := Watch(context.Background(), EntryChanges, dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		f, err := os.OpenFile(filepath.Join(dir, "g"), os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		next(t, s) // its creation
		for range 100 {
			if _, err := f.WriteString("x"); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Remove(filepath.Join(dir, "g")); err != nil {
			t.Fatal(err)
		}
		evs := next(t, s)
		if len(evs) != 1 || evs[0].Mask&unix.IN_DELETE == 0 {
			t.Fatalf("after 100 writes and a removal got %+v, want the removal alone", evs)
		}
	})
	t.Run("cancel ends the stream and joins the reader", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := Watch(ctx, EntryChanges, dir)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		select {
		case _, ok := <-s.Events():
			if ok {
				t.Fatal("events after cancel")
			}
		case <-time.After(time.Second):
			t.Fatal("Events not closed within 1s of cancel")
		}
		if err := s.Err(); err != nil {
			t.Fatalf("Err after cancel: %v", err)
		}
		s.Close() // idempotent after the end
	})
	t.Run("close while a batch waits for its receiver", func(t *testing.T) {
		s, err := Watch(context.Background(), EntryChanges, dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "h"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // the reader holds the batch
		done := make(chan struct{})
		go func() { s.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Second):
			t.Fatal("Close blocked on an untaken batch")
		}
	})
	t.Run("a removed dir is forgotten and can be watched again", func(t *testing.T) {
		sub := filepath.Join(t.TempDir(), "sub")
		if err := os.Mkdir(sub, 0o700); err != nil {
			t.Fatal(err)
		}
		s, err := Watch(context.Background(), EntryChanges, sub)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := os.Remove(sub); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Second)
		for s.Watching(sub) {
			if time.Now().After(deadline) {
				t.Fatal("still watching a removed dir")
			}
			next(t, s)
		}
		if err := os.Mkdir(sub, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := s.Add(sub); err != nil || !s.Watching(sub) {
			t.Fatalf("watch again: %v", err)
		}
	})
	t.Run("a burst bigger than one read arrives whole and in order", func(t *testing.T) {
		burst := t.TempDir()
		s, err := Watch(context.Background(), EntryChanges, burst)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		// 200 creations of 200-byte names: 43 KiB of events, more than
		// one read of the reader's buffer takes.
		const n = 200
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("%03d-%s", i, strings.Repeat("x", 196))
			if err := os.WriteFile(filepath.Join(burst, names[i]), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		for len(got) < n {
			for _, ev := range next(t, s) {
				if ev.Mask&unix.IN_CREATE != 0 {
					got = append(got, ev.Name)
				}
			}
		}
		for i := range names {
			if got[i] != names[i] {
				t.Fatalf("creation %d: got %q, want %q", i, got[i], names[i])
			}
		}
	})
	t.Run("a missing dir is an error", func(t *testing.T) {
		if _, err := Watch(context.Background(), EntryChanges, filepath.Join(dir, "none")); err == nil {
			t.Fatal("no error")
		}
	})
}

// stackBytes is the memory the runtime holds for goroutine stacks.
func stackBytes() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/stacks:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// TestStreamStack: a stream's reader keeps a small stack. Its read buffer
// on the stack (64 KiB) made every reader's stack 128 KiB, for the life
// of the process: 8 MiB for the 64 streams here.
func TestStreamStack(t *testing.T) {
	dir := t.TempDir()
	const streams = 64
	before := stackBytes()
	ss := make([]*Stream, streams)
	for i := range ss {
		s, err := Watch(context.Background(), EntryChanges, dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		ss[i] = s
	}
	// Every reader has read once, its stack as deep as reading takes it.
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		next(t, s)
	}
	grown := stackBytes() - before
	if limit := int64(streams * 32 << 10); grown > limit {
		t.Fatalf("%d streams hold %d KiB more of stacks, want at most %d KiB (32 KiB each)", streams, grown>>10, limit>>10)
	}
	t.Logf("%d streams: %d KiB of stacks", streams, grown>>10)
}
