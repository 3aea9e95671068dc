package main

import (
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
)

// TestLogLevel checks that every level config accepts sets the logrus
// level of the same name.
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
			if got := logLevel(l); got != want {
				t.Fatalf("logLevel(%q) = %v, want %v", l, got, want)
			}
		})
	}
}
