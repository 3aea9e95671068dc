// Command cdi-dra-controller runs once in a cluster beside the DRA
// driver's DaemonSet: it labels each ResourceClaim allocated devices of
// the driver with binding conditions (resources with prepareBeforeBind)
// with the node of those devices, so that each node's driver, which
// watches only the claims of its node's label, prepares them before the
// scheduler binds their pods (package bindmarker).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/sirupsen/logrus"
	"k8s.io/client-go/kubernetes"

	"github.com/cdi-device-plugin/cdi-device-plugin/bindmarker"
	"github.com/cdi-device-plugin/cdi-device-plugin/config"
	"github.com/cdi-device-plugin/cdi-device-plugin/dra"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/command"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/kubeclient"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
)

var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.LookupEnv, os.Stderr, kubeclient.New)
	stop()
	os.Exit(code)
}

// run runs the marker until ctx is done and returns the exit status: 0 on
// a clean shutdown and for -h and --version, 2 for a bad flag or
// variable, 1 for any other failure.
func run(ctx context.Context, args []string, env config.Env, stderr io.Writer, client func(string) (kubernetes.Interface, error)) int {
	fs := flag.NewFlagSet("cdi-dra-controller", flag.ContinueOnError)
	fs.SetOutput(stderr)
	get := func(k string) string { v, _ := env(k); return v }
	driver := fs.String("driver-name", get("DRIVER_NAME"), "the DRA driver's name (DRIVER_NAME): the claims allocated its devices with binding conditions are labelled <driver>/prepare-node=<node>")
	kubeconfig := fs.String("kubeconfig", get("KUBECONFIG"), "kubeconfig file (KUBECONFIG; default: the in-cluster configuration)")
	level := fs.String("log-level", or(get("LOG_LEVEL"), "info"), "log level (LOG_LEVEL): trace, debug, info, warn, error")
	format := fs.String("log-format", or(get("LOG_FORMAT"), "text"), "log format (LOG_FORMAT): text or json")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stderr, "cdi-dra-controller", version)
		return 0
	}
	bad := func(err error) int {
		fmt.Fprintln(stderr, "cdi-dra-controller:", err)
		return 2
	}
	if err := dra.CheckDriverName("driver-name", *driver); err != nil {
		return bad(err)
	}
	lvl, err := config.ParseLevel(*level)
	if err != nil {
		return bad(err)
	}
	lf, err := config.ParseLogFormat(*format)
	if err != nil {
		return bad(err)
	}
	cs, err := client(*kubeconfig)
	if err != nil {
		return bad(&config.FieldError{Field: "kubeconfig", Value: *kubeconfig, Reason: "no API client (empty: the in-cluster configuration): " + err.Error()})
	}
	logger := logrus.New()
	logger.SetOutput(stderr)
	logger.SetLevel(logs.Level(lvl))
	logger.SetFormatter(logs.Formatter(lf))
	log := logrus.NewEntry(logger).WithField("driver", *driver)
	if err := (&bindmarker.Marker{Client: cs, Driver: *driver, Log: log}).Run(ctx); err != nil {
		command.Exiting(log, err, stderr)
		return 1
	}
	log.Info("shut down cleanly")
	return 0
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
