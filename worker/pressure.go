package worker

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shardpool/shardpool/stream"
)

// running is a shard whose command runs, for the pressure response.
type running struct {
	key     string
	run, id string
	class   string
	attempt int
	started time.Time
	preempt chan struct{}
	once    sync.Once
	why     string
	// halted is set, before preempt closes, where the run was halted
	// with its running commands stopped (halts.go), not preempted.
	halted bool
	// pid is the command's once it started; under w.mu. The worker's
	// report lists it (stream.Command).
	pid int
}

// stop stops r's command: preempted for why or, with halted, for its
// run's halt (halts.go). It reports whether this call stopped it (not a
// preemption or halt before).
func (r *running) stop(why string, halted bool) bool {
	stopped := false
	r.once.Do(func() {
		r.why, r.halted, stopped = why, halted, true
		close(r.preempt)
	})
	return stopped
}

// addRunning notes r's command as running. Where its run was halted with
// its running commands stopped, r is stopped at once: the caller starts
// no command (its preempt channel is closed).
func (w *Worker) addRunning(r *running) {
	w.noteIn(w.active, r)
}

// noteIn adds r to m (w.active or w.preparing, under w.mu) and stops it
// at once where its run was halted with its commands stopped (stopRun
// stops those already in either).
func (w *Worker) noteIn(m map[string]*running, r *running) {
	w.mu.Lock()
	m[r.key] = r
	why := w.haltedNow[r.run]
	w.mu.Unlock()
	if why != "" {
		r.stop(why, true)
	}
}

// commandStarted returns an onStart hook that notes the pid of r's
// command for the worker's report, then calls next.
func (w *Worker) commandStarted(r *running, next func(int) func()) func(int) func() {
	return func(pgid int) func() {
		w.mu.Lock()
		r.pid = pgid
		w.mu.Unlock()
		w.reportSoon()
		return next(pgid)
	}
}

// commands are the shards' commands running now, the longest running
// first, for the worker's report; under w.mu.
func (w *Worker) commands() []stream.Command {
	var cs []stream.Command
	for _, r := range w.active {
		if r.pid > 0 {
			cs = append(cs, stream.Command{Key: r.key, Attempt: r.attempt, PID: r.pid, Start: r.started.UTC()})
		}
	}
	slices.SortFunc(cs, func(a, b stream.Command) int {
		return cmp.Or(a.Start.Compare(b.Start), cmp.Compare(a.Key, b.Key))
	})
	return cs[:min(len(cs), stream.MaxReportedCommands)]
}

func (w *Worker) removeRunning(key string) {
	w.mu.Lock()
	delete(w.active, key)
	w.mu.Unlock()
}

// critical reports whether the host is under critical memory pressure now.
func (w *Worker) isCritical() (bool, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.critical != "", w.critical
}

// watchPressure checks memory every PressureEvery on a timer. Critical
// means headroom below CriticalHeadroom or memory PSI "full" avg10 above
// PressureFull. While critical, admission fetches nothing; when it stays
// critical for CriticalFor checks, the youngest running shard gets SIGTERM
// (it can checkpoint) and goes back to the queue with the reason. Further
// preemptions wait twice as long each time, up to 8 times, so one burst
// does not empty the host.
func (w *Worker) watchPressure(ctx context.Context) error {
	t := time.NewTimer(w.cfg.PressureEvery)
	defer t.Stop()
	streak, backoff := 0, w.cfg.CriticalFor
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		t.Reset(w.cfg.PressureEvery)
		why := w.pressure(ctx)
		w.mu.Lock()
		changed := w.critical != why
		w.critical = why
		w.mu.Unlock()
		if changed && why != "" {
			w.hostLog("*", "pressure", why+": not fetching")
		}
		if why == "" {
			streak, backoff = 0, w.cfg.CriticalFor
			continue
		}
		streak++
		if streak < backoff {
			continue
		}
		if y := w.youngest(); y != nil {
			msg := fmt.Sprintf("%s for %d checks: SIGTERM to the youngest shard %s (started %s ago) so it can checkpoint", why, streak, y.id, time.Since(y.started).Round(time.Millisecond))
			w.hostLog(y.class, "preempt", msg)
			w.admission(y.run, y.id, y.class, "preempt", msg)
			y.stop("memory pressure: "+why, false)
		}
		streak, backoff = 0, min(backoff*2, w.cfg.CriticalFor*8)
	}
}

func (w *Worker) youngest() *running {
	w.mu.Lock()
	defer w.mu.Unlock()
	var y *running
	for _, r := range w.active {
		if y == nil || r.started.After(y.started) {
			y = r
		}
	}
	return y
}

// pressure returns why memory is critical, or "".
func (w *Worker) pressure(ctx context.Context) string {
	snap, err := w.cfg.Probe.Snapshot(ctx, nil)
	if err != nil {
		return ""
	}
	if ps := snap.PSI.MemoryFull10; ps.Unknown == "" && ps.F > w.cfg.PressureFull {
		return fmt.Sprintf("memory pressure full avg10 %.1f%% > %.0f%%", ps.F, w.cfg.PressureFull)
	}
	if cg := snap.Cgroups; cg.MemoryLimit.IsKnown() && cg.WorkingSet.IsKnown() {
		if h := cg.MemoryLimit.N - cg.WorkingSet.N; h < w.cfg.CriticalHeadroom {
			return fmt.Sprintf("cgroup %s headroom %s < %s", cg.MemoryBinds, stream.FormatSize(h), stream.FormatSize(w.cfg.CriticalHeadroom))
		}
	}
	if m := snap.Host.MemAvailable; m.IsKnown() && m.N < w.cfg.CriticalHeadroom {
		return fmt.Sprintf("MemAvailable %s < %s", stream.FormatSize(m.N), stream.FormatSize(w.cfg.CriticalHeadroom))
	}
	return ""
}
