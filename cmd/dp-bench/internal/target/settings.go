package target

import (
	"time"

	"golang.org/x/sys/unix"
)

// Settings bound and size one run.
type Settings struct {
	// Calls is the number of timed calls per RPC (p50 over them).
	Calls int
	// Idle is the window in which CPU and wake-ups are measured with no
	// kubelet activity (0: not measured).
	Idle time.Duration
	// Prompt bounds "at once": the first ListAndWatch list.
	Prompt time.Duration
	// Register bounds the first registration, Restart the one after a
	// kubelet restart, Change a ListAndWatch update after a device file
	// is removed or put back.
	Register, Restart, Change time.Duration
	// Settle is how long no further registration may arrive after the
	// one that followed a kubelet restart.
	Settle time.Duration
	// Connect bounds the kubelet's call to the endpoint during Register.
	Connect time.Duration
	// Term bounds the exit after SIGTERM.
	Term time.Duration
	// TmpfsDir holds the runs' DevDir and CDIDir ("": TMPDIR).
	TmpfsDir string
	// DRACalls is the number of claims per size a DRA driver prepares
	// (p50 over them).
	DRACalls int
	// APIInterval is the least time between two calls that make a DRA
	// driver read a claim from the API server: above the interval of
	// client-go's default limiter (5 a second), so that the limiter is
	// not what is timed.
	APIInterval time.Duration
}

// DefaultSettings suit a benchmark; tests shorten them.
func DefaultSettings() Settings {
	return Settings{Calls: 200, Idle: 10 * time.Second, Prompt: time.Second, Register: 30 * time.Second,
		Restart: 30 * time.Second, Change: 15 * time.Second, Settle: time.Second, Connect: 2 * time.Second, Term: 10 * time.Second,
		TmpfsDir: defaultTmpfsDir(), DRACalls: 20, APIInterval: 210 * time.Millisecond}
}

// defaultTmpfsDir is /dev/shm when it is a tmpfs, else "" (TMPDIR).
func defaultTmpfsDir() string {
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		return "/dev/shm"
	}
	return ""
}
