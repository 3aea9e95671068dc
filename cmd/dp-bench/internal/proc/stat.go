package proc

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Stats is what /proc says of a process at one moment.
type Stats struct {
	CPU      time.Duration // on-CPU time of all its threads (schedstat)
	Switches int64         // voluntary context switches of all its threads: wake-ups
	RSS      int64         // resident set size, bytes
}

// Read sums the threads of pid. Threads that ended take their counts
// with them; Go rarely ends threads.
func Read(pid int) (Stats, error) {
	var s Stats
	base := fmt.Sprintf("/proc/%d", pid)
	tasks, err := os.ReadDir(base + "/task")
	if err != nil {
		return s, err
	}
	for _, t := range tasks {
		dir := base + "/task/" + t.Name()
		b, err := os.ReadFile(dir + "/schedstat")
		if err != nil {
			continue // the thread ended
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			ns, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return s, fmt.Errorf("%s/schedstat: %w", dir, err)
			}
			s.CPU += time.Duration(ns)
		}
		v, err := StatusField(dir+"/status", "voluntary_ctxt_switches:")
		if err == nil {
			s.Switches += v
		}
	}
	kb, err := StatusField(base+"/status", "VmRSS:")
	if err != nil {
		return s, err
	}
	s.RSS = kb << 10
	return s, nil
}

// StatusField reads the first number after name in a /proc status file
// (or /proc/meminfo).
func StatusField(path, name string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name); ok {
			fs := strings.Fields(rest)
			if len(fs) == 0 {
				break
			}
			return strconv.ParseInt(fs[0], 10, 64)
		}
	}
	return 0, errors.New(path + ": no " + name)
}
