package worker

import (
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/shardpool/shardpool/worker/probe"
)

// oomKills is the host's OOM-kill counter from /proc/vmstat, or -1 when it
// cannot be read.
func oomKills(procRoot string) int64 {
	return keyedValue(filepath.Join(procRoot, "vmstat"), "oom_kill")
}

// keyedValue reads the number after key in a "key value" file (vmstat,
// memory.oom_control), or -1 when the file or the key cannot be read.
func keyedValue(path, key string) int64 {
	b, err := os.ReadFile(path)
	return keyedOf(b, err, key)
}

// keyedOf is the number after key in b, a "key value" file's content that
// its read returned with err, or -1.
func keyedOf(b []byte, err error, key string) int64 {
	if err != nil {
		return -1
	}
	n, found, err := probe.ParseKeyed(b, key)
	if !found || err != nil {
		return -1
	}
	return n
}

// oomBaselineAge is how old the OOM-kill count taken before a child starts
// may be. Generating /proc/vmstat costs the kernel tens of microseconds,
// measurable at a thousand short shards a second; one read per 100 ms is
// shared instead. The price: an OOM kill elsewhere on the host in the
// 100 ms before a start makes a later SIGKILL of that child count as an
// OOM kill, as one during its run already does.
const oomBaselineAge = 100 * time.Millisecond

// oomBaseline is the host's OOM-kill count, at most oomBaselineAge old.
func (w *Worker) oomBaseline() int64 {
	w.oomMu.Lock()
	defer w.oomMu.Unlock()
	if time.Since(w.oomAt) > oomBaselineAge {
		w.oomN, w.oomAt = oomKills(w.cfg.ProcRoot), time.Now()
	}
	return w.oomN
}

// pidAlive reports whether pid is a running process on this host
// (probe.PIDAlive: a zombie is not).
func pidAlive(pid int) bool { return probe.PIDAlive("/proc", pid) }

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// DefaultName is the worker name used when none is given: the host name
// with characters a KV key cannot hold replaced. In a Slurm job step it is
// HOST-jobJOBID (HOST-jobJOBID-STEP past the first step): the workers of
// two jobs that Slurm places on one node (a second `shardpool sbatch` for
// more workers, say) would otherwise share a name, and the second would
// stop at once, since a name is one live worker's. Its default scratch
// directory, named after it, is then the job's own too.
func DefaultName() string {
	h, _ := os.Hostname()
	return DefaultNameFor(h, os.Getenv("SLURM_JOB_ID"), os.Getenv("SLURM_STEP_ID"))
}

// DefaultNameFor is DefaultName on host, in Slurm job job ("" outside
// Slurm) and its step step.
func DefaultNameFor(host, job, step string) string {
	h := host
	if h == "" {
		h = "worker"
	}
	if job != "" {
		h += "-job" + job
		if step != "" && step != "0" {
			h += "-" + step
		}
	}
	n := unsafeName.ReplaceAllString(h, "-")
	if len(n) > 64 {
		n = n[len(n)-64:] // the job's part is what tells two workers of a node apart
	}
	return n
}
