package worker

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/shardpool/shardpool/stream"
)

// A host that lacks what a job needs (a library, a driver, a mount the
// command reads by itself) fails each shard as soon as its command
// starts, faster than healthy hosts run theirs: it takes shard after
// shard from the queue and spends their retries. From this worker alone
// that looks like a broken job. The shards' own records tell the two
// apart: the ones that failed here and were then validated by other
// workers, and how often those workers failed them.
//
// The judgement is a test against chance. Were the fault the job's, each
// attempt would fail with about the rate the other workers met on the
// same shards; a streak of L failures here then has probability p^L, and
// somewhere among this worker's n attempts about n·p^L. p is taken at its
// 95% upper bound from the other workers' attempts on the streak's shards
// (Clopper-Pearson), so a few lucky attempts elsewhere do not condemn a
// host running a flaky job. The worker stops once n·p^L < loneChance,
// with at least loneStreak failures in a row and loneValidated of their
// shards validated elsewhere. Simulated (TestJudgementUnderChance), 1e-4
// stopped no worker of a job failing 30 to 90% of its attempts
// everywhere in 1,000 runs of 10,000 attempts each, where 0.01 stopped 9
// to 14 per 1,000 at 50 and 70%; a host failing every attempt stops
// after 10 (14 after 100,000 validated attempts).
const (
	loneStreak    = 5
	loneValidated = 3
	loneChance    = 1e-4
	// loneKeys bounds the shards of a streak kept for the judgement: the
	// most recent ones.
	loneKeys = 64
)

// loneEvidence is what the records of a streak's shards say.
type loneEvidence struct {
	Streak    int // charged attempts that failed here in a row
	Here      int // charged attempts this worker ran, for the chance of a streak somewhere
	Validated int // the streak's shards validated by another worker since
	Others    int // attempts of other workers at those shards that ended
	OthersBad int // those that failed
}

// hostFault reports whether the streak is too long for chance, given how
// the other workers fared on the same shards.
func (e loneEvidence) hostFault() bool {
	if e.Streak < loneStreak || e.Validated < loneValidated {
		return false
	}
	p := failureUpper(e.OthersBad, e.Others)
	return float64(max(e.Here, 1))*math.Pow(p, float64(e.Streak)) < loneChance
}

// failureUpper is the 95% upper confidence bound of a failure rate from
// bad failures in n attempts (Clopper-Pearson): the rate at which so few
// failures have a 5% chance.
func failureUpper(bad, n int) float64 {
	if n <= 0 || bad >= n {
		return 1
	}
	lo, hi := 0.0, 1.0
	for range 40 {
		p := (lo + hi) / 2
		if binomialCDF(bad, n, p) > 0.05 {
			lo = p
		} else {
			hi = p
		}
	}
	return hi
}

// binomialCDF is P(X <= k) for X ~ Binomial(n, p), 0 < p < 1, term by
// term from P(X = 0), each the last times (n-i)/(i+1) · p/(1-p). In logs:
// (1-p)^n underflows for a few hundred attempts, and every later term
// with it, where the terms near k still count.
func binomialCDF(k, n int, p float64) float64 {
	lt := float64(n) * math.Log1p(-p)
	sum, lodds := math.Exp(lt), math.Log(p)-math.Log1p(-p)
	for i := 0; i < k; i++ {
		lt += math.Log(float64(n-i)) - math.Log(float64(i+1)) + lodds
		sum += math.Exp(lt)
	}
	return sum
}

// gatherLone counts what other workers did with the streak's shards
// (their records): the shards they validated, and their attempts that
// ended, failed or not. me is this worker's name: an earlier process
// under it is this worker too.
func gatherLone(recs []stream.ShardRecord, me string) (validated, others, bad int) {
	for i := range recs {
		rec := &recs[i]
		for _, at := range rec.Attempts {
			if at.Worker == me {
				continue
			}
			switch at.Outcome {
			case "", stream.OutcomeInterrupted, stream.OutcomePreempted, stream.OutcomeDiscarded, stream.OutcomeLeaseLost:
				// Running still, or ended by no fault of the job's.
				continue
			case stream.OutcomeOK:
				if rec.State == stream.ShardValidated {
					validated++
				}
			default:
				bad++
			}
			others++
		}
	}
	return validated, others, bad
}

// addToStreak adds the shard key of a failure here to the streak, under mu.
func (w *Worker) addToStreak(key string) {
	if i := slices.Index(w.streakKeys, key); i >= 0 {
		w.streakKeys = slices.Delete(w.streakKeys, i, i+1)
	}
	if len(w.streakKeys) == loneKeys {
		w.streakKeys = slices.Delete(w.streakKeys, 0, 1)
	}
	w.streakKeys = append(w.streakKeys, key)
}

// loneHoldMax bounds a hold: evidence from peers whose shards run for
// hours may never come in time, and a host held in error must serve
// again.
const loneHoldMax = 5 * time.Minute

// holdLone starts a hold, under mu, when the streak has reached the next
// hold and a healthy peer can run its shards: the worker fetches nothing
// while the other workers' outcomes on those shards come in, rather than
// take more of the queue and spend its retries. A failure here starts it
// at once; watchLone ends it (or stops the worker).
func (w *Worker) holdLone(now time.Time) holdOutcome {
	if !w.cfg.StopWhenFailingAlone || !w.loneSince.IsZero() || w.failedInARow < max(w.loneNext, loneStreak) {
		return holdNotDue
	}
	peer := w.healthyPeer(w.streakClass)
	if peer == "" {
		return holdNoPeer
	}
	w.loneSince = now
	w.loneWhy = fmt.Sprintf("its last %d attempts failed here while worker %s runs shards: not fetching while the failed shards run elsewhere, to tell a fault of host %s from the job's (at most %s)",
		w.failedInARow, peer, w.host, loneHoldMax)
	return holdStarted
}

// holdOutcome is what holdLone did.
type holdOutcome int

const (
	holdNotDue holdOutcome = iota // switched off, held already, or the streak is short of the next hold
	holdNoPeer                    // due, but no healthy peer is known
	holdStarted
)

// healthyPeer names a live worker that serves class and has not failed
// loneStreak attempts in a row itself, under mu; "" when there is none.
// A peer serving other classes only would never run the streak's shards,
// nor would one that drains or stops (leaving): a hold waiting for it
// would last its whole loneHoldMax.
func (w *Worker) healthyPeer(class string) string {
	for _, p := range w.peers {
		if p.FailedInARow < loneStreak && servesClass(p, class) && !leaving(p) {
			return p.Name
		}
	}
	return ""
}

// leaving reports whether the worker of report p fetches no more: it
// drains or stops, and exits once its shards have settled.
func leaving(p stream.WorkerReport) bool {
	return p.Draining != "" || p.Stopping != ""
}

// servesClass reports whether the worker of report p takes shards of
// class: it admits by measurement, gives every class slots as it
// appears, or has slots of that class.
func servesClass(p stream.WorkerReport, class string) bool {
	return p.Auto || p.SlotsEach > 0 || p.Slots[class] > 0
}

// fetchHeld is why the worker holds its fetches (holdLone, or start
// failures no other worker is spared: noteStart), or "" when it does not.
func (w *Worker) fetchHeld() string {
	if why := w.loneHeld(); why != "" {
		return why
	}
	return w.outageHeld()
}

// loneHeld is why the worker holds its fetches (holdLone), or "".
func (w *Worker) loneHeld() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.loneWhy
}

// releaseLone ends a hold, under mu: the next one may start loneStreak
// failures later.
func (w *Worker) releaseLone() {
	if w.loneSince.IsZero() {
		return
	}
	w.loneSince, w.loneWhy = time.Time{}, ""
	w.loneNext = w.failedInARow + loneStreak
}

// watchLone judges the worker's streak of failures every period while it
// lasts: it stops the worker (StopWhenFailingAlone) once hostFault says
// the host is at fault, and ends a hold once the evidence cannot come or
// points at the job (a peer failed one of the shards too). The evidence
// arrives as other workers run the streak's shards, after their retry
// delays.
func (w *Worker) watchLone(ctx context.Context, every time.Duration) error {
	for now := range w.ticks(ctx, every) {
		w.mu.Lock()
		streak, here, gen := w.failedInARow, w.chargedHere, w.streakGen
		keys := slices.Clone(w.streakKeys)
		w.mu.Unlock()
		if streak < loneStreak {
			continue
		}
		recs := make([]stream.ShardRecord, 0, len(keys))
		pending := 0
		for _, key := range keys {
			rec, _, err := w.readShard(ctx, key)
			if err != nil {
				continue // removed (forget), or the store is away: judged without it
			}
			if rec.State != stream.ShardValidated && rec.State != stream.ShardFailed {
				pending++
			}
			recs = append(recs, rec)
		}
		e := loneEvidence{Streak: streak, Here: here}
		e.Validated, e.Others, e.OthersBad = gatherLone(recs, w.cfg.Name)
		w.refreshPeers(ctx)
		w.mu.Lock()
		if w.streakGen != gen {
			w.mu.Unlock()
			continue // a shard was validated here meanwhile
		}
		if e.hostFault() {
			last := w.lastFailure
			w.mu.Unlock()
			w.stopSelf(fmt.Sprintf("its last %d attempts failed on host %s (the last: %s), while other workers validated %d of those shards, failing %d of their %d attempts at them: "+
				"the fault is likely the host's (a library, a driver, a mount the command needs), so it stopped fetching rather than fail more of the queue here",
				e.Streak, w.host, last, e.Validated, e.OthersBad, e.Others))
			return nil
		}
		held := !w.loneSince.IsZero()
		var ended string
		switch {
		case !held:
			if pending > 0 && e.OthersBad == 0 {
				w.holdLone(now)
			}
		case e.OthersBad > 0:
			ended = fmt.Sprintf("other workers failed %d of their %d attempts at the shards that failed here: the job's fault as much as the host's", e.OthersBad, e.Others)
		case pending == 0:
			ended = fmt.Sprintf("the shards that failed here have ended (%d validated elsewhere), too few to judge the host", e.Validated)
		case w.healthyPeer(w.streakClass) == "":
			ended = "no other worker serving class " + w.streakClass + " runs shards without failing"
		case now.Sub(w.loneSince) >= loneHoldMax:
			ended = fmt.Sprintf("held %s, the most a hold lasts", loneHoldMax)
		}
		if ended != "" {
			w.releaseLone()
		}
		w.mu.Unlock()
		// A hold is logged as the fetch loops' wait; its end here.
		if ended != "" {
			w.hostLog("*", "resume", "fetching again: "+ended)
			w.wakeAll()
		}
	}
	return nil
}

// stopSelf drains the worker for a fault of its host, once: Failed says
// why afterwards.
func (w *Worker) stopSelf(why string) {
	w.mu.Lock()
	first := w.stopped == ""
	if first {
		w.stopped = why
	}
	w.mu.Unlock()
	if first {
		w.log.Error("worker stops", "why", why)
		w.Drain(why)
	}
}
