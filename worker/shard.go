package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/staging"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// ShardDirs are the per-shard paths under the run's output directory.
const (
	// MetaDir holds shardpool's own files inside the output directory.
	MetaDir = ".shardpool"
)

// CkptDir is the shard's checkpoint directory ({ckpt}): under the durable
// output so that it survives attempts and hosts, and one per run and
// generation, so that an edited job (a new fingerprint) starts afresh
// instead of resuming from what the old code checkpointed, and another
// run given the same output directory never resumes from this one's.
func CkptDir(output, run, fp, id string) string {
	return filepath.Join(output, MetaDir, "ckpt", run, fp, id)
}

// dropOlderCkpts removes the shard's checkpoint directories of the run's
// other generations once this generation committed the shard: no
// generation but the run's current one can run it again, and checkpoints
// of a training job can be large. Only the run's own are touched.
func (w *Worker) dropOlderCkpts(output, run, fp, id string) {
	runDir := filepath.Join(output, MetaDir, "ckpt", run)
	gens, err := checkpoint.ReadDir(runDir)
	if err != nil {
		return
	}
	for _, g := range gens {
		if !g.IsDir() || g.Name() == fp {
			continue
		}
		old := filepath.Join(runDir, g.Name(), id)
		if err := os.RemoveAll(old); err != nil { // nil when absent
			w.log.Warn("remove an older generation's checkpoints", "dir", old, "err", err)
			continue
		}
		_ = os.Remove(filepath.Join(runDir, g.Name())) // once empty
	}
}

// attemptState carries one attempt through its steps.
type attemptState struct {
	msg     jetstream.Msg
	m       stream.ShardMsg
	run     *stream.RunRecord
	key     string
	rec     stream.ShardRecord
	rev     uint64
	attempt int
	// held is the delivery as the worker's journal holds it, from its
	// fetch until it is settled.
	held *heldShard
	// found is the marker at the shard's destination when that is a
	// committed output of another fingerprint (alreadyDone).
	found *checkpoint.Marker
	// free gives the attempt's slot back (idempotent); it is called once
	// the command has exited, when the worker has room to conclude aside.
	free func()
	// stop is closed when the worker stops (its Run's context ends): a
	// commit waiting for the coordinator to answer gives up then
	// (untilStore).
	stop <-chan struct{}
	// inputs is the stamp of the shard's inputs as the command found
	// them (checkpoint.InputsStamp), recorded in the output's marker.
	inputs string
	// leased is set once this delivery holds the shard's lease: an
	// attempt the record leaves open is then over, its owner having
	// released the lease or been proven gone (see settle).
	leased bool
	// blind is set where the shard was fetched before a run of its class
	// was seen, with no look at its class's GPUs (admit): devices it
	// cannot have at its start are then the fetch's doing, not the
	// shard's.
	blind bool
	// awaitOwner is set by settle when its verdict would end an attempt
	// the record leaves open (the attempt limit, reached only by counting
	// it; another run's output at the destination) before this delivery
	// holds the lease: the delivery takes the lease, then settles again.
	awaitOwner bool
}

// maxConcluding bounds the attempts of one worker that conclude (commit,
// record, ack) after giving their slot back. A slot counts a running
// command; what follows its exit is I/O and state writes, which overlap
// with the next command instead of delaying it. Beyond the bound an
// attempt concludes in its slot, so a slow commit path slows fetching.
// An attempt concluding is a goroutine waiting on flushes shared with the
// others (outputGather, the coordinator's settleGather): at 1,000 shards
// a second and 60-100 ms of such waits, 64 filled and held the slots
// (5,000 shards of /bin/true: 6.6-8.5 s against 4.4-6.5 s with 256).
const maxConcluding = 256

// handle takes one delivered shard through its lifecycle. Every path ends
// in exactly one of Ack, Nak or Term of the message (or, when the lease is
// lost, in neither: the new owner's delivery decides).
func (w *Worker) handle(ctx context.Context, stop <-chan struct{}, msg jetstream.Msg, class, slotInfo string, blind bool, free func()) {
	meta, err := msg.Metadata()
	if err != nil {
		w.log.Error("message without metadata", "err", err)
		_ = msg.Term()
		return
	}
	a := &attemptState{msg: msg, attempt: int(meta.NumDelivered), free: free, stop: stop, blind: blind}
	if err := stream.Decode(msg.Data(), &a.m); err != nil {
		w.log.Error("undecodable shard message; terminating it", "subject", msg.Subject(), "err", err)
		_ = msg.TermWithReason("undecodable: " + err.Error())
		return
	}
	m := &a.m
	a.key = stream.ShardKey(m.Run, m.ID)
	w.handling.Add(1)
	defer w.handling.Add(-1)
	// From here until the message is settled the worker's journal holds
	// the delivery, so that a worker that finds this one dead can hand it
	// back at once (handBack), whichever step it died in: before its lease
	// too, when there is no lease to wait out but the ack wait would be.
	a.held = &heldShard{key: a.key, attempt: a.attempt, reply: msg.Reply()}
	w.journal.holding(a.held)
	defer w.journal.settled(a.held)
	run, err := w.runRecord(ctx, m.Run, m.Fingerprint, m.Settings)
	if err != nil {
		w.admission(m.Run, m.ID, class, "defer", "run record unreadable: "+err.Error())
		w.nakWithDelay(msg, w.backoff(1))
		return
	}
	if run.Fingerprint != m.Fingerprint {
		w.admission(m.Run, m.ID, class, "discard", fmt.Sprintf("message of generation %s; the run is now %s", m.Fingerprint, run.Fingerprint))
		_ = msg.TermWithReason(ErrStaleGeneration.Error())
		return
	}
	a.run = run
	w.notePreflight(m, &run.Spec)
	// The first delivery of round 0 usually has no record yet: skip the
	// read and let the Create in runAttempt find out (and settle afresh if
	// a record exists after all).
	if a.attempt == 1 && m.Retry == 0 {
		a.rec, a.rev = w.freshRecord(m), 0
	} else if err := w.loadRecord(ctx, a); err != nil {
		w.admission(m.Run, m.ID, class, "defer", "shard record unreadable: "+err.Error())
		w.nakWithDelay(msg, w.backoff(1))
		return
	}
	if w.settle(ctx, a, class) {
		return
	}
	if w.deferForLocality(ctx, a, class) {
		return
	}
	var pre chan error
	if a.rev == 0 && a.attempt == 1 && m.Retry == 0 && !a.awaitOwner {
		// First delivery: write the running record while the lease is being
		// taken instead of after it; both are on the way to the command.
		// Nobody can hold the lease of a shard that has no record at all,
		// and if the lease fails anyway the record is put back. Not when
		// settle waits for the lease to judge: no attempt may begin before.
		pre = make(chan error, 1)
		go func() {
			w.beginAttempt(a, w.owner(a.attempt))
			pre <- w.putRecord(ctx, a)
		}()
	}
	l, err := w.takeLease(ctx, a.key, m.Fingerprint, a.attempt)
	defer func() {
		if l != nil { // this delivery held the shard: the attempt has ended
			w.disown(a.key)
		}
	}()
	if err != nil && pre != nil {
		w.undoBegin(ctx, a, <-pre)
		pre = nil
	}
	if err != nil && !errors.Is(err, ErrLeaseHeld) && ctx.Err() == nil {
		// The store took no write (full, reloading, unreachable). A Nak
		// would spend one of the shard's deliveries, and with nothing
		// durable to say why, the redelivery would count as an attempt:
		// hold the message instead, keeping the slot, so that the worker
		// also stops fetching until the store takes writes again.
		w.admission(m.Run, m.ID, class, "defer", fmt.Sprintf("%v; holding the shard until the store takes writes again (not an attempt)", err))
		release := w.holdForStore(class, err)
		l, err = w.awaitStore(ctx, stop, a)
		release()
		if err == nil {
			w.admission(m.Run, m.ID, class, "resume", "the store takes writes again")
		}
	}
	recheck := a.awaitOwner
	if errors.Is(err, ErrLeaseHeld) {
		// A Nak would spend one of the shard's deliveries on someone else's
		// lease; instead keep the message in progress until the lease
		// expires or its owner releases it, then look at the record again.
		w.admission(m.Run, m.ID, class, "defer", fmt.Sprintf("%v; waiting for it to expire (TTL %s)", err, w.ttl))
		done := w.holdForOwner(a.key)
		l, err = w.awaitLease(ctx, stop, a, class)
		done()
		if errors.Is(err, errSettledMeanwhile) {
			return
		}
		recheck = true
	}
	a.leased = err == nil
	if a.leased && recheck {
		// The record as it is now that this delivery holds the lease: the
		// attempt that held it may have committed, failed, or ended
		// without a word.
		if lerr := w.loadRecord(ctx, a); lerr != nil || w.settle(ctx, a, class) {
			w.release(l)
			if lerr != nil {
				w.nakWithDelay(msg, w.backoff(1))
			}
			return
		}
	}
	if err != nil && isClosed(stop) {
		// Shutting down while waiting for the lease: hand the delivery back
		// at once, as for one not started (a restarted worker takes it).
		w.admission(m.Run, m.ID, class, "requeue", err.Error())
		w.requeue(msg)
		return
	}
	if err != nil {
		delay := w.ttl / 2
		w.admission(m.Run, m.ID, class, "defer", fmt.Sprintf("%v; retry in %s", err, delay))
		w.nakWithDelay(msg, delay)
		return
	}
	w.admission(m.Run, m.ID, class, "admit", fmt.Sprintf("attempt %d; %s", a.attempt, slotInfo))
	w.runAttempt(ctx, stop, a, l, class, pre)
}

// repeated reports, and logs, a delivery whose number an attempt of the
// same retry round in the record already has. An attempt is numbered by
// its delivery, but nats-server writes a consumer's state asynchronously:
// a coordinator killed and restarted can deliver a message again as its
// first delivery. Run under that number, the attempt would tell the job
// it is the first again ({attempt}, SHARDPOOL_ATTEMPT) and overwrite the
// earlier attempt's log. settle hands it back at once, uncharged; each
// redelivery carries the next number, up to the consumer's MaxDeliver, as
// before the crash.
func (w *Worker) repeated(a *attemptState, class string) bool {
	last := 0
	for _, at := range a.rec.Attempts {
		if at.Round == a.m.Retry {
			last = max(last, at.N)
		}
	}
	if a.attempt > last {
		return false
	}
	w.admission(a.m.Run, a.m.ID, class, "requeue", fmt.Sprintf(
		"delivery %d, but the record holds attempt %d of this round (the coordinator lost its delivery count in a crash): handed back for the next number, not an attempt", a.attempt, last))
	return true
}

// owner is this worker's identity for an attempt.
func (w *Worker) owner(attempt int) stream.Owner {
	return stream.Owner{Worker: w.cfg.Name, Host: w.host, BootID: w.boot, PID: w.pid, PIDNS: w.pidns, Attempt: attempt}
}

// beginAttempt marks the record running by owner with a new attempt.
func (w *Worker) beginAttempt(a *attemptState, owner stream.Owner) {
	m := &a.m
	a.rec.CloseLost()
	a.rec.State, a.rec.Owner, a.rec.Retry, a.rec.Reason = stream.ShardRunning, &owner, m.Retry, ""
	logName := fmt.Sprintf("%s.%d.log", m.ID, a.attempt)
	if m.Retry > 0 {
		logName = fmt.Sprintf("%s.r%d.%d.log", m.ID, m.Retry, a.attempt)
	}
	a.rec.Attempts = append(a.rec.Attempts, stream.Attempt{N: a.attempt, Round: m.Retry, Worker: w.cfg.Name, Host: w.host,
		Start: time.Now().UTC(), Log: filepath.Join(w.evidenceDir(m.Run), "attempts", logName)})
}

// undoBegin puts back a running record written ahead of a lease that was
// then not taken (err is the record write's result).
func (w *Worker) undoBegin(ctx context.Context, a *attemptState, err error) {
	if err != nil {
		return // nothing was written; the record is read afresh later
	}
	a.rec.Attempts = a.rec.Attempts[:len(a.rec.Attempts)-1]
	a.rec.State, a.rec.Owner = stream.ShardPending, nil
	if err := w.putRecord(ctx, a); err != nil {
		w.log.Warn("put back running record", "shard", a.key, "err", err)
	}
}

// awaitLease polls for the shard's lease at a third of the TTL, keeping the
// message in progress, while another owner holds it, for at most three
// TTLs. Each time the lease is still held it also reads the shard's
// record: once that says the shard ended (validated, or failed), the
// delivery settles from it (errSettledMeanwhile) instead of waiting out
// the lease, which an attempt that committed leaves to expire.
func (w *Worker) awaitLease(ctx context.Context, stop <-chan struct{}, a *attemptState, class string) (*lease, error) {
	return w.retryLease(ctx, stop, a, max(w.ttl/3, 100*time.Millisecond), 3*w.ttl, "the lease of "+a.key,
		func(err error) bool { return errors.Is(err, ErrLeaseHeld) },
		func() bool { return w.settledMeanwhile(ctx, a, class) })
}

// errSettledMeanwhile: the delivery was settled from the record while it
// waited for the lease.
var errSettledMeanwhile = errors.New("settled from the shard's record while waiting for its lease")

// settledMeanwhile reads the shard's record and, when it says the shard
// ended, settles the delivery as settle does for any delivery that finds
// it so. A record still running or pending is left to the wait.
func (w *Worker) settledMeanwhile(ctx context.Context, a *attemptState, class string) bool {
	if err := w.loadRecord(ctx, a); err != nil {
		return false
	}
	if a.rec.State != stream.ShardValidated && a.rec.State != stream.ShardFailed {
		return false
	}
	return w.settle(ctx, a, class)
}

// storeWaitMax bounds how long a delivery is held for a store that takes
// no writes; past it the delivery is handed back. It began no attempt, so
// it is not charged (see charged), but it spends one of MaxDeliver.
const storeWaitMax = 15 * time.Minute

// awaitStore tries the shard's lease again at a third of the TTL (at most
// every 5 s), keeping the message in progress, while the store refuses the
// write; it returns on success, on any other outcome (the lease held by
// another, which awaitLease then handles), on stop, or after storeWaitMax.
func (w *Worker) awaitStore(ctx context.Context, stop <-chan struct{}, a *attemptState) (*lease, error) {
	return w.retryLease(ctx, stop, a, min(max(w.ttl/3, 100*time.Millisecond), 5*time.Second), storeWaitMax,
		"the store to take the lease of "+a.key,
		func(err error) bool { return err != nil && !errors.Is(err, ErrLeaseHeld) }, nil)
}

// retryLease takes the shard's lease every `every`, keeping the message in
// progress, for as long as again(err) and at most `limit`; it returns the
// last outcome, or why it stopped waiting for `what`. settled, if set, is
// asked each time the lease is held by another whether the delivery has
// been settled by other means (errSettledMeanwhile).
func (w *Worker) retryLease(ctx context.Context, stop <-chan struct{}, a *attemptState, every, limit time.Duration, what string, again func(error) bool, settled func() bool) (*lease, error) {
	t := time.NewTicker(every)
	defer t.Stop()
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-stop:
			return nil, fmt.Errorf("worker shutting down while waiting for %s", what)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
		_ = a.msg.InProgress()
		l, err := w.takeLease(ctx, a.key, a.m.Fingerprint, a.attempt)
		if errors.Is(err, ErrLeaseHeld) && settled != nil && settled() {
			return nil, errSettledMeanwhile
		}
		if !again(err) || time.Now().After(deadline) {
			return l, err
		}
	}
}

// lookAtDestination reports whether the shard's destination dst holds
// its committed output already (alreadyDone), or else why a commit there
// would be refused: another run's output, or something of the user's
// (refused before the command runs: it stays so until someone moves it,
// and each retry would cost the command's whole run to fail the same).
// Its wait on the output's file system is noted for the report
// (slowfs.go).
func (w *Worker) lookAtDestination(ctx context.Context, a *attemptState, dst string) (done bool, refused error) {
	defer w.fsBegin(a.key, "in the look at its destination "+dst+" before its command")()
	_, err := os.Lstat(dst)
	absent := errors.Is(err, fs.ErrNotExist)
	a.found = nil // of this look only: settle may look again
	if !absent && w.alreadyDone(ctx, a, dst) {
		return true, nil
	}
	switch {
	case absent:
		return false, nil
	case a.found != nil:
		return false, otherRunsOutput(dst, a.m.Run, a.found)
	default:
		return false, foreignDestination(dst, a.m.Run, a.m.Fingerprint)
	}
}

// settle ends the delivery without running when the record or the output
// says so: already committed, already failed in this round, out of
// attempts, or numbered like an attempt the record already holds (handed
// back: see repeated). It reports whether it settled the message.
func (w *Worker) settle(ctx context.Context, a *attemptState, class string) bool {
	m, msg := &a.m, a.msg
	// Most shards have nothing at their destination yet: one lstat says
	// so, where the marker's open and the look for a foreign destination
	// each walked the output directory's path (two lookups in a directory
	// of thousands).
	dst := filepath.Join(a.run.Spec.Output, m.ID)
	done, refused := w.lookAtDestination(ctx, a, dst)
	if done {
		w.admission(m.Run, m.ID, class, "skip", "already committed with this fingerprint and its output verifies")
		w.settleDurably(ctx, a, func() error { return msg.DoubleAck(ctx) })
		return true
	}
	if refused != nil {
		if a.ownerMayLive() {
			// An attempt still running meets the same output at its
			// commit and fails the shard itself, with its own outcome.
			return false
		}
		w.failAtOnce(ctx, a, class, refused)
		return true
	}
	if a.rec.State == stream.ShardFailed && a.rec.Fingerprint == m.Fingerprint && a.rec.Retry >= m.Retry && len(a.rec.Attempts) > 0 {
		w.admission(m.Run, m.ID, class, "discard", "shard already recorded failed in this retry round")
		_ = msg.Term()
		return true
	}
	if limit := a.run.Spec.Retries + 1; charged(&a.rec, m.Retry) >= limit {
		if a.ownerMayLive() {
			// Charged as lost only once this delivery holds the lease;
			// until then the attempt may yet commit.
			return false
		}
		a.rec.CloseLost()
		why := fmt.Sprintf("attempt limit %d reached: earlier attempts ended without a report", limit)
		if err := w.finish(ctx, a, stream.ShardFailed, why, nil); err != nil {
			w.keepUnrecorded(a, class, err)
			return true
		}
		w.admission(m.Run, m.ID, class, "failed", why)
		w.settleDurably(ctx, a, func() error { return msg.TermWithReason("attempt limit reached") })
		w.count(false)
		return true
	}
	if w.repeated(a, class) {
		_ = msg.Nak()
		return true
	}
	return false
}

// ownerMayLive reports, and notes in awaitOwner, that the record holds an
// attempt open while this delivery does not hold the lease: its worker
// may be running it still. A delivery can come while an attempt runs, its
// heartbeat having reached the server late (a stalled or overloaded host),
// or after a coordinator restart. A verdict that would end that attempt
// (charge it as lost, fail the shard) waits until this delivery holds the
// lease, its owner having released it or been proven gone. A first
// delivery that skipped reading the record (a.rev 0) may meet such an
// attempt too, and waits likewise.
func (a *attemptState) ownerMayLive() bool {
	if a.leased || (a.rev != 0 && !a.rec.OpenAttempt()) {
		return false
	}
	a.awaitOwner = true
	return true
}

// otherRunsOutput refuses to replace the output mk at dst when another
// run (by name) committed it: two runs given one output directory and
// shard IDs in common would otherwise replace each other's results in
// turn, without a word. A new generation of the same run replaces its
// outputs as before; so does a run whose marker names no run (written
// before markers did).
func otherRunsOutput(dst, run string, mk *checkpoint.Marker) error {
	if mk.Run == "" || mk.Run == run {
		return nil
	}
	return fmt.Errorf("%w: %s holds the output of run %s (fingerprint %s, committed %s), which run %s would replace: give run %s an output directory of its own, or remove %s to let it",
		ErrOtherRunsOutput, dst, mk.Run, mk.Fingerprint, mk.Time.UTC().Format(time.RFC3339), run, run, dst)
}

// failAtOnce records the shard failed for a reason no retry can change,
// without running it, and terminates its message: the run ends BLOCKED
// with the reason and the command that retries it once it is dealt with.
func (w *Worker) failAtOnce(ctx context.Context, a *attemptState, class string, why error) {
	m := &a.m
	a.rec.CloseLost()
	payload := a.m
	if err := w.finish(ctx, a, stream.ShardFailed, why.Error(), &payload); err != nil {
		w.keepUnrecorded(a, class, err)
		return
	}
	w.admission(m.Run, m.ID, class, "failed", why.Error())
	reason := "failed: " + why.Error()
	if len(reason) > 200 { // the record has it whole
		reason = strings.ToValidUTF8(reason[:200], "")
	}
	w.settleDurably(ctx, a, func() error { return a.msg.TermWithReason(reason) })
	w.count(false)
}

func (w *Worker) freshRecord(m *stream.ShardMsg) stream.ShardRecord {
	return stream.ShardRecord{Run: m.Run, ID: m.ID, Fingerprint: m.Fingerprint, Class: m.Class, State: stream.ShardPending}
}

// readShard reads and decodes the shard record at key, with its revision.
func (w *Worker) readShard(ctx context.Context, key string) (stream.ShardRecord, uint64, error) {
	var rec stream.ShardRecord
	e, err := w.b.Shards.Get(ctx, key)
	if err != nil {
		return rec, 0, err
	}
	err = stream.Decode(e.Value(), &rec)
	return rec, e.Revision(), err
}

// loadRecord reads the shard's record into a, afresh: decoded over what a
// held before, a field the stored record omits (an owner cleared) would
// have kept its old value on a second look (settle, settledMeanwhile).
func (w *Worker) loadRecord(ctx context.Context, a *attemptState) error {
	rec, rev, err := w.readShard(ctx, a.key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		a.rec, a.rev = w.freshRecord(&a.m), 0
		return nil
	}
	if err != nil {
		return err
	}
	a.rec, a.rev = rec, rev
	if a.rec.Fingerprint != a.m.Fingerprint {
		// A record of an older generation: this generation starts afresh.
		a.rec = w.freshRecord(&a.m)
	}
	return nil
}

// alreadyDone reports whether the shard is committed for this fingerprint,
// its output verifies, and its inputs have not changed since. A record
// without a verifying output, or an output without a record, is checked
// against the other. dst is the shard's destination; a marker of another
// fingerprint found there is left in a.found, which the caller empties
// before each look. An output found while the record holds an attempt
// open is recorded only by a delivery that holds the lease; it closes that
// attempt too.
func (w *Worker) alreadyDone(ctx context.Context, a *attemptState, dst string) bool {
	// A validated record's output was read back by its committer: a quick
	// look suffices. An output without one is read in full.
	validated := a.rec.State == stream.ShardValidated
	mk, err := checkpoint.VerifyCommitted(dst, a.m.Fingerprint, !validated)
	if err != nil && mk.Fingerprint != "" && mk.Fingerprint != a.m.Fingerprint {
		a.found = &mk
	}
	if err != nil || validated {
		return err == nil
	}
	if !a.leased && a.rev != 0 && a.rec.OpenAttempt() {
		// The open attempt may have published this output a moment ago,
		// its record on the way (or waiting for a coordinator that came
		// back). Recorded validated here, the record would keep that
		// attempt with no outcome, and refuse the attempt's own write:
		// wait for its lease instead, and look again (awaitOwner).
		a.awaitOwner = true
		return false
	}
	if mk.InputsChanged(a.m.Inputs) {
		w.admission(a.m.Run, a.m.ID, a.m.Class, "redo", "the output at "+dst+" was made from inputs that have changed since (size or modification time): made again")
		return false
	}
	// Committed earlier (for example under another coordinator data dir):
	// record it as validated so the run's counts see it.
	a.rec.Output = &stream.Output{Path: dst, Checksum: mk.Manifest, Files: mk.Files, Bytes: mk.Bytes}
	why := "output already committed by an earlier run of this fingerprint"
	// This delivery holds the lease: an open attempt is over.
	if n := closeOpenAttempt(&a.rec, mk.Owner, "its worker did not record it (stopped or cut off in between)"); n > 0 {
		why = "output committed by attempt " + strconv.Itoa(n) + ", which did not record it"
	}
	return w.finish(ctx, a, stream.ShardValidated, why, nil) == nil
}

// closeOpenAttempt closes the attempt rec holds open, if any, once the
// shard's output is found committed with committer (the owner its marker
// names) and the record is about to say validated: ok, with "committed
// its output; " and why as its reason, where committer is that attempt
// (commitOwner of the record's running owner), else lost. It returns the
// number of an attempt closed ok, or 0.
func closeOpenAttempt(rec *stream.ShardRecord, committer, why string) int {
	if !rec.OpenAttempt() {
		return 0
	}
	if rec.Owner == nil || committer != commitOwner(*rec.Owner) {
		rec.CloseLost()
		return 0
	}
	last := &rec.Attempts[len(rec.Attempts)-1]
	last.Outcome, last.Reason = stream.OutcomeOK, "committed its output; "+why
	return last.N
}

// commitOwner is what an attempt of owner o writes as the owner in the
// marker of the output it commits. The record's running owner is that
// attempt's: alreadyDone compares the two.
func commitOwner(o stream.Owner) string {
	return fmt.Sprintf("%s/%s/%d/attempt-%d", o.Worker, o.Host, o.PID, o.Attempt)
}

// charged counts the attempts of retry round `round` that spend one of the
// shard's `retries`: every attempt that ran its command (or failed to
// start it), ended or lost with its worker. Not charged: attempts handed
// back by a shutdown or preempted under memory pressure, and ones
// discarded because another attempt had committed. A delivery that never
// began an attempt (a lease the store did not take, a worker killed before
// it leased, a locality deferral) is not charged either; the consumer's
// MaxDeliver still bounds deliveries in all, and the coordinator fails a
// shard that runs out of them.
func charged(rec *stream.ShardRecord, round int) int {
	n := 0
	for i := range rec.Attempts {
		at := &rec.Attempts[i]
		if at.Round != round {
			continue
		}
		switch at.Outcome {
		case stream.OutcomeInterrupted, stream.OutcomePreempted, stream.OutcomeDiscarded:
			continue
		}
		n++
	}
	return n
}

// putRecord writes a.rec with compare-and-set from a.rev.
func (w *Worker) putRecord(ctx context.Context, a *attemptState) error {
	ctx, cancel := w.storeCtx(ctx)
	defer cancel()
	a.rec.Updated = time.Now().UTC()
	data, err := stream.Encode(&a.rec)
	if err != nil {
		return err
	}
	var rev uint64
	if a.rev == 0 {
		rev, err = w.b.Shards.Create(ctx, a.key, data)
	} else {
		rev, err = w.b.Shards.Update(ctx, a.key, data, a.rev)
	}
	if err != nil {
		return fmt.Errorf("record shard %s: %w", a.key, err)
	}
	a.rev = rev
	return nil
}

// finish records a final state for the shard.
func (w *Worker) finish(ctx context.Context, a *attemptState, state, reason string, payload *stream.ShardMsg) error {
	a.rec.State, a.rec.Reason, a.rec.Owner, a.rec.Payload = state, reason, nil, payload
	a.rec.Retry = a.m.Retry
	if err := w.putRecord(ctx, a); err != nil {
		return err
	}
	w.countEnded(a.m.Run, state)
	return nil
}

// runAttempt runs an attempt whose lease is held. pre, when set, delivers
// the result of the running record written ahead (see handle).
func (w *Worker) runAttempt(ctx context.Context, stop <-chan struct{}, a *attemptState, l *lease, class string, pre <-chan error) {
	m, spec := &a.m, &a.run.Spec
	cls := spec.Classes[class]
	if cls.Scratch > 0 || spec.StageFor(class) {
		// Last, once this attempt's reservation is released and its
		// scratch emptied: fetch loops that admission held back for
		// scratch room look again (scratchFit).
		defer w.wakeAll()
	} else {
		defer w.holdNoScratch(class, a)()
	}
	owner := l.rec.Owner
	var err error
	if pre != nil {
		err = <-pre
	} else {
		w.beginAttempt(a, owner)
		err = w.putRecord(ctx, a)
	}
	at := a.rec.Attempts[len(a.rec.Attempts)-1]
	logDir := filepath.Dir(at.Log)
	if a.rev == 0 && errors.Is(err, jetstream.ErrKeyExists) {
		// The optimistic first delivery met an existing record (an earlier
		// generation, or a shard committed from another data directory).
		if err = w.loadRecord(ctx, a); err == nil {
			if w.settle(ctx, a, class) {
				w.release(l)
				return
			}
			w.beginAttempt(a, owner)
			err = w.putRecord(ctx, a)
		}
	}
	if err == nil {
		// The lease and the running record must survive a host crash of the
		// coordinator before the command starts.
		err = w.barrierRemote(ctx)
	}
	if err != nil {
		// Someone else changed the record (a new generation, a verification
		// failure), or it is not durable: let the message come back and
		// decide afresh.
		w.admission(m.Run, m.ID, class, "defer", err.Error())
		w.release(l)
		w.nakWithDelay(a.msg, w.backoff(1))
		return
	}
	base, err := w.scratch.take(m.Run)
	if err != nil {
		w.handBackForScratch(ctx, a, l, err, "")
		return
	}
	defer w.scratch.put(m.Run, base)
	var res result
	v := stream.Vars{ID: m.ID, Inputs: m.Inputs, Out: base + ".out", Scratch: base + ".tmp",
		Ckpt: CkptDir(spec.Output, m.Run, m.Fingerprint, m.ID), Attempt: a.attempt}
	// Staging and a wait for scratch space can outlast the lease's TTL:
	// beat for the attempt meanwhile, as the command's heartbeat does
	// once it runs. Without it a copy longer than the TTL let the
	// message come back (to another worker, whose lease then expired
	// under this one's copy). pctx ends them at once where the worker
	// stops, the lease is lost or the run is halted with its commands
	// stopped (halt --now: prep) instead of finishing a large input
	// first; a copy resumes from its verified chunks next time.
	var preLost chan struct{}
	var prep *running
	pctx, stopPre := ctx, func() {}
	if spec.StageFor(class) || cls.Scratch > 0 {
		preLost = make(chan struct{})
		stopBeat := w.heartbeat(ctx, a.msg, l, preLost)
		prep = &running{key: a.key, run: m.Run, id: m.ID, class: class, attempt: a.attempt, started: time.Now(), preempt: make(chan struct{})}
		unprep := w.addPreparing(prep)
		var cancel context.CancelFunc
		pctx, cancel = context.WithCancel(ctx)
		go func() {
			select {
			case <-stop:
			case <-preLost:
			case <-prep.preempt:
			case <-pctx.Done():
			}
			cancel()
		}()
		stopPre = func() { stopBeat(); unprep(); cancel() }
	}
	// preStopped is the result of an attempt that pctx ended while doing.
	preStopped := func(doing string) result {
		switch {
		case isClosed(preLost):
			return result{outcome: stream.OutcomeLeaseLost, reason: "lease could not be renewed while " + doing + "; not run"}
		case prep != nil && isClosed(prep.preempt) && ctx.Err() == nil:
			return result{outcome: stream.OutcomeInterrupted, reason: prep.why + "; it was " + doing + ", its command was not started", halted: true}
		}
		return result{outcome: stream.OutcomeInterrupted, reason: "worker shutting down while " + doing}
	}
	if !spec.StageFor(class) && cls.Scratch > 0 {
		// Staging reserves the class's declared scratch with the inputs;
		// a shard that stages nothing reserves it here, waiting in its
		// slot (its lease renewed) while running shards hold the room,
		// as it would wait for a slow copy.
		var release func()
		err := w.waitForRoom(pctx, m, class, func() (err error) {
			release, err = w.reserveScratch(cls.Scratch, v.Out, v.Scratch)
			return err
		})
		switch {
		case err == nil:
			defer release()
			defer w.holdScratch(class, a)()
		case staging.Held(err): // pctx ended the wait
			res = preStopped("waiting for scratch space")
		default:
			res = result{outcome: stream.OutcomeStart, reason: err.Error() + "; the command was not run"}
		}
	}
	if res.outcome == "" && spec.StageFor(class) {
		staged, unhold, sres := w.stage(pctx, a, cls, base+".in", v.Out, v.Scratch)
		if isClosed(preLost) || (sres.outcome != "" && pctx.Err() != nil && ctx.Err() == nil) {
			sres = preStopped("staging the inputs")
		}
		defer os.RemoveAll(base + ".in")
		if staged != nil {
			defer staged.Release()
			v.Inputs = staged.Paths
		}
		defer unhold() // before Release: never counted as room it has not
		res = sres
	}
	stopPre()
	if res.outcome == "" {
		res = w.prepareAndRun(ctx, stop, a, l, cls, v, logDir, at.Log)
		if chargedFailure(res.outcome) {
			res.reason += w.scratchFullNote(cls)
		}
	}
	// Before the slot is freed: a worker stopping after so many start
	// errors in a row fetches no more in their place.
	w.noteStart(ctx, class, res.outcome, res.reason)
	if !chargedFailure(res.outcome) {
		select {
		case w.concluding <- struct{}{}:
			defer func() { <-w.concluding }()
			a.free()
		default:
		}
	}
	w.conclude(ctx, a, l, v, res)
}

// placeGPUs reserves the devices of a's shard, of class cls, and returns
// them as CUDA_VISIBLE_DEVICES (released with w.releaseGPUs(a.key)), or
// the result of an attempt that could not have them: handed back
// uncharged where the devices are busy or the shard was fetched with no
// look at them, a start error otherwise.
func (w *Worker) placeGPUs(ctx context.Context, a *attemptState, cls stream.Class) (string, result) {
	snap, err := w.cfg.Probe.Snapshot(ctx, nil)
	if err != nil {
		return "", result{outcome: stream.OutcomeStart, reason: "probe GPUs: " + err.Error()}
	}
	// The VRAM admission counted devices by: the declared, or the
	// profile's measured peak where above it.
	vram := cls.VRAM
	if p, _, ok := w.peakFor(a.m.Class); ok {
		vram = max(vram, p.VRAM)
	}
	vramEach := vram / int64(cls.GPUs)
	uuids, err := w.reserveGPUs(snap, a.key, cls.GPUs, vramEach)
	if err != nil && w.gpusBusy(snap, cls.GPUs, vramEach) {
		// Not the shard's failure: its devices are busy now (another
		// job took one since admission looked, or another worker of
		// this host placed a shard on it since). Handed back
		// uncharged, as under memory pressure, to run once one is free
		// here or elsewhere. Where the host has too few healthy devices
		// at all, it is a start error, which stops a worker that meets
		// it again and again (StopAfterStartFailures).
		return "", result{outcome: stream.OutcomePreempted, reason: "assign GPUs: " + err.Error() + "; the devices are busy, not the shard's failure"}
	}
	if err != nil && a.blind {
		// Fetched before this worker had seen a run of the class, so
		// with no look at the devices: a host that has none to give
		// (MIG, too small, none at all) would have fetched nothing.
		// Not the shard's failure either: handed back uncharged, for
		// a host that can run it; this worker, knowing the class now,
		// fetches no more of it while its devices cannot take one.
		return "", result{outcome: stream.OutcomePreempted, reason: fmt.Sprintf("assign GPUs: %v; fetched before this worker had seen a run of class %s, with no look at its devices: handed back, not the shard's failure", err, a.m.Class)}
	}
	if err != nil {
		return "", result{outcome: stream.OutcomeStart, reason: "assign GPUs: " + err.Error()}
	}
	return uuids, result{}
}

// chargedFailure reports whether an attempt that ended with outcome
// spends one of the shard's attempts. Such an attempt concludes in its
// slot: it counts toward the failures in a row (attemptFailed) before the
// slot fetches again, so a hold after 5 (holdLone) starts before a 6th is
// fetched. Freed at the command's exit, the slot fetched the 6th in the
// moment before the 5th was counted: a host failing every shard took one
// more than the hold allowed, and its next hold came 5 after that one.
func chargedFailure(outcome string) bool {
	switch outcome {
	case stream.OutcomeOK, stream.OutcomeInterrupted, stream.OutcomePreempted, stream.OutcomeLeaseLost:
		return false
	}
	return true
}

// inputCheckWait bounds checkInputs: a network mount that does not answer
// is left to the command, which runs under its time limit.
const inputCheckWait = 5 * time.Second

// checkInputs stats each input and returns what it found, or the first
// error; it gives up after wait with neither (a stat on a hung NFS mount
// can block for good, and this goroutine must not).
func checkInputs(paths []string, wait time.Duration) ([]fs.FileInfo, error) {
	if len(paths) == 0 {
		return nil, nil
	}
	type found struct {
		infos []fs.FileInfo
		err   error
	}
	done := make(chan found, 1)
	go func() {
		infos := make([]fs.FileInfo, 0, len(paths))
		for _, p := range paths {
			fi, err := os.Stat(p)
			if err != nil {
				done <- found{err: err}
				return
			}
			infos = append(infos, fi)
		}
		done <- found{infos: infos}
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case f := <-done:
		return f.infos, f.err
	case <-t.C:
		return nil, nil
	}
}

// lookAtOutput says why the attempt's command is not to run as far as
// its output directory goes: gone or moved since this worker's first
// commit there, missing where its file system is not mounted, or not
// writable here. "" when none.
func (w *Worker) lookAtOutput(ctx context.Context, a *attemptState) string {
	out := a.run.Spec.Output
	defer w.fsBegin(a.key, "in the look at its output directory "+out+" before its command")()
	if why, _ := w.outputRefused(ctx, out, a.run.OutputOn); why != "" {
		return why
	}
	// An output directory this host cannot write (a read-only mount,
	// as after ext4's errors=remount-ro before Linux 6.12, or another
	// owner's) would fail the commit only after the command's whole
	// run: say so before it.
	// One access(2), no file made; a directory not made yet is made by
	// the commit.
	if err := unix.Access(out, unix.W_OK); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Sprintf("the output directory %s cannot be written on host %s: %v", out, w.host, err)
	}
	// One that access(2) calls writable may still refuse every write
	// (readonly.go).
	return w.outputReadOnly(out)
}

func (w *Worker) prepareAndRun(ctx context.Context, stop <-chan struct{}, a *attemptState, l *lease, cls stream.Class, v stream.Vars, logDir, logPath string) result {
	spec := &a.run.Spec
	// Each input was there when the run was submitted. One gone here
	// (deleted, moved, a mount this host lacks) fails the attempt with
	// that reason instead of whatever the command makes of it.
	var pe *fs.PathError
	infos, err := checkInputs(v.Inputs, inputCheckWait)
	if errors.As(err, &pe) && errors.Is(err, fs.ErrNotExist) {
		if why := w.dirProblem(spec.Dir); why != "" {
			return result{outcome: stream.OutcomeStart, reason: why} // the inputs' directory is likely gone with it
		}
		return result{outcome: stream.OutcomeStart, reason: fmt.Sprintf("input %s is missing on host %s (it was there at submit)", pe.Path, w.host)}
	} else if err != nil {
		return result{outcome: stream.OutcomeStart, reason: fmt.Sprintf("input unreadable on host %s: %v", w.host, err)}
	}
	// The inputs' stamp is of their source as the command is about to read
	// it, from the look just taken; staged copies are not what changes, so
	// their sources are looked at (under the same bound). A look that gave
	// up leaves no stamp: never taken for changed.
	if !slices.Equal(v.Inputs, a.m.Inputs) {
		infos, _ = checkInputs(a.m.Inputs, inputCheckWait)
	}
	a.inputs = checkpoint.StampOf(infos)
	if why := w.lookAtOutput(ctx, a); why != "" {
		return result{outcome: stream.OutcomeStart, reason: why + "; the command was not run"}
	}
	if why := w.roomAt(spec.Output, a.m.Class); why != "" {
		// Not the shard's failure: handed back, and its class held.
		return result{outcome: stream.OutcomeInterrupted, reason: why + "; the command was not run"}
	}
	// {out} and {scratch} come from the worker's pool, empty. {ckpt} is
	// created only when the command (or its validator or env) names it:
	// directory creation is a measurable part of a short shard's cost. A
	// job that reads SHARDPOOL_CKPT_DIR gets it created by its first
	// `ckpt commit`.
	if usesCkpt(spec) {
		if err := os.MkdirAll(v.Ckpt, 0o755); err != nil {
			return result{outcome: stream.OutcomeStart, reason: err.Error()}
		}
	}
	if err := w.ensureDir(logDir); err != nil {
		return result{outcome: stream.OutcomeStart, reason: err.Error()}
	}
	argv, err := stream.Expand(spec.Command, v)
	if err != nil {
		return result{outcome: stream.OutcomeStart, reason: err.Error()}
	}
	env, err := shardEnv(w.classEnv(spec, a.m.Fingerprint, a.m.Class, cls), spec, &a.m, v)
	if err != nil {
		return result{outcome: stream.OutcomeStart, reason: err.Error()}
	}
	if cls.GPUs > 0 {
		uuids, res := w.placeGPUs(ctx, a, cls)
		if res.outcome != "" {
			return res
		}
		defer w.releaseGPUs(a.key)
		env = append(env, "CUDA_VISIBLE_DEVICES="+uuids)
		w.admission(a.m.Run, a.m.ID, a.m.Class, "gpus", "CUDA_VISIBLE_DEVICES="+uuids)
	}
	lost := make(chan struct{})
	stopHB := w.heartbeat(ctx, a.msg, l, lost)
	// The growth estimate reserves the peak admission used: the declared
	// or, when larger, the measured one (a run profiled and not declared
	// has only the latter).
	peak, source := cls.Memory, "declared in the spec"
	if p, _, ok := w.peakFor(a.m.Class); ok && p.Memory > peak {
		peak, source = p.Memory, p.Source
	}
	var cg *shardCgroup
	if w.enforce && cls.Memory > 0 {
		// The class's memory is a hard per-shard limit here; CPU is capped at
		// its cpus. The cgroup lives under the worker's own.
		if c, err := w.cgroups.newShard(fmt.Sprintf("%s-%s-a%d", a.m.Run, a.m.ID, a.attempt), cls.Memory, int64(cls.CPUs)*1000); err == nil {
			cg = c
			defer w.cgroups.release(cg)
		} else {
			w.log.Warn("shard cgroup", "shard", a.key, "err", err)
		}
	}
	// Without a cgroup the process group's RSS is sampled while the
	// command runs: its peak where the kernel's figure says nothing.
	onStart, sampled := w.trackLive(liveShard{class: a.m.Class, peak: peak, run: a.m.Run, fp: a.m.Fingerprint, id: a.m.ID}, cg == nil)
	rr := &running{key: a.key, run: a.m.Run, id: a.m.ID, class: a.m.Class, attempt: a.attempt, started: time.Now(), preempt: make(chan struct{})}
	w.addRunning(rr)
	var res result
	if isClosed(rr.preempt) && rr.halted {
		// Its run was halted with its commands stopped as this one was
		// about to start (addRunning closed preempt before it returned).
		res = result{outcome: stream.OutcomeInterrupted, reason: rr.why + "; its command was not started", halted: true}
	} else {
		res = w.execute(argv, env, spec.Dir, logPath, spec.TimeoutFor(a.m.Class), stop, rr.preempt, lost, w.commandStarted(rr, onStart), cg, a.held)
		select {
		case <-rr.preempt:
			switch {
			case res.outcome == stream.OutcomeInterrupted && rr.halted:
				res.reason, res.halted = rr.why, true
			case res.outcome == stream.OutcomeInterrupted:
				res.outcome, res.reason = stream.OutcomePreempted, rr.why
			}
		default:
		}
	}
	w.removeRunning(a.key)
	if cg == nil {
		res.peakRSS = max(res.peakRSS, sampled())
	} else {
		res.peakMemory = cg.peak()
		if n := cg.oomKills(); n > 0 && res.outcome != stream.OutcomeOK {
			res.outcome = stream.OutcomeOOM
			res.reason = fmt.Sprintf("killed by the OOM killer at the class's memory limit of %s (its own cgroup)", stream.FormatSize(cls.Memory))
		}
	}
	if got := max(res.peakMemory, res.peakRSS); got > 0 {
		w.learnPeak(a.m.Run, a.m.Fingerprint, a.m.Class, a.m.ID, got)
		w.warnPeakAbove(a, peak, source, got)
	}
	if res.outcome == stream.OutcomeOK {
		vlog := logPath
		if res.log != "" {
			vlog = res.log // beside the attempt's log as it was named
		}
		if why := w.invalidOutput(spec, v, env, vlog, spec.TimeoutFor(a.m.Class), stop, lost, a.held); why != "" {
			res.outcome, res.reason = stream.OutcomeInvalid, why
		}
	}
	stopHB()
	return res
}

// warnPeakAbove says, once per run and class, that a shard's measured
// peak went well above (a quarter) the peak its class's admission
// reserves for each shard, from source: admission starts shards by that
// figure, so more of them may be started than the host can hold once
// they grow. A profile whose samples missed the largest shards (shards
// of one cost) is the usual cause. The margins keep apart two ways of
// measuring one peak (a cgroup's; sampled RSS, which counts the shared
// libraries of a pipeline's processes once each).
func (w *Worker) warnPeakAbove(a *attemptState, reserved int64, source string, got int64) {
	if !plan.WellAbove(got, reserved) {
		return
	}
	todo := "profile again, with a \"cost\" on each manifest line where shards differ in the work they do (docs/admission.md)"
	if !strings.HasPrefix(source, "measured") && !strings.HasPrefix(source, learnedPrefix) {
		todo = "declare the class's memory as its largest shard needs it"
	}
	risk := "more shards may be started than this host can hold once they grow"
	if w.cfg.Auto {
		// learnPeak raised what admission reserves; shards admitted
		// before went by the smaller figure, as do other workers until
		// this attempt is recorded (the run record's peaks_seen).
		risk = "shards admitted before this one was seen went by that figure; this worker's admission now reserves the largest peak seen"
	}
	msg := fmt.Sprintf("shard %s of class %s peaked at %s, above the %s per shard its admission reserves (%s): %s; %s",
		a.m.ID, a.m.Class, stream.FormatSize(got), stream.FormatSize(reserved), source, risk, todo)
	key := runClass{a.m.Run, a.m.Class}
	w.mu.Lock()
	_, warned := w.peakWarned[key]
	if !warned {
		w.peakWarned[key] = msg
	}
	w.mu.Unlock()
	if warned {
		return
	}
	w.log.Warn(msg, "run", a.m.Run)
	w.admission(a.m.Run, a.m.ID, a.m.Class, "peak-above", msg)
}

// invalidOutput judges what a command that exited 0 left in v.Out, as a
// run does before committing it and a profile does for its samples: each
// of the spec's outputs present, then the spec's validator run (its log
// beside the command's, at logPath.validator). It says why the output is
// invalid, or "" when it is not.
func (w *Worker) invalidOutput(spec *stream.Spec, v stream.Vars, env []string, logPath string, timeout time.Duration, stop, lost <-chan struct{}, held *heldShard) string {
	if missing := stream.MissingOutputs(v.Out, spec.Outputs, v.ID); len(missing) > 0 {
		return missingReason(missing, v.Out)
	}
	if len(spec.Validator) == 0 {
		return ""
	}
	vargv, err := stream.Expand(spec.Validator, v)
	if err != nil {
		return "validator: " + err.Error()
	}
	if vr := w.execute(vargv, env, spec.Dir, logPath+".validator", timeout, stop, nil, lost, nil, nil, held); vr.outcome != stream.OutcomeOK {
		return "validator: " + vr.reason
	}
	return ""
}

// missingReason says which of the spec's outputs an attempt that exited 0
// did not write, and what it wrote instead (the first few names at the top
// of out), which is usually the clue.
func missingReason(missing []string, out string) string {
	held := "{out} was empty"
	if entries, err := os.ReadDir(out); err == nil && len(entries) > 0 {
		var names []string
		for _, e := range entries[:min(len(entries), 5)] {
			n := e.Name()
			if e.IsDir() {
				n += "/"
			}
			names = append(names, n)
		}
		held = fmt.Sprintf("{out} held %q", names)
		if len(entries) > 5 {
			held += fmt.Sprintf(" and %d more", len(entries)-5)
		}
	}
	return fmt.Sprintf("exit 0, but nothing in {out} matches the spec's outputs %q (%s): the command wrote its result elsewhere, under another name, or not at all", missing, held)
}

// classEnv is the class environment (see classEnv) of a run generation,
// built once per fingerprint and class: the fingerprint covers the spec's
// env and classes, and the worker's own environment does not change.
func (w *Worker) classEnv(spec *stream.Spec, fp, class string, cls stream.Class) []string {
	key := fp + "\x00" + class
	w.mu.Lock()
	env, ok := w.envs[key]
	w.mu.Unlock()
	if ok {
		return env
	}
	env = classEnv(w.cfg.Binary, w.env, spec, cls)
	w.mu.Lock()
	w.envs[key] = env
	w.mu.Unlock()
	return env
}

func usesCkpt(spec *stream.Spec) bool {
	for _, a := range append(spec.Command[:len(spec.Command):len(spec.Command)], spec.Validator...) {
		if strings.Contains(a, "{ckpt}") {
			return true
		}
	}
	for _, val := range spec.Env {
		if strings.Contains(val, "{ckpt}") {
			return true
		}
	}
	return false
}

// ensureDir creates dir once per worker process (the attempts directory is
// shared by every shard of a run).
func (w *Worker) ensureDir(dir string) error {
	w.mu.Lock()
	done := w.dirs[dir]
	w.mu.Unlock()
	if done {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	w.mu.Lock()
	w.dirs[dir] = true
	w.mu.Unlock()
	return nil
}

// stage copies the shard's inputs to local scratch. On failure the result
// carries the reason and the attempt goes through the failure path.
// unhold ends the shard's count as holding its reservation (holdScratch),
// which begins the moment it has one, not at the copy's end; the caller
// calls it before it releases staged.
func (w *Worker) stage(ctx context.Context, a *attemptState, cls stream.Class, unpackDir, out, scratch string) (staged *staging.Staged, unhold func(), res result) {
	unhold = func() {}
	m := &a.m
	st, err := w.stagerFor(ctx)
	if err != nil {
		return nil, unhold, result{outcome: stream.OutcomeStage, reason: err.Error()}
	}
	files := m.Files
	if staging.Packed(files) {
		if _, err := os.Stat(files[0].Path); errors.Is(err, fs.ErrNotExist) {
			// Removed once the shard committed (dropPack): a delivery
			// after that stages the inputs themselves.
			files = nil
		}
	}
	if len(files) != len(m.Inputs) && !staging.Packed(files) {
		// Submitted without descriptions: describe here (reads each input once more).
		h := staging.LoadHashes("")
		files = nil
		for _, in := range m.Inputs {
			f, err := h.Describe(ctx, in)
			if err != nil {
				return nil, unhold, result{outcome: stream.OutcomeStage, reason: err.Error()}
			}
			files = append(files, f)
		}
	}
	// What its inputs need is what the class's next shards are
	// admitted by (scratchFit).
	w.noteStaged(m.Run, m.Fingerprint, m.Class, st.InputNeed(files))
	hold := func() func() {
		unhold = w.holdScratch(m.Class, a)
		return unhold
	}
	// Room that running shards hold comes back when they end: the shard
	// waits in its slot for it, as one that stages nothing does, rather
	// than spend an attempt.
	err = w.waitForRoom(ctx, m, m.Class, func() (err error) {
		staged, err = st.StageHeld(ctx, files, cls.Scratch, hold, out, scratch, unpackDir)
		return err
	})
	if err != nil {
		if ctx.Err() == nil { // else stopped: the caller says why
			w.admission(m.Run, m.ID, m.Class, "stage-failed", err.Error())
		}
		return nil, unhold, result{outcome: stream.OutcomeStage, reason: err.Error()}
	}
	if staging.Packed(files) {
		// Many small inputs came as one pack: unpack a verified working copy.
		// An error here must fail the attempt: the command would otherwise
		// run on no inputs (or some of them) and could exit 0.
		paths, err := unpack(ctx, staged.Paths[0], unpackDir)
		if err != nil {
			unhold()
			staged.Release()
			if ctx.Err() == nil {
				w.admission(m.Run, m.ID, m.Class, "stage-failed", "unpack: "+err.Error())
			}
			return nil, unhold, result{outcome: stream.OutcomeStage, reason: "unpack: " + err.Error()}
		}
		staged.Paths = paths
	}
	at := &a.rec.Attempts[len(a.rec.Attempts)-1]
	at.StageSeconds = staged.Stats.Seconds
	w.stagingLog(m, a.attempt, staged.Stats)
	return staged, unhold, result{}
}

// unpack extracts a staged pack into dir (made here, emptied first: an
// earlier process of the same pid, before a reboot, may have left it) and
// returns the unpacked inputs' paths.
func unpack(ctx context.Context, pack, dir string) ([]string, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return staging.Unpack(ctx, pack, dir)
}

// stagingLog appends one line per staging to runs/<run>/staging.jsonl
// (evidenceFile).
func (w *Worker) stagingLog(m *stream.ShardMsg, attempt int, s staging.Stats) {
	line, _ := json.Marshal(struct {
		Time    time.Time     `json:"time"`
		Worker  string        `json:"worker"`
		Shard   string        `json:"shard"`
		Attempt int           `json:"attempt"`
		Stats   staging.Stats `json:"stats"`
	}{time.Now().UTC(), w.cfg.Name, m.ID, attempt, s})
	w.mu.Lock()
	defer w.mu.Unlock()
	f, err := os.OpenFile(filepath.Join(w.evidenceDir(m.Run), w.evidenceFile("staging.jsonl")), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	f.Write(append(line, '\n'))
}

// heartbeat keeps the message in progress and the lease renewed at a third
// of the TTL; it closes lost when the lease cannot be renewed. The beats
// run on a timer, which costs no goroutine until the first one: most
// short shards end before it. The returned function stops the beats and
// waits for one in flight.
func (w *Worker) heartbeat(ctx context.Context, msg jetstream.Msg, l *lease, lost chan<- struct{}) (stop func()) {
	period := max(w.ttl/3, 100*time.Millisecond)
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex // held by a beat; guards t, over and away
	var t *time.Timer
	over := false
	var away time.Time // since when renewals get no answer
	beat := func() {
		mu.Lock()
		defer mu.Unlock()
		if over {
			return
		}
		_ = msg.InProgress()
		err := w.renew(ctx, l)
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, ErrLeaseLost):
			w.log.Warn("lease lost", "shard", l.key, "err", err)
			close(lost)
			over = true
			return
		case err != nil:
			// No answer (a coordinator restarting), or a full store: the
			// lease may be held still, and the command goes on. Tried
			// again every second, so that it is renewed (or taken back)
			// as soon as the store answers (unreachable.go).
			if away.IsZero() {
				away = time.Now()
				w.log.Warn("lease not renewed: the coordinator's store does not take it; the command goes on", "shard", l.key, "err", err)
			}
			t.Reset(min(period, time.Second))
			return
		case !away.IsZero():
			w.log.Info("lease renewed again", "shard", l.key, "after", time.Since(away).Round(time.Second))
			away = time.Time{}
		}
		t.Reset(period)
	}
	mu.Lock()
	t = time.AfterFunc(period, beat)
	mu.Unlock()
	return func() {
		cancel() // a renewal in flight returns at once
		mu.Lock()
		over = true
		t.Stop()
		mu.Unlock()
	}
}

// conclude commits a successful attempt or records a failed one, then
// settles the message.
func (w *Worker) conclude(ctx context.Context, a *attemptState, l *lease, v stream.Vars, res result) {
	m, spec := &a.m, &a.run.Spec
	class := m.Class
	at := &a.rec.Attempts[len(a.rec.Attempts)-1]
	at.Duration, at.ExitCode, at.Signal, at.PeakRSS = stream.Seconds(res.duration), res.exitCode, res.signal, res.peakRSS
	if res.peakMemory > 0 {
		at.PeakMemory = res.peakMemory
	}
	at.Outcome, at.Reason = res.outcome, res.reason
	if res.left != "" {
		at.LeftRunning = res.left
		w.admission(m.Run, m.ID, class, "left-running", res.left)
		w.noteLeft(m.Run, m.ID, res.left)
	}
	if !res.logged {
		at.Log = "" // the command printed nothing: no log file
	} else if res.log != "" {
		at.Log = res.log
	}
	if res.logLost != "" {
		// Not "printed nothing": said in the record, and by the worker.
		at.LogLost = res.logLost
		w.logLost(m.Run, m.ID, res.logLost)
	}

	if res.outcome == stream.OutcomeLeaseLost {
		// Another owner may hold the shard now; this attempt leaves no trace
		// but its log. The message is not settled: the lease decides.
		w.admission(m.Run, m.ID, class, "abandon", res.reason)
		return
	}
	if res.outcome == stream.OutcomeOK {
		err := w.untilStore(ctx, a, func(ctx context.Context) error { return w.ensureHeld(ctx, l) })
		if err == nil {
			t := time.Now()
			err = w.commit(ctx, a, v, l, t)
		}
		if err == nil {
			w.admission(m.Run, m.ID, class, "validated", fmt.Sprintf("attempt %d in %.3fs, output %s", a.attempt, res.duration.Seconds(), a.rec.Output.Checksum))
			w.settleDurably(ctx, a, func() error { return a.msg.DoubleAck(ctx) })
			w.count(true)
			return
		}
		if errors.Is(err, ErrLeaseLost) {
			w.admission(m.Run, m.ID, class, "abandon", "lease lost before commit; output discarded")
			return
		}
		if errors.Is(err, ErrOtherRunsOutput) || errors.Is(err, ErrForeignDestination) {
			// Met at the commit: it came while the command ran.
			at.Outcome, at.Reason = stream.OutcomeCommit, err.Error()
			w.failAtOnce(ctx, a, class, err)
			w.release(l)
			return
		}
		if errors.Is(err, checkpoint.ErrUnsafe) {
			// A symlink, a FIFO, a reserved or non-UTF-8 name in {out}:
			// the command writes it again at every retry, each of them
			// its whole length (hours, for some jobs), to fail the same.
			at.Outcome, at.Reason = stream.OutcomeCommit, err.Error()
			w.failAtOnce(ctx, a, class, fmt.Errorf("%w (not retried: the command would write it again)", err))
			w.release(l)
			return
		}
		if errors.Is(err, errCommitLost) {
			w.recordDiscarded(ctx, a, err)
			w.admission(m.Run, m.ID, class, "discard", "output discarded: "+err.Error())
			_ = a.msg.DoubleAck(ctx)
			return
		}
		if errors.Is(err, errCoordinator) || errors.Is(err, errRecordChanged) || errors.Is(err, errOutputMoved) {
			// Not the shard's failure: the coordinator's store did not take
			// a write (full, or gone), the record changed under the
			// validated one, or the output directory is gone or on another
			// file system (outroot.go). The message comes back, without
			// spending an attempt where the record can still say so; a
			// published output is then found verified and recorded, and an
			// output directory still gone fails the next delivery before
			// its command, as a start error (StopAfterStartFailures).
			at.Outcome, at.Reason = stream.OutcomeInterrupted, err.Error()
			a.rec.Output = nil
			w.handBackUncharged(ctx, a, l, "commit deferred: "+err.Error(), "defer", fmt.Sprintf("%v; redelivery in %s", err, w.ttl/2),
				func() { w.nakWithDelay(a.msg, w.ttl/2) })
			return
		}
		if errors.Is(err, errCommitPending) {
			// The other attempt may still fail to publish: keep the shard
			// queued and look again after a lease TTL.
			w.recordDiscarded(ctx, a, err)
			w.release(l)
			w.admission(m.Run, m.ID, class, "discard", fmt.Sprintf("output discarded: %v; recheck in %s", err, w.ttl))
			w.nakWithDelay(a.msg, w.ttl)
			return
		}
		if checkpoint.IsNoRoom(err) {
			never := w.noteFull(a, class, spec.Output, err)
			if never == "" {
				w.handBackForRoom(ctx, a, l, err)
				return
			}
			err = fmt.Errorf("%w; %s", err, never)
		}
		if errors.Is(err, unix.EROFS) {
			w.noteReadOnly(m.Run, m.ID, class, spec.Output, err)
		}
		at.Outcome, at.Reason = stream.OutcomeCommit, err.Error()
		res.outcome = stream.OutcomeCommit
	}
	if res.outcome == stream.OutcomeExit || res.outcome == stream.OutcomeSignal || res.outcome == stream.OutcomeInvalid {
		// A command that failed where the scratch directory refuses
		// writes failed for the host, not for the shard: a file system
		// remounted read-only after an error (which access(2) may not
		// tell: readonly.go), or its directories removed under the
		// worker, fails every command that writes {out}, while the pool's
		// directories, made once and reused, meet nothing. One look, on
		// failures only. Not a full one: a command may fill the scratch
		// itself, and is charged for it (scratchFullNote).
		if err := checkpoint.Writable(filepath.Join(w.cfg.Scratch, m.Run)); scratchBroken(err) {
			w.handBackForScratch(ctx, a, l, err, ", where the command failed: "+res.reason)
			return
		}
	}
	if res.outcome == stream.OutcomePreempted {
		// The host's pressure, or its GPUs taken, not the shard's
		// failure. The delay doubles with each hand-back too: a worker
		// that keeps meeting a device taken between its look and the
		// shard's start would otherwise take and hand back the shard
		// every second while it stays so, a record in its attempts each
		// time.
		delay := w.backoff(max(a.attempt, a.rec.Interrupted+1))
		reason := fmt.Sprintf("%s; requeued, redelivery in %s", res.reason, delay)
		w.handBackUncharged(ctx, a, l, reason, "requeue", reason, func() { w.nakWithDelay(a.msg, delay) })
		return
	}
	if res.outcome == stream.OutcomeInterrupted {
		reason, decision, why := "interrupted: "+res.reason+"; requeued", "requeue", res.reason
		if res.halted {
			// The halt took the run's message off the queue (a nak of it
			// changes nothing), unless a submission lifted the halt
			// meanwhile: then the nak hands it back at once.
			why = res.reason + "; held with the run's other shards until it is submitted again"
			reason, decision = why, "held"
		}
		w.handBackUncharged(ctx, a, l, reason, decision, why, func() { w.requeue(a.msg) })
		return
	}
	w.attemptFailed(ctx, a.key, class, fmt.Sprintf("%s %s: %s", m.Run, m.ID, at.Reason))
	limit, n := spec.Retries+1, charged(&a.rec, m.Retry)
	if n >= limit {
		payload := a.m
		if err := w.finish(ctx, a, stream.ShardFailed, fmt.Sprintf("after %d attempt(s): %s", n, at.Reason), &payload); err != nil {
			w.release(l)
			w.keepUnrecorded(a, class, err)
			return
		}
		w.release(l)
		w.admission(m.Run, m.ID, class, "failed", fmt.Sprintf("attempt %d of %d: %s", n, limit, at.Reason))
		w.settleDurably(ctx, a, func() error { return a.msg.TermWithReason("failed after retries") })
		w.count(false)
		return
	}
	delay := spec.RetryDelayAfter(n)
	if delay <= 0 {
		delay = w.backoff(n)
	}
	a.rec.State, a.rec.Owner, a.rec.Reason = stream.ShardPending, nil, fmt.Sprintf("attempt %d of %d: %s; retry in %s", n, limit, at.Reason, delay)
	if err := w.putRecord(ctx, a); err != nil {
		w.log.Warn("record attempt", "shard", a.key, "err", err)
	}
	w.release(l)
	w.admission(m.Run, m.ID, class, "retry", fmt.Sprintf("attempt %d of %d: %s; redelivery in %s", n, limit, at.Reason, delay))
	w.nakWithDelay(a.msg, delay)
}

// commit moves the attempt's outputs to <output>/<id> through checkpoint and
// records the shard validated. The prepared output is published only after
// this attempt won the shard's commit in the checkpoints bucket; a loser
// discards its copy. A previous output that does not verify is kept aside
// under .shardpool/replaced for inspection.
func (w *Worker) commit(ctx context.Context, a *attemptState, v stream.Vars, l *lease, start time.Time) error {
	spec := &a.run.Spec
	dst := filepath.Join(spec.Output, a.m.ID)
	// The file system's parts of the commit are noted for the report
	// (slowfs.go); the waits for the coordinator between them are not.
	inCommit := "in its commit to " + spec.Output
	fsDone := w.fsBegin(a.key, inCommit)
	defer func() { fsDone() }()
	if err := foreignDestination(dst, a.m.Run, a.m.Fingerprint); err != nil {
		return err
	}
	if why, err := w.outputRootFor(ctx, spec.Output, a.run.OutputOn); err != nil {
		return fmt.Errorf("commit %s: %w", dst, err)
	} else if why != "" {
		return fmt.Errorf("%w: %s", errOutputMoved, why)
	}
	p, err := checkpoint.Prepare(ctx, dst, v.Out, checkpoint.Options{
		Owner: commitOwner(w.owner(a.attempt)), Fingerprint: a.m.Fingerprint, Run: a.m.Run, Inputs: a.inputs, Move: true,
		Sync: w.outputSync(ctx, spec.Output)})
	if err != nil {
		return err
	}
	fsDone()
	// A coordinator that does not answer keeps the prepared output: the
	// claim is tried again once it does, after the lease is renewed (or
	// taken back: unreachable.go), which it must be by then.
	tried := false
	err = w.untilStore(ctx, a, func(ctx context.Context) error {
		if tried {
			if err := w.ensureHeld(ctx, l); err != nil {
				return err
			}
		}
		tried = true
		if err := w.claimCommit(ctx, a, l.rec.Owner, p.Marker.Manifest, dst); err != nil {
			return err
		}
		// The claim must outlive a host crash of the coordinator before
		// the output appears, or a second attempt could publish too.
		return w.barrierRemote(ctx)
	})
	if err != nil {
		p.Discard()
		if errors.Is(err, errCommitLost) || errors.Is(err, errCommitPending) || errors.Is(err, ErrLeaseLost) {
			return err
		}
		return fmt.Errorf("%w: %v", errCoordinator, err)
	}
	fsDone = w.fsBegin(a.key, inCommit)
	if published, err := p.PublishIfAbsent(); err != nil {
		return checkpoint.NoRoom(err, spec.Output, p.Marker)
	} else if !published {
		keep := ""
		if _, err := os.Stat(dst); err == nil {
			if _, verr := checkpoint.VerifyQuick(dst); verr != nil {
				keep = filepath.Join(spec.Output, MetaDir, "replaced")
			}
		}
		if err := p.Publish(keep); err != nil {
			return checkpoint.NoRoom(err, spec.Output, p.Marker)
		}
	}
	fsDone()
	mk := p.Marker
	a.rec.Output = &stream.Output{Path: dst, Checksum: mk.Manifest, Files: mk.Files, Bytes: mk.Bytes}
	a.rec.Attempts[len(a.rec.Attempts)-1].CommitSeconds = time.Since(start).Seconds()
	// Published: the record waits for a coordinator that does not answer
	// too (were it given up, the next delivery would find the output and
	// record it, a lease TTL later).
	if err := w.untilStore(ctx, a, func(ctx context.Context) error { return w.finish(ctx, a, stream.ShardValidated, "", nil) }); err != nil &&
		!w.recordedForIt(ctx, a, mk.Manifest) {
		if stream.IsConflict(err) {
			return fmt.Errorf("%w (another attempt, or the coordinator, wrote it): output committed, this attempt's record not written: %v", errRecordChanged, err)
		}
		return fmt.Errorf("%w: output committed, record not written: %v", errCoordinator, err)
	}
	// Not only where the command names {ckpt}: a job may use
	// $SHARDPOOL_CKPT_DIR. Where no run checkpoints, this is one failed
	// open.
	w.dropOlderCkpts(spec.Output, a.m.Run, a.m.Fingerprint, a.m.ID)
	dropPack(spec.Output, a.m.Files)
	return nil
}

// dropPack removes the pack a committed shard's inputs came in: a copy of
// them all, of no use once the output is there (a retry or a redo of the
// shard stages its inputs one by one, and a new submission packs them
// again). Only a pack in the run's own pack directory is removed.
func dropPack(output string, files []stream.InputFile) {
	if staging.Packed(files) && filepath.Dir(files[0].Path) == staging.PackDir(output) {
		_ = os.Remove(files[0].Path)
	}
}

// foreignDestination refuses a destination that exists, is not empty, and
// has no COMPLETE marker: every commit lands whole with its marker, so such
// a directory is not a shardpool output but something of the user's (an
// output directory shared with the inputs, and a shard named like one of
// its folders). It is left alone, not moved aside. An empty directory
// there is removed: there is nothing in it to keep. It also refuses one
// whose marker is another run's, of another fingerprint (otherRunsOutput):
// committed there since the shard started.
func foreignDestination(dst, run, fp string) error {
	const fix = "move it away, or give the output directory or the shard another name"
	if info, err := os.Lstat(dst); err != nil {
		return nil // absent (or unreadable: the commit says why)
	} else if !info.IsDir() {
		return fmt.Errorf("%w, left as it is: %s exists and is not a directory; %s", ErrForeignDestination, dst, fix)
	}
	// A marker makes it an output, sound or damaged: the commit judges it.
	// Only without one is the directory read, and then rarely in full.
	if mk, err := checkpoint.ReadMarker(dst); err == nil {
		if mk.Fingerprint == fp {
			return nil
		}
		return otherRunsOutput(dst, run, &mk)
	} else if !errors.Is(err, checkpoint.ErrIncomplete) {
		return nil
	}
	entries, err := os.ReadDir(dst)
	if err != nil {
		return nil // the commit says why
	}
	if len(entries) == 0 {
		_ = os.Remove(dst)
		return nil
	}
	return fmt.Errorf("%w, left as it is: %s exists with %d entries and no %s marker; %s",
		ErrForeignDestination, dst, len(entries), checkpoint.MarkerName, fix)
}

var (
	errCommitLost    = errors.New("another attempt committed this shard first")
	errCommitPending = errors.New("another live attempt is committing this shard")
	// errCoordinator: the coordinator's store did not take a write the
	// commit needs (its claim, barrier or the validated record).
	errCoordinator = errors.New("coordinator store unavailable")
	// errRecordChanged: the shard's record changed between this attempt's
	// running record and its validated one, and does not say what this
	// attempt would (recordedForIt).
	errRecordChanged = errors.New("the shard's record changed meanwhile")
)

// handBackUncharged ends an attempt that was not the shard's failure (a
// shutdown, memory pressure, a coordinator store that did not take the
// commit): the record goes back to pending with the delivery counted in
// Interrupted, not against the attempt limit; the lease is released, the
// decision logged, and settle hands the message back.
func (w *Worker) handBackUncharged(ctx context.Context, a *attemptState, l *lease, reason, decision, why string, settle func()) {
	a.rec.State, a.rec.Owner, a.rec.Reason = stream.ShardPending, nil, reason
	a.rec.Interrupted++
	// putRecord gives up by itself once the store takes no writes.
	if err := w.putRecord(context.WithoutCancel(ctx), a); err != nil {
		w.log.Warn("record hand-back", "shard", a.key, "err", err)
	}
	w.release(l)
	w.admission(a.m.Run, a.m.ID, a.m.Class, decision, why)
	settle()
}

// handBackForScratch hands an attempt back uncharged where the run's
// scratch directory failed it with err: the host's fault, not the
// shard's. The message comes back (to another worker, or to this one
// once its scratch works), and this worker fetches nothing meanwhile
// (scratchFault). detail, where set, follows the fault in the attempt's
// reason.
func (w *Worker) handBackForScratch(ctx context.Context, a *attemptState, l *lease, err error, detail string) {
	err = fmt.Errorf("scratch directory %s is not usable: %w", w.cfg.Scratch, err)
	w.scratchFault(err, filepath.Join(w.cfg.Scratch, a.m.Run))
	w.handBackForHost(ctx, a, l, err.Error()+detail, scratchRecheck)
}

// handBackForHost ends an attempt that the host failed (its scratch or
// its output directory), why saying how: recorded interrupted with why,
// no output, and handed back uncharged, redelivered after delay.
func (w *Worker) handBackForHost(ctx context.Context, a *attemptState, l *lease, why string, delay time.Duration) {
	at := &a.rec.Attempts[len(a.rec.Attempts)-1]
	at.Outcome, at.Reason = stream.OutcomeInterrupted, why
	a.rec.Output = nil
	reason := fmt.Sprintf("%s; not the shard's failure: requeued, redelivery in %s", why, delay)
	w.handBackUncharged(ctx, a, l, reason, "requeue", reason, func() { w.nakWithDelay(a.msg, delay) })
}

// keepUnrecorded leaves a shard's message queued when its final record
// could not be written: settling it would leave the shard with no message
// and no final state, pending for good. It comes back after a lease TTL
// and the record is tried again.
func (w *Worker) keepUnrecorded(a *attemptState, class string, err error) {
	w.admission(a.m.Run, a.m.ID, class, "defer", fmt.Sprintf("final record not written (%v); redelivery in %s", err, w.ttl))
	w.nakWithDelay(a.msg, w.ttl)
}

// claimCommit takes the shard's commit record with compare-and-set. A
// committed record of the same fingerprint beats this attempt when its
// output verifies at the destination with the recorded checksum
// (errCommitLost), or when it is younger than the lease TTL and its owner
// is not verified gone: it may be publishing right now (errCommitPending).
// Only a claim whose owner is gone, or that is older than a lease, or whose
// output was damaged, is taken over from its revision.
func (w *Worker) claimCommit(ctx context.Context, a *attemptState, owner stream.Owner, checksum, dst string) error {
	rec := stream.CommitRecord{Run: a.m.Run, ID: a.m.ID, Fingerprint: a.m.Fingerprint, State: stream.CommitCommitted,
		Owner: owner, Checksum: checksum, Path: dst, Time: time.Now().UTC()}
	data, err := stream.Encode(&rec)
	if err != nil {
		return err
	}
	for range 5 {
		// Usually the first claim: create without reading first.
		if _, err := w.b.Checkpoints.Create(ctx, a.key, data); err == nil {
			return nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("claim commit %s: %w", a.key, err)
		}
		e, err := w.b.Checkpoints.Get(ctx, a.key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("claim commit %s: %w", a.key, err)
		}
		var cur stream.CommitRecord
		if stream.Decode(e.Value(), &cur) == nil && cur.Fingerprint == a.m.Fingerprint && cur.State == stream.CommitCommitted {
			if cur.Owner == owner && cur.Checksum == checksum {
				// This attempt's own claim: an earlier try reached the
				// store and its answer did not (a coordinator killed
				// meanwhile, or nats.go sending what it buffered once it
				// reconnected). Claiming again wrote a second commit of
				// the same output (the drill's "one live commit per
				// shard" failed on it).
				return nil
			}
			// The output there is that commit's. It is another attempt's
			// of this shard, which won, unless it was made from inputs
			// that have changed since: then this attempt, made from them
			// as they are, replaces it (a submission queued it again).
			if mk, verr := checkpoint.VerifyQuick(dst); verr == nil && mk.Manifest == cur.Checksum &&
				(mk.Inputs == "" || mk.Inputs == a.inputs) {
				return errCommitLost
			}
			// Its age by the store's stamp, not by cur.Time: that is by
			// the claimant's clock, which may be far from this one's.
			if time.Since(w.onOwnTime(e.Created())) < w.ttl && !w.ownerGone(cur.Owner) {
				return errCommitPending
			}
		}
		if _, err := w.b.Checkpoints.Update(ctx, a.key, data, e.Revision()); err == nil {
			return nil
		}
	}
	return fmt.Errorf("claim commit %s: contended", a.key)
}

// recordDiscarded closes this attempt in the shard's record, marked
// discarded: in place where the record read afresh holds it (appended
// again, its open copy stayed under it, and was charged), else appended.
// The winner's output is at the destination, verified against its claim;
// when the record does not say validated yet (the winner died, or lost its
// record write, between publishing and recording), it is recorded
// validated here from that output, read back in full: otherwise nobody
// would, the message being settled, and the run would wait for good; an
// attempt it holds open is closed then (closeOpenAttempt). With nothing
// published yet (errCommitPending), a record this attempt held running
// goes back to pending.
func (w *Worker) recordDiscarded(ctx context.Context, a *attemptState, why error) {
	at := a.rec.Attempts[len(a.rec.Attempts)-1]
	at.Outcome, at.Reason = stream.OutcomeDiscarded, why.Error()
	dst := filepath.Join(a.run.Spec.Output, a.m.ID)
	// Read back once, however many times the record write is retried.
	published := sync.OnceValues(func() (checkpoint.Marker, error) {
		return checkpoint.VerifyCommitted(dst, a.m.Fingerprint, true)
	})
	for range 5 {
		if err := w.loadRecord(ctx, a); err != nil {
			return
		}
		mine := a.rec.OpenAttempt() // and this attempt the open one
		if i := slices.IndexFunc(a.rec.Attempts, func(x stream.Attempt) bool { return sameAttempt(x, at) }); i >= 0 {
			mine = mine && i == len(a.rec.Attempts)-1
			a.rec.Attempts[i] = at
		} else {
			mine = false
			a.rec.Attempts = append(a.rec.Attempts, at)
		}
		if a.rec.State != stream.ShardValidated {
			if mk, err := published(); err == nil {
				a.rec.Output = &stream.Output{Path: dst, Checksum: mk.Manifest, Files: mk.Files, Bytes: mk.Bytes}
				a.rec.Reason = "output committed by another attempt (" + mk.Owner + "), which did not record it"
				// Another attempt open (a later one, begun when this
				// one's lease was given up for lost while it committed)
				// has published and not recorded yet: its own record
				// write is refused from now on.
				closeOpenAttempt(&a.rec, mk.Owner, fmt.Sprintf("recorded by attempt %d of %s, which lost the commit race to it", at.N, at.Worker))
				a.rec.State, a.rec.Owner, a.rec.Retry = stream.ShardValidated, nil, a.m.Retry
			} else if mine {
				a.rec.State, a.rec.Owner, a.rec.Reason = stream.ShardPending, nil, at.Reason
			}
		}
		if w.putRecord(ctx, a) == nil {
			return
		}
	}
}

// recordedForIt reports whether the shard's record, which this attempt's
// validated record did not reach, says it already: an attempt that lost
// the commit race to this one recorded the shard validated from this
// attempt's output (checksum) and closed this attempt ok
// (recordDiscarded), or this attempt's own write landed and its answer
// was lost. The record read is then this attempt's, and the message is
// settled as after its own write; any other record (none read, or one
// that says something else) leaves the failure standing.
func (w *Worker) recordedForIt(ctx context.Context, a *attemptState, checksum string) bool {
	rec, rev, err := w.readShard(ctx, a.key)
	if err != nil || rec.Fingerprint != a.m.Fingerprint || rec.State != stream.ShardValidated ||
		rec.Output == nil || rec.Output.Checksum != checksum {
		return false
	}
	mine := a.rec.Attempts[len(a.rec.Attempts)-1]
	if !slices.ContainsFunc(rec.Attempts, func(x stream.Attempt) bool { return sameAttempt(x, mine) && x.Outcome == stream.OutcomeOK }) {
		return false
	}
	a.rec, a.rev = rec, rev
	w.countEnded(a.m.Run, stream.ShardValidated)
	return true
}

// sameAttempt reports whether x and y are one attempt (x as a record
// holds it, y as its worker does).
func sameAttempt(x, y stream.Attempt) bool {
	return x.N == y.N && x.Round == y.Round && x.Worker == y.Worker && x.Host == y.Host && x.Start.Equal(y.Start)
}

// barrier makes this worker's acknowledged writes durable at the
// coordinator (stream.SyncGroup) before a message is settled; concurrent
// callers share one request, and the coordinator may let it wait a few
// milliseconds for others. Under the other sync modes there is nothing to
// wait for.
func (w *Worker) barrier(ctx context.Context) error {
	if w.view().sync != stream.SyncGroup {
		return nil
	}
	last, done := w.joinFlush()
	defer done()
	if last {
		// At once, and for everyone: the coordinator's syncfs for this
		// request also answers the settling barriers waiting there.
		return w.durableNow.DoWithin(ctx, 0)
	}
	return w.durable.Do(ctx)
}

// joinFlush counts the caller among the deliveries waiting for a flush
// until done is called, and reports whether nobody else could join the
// flush (nobodyElse), so that waiting for company would only delay it.
func (w *Worker) joinFlush() (last bool, done func()) {
	n := w.flushing.Add(1)
	return w.nobodyElse(n), func() { w.flushing.Add(-1) }
}

// nobodyElse reports whether no delivery could join a flush that n of
// those in this worker's hands wait for: a lone shard (a run of one), or
// every one in hand waiting for a flush with nothing left in the queue
// (the last fetch of every class came back short). The last shards of a
// run once waited out their gathers (the outputs' 60 ms, then the
// coordinator's 30 ms) at the end of every run, the CPUs idle. While
// the queue is not dry, the next shard comes in a moment: counting only
// those in hand cut the gathers short mid-run too, and a run of 5,000
// short shards made 180 syncfs calls instead of 100.
func (w *Worker) nobodyElse(n int64) bool {
	h := w.handling.Load()
	return n >= h && (h <= 1 || w.queueDry())
}

// queueDry reports whether the last fetch of every class this worker
// serves came back short.
func (w *Worker) queueDry() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, g := range w.gates {
		if g.backlog() {
			return false
		}
	}
	return true
}

// hurryFlushes starts at once the flushes that deliveries wait for, once
// nobody else could join them (nobodyElse): they waited out their
// gathers when the queue ran dry after they began to wait.
func (w *Worker) hurryFlushes() {
	n := w.flushing.Load()
	if n == 0 || !w.nobodyElse(n) {
		return
	}
	w.mu.Lock()
	syncs := make([]*stream.FSSync, 0, len(w.outSyncs))
	for _, s := range w.outSyncs {
		if s != nil {
			syncs = append(syncs, s)
		}
	}
	w.mu.Unlock()
	for _, s := range syncs {
		s.Go(0, func(error) {})
	}
	if w.view().sync == stream.SyncGroup {
		// The coordinator's syncfs for this request answers the settling
		// barriers waiting there too.
		w.durableNow.GoWithin(0, func(error) {})
	}
}

// barrierRemote is a barrier that only matters if the coordinator's host
// can crash while this worker lives on: before a command starts (a lost
// lease would let a second worker run the shard) and before an output is
// published (a lost claim would let a second attempt publish). A worker
// on the coordinator's own boot dies with it; after the restart the output
// at the destination, verified, settles the shard. The barrier before
// settling a message (barrier) is never skipped: the record and the ack
// live in different files, and a crash may keep the ack alone.
func (w *Worker) barrierRemote(ctx context.Context) error {
	if v := w.view(); v.local || v.sync != stream.SyncGroup {
		return nil
	}
	return w.durableNow.Do(ctx)
}

// view is the worker's view of its coordinator; before any, the safe one.
func (w *Worker) view() coordView {
	if v := w.coord.Load(); v != nil {
		return *v
	}
	return coordView{sync: stream.SyncGroup}
}

// coordView is what a worker knows of its coordinator (learnCoordinator).
type coordView struct {
	sync  string // its sync mode
	local bool   // it runs on this boot of this host (see barrierRemote)
	store string // its store (CoordinatorInfo.Store); "" before an answer
	// proc is the coordinator's process when it runs on this boot and in
	// this pid namespace, whose CPU is shardpool's (shardpoolRoots).
	proc *probe.ProcID
}

// learnCoordinator asks the coordinator for its sync mode and host; the
// worker asks again with every report, so a coordinator restarted elsewhere
// or with another mode is noticed within one report period. Before the
// first answer it assumes group sync on another host (every barrier is
// made); a later failure keeps what it knew.
func (w *Worker) learnCoordinator(ctx context.Context, nc *nats.Conn) {
	if w.coord.Load() == nil {
		w.coord.Store(&coordView{sync: stream.SyncGroup})
	}
	ictx, cancel := context.WithTimeout(ctx, barrierTimeout)
	defer cancel()
	ci, err := stream.AskInfo(ictx, nc)
	if err != nil {
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, nats.ErrNoResponders) && w.infoMissRecent():
			// A coordinator restarting: its server takes connections
			// before the coordinator answers there, once it has recovered
			// its store and made it durable (a syncfs, seconds on a busy
			// disk). Misses within infoMissGrace are that moment.
			w.log.Debug("coordinator info unavailable", "err", err)
		default:
			w.warnOnline("coordinator info unavailable", "err", err)
		}
		return
	}
	w.infoMissedAt.Store(0)
	v := &coordView{sync: stream.SyncGroup}
	if stream.ValidSync(ci.Sync) {
		v.sync = ci.Sync
	}
	v.local = stream.KnownBootID(ci.BootID) && ci.BootID == w.boot && ci.Host == w.host
	v.store = ci.Store
	if v.local && ci.PID > 0 && ci.PIDNS != "" && ci.PIDNS == w.pidns {
		v.proc = &probe.ProcID{PID: ci.PID, Start: ci.Start}
	}
	w.coord.Store(v)
}

// infoMissGrace is how long the coordinator's info may find no responder
// before a worker warns: a coordinator restarting answers only once its
// store is recovered and durable. With a miss a report period (5 s) apart
// warned, a restart under a CI run's load was warned of.
const infoMissGrace = 30 * time.Second

// infoMissRecent notes a miss of the coordinator's info and reports
// whether the misses in a row began less than infoMissGrace ago.
func (w *Worker) infoMissRecent() bool {
	now := time.Now().UnixNano()
	if w.infoMissedAt.CompareAndSwap(0, now) {
		return true
	}
	return time.Duration(now-w.infoMissedAt.Load()) < infoMissGrace
}

// settleDurably makes the shard's final record durable, then runs the
// settling call (Ack or Term, which remove the message). When the barrier
// fails the message is handed back after a lease TTL instead: its next
// delivery finds the record or the output and settles it then.
func (w *Worker) settleDurably(ctx context.Context, a *attemptState, settle func() error) {
	if err := w.barrier(ctx); err != nil {
		w.log.Warn("final record not durable; message handed back", "shard", a.key, "err", err)
		w.nakWithDelay(a.msg, w.ttl)
		return
	}
	if err := settle(); err != nil {
		// A coordinator SIGKILLed may come back with its consumer's
		// deliveries behind its stream (nats-server writes consumer state
		// asynchronously): it ignores an ack for a delivery it no longer
		// knows and delivers the message again, and that delivery finds the
		// final record and settles it.
		w.log.Warn("ack or term not confirmed: the next delivery of this message finds its final record and settles it", "shard", a.key, "err", err)
	}
}

// isClosed reports whether ch is closed (a stop channel), without waiting.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// scratchFullNote says, for an attempt whose command failed, whether the
// scratch file system was full when it ended: the command says it in its
// own words ("No space left on device"), which do not say that staged
// inputs no shard used held the room, or that its class declares no
// scratch to reserve. It removes those idle inputs, so that the retry
// finds the room, and returns a note for the attempt's reason; "" where
// there was room. Full is less than 1 MiB or a thousandth of the file
// system left: a write that fails leaves little more.
func (w *Worker) scratchFullNote(cls stream.Class) string {
	st, err := probe.SysStatFS{}.Statfs(w.cfg.Scratch)
	if err != nil || st.Free() > max(1<<20, st.Total()/1000) {
		return ""
	}
	note := fmt.Sprintf("; the scratch file system of %s was full when the command ended (%s free of %s)",
		w.cfg.Scratch, stream.FormatSize(st.Free()), stream.FormatSize(st.Total()))
	if freed := w.hostStager().DropIdle(); freed > 0 {
		note += fmt.Sprintf(": %s of staged inputs no running shard used were removed for the retry", stream.FormatSize(freed))
	}
	if cls.Scratch == 0 {
		note += "; declare the class's scratch (room for its {out} and {scratch}) so that its shards wait for room instead of failing"
	}
	return note
}

// scratchWait is how often a shard waiting for scratch space that running
// shards hold looks again.
const scratchWait = 250 * time.Millisecond

// waitForRoom calls try until it fails for anything but room that running
// shards hold (staging.Held), looking again every scratchWait, and says
// once in admission.log that the shard waits. It returns try's last
// error: a Held one where ctx ended the wait.
func (w *Worker) waitForRoom(ctx context.Context, m *stream.ShardMsg, class string, try func() error) error {
	err := try()
	for logged := false; staging.Held(err); err = try() {
		if !logged {
			w.admission(m.Run, m.ID, class, "wait", err.Error()+"; waiting for them to end")
			logged = true
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(scratchWait):
		}
	}
	return err
}

// reserveScratch holds need bytes of the scratch file system for a shard
// whose class declares scratch and that stages nothing, until release, in
// the stager's reservations (staged shards' inputs and declared scratch
// are in them too; idle staged inputs are removed to make room). Without
// it such a class's scratch was declared for nothing: shards ran
// whatever the disk held and failed midway, or filled it for everyone.
// staging.Held(err) says that running shards' reservations hold the
// room, so that waiting for them will do; otherwise the file system
// cannot hold need even once they end, and the attempt fails with the
// numbers, unrun (a start error: a host whose scratch is full stops
// taking shards where others run them). What the shard writes in dirs
// (its {out} and {scratch}) leaves the reservation.
func (w *Worker) reserveScratch(need int64, dirs ...string) (release func(), err error) {
	return w.hostStager().Reserve(need, dirs...)
}
