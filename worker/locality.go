package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/staging"
	"github.com/shardpool/shardpool/stream"
)

// refreshPeers reads the other live workers' reports (for locality, and
// the peers of a hold: holdLone), their times moved to this worker's
// clock (onOwnClock).
func (w *Worker) refreshPeers(ctx context.Context) {
	all, err := w.b.WorkerReports(ctx)
	if err != nil {
		return
	}
	var own *stream.WorkerReport
	for i, r := range all {
		if r.Name == w.cfg.Name && r.PID == w.pid && r.Host == w.host {
			own = &all[i]
		}
	}
	if own != nil && !own.Stored.IsZero() && !own.Reported.IsZero() {
		w.storeAhead.Store(int64(own.Stored.Sub(own.Reported)))
	}
	var peers []stream.WorkerReport
	for _, r := range all {
		if r.Name == w.cfg.Name {
			continue
		}
		onOwnClock(&r, own)
		if time.Since(r.Reported) < 3*w.cfg.ReportEvery {
			peers = append(peers, r)
		}
	}
	w.mu.Lock()
	w.peers, w.peersAt = peers, time.Now()
	w.mu.Unlock()
}

// onOwnClock moves the times of peer report r (Reported, Started,
// LastStarted: by the peer's clock) to this worker's clock, given own,
// this worker's last report as read back (nil where it has none yet).
// Each report went to the same store, which stamped it (Stored) by its
// own clock: a report's Stored less its Reported is the store's clock
// less its writer's, give or take the write's latency, so the
// difference of the two is the peer's clock less this one's. Hosts
// whose clocks disagree by seconds (a node whose time service failed)
// otherwise took a peer's start from before this worker's start
// failures for one after them (outage.go), or a live peer for gone.
func onOwnClock(r *stream.WorkerReport, own *stream.WorkerReport) {
	if own == nil || own.Stored.IsZero() || own.Reported.IsZero() || r.Stored.IsZero() || r.Reported.IsZero() {
		return
	}
	ahead := own.Stored.Sub(own.Reported) - r.Stored.Sub(r.Reported)
	r.Reported = r.Reported.Add(-ahead)
	if !r.Started.IsZero() {
		r.Started = r.Started.Add(-ahead)
	}
	if !r.LastStarted.IsZero() {
		r.LastStarted = r.LastStarted.Add(-ahead)
	}
}

// onOwnTime is a time the coordinator's store stamped (a KV entry's
// Created), on this worker's clock: how old a record another host wrote
// is, judged without that host's clock.
func (w *Worker) onOwnTime(stamp time.Time) time.Time {
	return stamp.Add(-time.Duration(w.storeAhead.Load()))
}

// readStoreClock sets storeAhead from the store's own clock, before the
// worker has a report to read back: the info of the workers bucket
// carries the time the store gathered it, taken against the middle of
// the request. It is how checkName ages a report another host wrote
// without that host's clock. It returns false where the store did not
// answer or stamped nothing.
func (w *Worker) readStoreClock(ctx context.Context) bool {
	sent := time.Now()
	st, err := w.b.Workers.Status(ctx)
	got := time.Now()
	if err != nil {
		return false
	}
	kv, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || kv.StreamInfo() == nil || kv.StreamInfo().TimeStamp.IsZero() {
		return false
	}
	mid := sent.Add(got.Sub(sent) / 2)
	w.storeAhead.Store(int64(kv.StreamInfo().TimeStamp.Sub(mid)))
	return true
}

// deferForLocality hands a shard to another worker once, on its first
// delivery, when this worker has not staged its inputs and another live
// worker has every one of them and a free slot for the class. The
// deferral is recorded and does not count as an attempt, so it can neither
// burn the shard's retries nor bounce it around: the next delivery runs
// wherever it lands.
func (w *Worker) deferForLocality(ctx context.Context, a *attemptState, class string) bool {
	m := &a.m
	if !a.run.Spec.StageFor(class) || len(m.Files) == 0 || a.rec.Deferred > 0 || a.attempt > 1 {
		return false
	}
	keys := make([]string, len(m.Files))
	for i, f := range m.Files {
		keys[i] = staging.Key(f)
	}
	if st := w.hostStager(); st != nil && st.Has(keys) {
		return false
	}
	peer := w.peerWithInputs(class, keys)
	if peer == "" {
		return false
	}
	a.rec.Deferred++
	a.rec.Reason = fmt.Sprintf("handed to worker %s, which has the inputs staged and a free slot", peer)
	if err := w.putRecord(ctx, a); err != nil {
		return false // the record moved on: just run it here
	}
	w.admission(m.Run, m.ID, class, "defer", fmt.Sprintf("inputs staged on worker %s, which has a free %s slot; handing the shard to it once", peer, class))
	w.nakWithDelay(a.msg, 50*time.Millisecond)
	return true
}

// peerWithInputs names a live worker that has every key staged and room
// for one more shard of class now.
func (w *Worker) peerWithInputs(class string, keys []string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.peers {
		if leaving(p) {
			continue
		}
		have := make(map[string]bool, len(p.Staged))
		for _, k := range p.Staged {
			have[k] = true
		}
		all := true
		for _, k := range keys {
			all = all && have[k]
		}
		if !all {
			continue
		}
		_, waiting := p.Waiting[class]
		free := p.Slots[class] > p.Running[class] || (p.Auto && !waiting)
		if free && !waiting {
			return p.Name
		}
	}
	return ""
}
