package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/shardpool/shardpool/stream"
)

// StopAfterStartFailures stops a worker whose host cannot start the
// commands (a mount it lacks, an output it cannot write), so that it does
// not fail the rest of the queue there. But the same failures on every
// host at once are no host's fault: a file server rebooting, an input
// directory moved away for a moment. A fleet that stopped itself then had
// no worker left when the files came back. So at the limit the worker
// looks at the other workers serving the class: one that has started a
// command since this worker's start failures began (its report's
// last_started) shows that the host is at fault, and the worker stops.
// Where none has, it holds its fetches for outageFirst, doubling up to
// outageMost, fetching again after each wait (its next attempt tells
// whether the cause has passed), and stops once it has held for
// outageMax in all.
const (
	outageFirst = 10 * time.Second
	outageMost  = 5 * time.Minute
	outageMax   = 15 * time.Minute
)

// noteStart counts an attempt's outcome toward StopAfterStartFailures: a
// start-error or stage-error (the command never ran) adds one, an attempt
// whose command ran (whatever its exit) starts the count over and ends an
// outage, and one handed back uncharged (interrupted, preempted, lease
// lost) leaves it as it is. At the limit the worker stops, or holds while
// no other worker starts shards either (above).
func (w *Worker) noteStart(ctx context.Context, class, outcome, reason string) {
	now := time.Now()
	switch outcome {
	case stream.OutcomeStart, stream.OutcomeStage:
	case stream.OutcomeInterrupted, stream.OutcomePreempted, stream.OutcomeLeaseLost:
		return
	default:
		w.startFails.Store(0)
		w.mu.Lock()
		ended := !w.outageSince.IsZero()
		w.outageSince, w.outageUntil, w.outageWait, w.outageWhy = time.Time{}, time.Time{}, 0, ""
		w.mu.Unlock()
		if ended {
			w.hostLog("*", "resume", "a command started here again: the start failures have passed")
		}
		return
	}
	n := w.startFails.Add(1)
	if n == 1 {
		w.mu.Lock()
		w.startStreakAt = now
		w.mu.Unlock()
	}
	if limit := w.cfg.StopAfterStartFailures; limit <= 0 || n < int64(limit) {
		return
	}
	if w.b != nil {
		w.refreshPeers(ctx)
	}
	w.mu.Lock()
	peer, stale := w.startingPeer(class)
	switch {
	case peer != "":
		w.mu.Unlock()
		w.stopSelf(fmt.Sprintf("the last %d attempts could not start their command on host %s (the last: %s), while worker %s started commands, so it stopped fetching rather than fail the rest of the queue here", n, w.host, reason, peer))
		return
	case !w.outageSince.IsZero() && now.Sub(w.outageSince) >= outageMax:
		since := w.outageSince
		w.mu.Unlock()
		w.stopSelf(fmt.Sprintf("the last %d attempts could not start their command on host %s (the last: %s), and no other worker serving class %s has started a command since %s (%s): "+
			"the cause has not passed, so it stopped fetching rather than hold its node longer", n, w.host, reason, class, since.Format(time.RFC3339), now.Sub(since).Round(time.Second)))
		return
	}
	if w.outageSince.IsZero() {
		w.outageSince = now
	}
	wait := min(max(2*w.outageWait, outageFirst), outageMost)
	why := "no other worker serving class " + class + " started a command meanwhile: something they all need (a file system, a service) may be away"
	if stale != "" {
		// Its report is from before this worker's start failures began:
		// wait for the next one, which says how it fares now.
		wait, why = min(wait, max(w.cfg.ReportEvery, time.Second)), "worker "+stale+" has not reported since these failures began"
	} else {
		w.outageWait = wait
	}
	w.outageUntil = now.Add(wait)
	w.outageWhy = fmt.Sprintf("the last %d attempts could not start their command on host %s (the last: %s), and %s: not fetching for %s, then trying again (it stops after %s of this)",
		n, w.host, reason, why, wait, outageMax)
	w.mu.Unlock()
	w.log.Warn("start failures: holding", "why", w.outageWhy)
	w.wakeAll()
	// The fetch loops look again when the hold ends, not up to a
	// recheck later: other wakes move their rechecks off its end.
	time.AfterFunc(wait, w.wakeAll)
}

// startingPeer names a live worker serving class that has started a
// command since this worker's start failures began. stale names one whose
// report is older than those failures: its next one may show a start.
// Under mu.
func (w *Worker) startingPeer(class string) (peer, stale string) {
	for _, p := range w.peers {
		if !servesClass(p, class) {
			continue
		}
		if p.LastStarted.After(w.startStreakAt) {
			return p.Name, ""
		}
		if !p.Reported.After(w.startStreakAt) {
			stale = p.Name
		}
	}
	return "", stale
}

// outageHeld is why the worker holds its fetches for start failures that
// no other worker is spared (noteStart), or "" when it does not.
func (w *Worker) outageHeld() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if time.Now().Before(w.outageUntil) {
		return w.outageWhy
	}
	return ""
}
