package dra

import (
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/utils/clock"

	"github.com/cdi-device-plugin/cdi-device-plugin/cdi"
	"github.com/cdi-device-plugin/cdi-device-plugin/internal/logs"
	"github.com/cdi-device-plugin/cdi-device-plugin/metrics"
)

// Defaults of Options.
const (
	// DefaultPollInterval is how often the kubelet's PodResources is asked
	// while a handover guard is up.
	DefaultPollInterval = 2 * time.Second
	// DefaultFirstPublishHold bounds the wait of the first publish for a
	// handover guard the first look could not resolve.
	DefaultFirstPublishHold = 30 * time.Second
	// DefaultHealthResend is how often the device health is sent to the
	// kubelet when nothing changed: within the kubelet's 30 s, after which
	// it takes the health for unknown.
	DefaultHealthResend = 10 * time.Second
	// DefaultCleanupInterval is how often the checkpointed claims are
	// looked up in the API (see Options.CleanupGrace).
	DefaultCleanupInterval = time.Minute
	// DefaultCleanupGrace is how long a checkpointed claim must be gone
	// from the API before it is dropped and its devices released.
	DefaultCleanupGrace = 5 * time.Minute
)

// Options configure the driver.
type Options struct {
	// DriverName names the driver (CheckDriverName); NodeName the node,
	// which starts the name of every resource's pool (PoolName).
	DriverName, NodeName string
	Client               kubernetes.Interface
	// StatusClient (default Client) writes the claims' status.devices
	// (status.go). Give it a client of its own: a client's requests share
	// one client-side rate limit, and the status writes must not hold up
	// the kubelet plugin helper's reads of the claims it is asked to
	// prepare.
	StatusClient resourceclient.ResourceV1Interface
	// CleanupClient (default Client) reads the checkpointed claims for
	// the stale-claim clean-up (cleanup.go): a pass reads every prepared
	// claim, and through the helper's client it would spend the
	// client-side rate limit that the claim reads of NodePrepareResources
	// wait on. Give it a client of its own.
	CleanupClient resourceclient.ResourceV1Interface
	// RegistrarDir is the kubelet's plugin registry directory, PluginDir
	// the driver's own directory (dra.sock).
	RegistrarDir, PluginDir string
	// Writer writes the per-claim specs.
	Writer     *cdi.Writer
	Checkpoint *Checkpoint
	// PodResources is the kubelet's PodResources socket.
	PodResources string
	// BootID is the kernel's boot ID: a claim prepared in another boot is
	// prepared again.
	BootID    string
	Resources []Resource
	Log       *logrus.Entry
	// Metrics, when set, counts the spec writes, and gets the driver's own
	// series (metrics.DRA).
	Metrics *metrics.Metrics
	// PollInterval (default DefaultPollInterval), HealthResend (default
	// DefaultHealthResend).
	PollInterval, HealthResend time.Duration
	// PublishInterval (default DefaultPublishInterval) is the least time
	// between two ResourceSlice publishes after the first (coalescer).
	PublishInterval time.Duration
	// FirstPublishHold (default DefaultFirstPublishHold) is how long the
	// first publish waits for a handover guard that the first look could
	// not resolve (sliceLoop.run).
	FirstPublishHold time.Duration
	// CleanupInterval (default DefaultCleanupInterval) is how often the
	// checkpointed claims are looked up in the API; a claim gone (not
	// found, or its name taken by another UID) for CleanupGrace (default
	// DefaultCleanupGrace) is dropped and its devices released, as
	// Unprepare would. Clock (default the real one) times both.
	CleanupInterval, CleanupGrace time.Duration
	Clock                         clock.WithTicker
	// CleanupSpread (default 0: none) delays the clean-up's first pass by
	// a random time up to it after the driver serves (spreadDelay); the
	// command sets DefaultCleanupInterval.
	CleanupSpread time.Duration
	// NoDeviceStatus: the claims' status.devices is not written
	// (--device-status=false): one API write less per prepared claim,
	// which a large fleet's API server may want more than the status.
	NoDeviceStatus bool
	// DeviceMetadata: the helper writes each prepared claim's device
	// metadata (KEP-5304) for its containers (metadataFiles).
	DeviceMetadata bool
	// RollingUpdateUID, when set, is the UID of the driver's pod (POD_UID,
	// from the downward API): a new instance of the driver may then start
	// and serve beside the old one during a rollout (rolling.go). The
	// kubelet must support it (1.33 and later).
	RollingUpdateUID types.UID
}

// setDefaults gives the options left unset their defaults.
func (o *Options) setDefaults() {
	if o.Log == nil {
		o.Log = logs.Discard()
	}
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.HealthResend <= 0 {
		o.HealthResend = DefaultHealthResend
	}
	if o.CleanupInterval <= 0 {
		o.CleanupInterval = DefaultCleanupInterval
	}
	if o.CleanupGrace <= 0 {
		o.CleanupGrace = DefaultCleanupGrace
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.PublishInterval <= 0 {
		o.PublishInterval = DefaultPublishInterval
	}
	if o.FirstPublishHold <= 0 {
		o.FirstPublishHold = DefaultFirstPublishHold
	}
	if o.StatusClient == nil {
		o.StatusClient = o.Client.ResourceV1()
	}
	if o.CleanupClient == nil {
		o.CleanupClient = o.Client.ResourceV1()
	}
}
