// Package command is what the two commands, cdi-device-plugin and
// cdi-dra-driver, do alike around their parts: load the configuration,
// answering -h and --version and refusing a bad one, and sweep the temp
// files that writes killed mid-way left.
package command

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/sirupsen/logrus"

	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/atomicfile"
)

// Load loads the configuration of the command cmd, with its own flags
// (config.LoadWith), and answers what ends the command before it starts:
// -h (config writes the usage to stderr) and --version (the name and
// version) with exit status 0, a bad configuration (the name and the
// error) with 2. cfg is nil when the command is to exit with status exit.
func Load(cmd config.Command, version string, args []string, env config.Env, stderr io.Writer, extra ...config.Extra) (cfg *config.Config, exit int) {
	cfg, err := config.LoadWith(cmd, args, env, stderr, extra...)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return nil, 0
	case errors.Is(err, config.ErrVersion):
		fmt.Fprintln(stderr, cmd, version)
		return nil, 0
	case err != nil:
		fmt.Fprintln(stderr, string(cmd)+":", err)
		return nil, 2
	}
	return cfg, 0
}

// SweepTemps removes the temp files that runs killed mid-write left in
// our directories (spec, nodes, registries, device state, checkpoint):
// those matching patterns that are not of this process
// (atomicfile.RemoveStaleTemps). It logs each file removed, and a failure
// as a warning. A command runs it beside its resources, after their
// start-up work.
func SweepTemps(patterns []string, log *logrus.Entry) {
	for _, pattern := range patterns {
		removed, err := atomicfile.RemoveStaleTemps(pattern)
		for _, p := range removed {
			log.WithField("file", p).Info("removed a temp file of an interrupted write")
		}
		if err != nil {
			log.WithError(err).Warn("removing temp files of interrupted writes")
		}
	}
}

// Exiting says why the command stops with err: logged at error, and,
// where the log level drops that (fatal or panic, which the logging
// library accepts and neither command logs at), written to stderr as the
// configuration errors are, so that the process never ends with a status
// and not a line.
func Exiting(log *logrus.Entry, err error, stderr io.Writer) {
	if log.Logger.IsLevelEnabled(logrus.ErrorLevel) {
		log.WithError(err).Error("exiting")
		return
	}
	fmt.Fprintln(stderr, "exiting:", err)
}
