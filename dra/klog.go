package dra

import (
	"fmt"

	"github.com/go-logr/logr"
	"github.com/sirupsen/logrus"
)

// Logger is a logr.Logger (what klog and the kubeletplugin and
// resourceslice packages log through) that writes to log: klog's V(0) at
// info, V(1)-V(4) at debug, above at trace; key/value pairs become fields.
func Logger(log *logrus.Entry) logr.Logger { return logr.New(logrusSink{e: log}) }

type logrusSink struct {
	e    *logrus.Entry
	name string
}

func level(v int) logrus.Level {
	switch {
	case v <= 0:
		return logrus.InfoLevel
	case v <= 4:
		return logrus.DebugLevel
	}
	return logrus.TraceLevel
}

func (logrusSink) Init(logr.RuntimeInfo) {}

func (s logrusSink) Enabled(v int) bool { return s.e.Logger.IsLevelEnabled(level(v)) }

func (s logrusSink) Info(v int, msg string, kv ...any) { s.with(kv).Log(level(v), msg) }

func (s logrusSink) Error(err error, msg string, kv ...any) { s.with(kv).WithError(err).Error(msg) }

func (s logrusSink) WithValues(kv ...any) logr.LogSink {
	return logrusSink{e: s.with(kv), name: s.name}
}

func (s logrusSink) WithName(name string) logr.LogSink {
	if s.name != "" {
		name = s.name + "/" + name
	}
	return logrusSink{e: s.e.WithField("logger", name), name: name}
}

func (s logrusSink) with(kv []any) *logrus.Entry {
	if len(kv) == 0 {
		return s.e
	}
	f := logrus.Fields{}
	for i := 0; i+1 < len(kv); i += 2 {
		f[fmt.Sprint(kv[i])] = kv[i+1]
	}
	return s.e.WithFields(f)
}
