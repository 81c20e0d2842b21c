package coordinator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/stream"
)

var (
	// ErrRunActive means a run that is not COMPLETE or BLOCKED was asked
	// to be forgotten.
	ErrRunActive = errors.New("run is still active")
)

// Forgotten is what Forget removed, and what it left.
type Forgotten struct {
	Run         string           `json:"run"`
	Fingerprint string           `json:"fingerprint"`
	State       string           `json:"state"`
	Removed     stream.Footprint `json:"removed"`
	// Output and Evidence stay on disk: the outputs, and the run's
	// evidence folder under the coordinator's data directory.
	Output   string `json:"output"`
	Evidence string `json:"evidence,omitempty"`
}

// ForgottenName is the file in a run's evidence folder that says the run
// was forgotten (ForgottenNote). It speaks for the run only while no
// progress.json is newer: a run of the name submitted since has moved on.
const ForgottenName = "forgotten.json"

// ForgottenVersion is ForgottenNote.V.
const ForgottenVersion = 1

// ForgottenNote is forgotten.json: the run Forget removed from the store,
// as the evidence it left behind keeps it. Without it, the evidence of a
// forgotten run reads as that of a run still in its store (status
// --data), and as another job's, which profile and plan refuse to write
// over, after forget was the way out they named.
type ForgottenNote struct {
	V           int       `json:"v"`
	Run         string    `json:"run"`
	Fingerprint string    `json:"fingerprint"`
	State       string    `json:"state"`
	Output      string    `json:"output"`
	Written     time.Time `json:"written"`
}

// WriteForgotten writes forgotten.json of f into its evidence folder,
// where that folder is on this host (a client elsewhere than the
// coordinator may not see it: nothing is written then).
func WriteForgotten(f Forgotten) error {
	if f.Evidence == "" {
		return nil
	}
	if fi, err := os.Stat(f.Evidence); err != nil || !fi.IsDir() {
		return nil
	}
	return writeEvidence(f.Evidence, ForgottenName, ForgottenNote{V: ForgottenVersion, Run: f.Run, Fingerprint: f.Fingerprint,
		State: f.State, Output: f.Output, Written: time.Now().UTC()})
}

// ForgottenSince is the forgotten.json of the evidence folder dir where
// it was written at or after since, the time of the run's last summary
// (final.json or progress.json); else nil: a run of the name came after
// the forget, or there was none. An unreadable one counts as none.
func ForgottenSince(dir string, since time.Time) *ForgottenNote {
	gone, err := readEvidence[ForgottenNote](dir, ForgottenName)
	if err != nil || gone == nil || gone.Written.Before(since) {
		return nil
	}
	return gone
}

// Forget removes a finished run from the store: its run record, shard
// records, commit records, leases and anything still queued (a BLOCKED
// run's shard that no worker could take). A coordinator that serves runs
// for months otherwise keeps every record of every run (about 2 KiB a
// shard). Outputs and evidence are not touched, and submitting the run
// again later finds its committed outputs, reads each back in full and
// records it validated without running its command.
//
// Refused, changing nothing: a run that is not COMPLETE or BLOCKED
// (ErrRunActive), or a halted one whose running shards have not ended.
// Leases are not looked at: a validated shard's lease is left to expire,
// and otherwise in a COMPLETE or BLOCKED run no shard's record says it
// runs. A submission right after publishes shard IDs the queue still
// remembers (its duplicate window, 10 minutes): Submit publishes those
// again under IDs of their own (restoreLost).
func Forget(ctx context.Context, js jetstream.JetStream, run string) (Forgotten, error) {
	out := Forgotten{Run: run}
	b, r, rev, err := runRecord(ctx, js, "forget", run)
	if err != nil {
		return out, err
	}
	out.Fingerprint, out.State, out.Output, out.Evidence = r.Fingerprint, r.State, r.Spec.Output, r.Evidence
	if err := forgettable(&r); err != nil {
		return out, fmt.Errorf("forget %s: %w", run, err)
	}
	for tries := 1; ; tries++ {
		removed, err := b.PurgeRun(ctx, run, rev)
		out.Removed.Add(removed)
		if !errors.Is(err, stream.ErrRunChanged) {
			if err != nil {
				return out, fmt.Errorf("forget %s: %w", run, err)
			}
			break
		}
		// Written since it was read: by the tracker (the run is still
		// finished, and goes on being forgotten), or by a submission.
		e, gerr := b.Runs.Get(ctx, run)
		var cur stream.RunRecord
		if gerr == nil {
			gerr = stream.Decode(e.Value(), &cur)
		}
		if gerr != nil {
			return out, fmt.Errorf("forget %s: %w", run, gerr)
		}
		if cur.Fingerprint != r.Fingerprint || forgettable(&cur) != nil || tries == 3 {
			return out, fmt.Errorf("forget %s: %w: a submission of the run came while it was being forgotten: its queued shards and shard records were removed, and its run record (now %s, generation %s) was kept; submit the run again to queue its shards again",
				run, ErrRunActive, cur.State, cur.Fingerprint)
		}
		rev = e.Revision()
	}
	return out, nil
}

// runRecord reads the record of run for op ("forget", "halt") once the
// buckets are there, with its revision; a run never submitted, or
// forgotten, is ErrRunNotFound.
func runRecord(ctx context.Context, js jetstream.JetStream, op, run string) (*stream.Buckets, stream.RunRecord, uint64, error) {
	var r stream.RunRecord
	b, err := stream.WaitBuckets(ctx, js, 15*time.Second)
	if err != nil {
		return nil, r, 0, fmt.Errorf("%s %s: %w", op, run, err)
	}
	e, err := b.Runs.Get(ctx, run)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, r, 0, fmt.Errorf("%s %s: %w", op, run, ErrRunNotFound)
	}
	if err != nil {
		return nil, r, 0, fmt.Errorf("%s %s: %w", op, run, err)
	}
	if err := stream.Decode(e.Value(), &r); err != nil {
		return nil, r, 0, fmt.Errorf("%s %s: run record: %w", op, run, err)
	}
	return b, r, e.Revision(), nil
}

// forgettable refuses a run that is not finished: not COMPLETE or
// BLOCKED, or a halted one whose running shards have not ended.
func forgettable(r *stream.RunRecord) error {
	if r.State != stream.RunComplete && r.State != stream.RunBlocked {
		return fmt.Errorf("%w: it is %s (%d pending, %d running); a run is forgotten once it is COMPLETE or BLOCKED",
			ErrRunActive, r.State, r.Counts.Pending, r.Counts.Running)
	}
	if r.Counts.Running > 0 {
		// A halted run (BLOCKED with shards still running): its workers
		// would record and commit them after the records are gone.
		return fmt.Errorf("%w: it is %s with %d shard(s) still running (%s); it can be forgotten once they end",
			ErrRunActive, r.State, r.Counts.Running, r.Halted)
	}
	return nil
}
