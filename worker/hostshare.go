package worker

import (
	"sort"
	"strings"
	"time"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/worker/probe"
)

// Worker glue of the host ledger (ledger.go): the budget a look at the
// host admits against, and what this worker holds, written at each
// admission decision and between them.

// sharedRecheck is how often a worker held back by the shared budget looks
// again: the other workers' shards end without a word to it.
const sharedRecheck = 100 * time.Millisecond

// budgetShare names the budget a snapshot admits against: a Slurm
// allocation, or the limiting cgroups (none: the host). Workers of equal
// share split one budget; workers of different shares have their own
// (an allocation or a limiting cgroup each).
func budgetShare(s *probe.Snapshot) string {
	if s.Slurm != nil && s.Slurm.JobID != "" {
		return "slurm " + s.Slurm.JobID
	}
	cg := s.Cgroups
	return strings.Join([]string{"memory " + orHost(cg.MemoryBinds), "cpu " + orHost(cg.CPUBinds), "cpuset " + orHost(cg.CpusetList)}, "; ")
}

func orHost(s string) string {
	if s == "" {
		return "host"
	}
	return s
}

// shareBegin locks the host ledger and returns what the host's other
// workers with snap's budget hold; without a ledger, nothing. Every
// shareBegin that returns no error is followed by shareCommit or
// shareAbort.
func (w *Worker) shareBegin(snap *probe.Snapshot) (others, error) {
	if w.ledger == nil {
		return others{}, nil
	}
	return w.ledger.begin(budgetShare(snap))
}

func (w *Worker) shareAbort() {
	if w.ledger != nil {
		w.ledger.abort()
	}
}

// shareCommit writes what this worker holds and unlocks the ledger.
func (w *Worker) shareCommit(h Hold) error {
	if w.ledger == nil {
		return nil
	}
	return w.ledger.commit(h)
}

// publishFixed writes what a worker with fixed slots holds once k more
// shards of class are fetched: it reads nothing, but the auto workers of
// the host count its shards. locked: the caller left the ledger locked
// (fixedGPUs), and this write unlocks it.
func (w *Worker) publishFixed(class string, k int, locked bool) {
	if w.ledger == nil {
		return
	}
	peak, _, _ := w.peakFor(class)
	h := w.holding(class, k, peak, 0)
	// Memory: the whole peak of each shard not started yet. What running
	// shards may still grow by would take a scan of /proc per decision,
	// which the fixed-slots path does not pay; they count as grown.
	w.mu.Lock()
	var running int64
	for _, s := range w.live {
		running += s.peak
	}
	w.mu.Unlock()
	h.Memory = max(w.inflightMemory()-running, 0) + int64(k)*peak.Memory
	var err error
	if locked {
		err = w.ledger.commit(h)
	} else {
		err = w.ledger.publish(w.fixedShare, h)
	}
	if err != nil {
		w.log.Warn("host ledger", "err", err)
	}
}

// shareCommitHeld writes what this worker holds after a change of its
// GPU reservations (between shareBegin and now), and unlocks the ledger.
func (w *Worker) shareCommitHeld() error {
	if w.ledger == nil {
		return nil
	}
	return w.ledger.recommit(w.holding("", 0, plan.Peak{}, w.ledger.last.Memory))
}

// holding is what this worker's shards in flight hold once k more of
// class (peak) are fetched, with memory the growth still to come as the
// caller computed it.
func (w *Worker) holding(class string, k int, peak plan.Peak, memory int64) Hold {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := Hold{Memory: memory, CPU: int64(k) * peak.CPU}
	gpus := int64(k) * peak.GPUs
	for c, g := range w.gates {
		p := w.peaks[c]
		if c == class {
			p = peak
		}
		n := int64(g.count())
		h.CPU += n * p.CPU
		gpus += n * p.GPUs
	}
	for u := range w.gpuRes {
		h.GPUs = append(h.GPUs, u)
	}
	sort.Strings(h.GPUs)
	h.GPUPending = max(gpus-int64(len(h.GPUs)), 0)
	return h
}

// refreshHold writes what this worker holds now without an admission
// decision (they stop while nothing is queued): shards that ended since
// the last decision give back their CPU and GPUs, and their memory down to
// the whole peaks of the shards still in flight.
func (w *Worker) refreshHold() {
	if w.ledger == nil {
		return
	}
	w.ledger.mu.Lock()
	share := w.ledger.me.Share
	w.ledger.mu.Unlock()
	if _, err := w.ledger.begin(share); err != nil {
		return
	}
	// The last hold is read under the lock begin took: a decision may
	// have written one since.
	h := w.holding("", 0, plan.Peak{}, 0)
	h.Memory = min(w.ledger.last.Memory, w.inflightMemory())
	if err := w.ledger.recommit(h); err != nil {
		w.log.Warn("host ledger", "err", err)
	}
}

// withoutGPUs drops from free the devices in held (held by the host's
// other workers), and from total those it dropped.
func withoutGPUs(free []probe.GPU, total int, held []string) ([]probe.GPU, int) {
	if len(held) == 0 {
		return free, total
	}
	theirs := make(map[string]bool, len(held))
	for _, u := range held {
		theirs[u] = true
	}
	out := free[:0:0]
	for _, d := range free {
		if theirs[d.UUID] {
			total--
			continue
		}
		out = append(out, d)
	}
	return out, total
}
