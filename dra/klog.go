package dra

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"github.com/sirupsen/logrus"
	"k8s.io/klog/v2"
)

// klog's process-wide logger is set once (klog.SetLogger writes globals
// that the goroutines of client-go and the DRA libraries read without a
// lock); it writes to the entry SetKlogLog stored last.
var (
	klogOnce sync.Once
	klogTo   atomic.Pointer[logrus.Entry]
)

// SetKlogLog makes klog's process-wide logger (what client-go and the
// libraries log through where no contextual logger reaches) write to log,
// as Logger does. The first call sets klog's logger; later ones (a second
// run in one process, as in tests) only change where it writes, so no
// library goroutine still running, or finished without a join the race
// detector can see, races with the change.
func SetKlogLog(log *logrus.Entry) {
	klogTo.Store(log)
	klogOnce.Do(func() { klog.SetLogger(logr.New(klogSink{})) })
}

// klogSink is a logrusSink over the entry SetKlogLog stored last.
type klogSink struct{}

func (klogSink) sink() logrusSink { return logrusSink{e: klogTo.Load()} }

func (klogSink) Init(logr.RuntimeInfo) {}

func (k klogSink) Enabled(v int) bool { return k.sink().Enabled(v) }

func (k klogSink) Info(v int, msg string, kv ...any) { k.sink().Info(v, msg, kv...) }

func (k klogSink) Error(err error, msg string, kv ...any) { k.sink().Error(err, msg, kv...) }

func (k klogSink) WithValues(kv ...any) logr.LogSink { return k.sink().WithValues(kv...) }

func (k klogSink) WithName(name string) logr.LogSink { return k.sink().WithName(name) }

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
