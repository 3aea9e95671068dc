package config

import (
	"errors"
	"go/parser"
	"go/token"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLogLevelSpellings pins the log levels Load accepts: the spellings
// logrus.ParseLevel took before config owned its Level, in any case.
func TestLogLevelSpellings(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Level
	}{
		{"trace", LevelTrace},
		{"debug", LevelDebug},
		{"", LevelInfo},
		{"info", LevelInfo},
		{"INFO", LevelInfo},
		{"warn", LevelWarn},
		{"Warning", LevelWarn},
		{"error", LevelError},
		{"fatal", LevelFatal},
		{"panic", LevelPanic},
	} {
		t.Run(tc.in, func(t *testing.T) {
			args := []string{}
			if tc.in != "" {
				args = append(args, "--log-level", tc.in)
			}
			cfg, err := Load(args, envOf(nil), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Level != tc.want || cfg.Level.String() != string(tc.want) {
				t.Fatalf("level %q, want %q", cfg.Level, tc.want)
			}
		})
	}
	for _, bad := range []string{"loud", "warnings", " info", "0"} {
		t.Run("refused/"+bad, func(t *testing.T) {
			_, err := Load([]string{"--log-level", bad}, envOf(nil), io.Discard)
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrInvalid) || fe.Field != "log-level" || fe.Value != bad {
				t.Fatalf("err %v, want a log-level FieldError for %q", err, bad)
			}
		})
	}
}

// TestNoLoggingLibrary keeps config a leaf that does not hand the logging
// library's types to its callers.
func TestNoLoggingLibrary(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == "github.com/sirupsen/logrus" {
				t.Errorf("%s imports %s", f, p)
			}
		}
	}
}
