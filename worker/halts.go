package worker

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/stream"
)

// Runs halted with `shardpool halt --now` (stream.RunRecord.HaltStop):
// the halt takes the run's queued messages off the queue, and every
// worker stops the commands it runs for the run, as memory pressure
// preempts one (SIGTERM, then SIGKILL after the grace period), and hands
// their shards back uncharged: they are held with the rest until the run
// is submitted again.

// watchRuns follows the run records (the current ones first, then
// every change) until ctx ends: for halts that stop running commands
// (stopRun), and, where the worker looks at the runs (discovery of
// classes, their peaks), to tell that loop of a run that changed in a
// way it cares about (runsNews; runChanged). One watch of the bucket
// for both: each worker had two, each update decoded twice. A watch
// that ends (its coordinator restarted, the connection lost for long) is
// set up again: the records it then delivers first include any halt
// written meanwhile.
func (w *Worker) watchRuns(ctx context.Context) error {
	for ctx.Err() == nil {
		if rw, err := w.b.Runs.WatchAll(ctx); err == nil {
			w.followRuns(ctx, rw.Updates())
			stream.StopWatch(rw)
		} else if ctx.Err() == nil {
			w.log.Debug("watch runs; again in a moment (new runs are seen every report period meanwhile)", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(haltWatchAgain):
		}
	}
	return nil
}

// haltWatchAgain is how long watchRuns waits before it sets up a watch
// that ended or could not be set up.
const haltWatchAgain = time.Second

// followRuns notes each run record of updates (stopRun, runsNews) until
// the channel closes or ctx ends.
func (w *Worker) followRuns(ctx context.Context, updates <-chan jetstream.KeyValueEntry) {
	seen := map[string]string{}
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-updates:
			if !ok {
				return
			}
			if e == nil {
				continue // the end of the records there were
			}
			var rec *stream.RunRecord
			if e.Operation() == jetstream.KeyValuePut {
				var r stream.RunRecord
				if stream.Decode(e.Value(), &r) == nil {
					rec = &r
				}
			}
			if runChanged(seen, e.Key(), e.Operation(), rec) {
				select {
				case w.runsNews <- struct{}{}:
				default: // one pending is enough: refreshPeaks reads them all
				}
			}
			switch {
			case e.Operation() != jetstream.KeyValuePut:
				w.stopRun(e.Key(), "") // forgotten
			case rec != nil:
				why := ""
				if rec.HaltStop && rec.Halted != "" {
					why = "stopped: the run was " + rec.Halted
				}
				w.stopRun(rec.Name, why)
			}
		}
	}
}

// stopRun notes why run's commands are stopped now (why empty: they are
// not, or no longer) and stops those running, and those that start
// while it stands (addRunning).
func (w *Worker) stopRun(run, why string) {
	w.mu.Lock()
	if why == "" {
		delete(w.haltedNow, run)
		w.mu.Unlock()
		return
	}
	w.haltedNow[run] = why
	var stop, prep []*running
	for _, r := range w.active {
		if r.run == run {
			stop = append(stop, r)
		}
	}
	for _, r := range w.preparing {
		if r.run == run {
			prep = append(prep, r)
		}
	}
	w.mu.Unlock()
	for _, r := range stop {
		// Each rewrite of the halted run's record comes here again:
		// one line for the command, when it is stopped.
		if r.stop(why, true) {
			w.admission(r.run, r.id, r.class, "halt", "SIGTERM to its command: "+why)
		}
	}
	for _, r := range prep {
		if r.stop(why, true) {
			w.admission(r.run, r.id, r.class, "halt", "staging of its inputs (or its wait for scratch space) ended: "+why)
		}
	}
}

// addPreparing notes r's shard as staging its inputs or waiting for
// scratch space, before its command, until the returned func is called.
// A halt --now of its run (stopRun, or one standing already) stops r:
// the copy or the wait ends at once, and the command is not started.
// What it copied is kept for the shard's next attempt, as after the
// worker's own stop (staging's keepInterrupted).
func (w *Worker) addPreparing(r *running) (done func()) {
	w.noteIn(w.preparing, r)
	return func() {
		w.mu.Lock()
		delete(w.preparing, r.key)
		w.mu.Unlock()
	}
}
