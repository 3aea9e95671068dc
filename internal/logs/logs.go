// Package logs holds the one default logger of the packages that take an
// injected *logrus.Entry (when none is given, nothing is logged), and the
// commands' log level and format as config names them.
package logs

import (
	"io"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
)

// Discard returns an entry that logs nothing.
func Discard() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.SetLevel(logrus.PanicLevel)
	return logrus.NewEntry(l)
}

// New returns a command's logger: it writes to out at the configuration's
// level and in its format.
func New(out io.Writer, cfg *config.Config) *logrus.Logger {
	l := logrus.New()
	l.SetOutput(out)
	Apply(l, cfg)
	return l
}

// Apply sets l's level and format to the configuration's (at start, and
// again on a reload).
func Apply(l *logrus.Logger, cfg *config.Config) {
	l.SetLevel(Level(cfg.Level))
	l.SetFormatter(Formatter(cfg.LogFormat))
}

// Formatter is the logrus formatter of a log format.
func Formatter(f config.LogFormat) logrus.Formatter {
	if f == config.LogJSON {
		return &logrus.JSONFormatter{TimestampFormat: time.RFC3339Nano}
	}
	return &logrus.TextFormatter{FullTimestamp: true, TimestampFormat: time.RFC3339Nano}
}

// Level maps config's level onto logrus's; config.Load accepts no other.
func Level(l config.Level) logrus.Level {
	switch l {
	case config.LevelTrace:
		return logrus.TraceLevel
	case config.LevelDebug:
		return logrus.DebugLevel
	case config.LevelWarn:
		return logrus.WarnLevel
	case config.LevelError:
		return logrus.ErrorLevel
	case config.LevelFatal:
		return logrus.FatalLevel
	case config.LevelPanic:
		return logrus.PanicLevel
	default:
		return logrus.InfoLevel
	}
}
