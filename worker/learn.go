package worker

import (
	"fmt"
	"maps"
	"strings"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// Learned peaks: admission reserves per shard the peak its run declares
// or its profile measured. A shard seen to hold well more than that (a
// profile whose samples missed the largest shards, a declared memory
// that was a guess) raises what this worker reserves for the run's class
// to the largest peak seen, for the shards it admits from then on and
// for the growth of those still running. Only upward, for the same job
// (fingerprint). Two sources: this worker's own shards, sampled while
// they run and measured at their end (at once), and the run record's
// PeaksSeen, which the coordinator keeps from every worker's recorded
// attempts (seconds later, for the whole fleet, and kept across
// restarts of workers and coordinator).
// A learned peak above the host's memory budget counts as the budget: a
// shard that ran here, measured as a sum of RSS that may count shared
// pages more than once, must not leave its class no slot for good.

// learnedPrefix begins the source of a learned peak.
const learnedPrefix = "learned"

// learnedPeak is the largest peak seen of a run's class, where it went
// well above the run's own figure.
type learnedPeak struct {
	fp     string
	bytes  int64
	source string
	// logged is the learned peak admission.log last announced: a rise by
	// a quarter more is announced again, not every sample's few KiB.
	logged int64
}

// runBase is an active run of a class and the peak its record gives the
// class (declared or measured), which learning compares with.
type runBase struct {
	run, fp string
	memory  int64
	source  string
	// seen is the largest peak the run's record gives of the class's
	// attempts (PeaksSeen).
	seen stream.PeakSeen
}

// learnPeak records got, a peak of shard id of run (fingerprint fp) and
// class, measured at the end of its attempt, and says so where it changed
// what admission reserves (learnLocked).
func (w *Worker) learnPeak(run, fp, class, id string, got int64) {
	w.mu.Lock()
	news := w.learnLocked(run, fp, class, id, got)
	w.mu.Unlock()
	w.sayLearned(news)
}

// learnedNews is a learned peak for admission.log (learnLocked); a zero
// value says nothing.
type learnedNews struct{ run, class, id, msg string }

// learnLocked records got, a peak of shard id of run (fingerprint fp) and
// class, measured at the end of its attempt or sampled while it runs. It
// changes what admission reserves only where got is well above the run's
// own figure for the class, or above what was learned already; what it
// returns is for sayLearned, after w.mu is let go. Under w.mu.
func (w *Worker) learnLocked(run, fp, class, id string, got int64) learnedNews {
	var base *runBase
	for i, b := range w.classRuns[class] {
		if b.run == run && b.fp == fp {
			base = &w.classRuns[class][i]
			break
		}
	}
	key := runClass{run, class}
	l, had := w.learned[key]
	if had && l.fp != fp {
		l, had = learnedPeak{}, false
	}
	if base == nil || got <= l.bytes || (!had && !plan.WellAbove(got, base.memory)) {
		return learnedNews{}
	}
	l.fp, l.bytes, l.source = fp, got, learnedSource(id, *base)
	announce := l.logged == 0 || got > l.logged+l.logged/4
	if announce {
		l.logged = got
	}
	w.learned[key] = l
	if p, ok := w.peaks[class]; ok && got > p.Memory {
		// A new map: refreshPeaks reads the one it made after handing
		// it over, outside the lock.
		p.Memory, p.Source = got, l.source
		peaks := maps.Clone(w.peaks)
		peaks[class] = p
		w.peaks = peaks
	}
	if !announce || !w.cfg.Auto {
		return learnedNews{}
	}
	return learnedNews{run: run, class: class, id: id,
		msg: fmt.Sprintf("admission on this worker reserves %s per shard of the class from now on (%s); the other workers learn it from the run record once the attempt is recorded", stream.FormatSize(got), l.source)}
}

// sayLearned writes a learned peak to the run's and the host's
// admission.log.
func (w *Worker) sayLearned(n learnedNews) {
	if n.msg == "" {
		return
	}
	w.admission(n.run, n.id, n.class, "peak-learned", n.msg)
	w.hostLog(n.class, "peak-learned", "run "+n.run+": "+n.msg)
}

// applyLearned raises the peaks refreshPeaks found, per class, to what
// was learned for its active runs, keeps the runs for learnPeak, and
// forgets what was learned for runs no longer active or of another job.
// Under w.mu.
func (w *Worker) applyLearned(peaks map[string]plan.Peak, runs map[string][]runBase) {
	active := map[runClass]string{}
	for class, bs := range runs {
		for _, b := range bs {
			k := runClass{b.run, class}
			active[k] = b.fp
			// What the fleet's recorded attempts reached: learned as if
			// seen here, without a line of its own (each decision's peak
			// names it), as this worker did not see it happen.
			l := w.learned[k]
			if l.fp != b.fp {
				l = learnedPeak{}
			}
			if plan.WellAbove(b.seen.Bytes, b.memory) && b.seen.Bytes > l.bytes {
				if w.learned == nil {
					w.learned = map[runClass]learnedPeak{}
				}
				w.learned[k] = learnedPeak{fp: b.fp, bytes: b.seen.Bytes, source: learnedSource(b.seen.Shard, b), logged: max(l.logged, b.seen.Bytes)}
			}
		}
	}
	for k, l := range w.learned {
		if fp, ok := active[k]; !ok || fp != l.fp {
			delete(w.learned, k)
			continue
		}
		if p := peaks[k.class]; l.bytes > p.Memory {
			p.Memory, p.Source = l.bytes, l.source
			peaks[k.class] = p
		}
	}
	w.classRuns = runs
}

// livePeak is the peak the growth estimate reserves for a running shard:
// its class's when it started, or what was learned of its run's class
// since, where that is more. Under w.mu.
func (w *Worker) livePeak(s liveShard) int64 {
	if l, ok := w.learned[runClass{s.run, s.class}]; ok && l.fp == s.fp && l.bytes > s.peak {
		return l.bytes
	}
	return s.peak
}

// learnedAbove says whether peak is a learned one above a known memory
// budget b.
func learnedAbove(peak plan.Peak, b probe.Value) bool {
	return strings.HasPrefix(peak.Source, learnedPrefix) && b.IsKnown() && peak.Memory > b.N
}

// learnedSource says where a learned peak comes from, as admission's
// decisions name it.
func learnedSource(shard string, base runBase) string {
	return fmt.Sprintf("%s from shard %s, above the %s %s", learnedPrefix, shard, stream.FormatSize(base.memory), base.source)
}
