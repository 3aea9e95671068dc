// Package logs holds the one default logger of the packages that take an
// injected *logrus.Entry: when none is given, nothing is logged.
package logs

import (
	"io"

	"github.com/sirupsen/logrus"
)

// Discard returns an entry that logs nothing.
func Discard() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.SetLevel(logrus.PanicLevel)
	return logrus.NewEntry(l)
}
