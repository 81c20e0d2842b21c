package worker

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/shardpool/shardpool/stream"
)

// exitWhenIdle drains the worker once it has had nothing to run for
// IdleExit (no shard holding a slot, none delivered since, no hold), and
// no shard of its classes is out that it stays for (keeping).
func (w *Worker) exitWhenIdle(ctx context.Context) error {
	var unread time.Time // since when the queue could not be read
	kept := ""
	for range w.ticks(ctx, min(max(w.cfg.IdleExit/4, 10*time.Millisecond), time.Second)) {
		// A held worker (holdLone, or start failures no other worker is
		// spared) is not idle: it stops, or fetches again, once the
		// evidence is in or the wait is over.
		if w.Running() > 0 || w.fetchHeld() != "" {
			w.busyTill(time.Now())
			w.keep(nil)
			kept = ""
			continue
		}
		idle := time.Since(time.Unix(0, w.busyAt.Load()))
		if idle < w.cfg.IdleExit {
			continue
		}
		why, classes, err := w.keeping(ctx)
		switch {
		case err != nil:
			// Unknown is not empty: look again, but not for ever. A
			// worker that cannot reach the queue for a while cannot run
			// what comes back on it either, and its node is better
			// released than held to the time limit.
			if unread.IsZero() {
				unread = time.Now()
				w.log.Warn("idle, but the queue cannot be read: looking again before leaving", "err", err)
			}
			if time.Since(unread) < max(w.cfg.IdleExit, idleUnread) {
				continue
			}
			w.Drain(fmt.Sprintf("no shard to run for %s: --idle-exit (the queue could not be read for %s: %v)", idle.Round(time.Second), time.Since(unread).Round(time.Second), err))
			return nil
		case len(classes) > 0:
			unread = time.Time{}
			w.keep(classes)
			if why != kept {
				w.log.Info("idle, but staying", "why", why)
				w.hostLog("*", "keep", why)
				kept = why
			}
			continue
		}
		w.Drain(fmt.Sprintf("no shard to run for %s: --idle-exit", idle.Round(time.Second)))
		return nil
	}
	return nil
}

// idleUnread is how long an idle worker goes on looking at a queue it
// cannot read before it leaves anyway (exitWhenIdle), at the least.
const idleUnread = time.Minute

// keeping lists the classes this idle worker stays for, and says why, or
// none when it may leave. A shard delivered and not yet settled (its
// consumer's ack pending) may come back: its command fails and waits out
// a retry's delay, or its worker dies and the lease runs out. Were every
// idle worker to leave meanwhile, nothing would run it, and the run would
// stay RUNNING with no worker (a batch allocation whose jobs all ended).
// So an idle worker serving the class stays while any is out, unless
// another says it stays for them (keptBy). A worker running shards does
// not count, whatever its report says: it may be the one that dies.
func (w *Worker) keeping(ctx context.Context) (string, []string, error) {
	w.mu.Lock()
	classes := slices.Sorted(maps.Keys(w.gates))
	w.mu.Unlock()
	var kept, whys []string
	for _, class := range classes {
		c, err := w.cfg.JetStream.Consumer(ctx, stream.StreamShards, class)
		if err != nil {
			return "", nil, fmt.Errorf("class %s: %w", class, err)
		}
		out := c.CachedInfo().NumAckPending
		if out == 0 {
			continue
		}
		w.mu.Lock()
		stale := time.Since(w.peersAt) >= time.Second
		w.mu.Unlock()
		if stale && w.b != nil {
			w.refreshPeers(ctx)
		}
		w.mu.Lock()
		by := keptBy(w.cfg.Name, w.peers, class)
		w.mu.Unlock()
		if by != "" {
			continue
		}
		kept = append(kept, class)
		whys = append(whys, fmt.Sprintf("%d shard(s) of class %s", out, class))
	}
	if len(kept) == 0 {
		return "", nil, nil
	}
	return fmt.Sprintf("idle past --idle-exit, but %s are out (running on a worker, or due back after a retry's delay or a dead worker's lease), "+
		"and no other worker stays for them: staying until they settle", strings.Join(whys, " and ")), kept, nil
}

// keptBy names the live peer that stays for class's shards out
// (keeping), or "": one serving the class, not draining, that runs
// nothing and serves until it is stopped (Stays: it has no --idle-exit,
// and holds no fetches), or whose report says it stays for them
// (Keeping) and whose name sorts before self's. One that serves until
// stopped but runs shards is not counted on: it may be the one that
// dies. So a fleet of workers that serve until stopped, joined by a
// batch job's workers with --idle-exit, keeps none of the job's (its
// nodes would be held for the tail that the fleet runs) while one of
// the fleet is idle. Two workers that start to stay at once see each
// other's word and the one whose name sorts last leaves. A report lags
// what its worker does by up to reportGap: a late word only keeps a
// worker longer than it had to, but one that serves until stopped and
// started a shard a moment ago still looks idle.
func keptBy(self string, peers []stream.WorkerReport, class string) string {
	for _, p := range peers {
		if leaving(p) || !servesClass(p, class) {
			continue
		}
		if (p.Stays && sum(p.Running) == 0) || (p.Name < self && slices.Contains(p.Keeping, class)) {
			return p.Name
		}
	}
	return ""
}

// keep sets the classes this worker says it stays for (reports'
// Keeping), and sends a report at once when they change.
func (w *Worker) keep(classes []string) {
	w.mu.Lock()
	same := slices.Equal(w.keepFor, classes)
	w.keepFor = classes
	w.mu.Unlock()
	if !same {
		w.reportSoon()
	}
}

// sum adds the values of m.
func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
