package coordinator

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unique"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/stream"
)

// shardInfo is what the tracker keeps of a shard's record: a coordinator
// holds one per shard of every run it tracks, so it keeps no more than it
// counts and writes to final.json, and shares the strings every shard of
// a run repeats (unique.Make).
type shardInfo struct {
	fp, state, reason, class string
	checksum                 string // of the committed output, if any
	files                    int
	bytes                    int64
	attempts, retry          int
	rev                      uint64 // the record's revision
	// took and peak are what the attempt that validated the shard took
	// (stream.ShardTimes.Validated); zero where none was timed.
	took time.Duration
	peak int64
}

type runInfo struct {
	ending Pace // how fast its shards end, for the record's pace
	// soFar is the timing of the shards validated before the verdict,
	// computed at soFarAt for the generation soFarFP with soFarN
	// validated; again once 10% more are validated, or timingEvery
	// later. Each is a pass over the run's shards and a sort: a run of
	// 100,000 shards makes about 120 of them, not one per record write.
	soFar   *stream.Timing
	soFarAt time.Time
	soFarFP string
	soFarN  int
	rec     stream.RunRecord
	rev     uint64
	known   bool
	shards  map[string]*shardInfo
	n       map[string]int            // records per state for the current fingerprint
	byClass map[string]map[string]int // the same, per class
	dirty   bool
	// retried is set when a shard entered a new retry round, or a halt
	// by hand arrived: the next flush writes the record even if state,
	// counts and reason came out the same, so that whoever requested the
	// retry sees a verdict newer than the request (see cmd/shardpool
	// waitRun), and whoever halted the run its counts as the shard
	// records have them (Halt).
	retried    bool
	verifiedFP string
	// acking is when the tracker first found every shard validated and
	// messages of the run still in the work queue, zero while it does
	// not: their workers acknowledge each one after its record
	// (worker.settleDurably), and the run is COMPLETE only once none is
	// left (see drained).
	acking    time.Time
	orphansAt time.Time // when drained last looked for messages no consumer will deliver
	evidence  string    // state the evidence was last written for
	// progress is what progress.json last said (zero before the first
	// look), written at progressAt; progressFailed is set while writing
	// it fails.
	progress       progressKey
	progressAt     time.Time
	progressFailed bool
	// purged is the HaltSeq of the halt whose messages this tracker took
	// off the queue (0: none yet since it started).
	purged uint64
	// forgotten is set when the run record was removed (`forget`): the
	// next record of the run reads its shard records from the store.
	// floor is the shard bucket's last revision at that read: watch
	// events up to it are in what was read, or were purged with the run.
	forgotten bool
	floor     uint64
	// peaks is, per class, the largest attempt peak of the shards of
	// generation peaksFP (notePeak), for the record's PeaksSeen.
	peaks   map[string]stream.PeakSeen
	peaksFP string
	// unleased holds, while the run is halted, its shards recorded
	// running that have had no lease since a look, with the revision of
	// their record and the time then (releaseUnleased).
	unleased map[string]unleased
}

// unleased is a shard of a halted run first found running without a
// lease at (at), its record at revision rev.
type unleased struct {
	rev uint64
	at  time.Time
}

// tracker keeps run state from shard records. Only its loop goroutine
// touches its fields.
type tracker struct {
	c    *Coordinator
	runs map[string]*runInfo
	adv  chan *nats.Msg
	// exhausted holds messages that ran out of deliveries and whose shard
	// could not be recorded failed yet (stream sequence -> deliveries).
	exhausted map[uint64]int
	// seen is the last shard record revision applied.
	seen uint64
	// live is set once the runs watch has replayed the store: a run
	// record after that is news (a submission), and is logged as such.
	live bool
}

func newTracker(c *Coordinator) *tracker {
	return &tracker{c: c, runs: map[string]*runInfo{}, adv: make(chan *nats.Msg, 256), exhausted: map[uint64]int{}}
}

// replayWait bounds the wait for the KV watches' end-of-replay markers.
const replayWait = 10 * time.Second

// flushEvery is how often the tracker writes what changed in the runs'
// records (their counts, their state): how far a record's counts may
// trail the shard records.
const flushEvery = 200 * time.Millisecond

func (t *tracker) run(ctx context.Context) error {
	b := t.c.b
	// The watches outlive ctx by the moment catchUp needs on stopping
	// (nats.go ends a watch when its context ends); StopWatch ends them.
	wctx, endWatches := context.WithCancel(context.WithoutCancel(ctx))
	defer endWatches()
	sw, err := b.Shards.WatchAll(wctx)
	if err != nil {
		return fmt.Errorf("tracker: watch shards: %w", err)
	}
	defer stream.StopWatch(sw)
	rw, err := b.Runs.WatchAll(wctx)
	if err != nil {
		return fmt.Errorf("tracker: watch runs: %w", err)
	}
	defer stream.StopWatch(rw)
	sub, err := t.c.nc.ChanSubscribe(stream.AdvisoryMaxDeliveries, t.adv)
	if err != nil {
		return fmt.Errorf("tracker: subscribe advisories: %w", err)
	}
	defer sub.Unsubscribe()
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	// Nothing is judged before both watches have delivered their initial
	// values (each ends them with a nil entry): a run judged from half a
	// replay could be written QUEUED or BLOCKED for a moment after a
	// restart, and whoever waits on the record would take that as news.
	// A watcher that could not count its initial values sends no marker;
	// past replayWait the tracker judges anyway rather than never.
	runsReplayed, shardsReplayed := false, false
	replayed := time.After(replayWait)
	var swept time.Time // the first tick sweeps: advisories sent before the subscription are lost
	var unleasedAt time.Time
	// again brings the next flush early while a run's last
	// acknowledgements are on their way (runInfo.acking).
	var again <-chan time.Time
	flush := func(ctx context.Context) {
		if runsReplayed && shardsReplayed {
			if t.flush(ctx, false) && again == nil {
				again = time.After(ackPoll)
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			if runsReplayed && shardsReplayed {
				t.catchUp(sw, time.Second)
				// What the run looked like when its coordinator stopped;
				// its record only in a moment where the store takes no
				// writes (full), not a request's whole timeout.
				fctx, cancel := context.Background(), context.CancelFunc(func() {})
				if t.c.StoreFull() != "" {
					fctx, cancel = context.WithTimeout(fctx, fullStoreWrite)
				}
				t.flush(fctx, true)
				cancel()
			}
			return ctx.Err()
		case e, ok := <-rw.Updates():
			if !ok {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("tracker: runs watch closed")
			}
			if e == nil {
				runsReplayed, t.live = true, true
				if shardsReplayed {
					t.sayWhatItHolds()
				}
				flush(ctx)
				continue
			}
			t.onRun(ctx, e)
		case e, ok := <-sw.Updates():
			if !ok {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("tracker: shards watch closed")
			}
			if e == nil {
				shardsReplayed = true
				if runsReplayed {
					t.sayWhatItHolds()
				}
				flush(ctx)
				continue
			}
			if t.onShard(e) {
				// The run's last shard settled: judge it now, not at the
				// next tick.
				flush(ctx)
			}
		case m := <-t.adv:
			t.onMaxDeliveries(ctx, m)
		case <-again:
			again = nil
			flush(ctx)
		case <-replayed:
			if !runsReplayed || !shardsReplayed {
				t.c.log.Warn("tracker: no end-of-replay marker from the KV watches; judging runs from what arrived", "after", replayWait)
				runsReplayed, shardsReplayed, t.live = true, true, true
				t.sayWhatItHolds()
			}
		case <-tick.C:
			if len(t.exhausted) > 0 {
				if s, err := t.c.js.Stream(ctx, stream.StreamShards); err == nil {
					for seq, n := range t.exhausted {
						if t.exhaust(ctx, s, seq, n) {
							delete(t.exhausted, seq)
						}
					}
				}
			}
			if time.Since(swept) >= sweepEvery {
				t.sweepExhausted(ctx)
				swept = time.Now()
			}
			if time.Since(unleasedAt) >= t.unleasedEvery() {
				t.releaseUnleased(ctx)
				unleasedAt = time.Now()
			}
			flush(ctx)
		}
	}
}

// fullStoreWrite bounds the last write of a stopping tracker whose store
// is full: it would wait out the request's whole timeout for an answer
// that does not come (`run` took 5 s more to stop).
const fullStoreWrite = 250 * time.Millisecond

// catchUp applies the shard records that were stored before it was
// called and that the watch has not delivered yet, waiting at most wait:
// a stopping `run` stops its worker first, and what the tracker then
// writes (the run record, progress.json) must count the worker's last
// records.
func (t *tracker) catchUp(sw jetstream.KeyWatcher, wait time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st, err := t.c.b.Shards.Status(ctx)
	if err != nil {
		return
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return
	}
	last := bs.StreamInfo().State.LastSeq
	for t.seen < last {
		select {
		case <-ctx.Done():
			t.c.log.Warn("tracker: stopping before the shard records' watch caught up", "stored", last)
			return
		case e, ok := <-sw.Updates():
			if !ok {
				return
			}
			if e == nil {
				continue
			}
			t.onShard(e)
		}
	}
}

func (t *tracker) info(run string) *runInfo {
	ri := t.runs[run]
	if ri == nil {
		ri = newRunInfo()
		t.runs[run] = ri
	}
	return ri
}

// newRunInfo is a run the tracker holds nothing of yet.
func newRunInfo() *runInfo {
	return &runInfo{shards: map[string]*shardInfo{}, n: map[string]int{}, byClass: map[string]map[string]int{}}
}

func (t *tracker) onRun(ctx context.Context, e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		// Forgotten: its shard records were purged from the store without
		// a watch event each. The two watches are not ordered between
		// them, so records of the run submitted again may have arrived
		// already; the next run record reads them afresh.
		was := t.runs[e.Key()]
		ri := newRunInfo()
		ri.forgotten = true
		t.runs[e.Key()] = ri
		if t.live {
			t.c.log.Info("run forgotten", "run", e.Key())
			if was != nil && was.known {
				t.noteForgotten(was.rec)
			}
		}
		return
	}
	var r stream.RunRecord
	if err := stream.Decode(e.Value(), &r); err != nil {
		t.c.log.Warn("skip undecodable run record", "run", e.Key(), "err", err)
		return
	}
	ri := t.info(r.Name)
	fpChanged := ri.rec.Fingerprint != r.Fingerprint
	if t.live {
		t.saySubmitted(ri, r, fpChanged)
	}
	if (r.HaltedBy != "" || r.HaltStop) && r.Halted != ri.rec.Halted {
		ri.retried = true
	}
	ri.rec, ri.rev, ri.known, ri.dirty = r, e.Revision(), true, true
	// The peaks the record has kept (this tracker's before a restart, or
	// another coordinator's) stand until its shards' records are read
	// again: a flush in between must not write them away.
	for class, p := range r.PeaksSeen {
		ri.notePeak(class, p.Shard, p.Bytes)
	}
	if fpChanged {
		ri.n, ri.byClass = map[string]int{}, map[string]map[string]int{}
		for _, si := range ri.shards {
			if si.fp == r.Fingerprint {
				ri.add(si, 1)
			}
		}
		ri.verifiedFP, ri.evidence = "", ""
		t.writeResume(ri, r.Resume)
	}
	if ri.forgotten {
		t.reload(ctx, r.Name, ri)
	}
}

// noteForgotten writes forgotten.json into the evidence folder of r, a
// run forgotten while this coordinator runs, where the folder is on this
// host: a forget from another host (`forget --server` on a laptop)
// cannot write it there, and without it the folder reads as a run still
// in the store (status --data), and as another job's to profile and
// plan. The watch delivers the removal before any later record of the
// name, so the progress.json of a run submitted again is newer.
func (t *tracker) noteForgotten(r stream.RunRecord) {
	f := Forgotten{Run: r.Name, Fingerprint: r.Fingerprint, State: r.State, Output: r.Spec.Output, Evidence: t.c.EvidenceDir(r.Name)}
	if err := WriteForgotten(f); err != nil {
		t.c.log.Warn("note the forget in the run's evidence", "run", r.Name, "file", ForgottenName, "err", err)
	}
}

// saySubmitted logs a submission the runs watch brings while the
// coordinator runs: a new run, a new generation of one, or a retry round
// of its failed shards. Its own writes (state and counts) and a
// resubmission that changes nothing are not news.
func (t *tracker) saySubmitted(ri *runInfo, r stream.RunRecord, fpChanged bool) {
	switch {
	case !ri.known || ri.forgotten:
		t.c.log.Info("run submitted", "run", r.Name, "fingerprint", r.Fingerprint, "shards", r.Counts.Total)
	case fpChanged:
		t.c.log.Info("run submitted: a new generation", "run", r.Name, "fingerprint", r.Fingerprint, "replaces", ri.rec.Fingerprint, "shards", r.Counts.Total)
	case r.Retry > ri.rec.Retry:
		t.c.log.Info("run's failed shards requeued", "run", r.Name, "retry_round", r.Retry)
	}
}

// sayWhatItHolds logs, once the store has been read, the runs it holds:
// each unfinished run by name with its state and counts as last recorded,
// the BLOCKED ones by name, and how many are COMPLETE. A restarted
// coordinator's output otherwise said nothing of the runs it goes on with.
func (t *tracker) sayWhatItHolds() {
	var active, blocked []string
	complete := 0
	for name, ri := range t.runs {
		if !ri.known {
			continue
		}
		switch c := ri.rec.Counts; ri.rec.State {
		case stream.RunComplete:
			complete++
		case stream.RunBlocked:
			blocked = append(blocked, name)
		default:
			active = append(active, fmt.Sprintf("%s %s %d/%d validated", name, ri.rec.State, c.Validated, c.Total))
		}
	}
	if len(active)+len(blocked)+complete == 0 {
		t.c.log.Info("runs in the store: none")
		return
	}
	attrs := []any{"complete", complete}
	if len(active) > 0 {
		attrs = append(attrs, "unfinished", firstFew(active))
	}
	if len(blocked) > 0 {
		attrs = append(attrs, "blocked", firstFew(blocked))
	}
	t.c.log.Info("runs in the store", attrs...)
}

// firstFew is the first ten of names in order, joined, and how many more
// there are: a store of thousands of runs gets a line, not a page.
func firstFew(names []string) string {
	sort.Strings(names)
	return joinFirst(names, 10)
}

// reload replaces what ri holds of its shards with the records in the
// store, for a run submitted again after it was forgotten. Watch events
// up to the bucket's last revision before the read are then stale: the
// record read is as new or newer, or was purged with the forgotten run.
// When the store cannot be read, the run goes on from the watch alone.
func (t *tracker) reload(ctx context.Context, name string, ri *runInfo) {
	ri.forgotten = false
	entries, last, err := t.readShards(ctx, name)
	if err != nil {
		t.c.log.Warn("tracker: cannot read the shard records of a run submitted again after it was forgotten; counting from the watch", "run", name, "err", err)
		return
	}
	fresh := newRunInfo()
	ri.shards, ri.n, ri.byClass, ri.floor, ri.dirty = fresh.shards, fresh.n, fresh.byClass, 0, true
	seen := t.seen // what the watch delivered, which catchUp goes by
	for _, e := range entries {
		t.onShard(e)
	}
	t.seen, ri.floor = seen, last
}

// readShards reads every shard record of run from the store, and the shard
// bucket's last revision before the read.
func (t *tracker) readShards(ctx context.Context, run string) ([]jetstream.KeyValueEntry, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := t.c.b.Shards.Status(ctx)
	if err != nil {
		return nil, 0, err
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return nil, 0, fmt.Errorf("shard bucket status of type %T", st)
	}
	last := bs.StreamInfo().State.LastSeq
	keys, err := t.c.b.KeysMatching(ctx, t.c.b.Shards, run+".*")
	if err != nil {
		return nil, 0, err
	}
	var entries []jetstream.KeyValueEntry
	for _, k := range keys {
		e, err := t.c.b.Shards.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		entries = append(entries, e)
	}
	return entries, last, nil
}

// onShard applies one shard record; it reports whether every shard of the
// record's run is now validated or failed.
func (t *tracker) onShard(e jetstream.KeyValueEntry) bool {
	t.seen = max(t.seen, e.Revision())
	run, id, ok := strings.Cut(e.Key(), ".")
	if !ok {
		return false
	}
	ri := t.info(run)
	old := ri.shards[id]
	if e.Revision() <= ri.floor || (old != nil && e.Revision() <= old.rev) {
		return false // already read from the store (see reload)
	}
	if old != nil && old.fp == ri.rec.Fingerprint {
		ri.add(old, -1)
	}
	if e.Operation() != jetstream.KeyValuePut {
		delete(ri.shards, id)
		ri.dirty = true
		return false
	}
	var r stream.ShardBrief
	if err := stream.Decode(e.Value(), &r); err != nil {
		t.c.log.Warn("skip undecodable shard record", "key", e.Key(), "err", err)
		delete(ri.shards, id)
		return false
	}
	si := &shardInfo{fp: unique.Make(r.Fingerprint).Value(), state: unique.Make(r.State).Value(), reason: r.Reason, class: unique.Make(r.Class).Value(),
		attempts: len(r.Attempts), retry: r.Retry, rev: e.Revision()}
	if r.Output != nil {
		si.checksum, si.files, si.bytes = r.Output.Checksum, r.Output.Files, r.Output.Bytes
	}
	// A record's attempts are decoded only where one may have ended
	// since: once a shard on the way of most (its validated record),
	// again for each failure.
	ended := si.attempts > 0 && si.state != stream.ShardRunning &&
		(old == nil || old.state == stream.ShardRunning || si.attempts != old.attempts || old.fp != si.fp)
	if ended || si.state == stream.ShardValidated {
		var tm stream.ShardTimes
		if stream.Decode(e.Value(), &tm) == nil {
			if si.state == stream.ShardValidated {
				si.took, si.peak, _ = tm.Validated()
			}
			if si.fp == ri.rec.Fingerprint {
				ri.notePeak(si.class, id, tm.Peak())
			}
		}
	}
	if old != nil && old.fp == si.fp && si.retry > old.retry {
		ri.retried = true
	}
	if old != nil && old.state == stream.ShardValidated && si.state != stream.ShardValidated {
		// An output is being redone: the run's outputs are verified again
		// when it completes.
		ri.verifiedFP = ""
	}
	if old == nil {
		id = strings.Clone(id) // not the key's whole subject, which id is cut from
	}
	ri.shards[id] = si
	if si.fp == ri.rec.Fingerprint {
		ri.add(si, 1)
	}
	ri.dirty = true
	total := ri.rec.Counts.Total
	return ri.rec.Queued && total > 0 && ri.n[stream.ShardValidated]+ri.n[stream.ShardFailed] >= total
}

// notePeak keeps peak, shard id's largest attempt peak, where it is the
// largest of its class in the run's current generation.
func (ri *runInfo) notePeak(class, id string, peak int64) {
	if ri.peaksFP != ri.rec.Fingerprint {
		ri.peaks, ri.peaksFP = nil, ri.rec.Fingerprint
	}
	if peak <= ri.peaks[class].Bytes {
		return
	}
	if ri.peaks == nil {
		ri.peaks = map[string]stream.PeakSeen{}
	}
	ri.peaks[class] = stream.PeakSeen{Bytes: peak, Shard: strings.Clone(id)}
	ri.dirty = true
}

// peaksSeen is the record's PeaksSeen: the largest attempt peaks of the
// current generation's shards, per class.
func (ri *runInfo) peaksSeen() map[string]stream.PeakSeen {
	if ri.peaksFP != ri.rec.Fingerprint {
		return nil
	}
	return ri.peaks
}

func (ri *runInfo) add(si *shardInfo, d int) {
	ri.n[si.state] += d
	m := ri.byClass[si.class]
	if m == nil {
		m = map[string]int{}
		ri.byClass[si.class] = m
	}
	m[si.state] += d
}

func (ri *runInfo) classCounts() map[string]stream.Counts {
	out := map[string]stream.Counts{}
	for class, total := range ri.rec.Classes {
		m := ri.byClass[class]
		c := stream.Counts{Total: total, Running: m[stream.ShardRunning], Validated: m[stream.ShardValidated], Failed: m[stream.ShardFailed]}
		c.Pending = total - c.Running - c.Validated - c.Failed
		out[class] = c
	}
	return out
}

// derive computes the run's state from its counts.
func (t *tracker) derive(ctx context.Context, ri *runInfo) (string, stream.Counts, string) {
	total := ri.rec.Counts.Total
	c := stream.Counts{Total: total, Running: ri.n[stream.ShardRunning], Validated: ri.n[stream.ShardValidated], Failed: ri.n[stream.ShardFailed]}
	c.Pending = total - c.Running - c.Validated - c.Failed
	since := ri.acking
	ri.acking = time.Time{} // drained sets it again
	switch {
	case !ri.rec.Queued:
		return stream.RunPrepared, c, ""
	case c.Validated >= total:
		if reason, ok := t.drained(ctx, ri, since); !ok {
			return stream.RunRunning, c, reason
		}
		if ri.verifiedFP == ri.rec.Fingerprint {
			return stream.RunComplete, c, ri.rec.Reason
		}
		reason, ok := t.verifyOutputs(ctx, ri)
		if !ok {
			return stream.RunRunning, c, reason
		}
		ri.verifiedFP = ri.rec.Fingerprint
		return stream.RunComplete, c, reason
	case ri.rec.Halted != "":
		return stream.RunBlocked, c, haltedReason(&ri.rec, c)
	case c.Pending <= 0 && c.Running == 0 && c.Failed > 0:
		return stream.RunBlocked, c, fmt.Sprintf("%d shard(s) failed: %s; retry them with: %s", c.Failed, ri.failedIDs(3), retryCommand(ri.rec))
	case c.Running+c.Validated+c.Failed > 0:
		return stream.RunRunning, c, ""
	}
	return stream.RunQueued, c, ""
}

// drained reports whether the work queue holds no message of ri's run,
// with the reason the run is not COMPLETE yet where it does. A worker
// records a shard validated and then, once a sync barrier has made the
// record durable, acknowledges its message (worker.settleDurably): for a
// few milliseconds after the last record the last messages are still
// queued, and `nats stream info SHARDS` would count them beside a run
// said COMPLETE. A message whose worker died before its acknowledgement
// is delivered again after the ack wait; the worker that takes it finds
// the output committed and acknowledges it. since is when the looks
// began to find messages left (zero: the last one found none).
func (t *tracker) drained(ctx context.Context, ri *runInfo, since time.Time) (string, bool) {
	n, err := stream.QueuedOf(ctx, t.c.js, ri.rec.Name)
	if err == nil && n == 0 {
		return "", true
	}
	if since.IsZero() {
		since = time.Now()
	}
	ri.acking = since
	if err == nil && time.Since(since) >= orphanAfter && time.Since(ri.orphansAt) >= orphanAfter {
		// Acknowledgements come milliseconds after the last record, and a
		// lost worker's message waits in its consumer for the ack wait;
		// one at or below its consumer's acknowledged floor waits for
		// nothing (stream.RemoveOrphans: a store back from a power cut).
		ri.orphansAt = time.Now()
		removed, rerr := stream.RemoveOrphans(ctx, t.c.js, ri.rec.Name)
		if len(removed) > 0 {
			t.c.log.Warn("removed messages of a run that no consumer would deliver again: at or below their consumer's acknowledged floor, left in the work queue by a store that lost their removal in a crash",
				"run", ri.rec.Name, "sequences", removed)
			n, err = stream.QueuedOf(ctx, t.c.js, ri.rec.Name)
			if err == nil && n == 0 {
				return "", true
			}
		}
		if rerr != nil {
			t.c.log.Warn("look for messages no consumer would deliver", "run", ri.rec.Name, "err", rerr)
		}
	}
	if err != nil {
		return fmt.Sprintf("every shard validated; the work queue could not be read to see that none is left there: %v", err), false
	}
	return fmt.Sprintf("every shard validated; %d message(s) of the run still in the work queue, each until a worker acknowledges it (a lost worker's: after the ack wait, by the next worker that takes it)", n), false
}

// ackPoll is how soon the tracker looks again at a run waiting for its
// last acknowledgements (runInfo.acking), for ackPollFor; past that the
// flush tick looks (a lost worker's message waits for the ack wait).
const (
	ackPoll    = 5 * time.Millisecond
	ackPollFor = 2 * time.Second
)

// orphanAfter is how long a run with every shard validated waits for its
// last messages to leave the work queue before it looks for messages no
// consumer will deliver again, and how often it looks after that.
const orphanAfter = time.Second

// failedIDs names up to max failed shards with their reasons.
func (ri *runInfo) failedIDs(max int) string {
	var ids []string
	for id, si := range ri.shards {
		if si.fp == ri.rec.Fingerprint && si.state == stream.ShardFailed {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	var parts []string
	for i, id := range ids {
		if i == max {
			parts = append(parts, fmt.Sprintf("and %d more", len(ids)-max))
			break
		}
		reason := ri.shards[id].reason
		if len(reason) > 160 {
			cut := 160
			for cut > 0 && !utf8.RuneStart(reason[cut]) {
				cut-- // not within a character
			}
			reason = reason[:cut] + "..."
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", id, reason))
	}
	return strings.Join(parts, ", ")
}

// resumeCommand is what continues the run: for a BLOCKED run the command
// that retries its failed shards, else the one that resumes it.
func resumeCommand(r stream.RunRecord) string {
	switch {
	case r.State == stream.RunBlocked && r.HaltedBy != "":
		// Halted by hand: submitted again, its held shards are queued.
		return submitCommand(r)
	case r.State == stream.RunBlocked:
		return retryCommand(r)
	}
	return r.Resume
}

// submitCommand submits the run again as it was submitted.
func submitCommand(r stream.RunRecord) string {
	return cmp.Or(r.Resume, "shardpool submit "+r.Spec.SpecPath)
}

func retryCommand(r stream.RunRecord) string {
	if r.RetryCmd != "" {
		return r.RetryCmd
	}
	return "shardpool submit --retry-failed " + r.Spec.SpecPath
}

// verifyReaders is how many outputs are verified at once.
const verifyReaders = 4

// verifyOutputs checks every output of the run at the destination (marker,
// file list checksum, sizes, fingerprint; the committing worker already read
// every byte back). Shards whose output fails are marked failed so that the
// run blocks with a retry command instead of claiming COMPLETE.
func (t *tracker) verifyOutputs(ctx context.Context, ri *runInfo) (string, bool) {
	out := ri.rec.Spec.Output
	if _, err := os.Stat(out); errors.Is(err, fs.ErrNotExist) {
		return "outputs verified by their committing workers; the destination is not visible from the coordinator", true
	}
	ids := make(chan string)
	var mu sync.Mutex
	failed := map[string]error{}
	var wg sync.WaitGroup
	var verified, empty atomic.Int64
	// A few readers at once: each check is a few small reads, mostly from
	// the page cache, and a run has thousands.
	for range verifyReaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				mk, err := checkpoint.VerifyCommitted(filepath.Join(out, id), ri.rec.Fingerprint, false)
				if err != nil {
					mu.Lock()
					failed[id] = err
					mu.Unlock()
					continue
				}
				verified.Add(1)
				if mk.Files == 0 {
					empty.Add(1)
				}
			}
		}()
	}
	for id, si := range ri.shards {
		if si.fp == ri.rec.Fingerprint {
			ids <- id
		}
	}
	close(ids)
	wg.Wait()
	var bad []string
	for id, err := range failed {
		bad = append(bad, id)
		reason := "output at the destination failed verification: " + err.Error()
		t.revokeCommit(ctx, ri.rec.Name, id, reason)
		if err := t.failShard(ctx, ri.rec.Name, id, reason, nil); err != nil {
			t.c.log.Warn("record failed verification", "run", ri.rec.Name, "shard", id, "err", err)
		}
	}
	if len(bad) > 0 {
		return fmt.Sprintf("%d output(s) failed verification at the destination", len(bad)), false
	}
	// Every shard is committed: what interrupted commits left beside the
	// outputs (a worker killed mid-commit) goes now.
	if removed, err := checkpoint.SweepTemps(out); err != nil {
		t.c.log.Warn("sweep temporary directories", "run", ri.rec.Name, "output", out, "err", err)
	} else if len(removed) > 0 {
		t.c.log.Info("removed what interrupted commits left", "run", ri.rec.Name, "output", out, "dirs", removed)
	}
	if n := verified.Load(); n > 0 && empty.Load() == n && len(ri.rec.Spec.Outputs) == 0 {
		// A command that wrote its results into its working directory, or
		// got a placeholder wrong, completed with nothing committed.
		return fmt.Sprintf("every output verified at the destination, and all %d are empty: the command wrote nothing into {out} ($SHARDPOOL_OUT); "+
			"what it wrote elsewhere is neither committed nor checked (expected of a job that keeps its results elsewhere; `outputs` in the spec makes an empty output fail)", n), true
	}
	return "every output verified at the destination", true
}

// failShard records a shard as failed with compare-and-set. With a payload
// (a message that ran out of deliveries) a validated record, one already
// failed in this retry round (its reason kept), or one of another
// generation is left alone, and one that does not decode is
// replaced (nothing could run the shard past it); without one (an output
// that failed verification at the destination) the record is failed
// whatever it says. It returns nil once nothing more is to be done.
func (t *tracker) failShard(ctx context.Context, run, id, reason string, payload *stream.ShardMsg) error {
	key := stream.ShardKey(run, id)
	var err error
	for i := 0; i < 5; i++ {
		var e jetstream.KeyValueEntry
		e, err = t.c.b.Shards.Get(ctx, key)
		var r stream.ShardRecord
		var rev uint64
		why := reason
		switch {
		case err == nil:
			rev = e.Revision()
			if derr := stream.Decode(e.Value(), &r); derr != nil {
				if payload == nil {
					return fmt.Errorf("fail shard %s: its record did not decode: %w", key, derr)
				}
				r = stream.ShardRecord{Run: run, ID: id, Fingerprint: payload.Fingerprint, Class: payload.Class}
				why += fmt.Sprintf("; its record did not decode (%v) and was replaced", derr)
			} else if payload != nil && (r.State == stream.ShardValidated || r.Fingerprint != payload.Fingerprint ||
				r.State == stream.ShardFailed && r.Retry == payload.Retry) {
				return nil // settled, or of another generation: the message is moot
			}
		case errors.Is(err, jetstream.ErrKeyNotFound) && payload != nil:
			r = stream.ShardRecord{Run: run, ID: id, Fingerprint: payload.Fingerprint, Class: payload.Class}
		default:
			return fmt.Errorf("fail shard %s: %w", key, err)
		}
		r.CloseLost() // its worker is over: exhaust waits for the lease to go
		r.State, r.Reason, r.Owner, r.Updated = stream.ShardFailed, why, nil, time.Now().UTC()
		if payload != nil {
			r.Payload = payload
		}
		data, _ := stream.Encode(&r)
		if rev == 0 {
			_, err = t.c.b.Shards.Create(ctx, key, data)
		} else {
			_, err = t.c.b.Shards.Update(ctx, key, data, rev)
		}
		if err == nil {
			t.c.log.Warn("shard failed", "run", run, "shard", id, "reason", why)
			return nil
		}
	}
	return fmt.Errorf("fail shard %s: %w", key, err)
}

// revokeCommit marks the shard's commit record revoked, so the attempt
// that redoes it can claim the commit again and the history shows why.
func (t *tracker) revokeCommit(ctx context.Context, run, id, reason string) {
	key := stream.ShardKey(run, id)
	for range 5 {
		e, err := t.c.b.Checkpoints.Get(ctx, key)
		if err != nil {
			return
		}
		var r stream.CommitRecord
		if stream.Decode(e.Value(), &r) != nil || r.State == stream.CommitRevoked {
			// Already revoked: a second verification pass that ran before
			// the shard's failed record reached the tracker (a busy host)
			// found the same damaged output.
			return
		}
		r.State, r.Reason, r.Time = stream.CommitRevoked, reason, time.Now().UTC()
		data, _ := stream.Encode(&r)
		if _, err := t.c.b.Checkpoints.Update(ctx, key, data, e.Revision()); err == nil {
			return
		}
	}
}

// onMaxDeliveries handles a shard whose message ran out of deliveries
// without a worker recording its end: its last worker died mid-attempt, or
// worker shutdowns handed it back more often than stream.InterruptDeliveries.
func (t *tracker) onMaxDeliveries(ctx context.Context, m *nats.Msg) {
	var adv struct {
		StreamSeq  uint64 `json:"stream_seq"`
		Deliveries int    `json:"deliveries"`
	}
	if err := json.Unmarshal(m.Data, &adv); err != nil {
		return
	}
	s, err := t.c.js.Stream(ctx, stream.StreamShards)
	if err != nil || !t.exhaust(ctx, s, adv.StreamSeq, adv.Deliveries) {
		t.exhausted[adv.StreamSeq] = adv.Deliveries
	}
}

// exhaust records the shard of message seq of s (SHARDS) failed and then
// deletes the message; it reports whether that is done. A message is deleted only once
// its shard is recorded: deleted first, a shard whose record could not be
// written would have neither, and its run would wait for good. Until then
// the flush tick tries again (t.exhausted).
func (t *tracker) exhaust(ctx context.Context, s jetstream.Stream, seq uint64, deliveries int) bool {
	raw, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true // settled meanwhile, or already handled
	}
	if err != nil {
		return false
	}
	var sm stream.ShardMsg
	if err := stream.Decode(raw.Data, &sm); err != nil {
		t.c.log.Warn("exhausted message does not decode; deleting it", "seq", seq, "err", err)
		_ = s.DeleteMsg(ctx, seq)
		return true
	}
	if held, err := t.leaseHeld(ctx, &sm); err != nil || held {
		// An attempt of this generation may still run: the message ran out
		// of deliveries while its worker's heartbeats reached the server
		// late, and it may yet commit. Its lease is renewed while it runs
		// and expires within a TTL of its worker's end; the tick looks
		// again until then (and the record then says what became of it).
		return false
	}
	reason := fmt.Sprintf("ran out of deliveries (%d): its last one ended without a report (its worker was lost), was handed back by a worker's shutdown or memory pressure, or never began an attempt (its lease or record not taken by the store)", deliveries)
	if err := t.failShard(ctx, sm.Run, sm.ID, reason, &sm); err != nil {
		t.c.log.Warn("record exhausted shard; trying again", "run", sm.Run, "shard", sm.ID, "err", err)
		return false
	}
	if err := s.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.c.log.Warn("delete exhausted message", "run", sm.Run, "shard", sm.ID, "err", err)
		return false
	}
	return true
}

// leaseHeld reports whether the shard of sm has a lease of its
// generation in the store.
func (t *tracker) leaseHeld(ctx context.Context, sm *stream.ShardMsg) (bool, error) {
	e, err := t.c.b.Leases.Get(ctx, stream.ShardKey(sm.Run, sm.ID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var l stream.Lease
	if stream.Decode(e.Value(), &l) != nil {
		return false, nil // unreadable: nothing to wait for
	}
	return l.Fingerprint == sm.Fingerprint, nil
}

// sweepEvery is how often the tracker looks for exhausted messages whose
// advisory it did not receive.
const sweepEvery = 10 * time.Second

// releaseUnleased ends the attempts of a halted run whose workers are
// gone. A shard recorded running is settled by its worker, or, where
// the worker is lost, by the next delivery of its message once the lease
// expires; a halt takes the messages off the queue, so no delivery
// comes, and the shard would count as running for good (a `shardpool
// run` halted would wait for it until interrupted). A shard of a halted
// run recorded running with no lease of its generation at every look for
// a whole lease TTL, its record unchanged, has its attempt closed as
// lost (charged, as a redelivery would have closed it) and goes back to
// pending, held with the rest. A live worker renews its lease every
// third of a TTL (and takes it again after a coordinator restart that
// let it expire), so it keeps its shard; one only cut off from the
// coordinator stops such a command itself once it cannot renew the
// lease, and does not commit without it.
func (t *tracker) releaseUnleased(ctx context.Context) {
	for name, ri := range t.runs {
		if ri.rec.Halted == "" || ri.n[stream.ShardRunning] == 0 {
			ri.unleased = nil
			continue
		}
		seen := map[string]unleased{}
		for id, si := range ri.shards {
			if si.state != stream.ShardRunning || si.fp != ri.rec.Fingerprint {
				continue
			}
			held, err := t.leaseHeld(ctx, &stream.ShardMsg{Run: name, ID: id, Fingerprint: si.fp})
			if err != nil || held {
				continue
			}
			u, ok := ri.unleased[id]
			if !ok || u.rev != si.rev {
				u = unleased{rev: si.rev, at: time.Now()}
			}
			if time.Since(u.at) < t.c.cfg.LeaseTTL {
				seen[id] = u // look again at the next sweep
				continue
			}
			if err := t.releaseLost(ctx, name, id, si.rev); err != nil {
				t.c.log.Warn("release a halted run's shard whose worker is gone; trying again", "run", name, "shard", id, "err", err)
				seen[id] = u
			}
		}
		ri.unleased = seen
	}
}

// unleasedEvery is how often releaseUnleased looks: half a lease TTL,
// so that a lost worker's shard is released within two and a half TTLs
// of its last renewal.
func (t *tracker) unleasedEvery() time.Duration {
	return max(t.c.cfg.LeaseTTL/2, time.Second)
}

// releaseLost closes the open attempt of the shard's record at revision
// rev as lost and makes the shard pending (compare-and-set: a record
// changed meanwhile is left to whoever changed it).
func (t *tracker) releaseLost(ctx context.Context, run, id string, rev uint64) error {
	key := stream.ShardKey(run, id)
	e, err := t.c.b.Shards.Get(ctx, key)
	if err != nil {
		return err
	}
	var r stream.ShardRecord
	if e.Revision() != rev || stream.Decode(e.Value(), &r) != nil || !r.OpenAttempt() {
		return nil
	}
	r.CloseLost()
	r.State, r.Owner, r.Updated = stream.ShardPending, nil, time.Now().UTC()
	r.Reason = "its worker stopped renewing the lease while the run was halted (gone, or cut off from the coordinator): held with the run's other shards"
	data, err := stream.Encode(&r)
	if err != nil {
		return err
	}
	_, err = t.c.b.Shards.Update(ctx, key, data, rev)
	switch {
	case stream.IsConflict(err):
		return nil // changed meanwhile: whoever changed it decides
	case err != nil:
		return err
	}
	t.c.log.Warn("released a halted run's shard whose worker is gone", "run", run, "shard", id)
	return nil
}

// sweepExhausted finds messages that ran out of deliveries without the
// tracker hearing of it: the max-deliveries advisory is a core NATS
// message, lost while no tracker listens (a coordinator restarting) or
// dropped by a subscription that fell behind. Such a message stays in the
// stream, never delivered again, and its run would wait for good. For a
// class whose consumer has nothing pending and nothing awaiting an ack,
// every message under its filter past the ack floor and at or below the
// last delivered sequence is exhausted (acknowledged ones are removed from
// the work queue); each is handled as its advisory would have been.
func (t *tracker) sweepExhausted(ctx context.Context) {
	s, err := t.c.js.Stream(ctx, stream.StreamShards)
	if err != nil {
		return
	}
	if s.CachedInfo().State.Msgs == 0 {
		return
	}
	var infos []*jetstream.ConsumerInfo
	l := s.ListConsumers(ctx)
	for ci := range l.Info() {
		infos = append(infos, ci)
	}
	if l.Err() != nil {
		return
	}
	for _, ci := range infos {
		if ci.NumPending != 0 || ci.NumAckPending != 0 || ci.Delivered.Stream == 0 {
			continue
		}
		for seq := ci.AckFloor.Stream + 1; seq <= ci.Delivered.Stream; {
			m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(ci.Config.FilterSubject))
			if err != nil || m.Sequence > ci.Delivered.Stream {
				break
			}
			if _, known := t.exhausted[m.Sequence]; !known {
				t.c.log.Warn("found a message that ran out of deliveries unreported", "class", ci.Name, "seq", m.Sequence)
				if !t.exhaust(ctx, s, m.Sequence, ci.Config.MaxDeliver) {
					t.exhausted[m.Sequence] = ci.Config.MaxDeliver
				}
			}
			seq = m.Sequence + 1
		}
	}
}

// flush writes the run records whose shards changed, and progress.json
// where due (at once, with final: the coordinator stops). It reports
// whether a run waits for its last acknowledgements and should be looked
// at again soon (ackPoll).
func (t *tracker) flush(ctx context.Context, final bool) bool {
	soon := false
	for name, ri := range t.runs {
		if !ri.known {
			continue
		}
		if ri.dirty {
			t.flushRun(ctx, name, ri)
		}
		if !ri.acking.IsZero() {
			ri.dirty = true // nothing in the shard records will say when the queue empties
			soon = soon || time.Since(ri.acking) < ackPollFor
		}
		t.purgeHalted(ctx, ri)
		t.maybeProgress(ri, final)
	}
	return soon
}

// flushRun writes the run record of a run whose shards changed, when its
// state, counts or reason did.
func (t *tracker) flushRun(ctx context.Context, name string, ri *runInfo) {
	state, counts, reason := t.derive(ctx, ri)
	classes := ri.classCounts()
	if state == stream.RunRunning && shouldHalt(&ri.rec, counts) {
		t.halt(ctx, name, ri, counts, classes)
		return
	}
	peaks := ri.peaksSeen()
	if state == ri.rec.State && counts == ri.rec.Counts && reason == ri.rec.Reason && maps.Equal(classes, ri.rec.ClassCounts) && maps.Equal(peaks, ri.rec.PeaksSeen) && !ri.retried {
		ri.dirty = false
		t.maybeEvidence(ri)
		return
	}
	r := ri.rec
	r.State, r.Counts, r.ClassCounts, r.Reason = state, counts, classes, reason
	// A copy: notePeak changes ri.peaks in place, and the record kept as
	// written must stay what was written.
	r.PeaksSeen = maps.Clone(peaks)
	was := ri.rec.State
	if !t.writeRun(ctx, ri, r) {
		return
	}
	if r.State != was {
		t.c.log.Info("run state", "run", name, "state", r.State, "reason", r.Reason)
	}
	t.maybeEvidence(ri)
}

// writeRun writes r, the tracker's judgement of ri's run, over the record
// it last read (compare-and-set), dated now. When a submission wrote in
// between it writes nothing: that update arrives through the watch, and
// the next flush judges again from it.
func (t *tracker) writeRun(ctx context.Context, ri *runInfo, r stream.RunRecord) bool {
	r.Updated, r.Evidence = time.Now().UTC(), t.c.EvidenceDir(r.Name)
	r.Timing, r.Pace = nil, nil
	if r.State == stream.RunComplete || r.State == stream.RunBlocked {
		// With the verdict, what its shards took, as final.json has it:
		// status shows it wherever it runs (final.json is on this host).
		r.Timing = ri.timing()
	} else {
		if perSec, left, ok := ri.ending.Observe(r.Updated, r.Counts.Validated+r.Counts.Failed, r.Counts.Pending+r.Counts.Running); ok {
			// Before it, how fast shards end, which status gives with the
			// time left, as run's progress line does.
			r.Pace = &stream.RunPace{PerSecond: perSec, LeftSeconds: left.Seconds()}
		}
		// And what the shards validated so far took: status compares its
		// running shards with them (a straggler stands out).
		if n := r.Counts.Validated; n > 0 {
			if ri.soFarAt.IsZero() || ri.soFarFP != r.Fingerprint || n < ri.soFarN ||
				n*10 >= ri.soFarN*11 || (n != ri.soFarN && r.Updated.Sub(ri.soFarAt) >= timingEvery) {
				ri.soFar, ri.soFarAt, ri.soFarFP, ri.soFarN = ri.timing(), r.Updated, r.Fingerprint, n
			}
			r.Timing = ri.soFar
		}
	}
	data, err := stream.Encode(&r)
	if err != nil {
		return false
	}
	rev, err := t.c.b.Runs.Update(ctx, r.Name, data, ri.rev)
	if err != nil {
		return false
	}
	ri.rec, ri.rev, ri.dirty, ri.retried = r, rev, false, false
	return true
}

// shouldHalt says whether a running run has reached its halt: Halt shards
// failed after their retries since the submission that set HaltBase, and
// none validated since, with shards left to hold back.
func shouldHalt(r *stream.RunRecord, c stream.Counts) bool {
	return r.Halt > 0 && r.Halted == "" && c.Pending > 0 &&
		c.Failed-r.HaltBase.Failed >= r.Halt && c.Validated <= r.HaltBase.Validated
}

// halt stops a run whose command seems to fail for every shard (Halt): it
// records why, with the stream sequence before which the run's messages
// go, and then takes those messages off the queue, so that workers start
// none of its shards; the ones running end as they would. The run is
// BLOCKED until a submission puts its messages back (Submit). The bound
// keeps the purge from taking what that submission published, whenever
// it runs.
func (t *tracker) halt(ctx context.Context, name string, ri *runInfo, c stream.Counts, classes map[string]stream.Counts) {
	s, err := t.c.js.Stream(ctx, stream.StreamShards)
	if err != nil {
		t.c.log.Warn("halt: read the work queue", "run", name, "err", err)
		return // the next flush tries again
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.c.log.Warn("halt: read the work queue", "run", name, "err", err)
		return
	}
	r := ri.rec
	r.Halted = fmt.Sprintf("halted: %d shard(s) failed after their retries since the run was submitted, none validated, so the command may fail for every shard: %s",
		c.Failed-r.HaltBase.Failed, ri.failedIDs(3))
	r.HaltSeq = info.State.LastSeq + 1
	r.State, r.Counts, r.ClassCounts, r.Reason = stream.RunBlocked, c, classes, haltedReason(&r, c)
	if !t.writeRun(ctx, ri, r) {
		return
	}
	t.c.log.Warn("run halted", "run", name, "why", r.Halted)
	t.purgeHalted(ctx, ri)
	t.maybeEvidence(ri)
}

// purgeHalted takes a halted run's queued messages off the queue, once per
// halt and tracker (again after a restart: a halt recorded just before a
// crash may not have purged yet; purging twice is harmless).
func (t *tracker) purgeHalted(ctx context.Context, ri *runInfo) {
	if ri.rec.Halted == "" || ri.purged == ri.rec.HaltSeq {
		return
	}
	if err := PurgeHalted(ctx, t.c.js, &ri.rec); err != nil {
		t.c.log.Warn("halt: take the run's messages off the queue", "run", ri.rec.Name, "err", err)
		return // tried again at the next flush
	}
	ri.purged = ri.rec.HaltSeq
}

// PurgeHalted removes the queued messages of the halted run r that were
// published before its HaltSeq. Messages a worker holds go too: its
// attempt ends as it would, and its record says how.
func PurgeHalted(ctx context.Context, js jetstream.JetStream, r *stream.RunRecord) error {
	s, err := js.Stream(ctx, stream.StreamShards)
	if err != nil {
		return err
	}
	return s.Purge(ctx, jetstream.WithPurgeSubject(stream.RunSubjects(r.Name)), jetstream.WithPurgeSequence(r.HaltSeq))
}

// haltedReason is a halted run's reason: why, what was held back, and how
// to go on.
func haltedReason(r *stream.RunRecord, c stream.Counts) string {
	running := ""
	switch {
	case c.Running > 0 && r.HaltStop:
		running = fmt.Sprintf(" (%d running are being stopped)", c.Running)
	case c.Running > 0:
		running = fmt.Sprintf(" (%d running end as they would)", c.Running)
	}
	held := fmt.Sprintf("%s; its %d pending shard(s) were taken off the queue%s.", r.Halted, c.Pending, running)
	if r.HaltStop && c.Running == 0 {
		held = fmt.Sprintf("%s; its %d pending shard(s) are held (taken off the queue, or stopped as they ran).", r.Halted, c.Pending)
	}
	if r.HaltedBy != "" {
		return fmt.Sprintf("%s To go on: %s (queues them again; a changed spec runs every shard again)", held, submitCommand(*r))
	}
	return fmt.Sprintf("%s Once the cause is fixed, retry with: %s "+
		"(or submit it again to queue only them; a changed spec runs every shard again)", held, retryCommand(*r))
}

func (t *tracker) writeResume(ri *runInfo, cmd string) {
	if cmd == "" {
		return
	}
	dir := t.c.EvidenceDir(ri.rec.Name)
	if err := os.MkdirAll(dir, 0o755); err == nil {
		_ = checkpoint.WriteFile(filepath.Join(dir, ResumeName), []byte(cmd+"\n"))
	}
}

// progressEvery bounds how often a run's progress.json is rewritten while
// only its counts change; a new state or generation is written at once.
const progressEvery = time.Second

// Progress is progress.json in a run's evidence folder: the run as its
// coordinator last judged it. It is rewritten when the run's state or
// generation changes, at most once every progressEvery while only its
// counts change, and when the coordinator stops; so for a run that
// stopped before a verdict (interrupted, or killed at most a second
// after its last change) it tells where the run stood, and for one
// resubmitted after a verdict, that final.json's verdict is older.
type Progress struct {
	V int `json:"v"`
	RunSummary
	ClassCounts map[string]stream.Counts `json:"class_counts,omitempty"`
}

// RunSummary is what final.json and progress.json both say of a run.
type RunSummary struct {
	Run         string        `json:"run"`
	Fingerprint string        `json:"fingerprint"`
	State       string        `json:"state"`
	Reason      string        `json:"reason,omitempty"`
	Counts      stream.Counts `json:"counts"`
	// Resume is the command that resumes the run, or, BLOCKED, the one
	// that retries its failed shards (resumeCommand).
	Resume  string    `json:"resume"`
	Output  string    `json:"output"`
	Written time.Time `json:"written"`
	// Shardpool is the build of the coordinator that wrote it
	// (stream.Build.Version); absent from older files.
	Shardpool string `json:"shardpool,omitempty"`
}

// summaryOf is the run record's summary, written now.
func summaryOf(r *stream.RunRecord) RunSummary {
	return RunSummary{Run: r.Name, Fingerprint: r.Fingerprint, State: r.State, Reason: r.Reason, Counts: r.Counts,
		Resume: resumeCommand(*r), Output: r.Spec.Output, Written: time.Now().UTC(), Shardpool: stream.ThisBuild().Version}
}

// ProgressVersion is Progress.V.
const ProgressVersion = 1

// progressKey is what decides whether progress.json needs rewriting.
type progressKey struct {
	fp, state, reason string
	counts            stream.Counts
}

// maybeProgress rewrites the run's progress.json when what it says
// changed: at once for a new state or generation (or with force), else at
// most every progressEvery.
func (t *tracker) maybeProgress(ri *runInfo, force bool) {
	r := &ri.rec
	if r.Name == "" {
		return
	}
	key := progressKey{fp: r.Fingerprint, state: r.State, reason: r.Reason, counts: r.Counts}
	if key == ri.progress {
		return
	}
	dir := t.c.EvidenceDir(r.Name)
	if ri.progress == (progressKey{}) {
		// First look since the coordinator started: a file that already
		// says this (a restart of a finished run) is left as it is.
		if p, err := ReadProgress(dir); err == nil && p != nil && key == (progressKey{fp: p.Fingerprint, state: p.State, reason: p.Reason, counts: p.Counts}) {
			ri.progress, ri.progressAt = key, time.Now()
			return
		}
	}
	// A new stage goes out at once, unless the last write failed: then
	// it is tried again a progressEvery later, as counts are.
	sameStage := key.fp == ri.progress.fp && key.state == ri.progress.state
	if !force && (sameStage || ri.progressFailed) && time.Since(ri.progressAt) < progressEvery {
		return // the next flush writes it
	}
	err := writeEvidence(dir, ProgressName, Progress{V: ProgressVersion, RunSummary: summaryOf(r), ClassCounts: r.ClassCounts})
	ri.progressAt = time.Now()
	if err != nil {
		// Said once, not at every try.
		if !ri.progressFailed {
			t.c.log.Warn("write progress.json", "run", r.Name, "err", err)
		}
		ri.progressFailed = true
		return
	}
	ri.progress, ri.progressFailed = key, false
}

// ReadProgress reads the progress.json of the evidence folder dir; it
// returns nil and no error when there is none.
func ReadProgress(dir string) (*Progress, error) { return readEvidence[Progress](dir, ProgressName) }

// ReadFinal reads the final.json of the evidence folder dir; it returns
// nil and no error when there is none.
func ReadFinal(dir string) (*Final, error) { return readEvidence[Final](dir, FinalName) }

func readEvidence[T any](dir, name string) (*T, error) {
	path := filepath.Join(dir, name)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &v, nil
}

// writeEvidence writes v as JSON to the file name of the evidence folder
// dir, durably.
func writeEvidence(dir, name string, v any) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return checkpoint.WriteFile(filepath.Join(dir, name), append(b, '\n'))
}

// writeFinal writes f as the final.json of the evidence folder dir,
// durably, as writeEvidence would, one shard at a time: encoded in one
// piece, a run of 200,000 shards allocated 78 MB at once for a 24 MB file
// (a million shards, about 400 MB), beside what the run's end holds.
func writeFinal(dir string, f *Final) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	summary, err := json.MarshalIndent(f.RunSummary, "", "  ")
	if err != nil {
		return err
	}
	// The summary's fields, the timing, then the shards, as MarshalIndent
	// of f writes them: summary is "{\n  ...\n}", or "{}" with no field.
	head := bytes.TrimSuffix(bytes.TrimSuffix(summary, []byte("}")), []byte("\n"))
	return checkpoint.WriteFileFrom(filepath.Join(dir, FinalName), 0o644, func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, 64<<10)
		bw.Write(head)
		if len(head) > 1 {
			bw.WriteString(",")
		}
		if f.Timing != nil {
			b, err := json.MarshalIndent(f.Timing, "  ", "  ")
			if err != nil {
				return err
			}
			bw.WriteString("\n  \"timing\": ")
			bw.Write(b)
			bw.WriteString(",")
		}
		bw.WriteString("\n  \"shards\": ")
		if f.Shards == nil {
			bw.WriteString("null")
		} else {
			bw.WriteString("[")
			for i := range f.Shards {
				b, err := json.MarshalIndent(&f.Shards[i], "    ", "  ")
				if err != nil {
					return err
				}
				if i > 0 {
					bw.WriteString(",")
				}
				bw.WriteString("\n    ")
				bw.Write(b)
			}
			if len(f.Shards) > 0 {
				bw.WriteString("\n  ")
			}
			bw.WriteString("]")
		}
		bw.WriteString("\n}\n")
		return bw.Flush()
	})
}

// ProgressName, FinalName and ResumeName are a run's progress, verdict
// and resume-command files in its evidence folder.
const (
	ProgressName = "progress.json"
	FinalName    = "final.json"
	ResumeName   = "resume.txt"
)

// StoppedName is the file in a run's evidence folder that says why a
// `shardpool run` stopped before its verdict: halted, drained,
// interrupted, its store full, its worker failed.
const StoppedName = "stopped.json"

// StoppedVersion is Stopped.V.
const StoppedVersion = 1

// Stopped is stopped.json. It speaks for the run only while no
// progress.json is newer: a later run of it has moved on.
type Stopped struct {
	V   int    `json:"v"`
	Run string `json:"run"`
	// Why is the stop in words ("halted: the first 5 shard(s) ...").
	Why string `json:"why"`
	// Failed holds up to 5 failed shards with their reasons and logs,
	// one per line, where the stop was a halt.
	Failed []string `json:"failed,omitempty"`
	// MoreFailed is how many more had failed when it stopped.
	MoreFailed int       `json:"more_failed,omitempty"`
	Written    time.Time `json:"written"`
}

// WriteStopped writes s as the stopped.json of the evidence folder dir.
func WriteStopped(dir string, s Stopped) error {
	s.V, s.Written = StoppedVersion, time.Now().UTC()
	return writeEvidence(dir, StoppedName, s)
}

// ReadStopped reads the stopped.json of the evidence folder dir; it
// returns nil and no error when there is none.
func ReadStopped(dir string) (*Stopped, error) { return readEvidence[Stopped](dir, StoppedName) }

// Final is final.json: what a run ended with.
type Final struct {
	RunSummary
	// Timing is absent where no validated shard was timed.
	Timing *stream.Timing `json:"timing,omitempty"`
	Shards []FinalShard   `json:"shards"`
}

// FinalShard is one shard in final.json.
type FinalShard struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	Checksum string `json:"checksum,omitempty"`
	Files    int    `json:"files,omitempty"`
	Bytes    int64  `json:"bytes,omitempty"`
	Attempts int    `json:"attempts"`
	Reason   string `json:"reason,omitempty"`
	// Seconds and PeakMemory are what the attempt that validated the
	// shard took: its command's wall time, and the peak of its process
	// tree's memory (the shard cgroup's where it had one, else the
	// command's peak RSS). Absent where no attempt was timed (an output
	// already committed, found and recorded) or nothing was measured.
	Seconds    float64 `json:"seconds,omitempty"`
	PeakMemory int64   `json:"peak_memory,omitempty"`
}

// timingEvery is how often a running run's record has the timing of its
// shards validated so far computed again, at least, while more are.
const timingEvery = 10 * time.Second

// timingOf summarizes the timed shards of shards, nil where none was
// timed. Of shards with the same maximum, the one of the lowest ID names
// it.
func timingOf(shards []FinalShard) *stream.Timing {
	return timingOfEach(func(yield func(id string, secs float64, peak int64)) {
		for _, s := range shards {
			yield(s.ID, s.Seconds, s.PeakMemory)
		}
	})
}

// timing is timingOf(ri.finalShards()) without building that list,
// which the run record's timing is made from at each write of a verdict.
func (ri *runInfo) timing() *stream.Timing {
	return timingOfEach(func(yield func(id string, secs float64, peak int64)) {
		for id, si := range ri.shards {
			if si.fp == ri.rec.Fingerprint {
				yield(id, si.took.Seconds(), si.peak)
			}
		}
	})
}

// timingOfEach is timingOf over what each yields, in any order.
func timingOfEach(each func(yield func(id string, secs float64, peak int64))) *stream.Timing {
	var secs []float64
	var peaks []int64
	var slowest, biggest string
	var slowestSecs float64
	var biggestPeak int64
	each(func(id string, s float64, peak int64) {
		if s <= 0 {
			return
		}
		secs = append(secs, s)
		if s > slowestSecs || (s == slowestSecs && id < slowest) {
			slowest, slowestSecs = id, s
		}
		if peak > 0 {
			peaks = append(peaks, peak)
			if peak > biggestPeak || (peak == biggestPeak && id < biggest) {
				biggest, biggestPeak = id, peak
			}
		}
	})
	if len(secs) == 0 {
		return nil
	}
	t := &stream.Timing{Shards: len(secs), Seconds: spreadOf(secs, slowest)}
	if len(peaks) > 0 {
		p := spreadOf(peaks, biggest)
		t.PeakMemory = &p
	}
	return t
}

// spreadOf is the spread of vs, whose maximum was the shard maxShard.
func spreadOf[T int64 | float64](vs []T, maxShard string) stream.Spread[T] {
	slices.Sort(vs)
	return stream.Spread[T]{Shards: len(vs), P50: stream.NearestRank(vs, 0.5), P95: stream.NearestRank(vs, 0.95), Max: vs[len(vs)-1], MaxShard: maxShard}
}

// finalShards is final.json's list of the run's shards of its
// generation, by ID.
func (ri *runInfo) finalShards() []FinalShard {
	var out []FinalShard
	for id, si := range ri.shards {
		if si.fp != ri.rec.Fingerprint {
			continue
		}
		out = append(out, FinalShard{ID: id, State: si.state, Attempts: si.attempts, Reason: si.reason, Checksum: si.checksum, Files: si.files, Bytes: si.bytes,
			Seconds: si.took.Seconds(), PeakMemory: si.peak})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (t *tracker) maybeEvidence(ri *runInfo) {
	st := ri.rec.State
	if (st != stream.RunComplete && st != stream.RunBlocked) || ri.evidence == st+ri.rec.Reason {
		return
	}
	ri.evidence = st + ri.rec.Reason
	f := Final{RunSummary: summaryOf(&ri.rec), Shards: ri.finalShards()}
	f.Timing = timingOf(f.Shards)
	if err := writeFinal(t.c.EvidenceDir(ri.rec.Name), &f); err != nil {
		t.c.log.Error("write final.json", "run", ri.rec.Name, "err", err)
	}
	t.writeResume(ri, f.Resume)
}
