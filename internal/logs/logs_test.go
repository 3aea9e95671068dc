package logs

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
)

// TestLogLevel checks that every level config accepts sets the logrus
// level of the same name, at start (New) and on a reload (Apply).
func TestLogLevel(t *testing.T) {
	for _, l := range []config.Level{
		config.LevelTrace, config.LevelDebug, config.LevelInfo, config.LevelWarn,
		config.LevelError, config.LevelFatal, config.LevelPanic,
	} {
		t.Run(string(l), func(t *testing.T) {
			want, err := logrus.ParseLevel(string(l))
			if err != nil {
				t.Fatal(err)
			}
			if got := Level(l); got != want {
				t.Fatalf("Level(%q) = %v, want %v", l, got, want)
			}
			if got := New(&bytes.Buffer{}, &config.Config{Level: l}).GetLevel(); got != want {
				t.Fatalf("New at %q: level %v, want %v", l, got, want)
			}
			lg := New(&bytes.Buffer{}, &config.Config{Level: config.LevelInfo})
			Apply(lg, &config.Config{Level: l})
			if got := lg.GetLevel(); got != want {
				t.Fatalf("Apply of %q: level %v, want %v", l, got, want)
			}
		})
	}
}

// TestFormat: New writes in the configured format to the output given,
// and Apply switches it.
func TestFormat(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf, &config.Config{Level: config.LevelInfo, LogFormat: config.LogJSON})
	l.Info("hello")
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil || m["msg"] != "hello" {
		t.Fatalf("JSON format wrote %q (%v)", buf.String(), err)
	}
	buf.Reset()
	Apply(l, &config.Config{Level: config.LevelInfo, LogFormat: config.LogText})
	l.Info("hello")
	if json.Valid(buf.Bytes()) || !bytes.Contains(buf.Bytes(), []byte("msg=hello")) {
		t.Fatalf("text format wrote %q", buf.String())
	}
}
