package worker

import (
	"context"
	"fmt"
	"time"
)

// A worker whose process does not run for a while (stopped with Ctrl-Z or
// SIGSTOP, a Slurm job suspended, a VM paused, a host that starves it)
// renews no lease meanwhile. Its leases may expire and another worker take
// their shards; once it runs again its attempts of those shards are lost
// or their outputs discarded (the commit claim keeps a shard from being
// committed twice), and the coordinator's records say "did not report
// this attempt before its lease expired". Nothing said why: a worker
// stopped for 50 s and continued only logged that it took a lease back.
// So the worker watches its own clock: a tick of frozenTick that comes
// later than a heartbeat period (a third of the lease TTL, at least
// frozenMin) says the process did not run, and for how long.

// frozenTick is how often the watch ticks; frozenMin is the least
// lateness it reports.
const (
	frozenTick = time.Second
	frozenMin  = 2 * time.Second
)

// watchFrozen ticks until ctx ends and says so where a tick came late.
func (w *Worker) watchFrozen(ctx context.Context) error {
	t := time.NewTicker(frozenTick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := time.Now()
		w.noteFrozen(now.Sub(last) - frozenTick)
		last = now
	}
}

// noteFrozen reports a tick late by late, where that is more than a
// heartbeat period.
func (w *Worker) noteFrozen(late time.Duration) {
	if late < max(w.ttl/3, frozenMin) {
		return
	}
	d := late.Round(100 * time.Millisecond)
	detail := fmt.Sprintf("this worker's process did not run for %s (stopped with Ctrl-Z or SIGSTOP, a suspended job, a paused VM, or a host that starved it of CPU)", d)
	if late >= w.ttl {
		detail += fmt.Sprintf(": its leases (TTL %s) may have expired meanwhile; a shard another worker took since is not committed twice, and this worker's attempt of it is lost or its output discarded", w.ttl)
	} else {
		detail += fmt.Sprintf(": its leases (TTL %s) were not renewed meanwhile", w.ttl)
	}
	w.log.Warn(detail)
	w.hostLog("-", "not-running", detail)
}
