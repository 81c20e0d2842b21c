package coordinator

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/stream"
)

// Halted is what Halt did to a run.
type Halted struct {
	Run         string `json:"run"`
	Fingerprint string `json:"fingerprint"`
	State       string `json:"state"`
	// Held counts the pending shards taken off the queue; Running the
	// shards whose commands run on and end as they would or, where Stop
	// is set, are being stopped.
	Held    int  `json:"held"`
	Running int  `json:"running"`
	Stop    bool `json:"stop,omitempty"`
	// Already is the halt that was in place before (nothing changed);
	// empty where this call halted the run, or stopped its running
	// commands.
	Already string `json:"already,omitempty"`
	// Reason is the run's reason now: why, and the command that goes on.
	Reason string `json:"reason"`
	Resume string `json:"resume"`
}

// Halt stops a run by hand, as the coordinator halts one whose shards
// all fail: it records the halt (by who, a user and host, says who asked)
// with the stream sequence before which the run's messages go, then
// takes them off the queue, so that no worker starts another of its
// shards. The commands running end as they would, and a shard that
// succeeds is validated; with stop (`shardpool halt --now`) the workers
// stop them instead (SIGTERM, then SIGKILL after their grace period) and
// hand their shards back uncharged, held with the rest. The run is
// BLOCKED until a submission of it puts its held shards back (Submit
// lifts the halt). A run halted already is left as it is (Halted.Already
// says why it is), but for stop on a halt that let its commands run: that
// stops them now. A COMPLETE run, or a BLOCKED one with nothing queued
// (nor, with stop, running), has nothing to halt (ErrNothingToHalt).
func Halt(ctx context.Context, js jetstream.JetStream, run, by string, stop bool) (Halted, error) {
	out := Halted{Run: run}
	b, cur, curRev, err := runRecord(ctx, js, "halt", run)
	if err != nil {
		return out, err
	}
	if err := haltable(&cur, stop); err != nil || !haltChanges(&cur, stop) {
		return halted(out, &cur, cur.Halted), err
	}
	s, err := js.Stream(ctx, stream.StreamShards)
	if err != nil {
		return out, fmt.Errorf("halt %s: %w", run, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return out, fmt.Errorf("halt %s: %w", run, err)
	}
	// What was published before now goes; a submission after this one's
	// record publishes past the bound, and is never taken off.
	seq := info.State.LastSeq + 1
	var refused error
	mine := false
	now := time.Now().UTC().Format(time.RFC3339)
	// Written over the record as the tracker or a submission may have
	// changed it meanwhile (changeRun reads it again on a conflict).
	rec, rev, err := changeRun(ctx, b, cur, curRev, func(r *stream.RunRecord) {
		if refused, mine = haltable(r, stop), false; refused != nil || !haltChanges(r, stop) {
			return // a halt of its failures meanwhile stands
		}
		// The state is the coordinator's to judge (BLOCKED, from the
		// shard records: the record's counts may be a flush old, and a
		// `shardpool run` takes BLOCKED with nothing running for its
		// verdict).
		mine = true
		if r.Halted != "" {
			// Halted already, its commands left to run: the halt's bound
			// and who halted it stand.
			r.Halted += fmt.Sprintf("; its running commands stopped by hand (shardpool halt --now, by %s at %s)", by, now)
			r.HaltStop = true
			return
		}
		how := "shardpool halt"
		if stop {
			how = "shardpool halt --now, its running commands stopped"
		}
		r.Halted = fmt.Sprintf("halted by hand (%s, by %s at %s)", how, by, now)
		r.HaltedBy, r.HaltSeq, r.HaltStop = by, seq, stop
	})
	if err != nil {
		return out, fmt.Errorf("halt %s: %w", run, err)
	}
	if refused != nil || !mine {
		return halted(out, &rec, rec.Halted), refused
	}
	// The coordinator purges too, at its next look; the first purge is
	// this one, so that the halt holds once the command returns.
	if err := PurgeHalted(ctx, js, &rec); err != nil {
		return halted(out, &rec, ""), fmt.Errorf("halt %s: take its messages off the queue: %w", run, err)
	}
	// The coordinator judges the halted run from its shard records at
	// once: BLOCKED, how many shards were held and how many run on (with
	// stop, until their workers have stopped them, within the wait).
	judged := rec
	for wait := time.Now().Add(judgeWait); time.Now().Before(wait) && ctx.Err() == nil; time.Sleep(50 * time.Millisecond) {
		e, err := b.Runs.Get(ctx, run)
		if err != nil && judged.State == stream.RunBlocked {
			break // judged, and then gone: a `shardpool run` that ended BLOCKED
		}
		if err != nil || e.Revision() <= rev {
			continue
		}
		var r stream.RunRecord
		if stream.Decode(e.Value(), &r) != nil || r.Halted != rec.Halted || r.Fingerprint != rec.Fingerprint {
			break // halted and submitted again meanwhile: report what was written
		}
		if judged = r; (r.State == stream.RunBlocked && (!stop || r.Counts.Running == 0)) || r.State == stream.RunComplete {
			break
		}
	}
	return halted(out, &judged, ""), nil
}

// judgeWait bounds how long Halt waits for the coordinator's judgement of
// the run it halted (a coordinator that is down judges it when it is back).
const judgeWait = 5 * time.Second

// haltable refuses a run that has nothing left to start: COMPLETE, or
// BLOCKED with nothing pending (its failed shards wait for a retry) and,
// where the halt would stop running commands (stop), nothing running.
func haltable(r *stream.RunRecord, stop bool) error {
	switch {
	case r.Halted != "":
		return nil
	case r.State == stream.RunComplete:
		return fmt.Errorf("halt %s: %w: the run is COMPLETE", r.Name, ErrNothingToHalt)
	case r.State == stream.RunBlocked && r.Counts.Pending == 0 && stop && r.Counts.Running == 0:
		return fmt.Errorf("halt %s: %w: the run is BLOCKED with nothing queued or running (%s)", r.Name, ErrNothingToHalt, r.Reason)
	case r.State == stream.RunBlocked && r.Counts.Pending == 0 && !stop:
		return fmt.Errorf("halt %s: %w: the run is BLOCKED with nothing queued (%s)", r.Name, ErrNothingToHalt, r.Reason)
	}
	return nil
}

// haltChanges reports whether a halt, stopping running commands or not
// (stop), changes the run record r: a run not halted yet, or halted with
// its commands left to run where this halt stops them.
func haltChanges(r *stream.RunRecord, stop bool) bool {
	return r.Halted == "" || (stop && !r.HaltStop)
}

// halted fills out from the run record r; already is the halt that was
// in place before, where this call changed nothing.
func halted(out Halted, r *stream.RunRecord, already string) Halted {
	out.Fingerprint, out.State, out.Held, out.Running, out.Stop = r.Fingerprint, r.State, r.Counts.Pending, r.Counts.Running, r.HaltStop
	out.Reason, out.Resume, out.Already = r.Reason, resumeCommand(*r), already
	return out
}
