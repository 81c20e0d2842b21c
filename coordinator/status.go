package coordinator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// StatusVersion is the "v" of the status document; fields are only added
// within a version.
const StatusVersion = 1

// Status is the document behind `shardpool status --json` and GET /status.
type Status struct {
	V    int       `json:"v"`
	Time time.Time `json:"time"`
	// Coordinator is its host and sync mode; absent when it did not answer.
	Coordinator *stream.CoordinatorInfo `json:"coordinator,omitempty"`
	Runs        []RunStatus             `json:"runs"`
	Workers     []stream.WorkerReport   `json:"workers"`
	// Unreadable names run records that could not be read or decoded
	// ("name: why"), when listing every run: one damaged record must not
	// hide the others.
	Unreadable []string `json:"unreadable,omitempty"`
	// From is "evidence" in a document that no coordinator answered
	// (`shardpool status --data` of a state directory none serves): each
	// run is its last verdict from final.json (or progress.json, when that
	// holds a newer one), and Workers is empty.
	From string `json:"from,omitempty"`
	// NoVerdict lists, in such a document, the runs that ended without a
	// verdict (killed or interrupted before COMPLETE or BLOCKED), or whose
	// last verdict is older than their last submission.
	NoVerdict []RunEvidence `json:"no_verdict,omitempty"`
	// Drill is, in such a document, the last recovery drill run with this
	// state directory (`shardpool drill --data DIR` copies its report to
	// DIR/runs/drill/drill.json); absent where none was.
	Drill *DrillSummary `json:"drill,omitempty"`
	// NotRuns lists, in such a document, the folders of DIR/runs that hold
	// evidence of no run a coordinator of DIR tracked: no final.json,
	// progress.json or resume.txt, only what `shardpool plan`, `profile`,
	// `stage` or a worker whose coordinator keeps its state elsewhere
	// wrote there.
	NotRuns []NotRun `json:"not_runs,omitempty"`
}

// NotRun is an evidence folder of a name no coordinator of the state
// directory ran (see Status.NotRuns), with the files it holds.
type NotRun struct {
	Name     string   `json:"name"`
	Evidence string   `json:"evidence"`
	Files    []string `json:"files"`
}

// DrillSummary is the gist of a drill.json: when the drill ran, whether
// every check passed, and which did not.
type DrillSummary struct {
	Started time.Time `json:"started"`
	Seconds float64   `json:"seconds"`
	Passed  bool      `json:"passed"`
	Checks  int       `json:"checks"`
	// NotPassed names each check that did not pass, with its result
	// ("name: FAIL" or "name: UNVERIFIED").
	NotPassed []string `json:"not_passed,omitempty"`
	Report    string   `json:"report"`
	// Unreadable says why the report could not be read; the fields
	// but Report are then empty.
	Unreadable string `json:"unreadable,omitempty"`
}

// RunEvidence is a run known only by its evidence folder.
type RunEvidence struct {
	Name     string `json:"name"`
	Evidence string `json:"evidence"`
	// Why there is no verdict: none was written, or final.json is unreadable.
	Why string `json:"why"`
	// Stopped is why the `shardpool run` of it stopped, where it said so
	// (stopped.json): halted, drained, interrupted; Failed, for a halt,
	// the failed shards it named.
	Stopped    string   `json:"stopped,omitempty"`
	Failed     []string `json:"failed,omitempty"`
	MoreFailed int      `json:"more_failed,omitempty"`
	// Resume is the command that resumes the run (resume.txt).
	Resume string `json:"resume,omitempty"`
	// From progress.json, where the run wrote one (absent otherwise): its
	// state, generation and counts when last recorded, at Recorded. The
	// run's coordinator rewrote it at most a second apart while counts
	// changed, and on stopping.
	State       string         `json:"state,omitempty"`
	Fingerprint string         `json:"fingerprint,omitempty"`
	Counts      *stream.Counts `json:"counts,omitempty"`
	Recorded    time.Time      `json:"recorded,omitzero"`
	// Previous is the older verdict final.json holds, when the run was
	// submitted again after it (a new generation, or a retry).
	Previous *RunStatus `json:"previous,omitempty"`
}

// RunStatus is one run in Status.
type RunStatus struct {
	Name        string                   `json:"name"`
	State       string                   `json:"state"`
	Fingerprint string                   `json:"fingerprint"`
	Counts      stream.Counts            `json:"counts"`
	Reason      string                   `json:"reason,omitempty"`
	Resume      string                   `json:"resume,omitempty"`
	Evidence    string                   `json:"evidence,omitempty"`
	Output      string                   `json:"output"`
	Submitted   time.Time                `json:"submitted,omitzero"` // absent in the evidence form: final.json does not keep it
	Updated     time.Time                `json:"updated"`
	ClassCounts map[string]stream.Counts `json:"class_counts,omitempty"`
	// Halt is the run's --halt (0: the coordinator never halts it);
	// Halted says why it halted, while it is.
	Halt   int    `json:"halt,omitempty"`
	Halted string `json:"halted,omitempty"`
	// Waiting says why queued shards are not running, per class.
	Waiting []string `json:"waiting,omitempty"`
	// Timing is, with a verdict, what the validated shards took (the run
	// record's, final.json's in the evidence form); before it, what those
	// validated so far took, as of up to 10 s before Updated.
	Timing *stream.Timing `json:"timing,omitempty"`
	// Pace is, before the verdict, how fast the run's shards end, as of
	// Updated (the run record's).
	Pace *stream.RunPace `json:"pace,omitempty"`
	// PeaksSeen is, per class, the largest peak memory an attempt of the
	// run's generation recorded, with its shard (the run record's), which
	// workers' admission reserves where it is well above the class's
	// declared or measured peak.
	PeaksSeen map[string]stream.PeakSeen `json:"peaks_seen,omitempty"`
	Shards    []stream.ShardRecord       `json:"shards,omitempty"`
	// Forgotten is, in the evidence form, when the run was forgotten
	// (forgotten.json) after this verdict: its records are gone from the
	// store, its outputs and evidence stay.
	Forgotten time.Time `json:"forgotten,omitzero"`
}

// ReadStatus reads runs and workers from the KV buckets. With run set, it
// returns that run only, with the records of its shards that are not
// validated (running, failed, pending retries).
func ReadStatus(ctx context.Context, js jetstream.JetStream, run string) (*Status, error) {
	st, _, err := readStatus(ctx, js, run)
	return st, err
}

// readStatus is ReadStatus, with the work queues it read (ReadQueues) for
// the runs' waiting reasons, which GET /metrics serves too.
func readStatus(ctx context.Context, js jetstream.JetStream, run string) (*Status, []QueueStats, error) {
	b, err := stream.WaitBuckets(ctx, js, 15*time.Second)
	if err != nil {
		return nil, nil, fmt.Errorf("status: %w", err)
	}
	st := &Status{V: StatusVersion, Time: time.Now().UTC(), Runs: []RunStatus{}, Workers: []stream.WorkerReport{}}
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if ci, err := stream.AskInfoAll(ictx, js.Conn(), 500*time.Millisecond); err == nil {
		st.Coordinator = &ci
	}
	cancel()
	names := []string{run}
	if run == "" {
		var err error
		if names, err = b.Keys(ctx, b.Runs); err != nil {
			return nil, nil, fmt.Errorf("status: list runs: %w", err)
		}
	}
	for _, n := range names {
		e, err := b.Runs.Get(ctx, n)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			if run == "" {
				continue // a deleted record the listing still counts
			}
			return nil, nil, fmt.Errorf("status %s: %w", n, ErrRunNotFound)
		}
		if err == nil {
			var r stream.RunRecord
			if err = stream.Decode(e.Value(), &r); err == nil {
				rs, err := runStatus(ctx, b, r, run != "")
				if err != nil {
					return nil, nil, err
				}
				st.Runs = append(st.Runs, rs)
				continue
			}
		}
		if run != "" {
			return nil, nil, fmt.Errorf("status %s: %w", n, err)
		}
		st.Unreadable = append(st.Unreadable, fmt.Sprintf("%s: %v", n, err))
	}
	workers, err := b.WorkerReports(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("status: list workers: %w", err)
	}
	st.Workers = append(st.Workers, workers...)
	sort.Slice(st.Workers, func(i, j int) bool { return st.Workers[i].Name < st.Workers[j].Name })
	boot, pidns := stream.BootID("/proc"), stream.PIDNamespace()
	for i := range st.Workers {
		wk := &st.Workers[i]
		if wk.Gone = goneHere(*wk, boot, pidns); wk.Gone == "" {
			wk.Disconnected = disconnected(*wk, st.Coordinator)
		}
		wk.ClockAhead = clockAhead(*wk)
	}
	queues := ReadQueues(ctx, js)
	caps := map[string]QueueStats{}
	for _, q := range queues {
		caps[q.Class] = q
	}
	short := map[int]uint64{} // run index -> its queued messages, short of its pending shards
	for i := range st.Runs {
		if st.Runs[i].Halted != "" {
			continue // its pending shards are held back, not waiting: its reason says so
		}
		st.Runs[i].Waiting = waiting(st.Runs[i], st.Workers, caps)
		if queued, ok := queueShort(ctx, js, st.Runs[i]); ok {
			short[i] = queued
		}
	}
	if len(short) > 0 {
		// One wait for every run that looks short (unqueued).
		select {
		case <-ctx.Done():
			return st, queues, nil
		case <-time.After(confirmAfter):
		}
		for i, before := range short {
			if why := unqueued(ctx, js, b, st.Runs[i], before); why != "" {
				st.Runs[i].Waiting = append(st.Runs[i].Waiting, why)
			}
		}
	}
	return st, queues, nil
}

// queueShort is a run's queued messages where they fall short of its
// pending shards, with nothing running (unqueued).
func queueShort(ctx context.Context, js jetstream.JetStream, r RunStatus) (uint64, bool) {
	if (r.State != stream.RunQueued && r.State != stream.RunRunning) || r.Counts.Running > 0 || r.Counts.Pending <= 0 {
		return 0, false
	}
	queued, err := stream.QueuedOf(ctx, js, r.Name)
	return queued, err == nil && queued < uint64(r.Counts.Pending)
}

// unqueued says how many of a stalled run's pending shards have no message
// in the work queue, when some have none: lost from a damaged store, or
// purged by hand (`nats stream purge SHARDS`). No worker can take them, and
// nothing but a submission publishes them again (it compares the queue
// with the unfinished shards). Only a run with nothing running is looked
// at: its counts are then settled, and while shards run, a count a moment
// behind the queue would raise a false alarm.
//
// The run record's counts trail the shard records by the tracker's flush
// (confirmAfter at most), and a worker removes a shard's message only
// after its final record: a shard that just failed for good, its message
// gone, may still count as pending. So a shortfall (queueShort: before,
// the queued messages then) is confirmed by the record read again once
// the flush has passed (the caller waits confirmAfter), against the
// queue as it was before: every message gone by then had its final
// record written before, and counted. (Found by hand: shards failing
// their start at once, an output file system gone read-only, raised the
// alarm in the middle of `run`.)
func unqueued(ctx context.Context, js jetstream.JetStream, b *stream.Buckets, r RunStatus, before uint64) string {
	e, err := b.Runs.Get(ctx, r.Name)
	if err != nil {
		return ""
	}
	var rec stream.RunRecord
	if stream.Decode(e.Value(), &rec) != nil {
		return ""
	}
	r.State, r.Counts = rec.State, rec.Counts
	// Short again, as the queue is now: shards submitted meanwhile, their
	// messages published, are not taken for lost.
	queued, ok := queueShort(ctx, js, r)
	if !ok || before >= uint64(r.Counts.Pending) {
		return ""
	}
	queued = max(queued, before)
	again := r.Resume
	if again == "" {
		again = "shardpool submit SPEC"
	}
	return fmt.Sprintf("%d of %d pending shard(s) have no message in the queue (lost from a damaged store, or purged): no worker can take them; submitting the run again publishes them: %s",
		uint64(r.Counts.Pending)-queued, r.Counts.Pending, again)
}

// confirmAfter is how long unqueued waits to read the run record again:
// more than the tracker's flush period (flushEvery), with room for the
// watch that brings it the shard records.
const confirmAfter = 3 * flushEvery / 2

// runStatus is one run's status from its record; with shards, the records
// of its unfinished shards too.
func runStatus(ctx context.Context, b *stream.Buckets, r stream.RunRecord, shards bool) (RunStatus, error) {
	rs := RunStatus{Name: r.Name, State: r.State, Fingerprint: r.Fingerprint, Counts: r.Counts, Reason: r.Reason,
		Resume: resumeCommand(r), Evidence: r.Evidence, Output: r.Spec.Output, Submitted: r.Submitted, Updated: r.Updated,
		ClassCounts: r.ClassCounts, Halt: r.Halt, Halted: r.Halted, PeaksSeen: r.PeaksSeen}
	rs.Timing = r.Timing // before the verdict, of the shards validated so far
	if r.State != stream.RunComplete && r.State != stream.RunBlocked {
		rs.Pace = r.Pace
	}
	if shards {
		var err error
		if rs.Shards, err = unfinished(ctx, b, r); err != nil {
			return rs, err
		}
	}
	return rs, nil
}

// admissionLogs names where the live auto workers log their admission
// decisions (" (w1 on h: /state/admission.log; ...)"), or "" where no
// report says.
func admissionLogs(workers []stream.WorkerReport) string {
	var at []string
	for _, w := range workers {
		if w.Auto && w.AdmissionLog != "" && w.Gone == "" && w.Disconnected == "" {
			at = append(at, fmt.Sprintf("%s on %s: %s", w.Name, w.Host, w.AdmissionLog))
		}
	}
	if len(at) == 0 {
		return ""
	}
	return " (" + strings.Join(at, "; ") + ")"
}

// waiting explains, per class with queued shards, why they are not running.
func waiting(r RunStatus, workers []stream.WorkerReport, caps map[string]QueueStats) []string {
	var out []string
	for _, class := range slices.Sorted(maps.Keys(r.ClassCounts)) {
		c := r.ClassCounts[class]
		if c.Pending <= 0 {
			continue
		}
		slots, busy, live := 0, 0, 0
		var whys []string
		for _, w := range workers {
			if w.Gone != "" || w.Disconnected != "" {
				continue // its report outlives it by up to the bucket's TTL
			}
			live++
			slots += w.Slots[class]
			busy += w.Running[class]
			if why, ok := w.Waiting[class]; ok {
				// Auto workers' reasons begin with their class, which the
				// line names already.
				whys = append(whys, w.Name+": "+strings.TrimPrefix(why, "class "+class+": "))
			}
		}
		cs := caps[class]
		switch {
		case cs.Cap > 0 && cs.InFlight >= cs.Cap:
			out = append(out, fmt.Sprintf("class %s: %d shard(s) wait: the fleet cap of %d in flight is reached", class, c.Pending, cs.Cap))
		case len(whys) > 0:
			out = append(out, fmt.Sprintf("class %s: %d shard(s) wait: %s", class, c.Pending, strings.Join(whys, "; ")))
		case slots == 0 && len(workers) > 0 && anyAuto(workers):
			out = append(out, fmt.Sprintf("class %s: %d shard(s) wait: workers admit by measured headroom; see their admission.log%s", class, c.Pending, admissionLogs(workers)))
		case slots == 0:
			hint := "start one: shardpool worker --slots auto (or N) serves every class, --slots " + class + "=N this one"
			if live > 0 {
				hint = "the workers were given --slots for other classes; start one with --slots auto (or N), or with " + class + "=N among its classes"
			}
			if base, ok := strings.CutSuffix(class, plan.OutlierSuffix); ok {
				// A worker given its class's slots serves it too.
				hint += ", or " + base + "=N, which serves its outliers too"
			}
			out = append(out, fmt.Sprintf("class %s: %d shard(s) wait: no live worker serves class %s (%s)", class, c.Pending, class, hint))
		case busy >= slots:
			out = append(out, fmt.Sprintf("class %s: %d shard(s) wait: all %d slot(s) of class %s are busy", class, c.Pending, slots, class))
		}
	}
	return out
}

// unfinished lists the run's shard records of its fingerprint that are not
// validated (running, failed, or pending after an attempt), by ID. The
// records come in one stream from a watcher, not a request per key (5,000
// shards took 0.82 s with a Get each); a run whose every shard is
// validated has none to list.
func unfinished(ctx context.Context, b *stream.Buckets, r stream.RunRecord) ([]stream.ShardRecord, error) {
	if r.Counts.Total > 0 && r.Counts.Validated == r.Counts.Total {
		return nil, nil
	}
	w, err := b.Shards.WatchFiltered(ctx, []string{r.Name + ".*"}, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("status %s: %w", r.Name, err)
	}
	defer stream.StopWatch(w)
	// The newest revision of each key: the first pass may deliver a key
	// twice when it is rewritten as the pass goes by.
	latest := map[string]jetstream.KeyValueEntry{}
	keep := func(e jetstream.KeyValueEntry) {
		if old, ok := latest[e.Key()]; !ok || e.Revision() > old.Revision() {
			latest[e.Key()] = e
		}
	}
	for {
		var e jetstream.KeyValueEntry
		select {
		case e = <-w.Updates():
		case <-ctx.Done():
			return nil, fmt.Errorf("status %s: %w", r.Name, ctx.Err())
		}
		if e == nil {
			break // the watcher's first pass is over
		}
		keep(e)
	}
	// The first pass also misses a record rewritten as it goes by (one
	// listing in a few dozen, of 1,000 records rewritten all the time:
	// TestStatusSeesRecordsBeingRewritten); the stream's own count of its
	// subjects does not, and what it names that the pass missed is read
	// alone.
	keys, err := b.KeysMatching(ctx, b.Shards, r.Name+".*")
	if err != nil {
		return nil, fmt.Errorf("status %s: %w", r.Name, err)
	}
	for _, k := range keys {
		if _, ok := latest[k]; ok {
			continue
		}
		e, err := b.Shards.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("status %s: %w", r.Name, err)
		}
		keep(e)
	}
	var out []stream.ShardRecord
	for _, e := range latest {
		var s stream.ShardRecord
		if stream.Decode(e.Value(), &s) != nil || s.Fingerprint != r.Fingerprint || s.State == stream.ShardValidated {
			continue
		}
		s.Payload = nil
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return strings.Compare(out[i].ID, out[j].ID) < 0 })
	return out, nil
}

// anyAuto reports whether a worker admits by measured headroom (its slots
// are not a fixed table).
func anyAuto(workers []stream.WorkerReport) bool {
	for _, w := range workers {
		if w.Auto {
			return true
		}
	}
	return false
}

// connected reports whether the worker of report r has a connection to
// the coordinator described by ci (nil: it did not answer), and whether
// that can be told at all: not for a report or a coordinator from before
// connections were named.
func connected(r stream.WorkerReport, ci *stream.CoordinatorInfo) (yes, known bool) {
	if ci == nil || len(ci.Clients) == 0 || r.Conn == "" {
		return false, false
	}
	return slices.Contains(ci.Clients, r.Conn), true
}

// clockShown is the least disagreement of a worker's clock with the
// coordinator's that status shows: below it, a report's write latency
// (milliseconds, up to a second or two on a loaded host) is all there is.
const clockShown = 5 * time.Second

// clockAhead is how far the worker of report r has its clock ahead of the
// coordinator's (its report's time against the store's stamp of it),
// where that is clockShown or more either way; 0 otherwise, or where
// either time is missing.
func clockAhead(r stream.WorkerReport) stream.Seconds {
	if r.Stored.IsZero() || r.Reported.IsZero() {
		return 0
	}
	if d := r.Reported.Sub(r.Stored); d.Abs() >= clockShown {
		return stream.Seconds(d)
	}
	return 0
}

// disconnected says why the worker of report r has no connection to the
// coordinator described by ci; "" when it has one, or when that cannot be
// told (connected). Unlike goneHere it proves nothing about the process:
// a worker cut off by the network lives on, and reconnects.
func disconnected(r stream.WorkerReport, ci *stream.CoordinatorInfo) string {
	if yes, known := connected(r, ci); yes || !known {
		return ""
	}
	return fmt.Sprintf("no connection named %s at the coordinator; its last report %s", r.Conn, r.Reported.UTC().Format(time.RFC3339))
}

// goneHere says why the worker of report r is proven gone, when it ran on
// this host (this boot and pid namespace, given as boot and pidns) and no
// live process has its pid; "" when it lives or nothing can be proven
// from here. A worker killed with SIGKILL leaves its report in the
// workers bucket until the bucket's TTL: without this, status showed it
// running its shards for that long.
func goneHere(r stream.WorkerReport, boot, pidns string) string {
	if !stream.SamePIDSpace(boot, pidns, r.BootID, r.PIDNS) || probe.PIDAlive("/proc", r.PID) {
		return ""
	}
	return fmt.Sprintf("pid %d is not running on %s, where it reported", r.PID, r.Host)
}
