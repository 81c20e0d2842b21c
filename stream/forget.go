package stream

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Footprint is what the store holds of one run: its queued messages and
// its keys in the shards, leases and checkpoints buckets.
type Footprint struct {
	Queued      uint64 `json:"queued"`
	Shards      int    `json:"shard_records"`
	Leases      int    `json:"leases"`
	Checkpoints int    `json:"commit_records"`
}

// Add adds what o counts to f.
func (f *Footprint) Add(o Footprint) {
	f.Queued += o.Queued
	f.Shards += o.Shards
	f.Leases += o.Leases
	f.Checkpoints += o.Checkpoints
}

// runBuckets are the buckets keyed <run>.<id>, with the footprint field
// each one counts into.
func (b *Buckets) runBuckets(f *Footprint) []struct {
	kv jetstream.KeyValue
	n  *int
} {
	return []struct {
		kv jetstream.KeyValue
		n  *int
	}{{b.Shards, &f.Shards}, {b.Leases, &f.Leases}, {b.Checkpoints, &f.Checkpoints}}
}

// RunFootprint counts what the store holds of run.
func (b *Buckets) RunFootprint(ctx context.Context, run string) (Footprint, error) {
	var f Footprint
	var err error
	if f.Queued, err = QueuedOf(ctx, b.js, run); err != nil {
		return f, err
	}
	for _, rb := range b.runBuckets(&f) {
		keys, err := b.KeysMatching(ctx, rb.kv, ShardKey(run, "*"))
		if err != nil {
			return f, fmt.Errorf("bucket %s: %w", rb.kv.Bucket(), err)
		}
		*rb.n = len(keys)
	}
	return f, nil
}

// QueuedOf counts the messages of run in the work queue (SHARDS).
func QueuedOf(ctx context.Context, js jetstream.JetStream, run string) (uint64, error) {
	s, err := js.Stream(ctx, StreamShards)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(RunSubjects(run)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", StreamShards, err)
	}
	var n uint64
	for _, k := range info.State.Subjects {
		n += k
	}
	return n, nil
}

// PurgeRun removes everything the store holds of run: its queued
// messages, its keys in the shards, leases and checkpoints buckets (every
// revision), and last its run record, with a purge marker that watchers
// (the coordinator's tracker, workers) see as the run's deletion. Nothing
// on disk outside the store is touched. It returns what it removed.
// With rev above 0, the run record is purged only at that revision: a
// record written since (a submission of the run while it was being
// forgotten) stays, and PurgeRun returns ErrRunChanged.
func (b *Buckets) PurgeRun(ctx context.Context, run string, rev uint64) (Footprint, error) {
	f, err := b.RunFootprint(ctx, run)
	if err != nil {
		return f, err
	}
	s, err := b.js.Stream(ctx, StreamShards)
	if err != nil {
		return f, err
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(RunSubjects(run))); err != nil {
		return f, fmt.Errorf("purge %s of %s: %w", StreamShards, run, err)
	}
	for _, rb := range b.runBuckets(&f) {
		s, err := b.js.Stream(ctx, kvStream(rb.kv))
		if err != nil {
			return f, fmt.Errorf("bucket %s: %w", rb.kv.Bucket(), err)
		}
		if err := s.Purge(ctx, jetstream.WithPurgeSubject(kvSubject(rb.kv, ShardKey(run, "*")))); err != nil {
			return f, fmt.Errorf("purge bucket %s of %s: %w", rb.kv.Bucket(), run, err)
		}
	}
	var opts []jetstream.KVDeleteOpt
	if rev > 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	if err := b.Runs.Purge(ctx, run, opts...); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		if rev > 0 && IsConflict(err) {
			return f, fmt.Errorf("purge run record %s: %w", run, ErrRunChanged)
		}
		return f, fmt.Errorf("purge run record %s: %w", run, err)
	}
	return f, nil
}

// ErrRunChanged is returned when the run record was written while the run
// was being purged (a submission of it at the same moment).
var ErrRunChanged = errors.New("the run record was written meanwhile")

// RemoveOrphans deletes the messages of run that no consumer will ever
// deliver again. After a power cut the store can come back with a
// consumer's state newer than the stream's: acknowledgements kept, the
// removal of the acknowledged messages from the work queue lost. Such a
// message is neither pending nor awaiting an acknowledgement, nothing
// would ever take it, and a run whose shards are all validated would wait
// for it to leave the queue forever (CI saw this twice; the forty-seventh
// session found the cause). A message of the run is such an orphan when
// its class's consumer has acknowledged every message up to it (its
// acknowledged floor), or has delivered past it and awaits no
// acknowledgement at all (acknowledged out of order, above the floor). It
// returns the stream sequences it removed.
func RemoveOrphans(ctx context.Context, js jetstream.JetStream, run string) ([]uint64, error) {
	s, err := js.Stream(ctx, StreamShards)
	if err != nil {
		return nil, err
	}
	// Each consumer, by its filter subject: up to which stream sequence
	// nothing of its is left to deliver.
	done := map[string]uint64{}
	lister := s.ListConsumers(ctx)
	for ci := range lister.Info() {
		if f := ci.Config.FilterSubject; f != "" {
			done[f] = ci.AckFloor.Stream
			if ci.NumAckPending == 0 {
				done[f] = max(ci.AckFloor.Stream, ci.Delivered.Stream)
			}
		}
	}
	if err := lister.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return nil, fmt.Errorf("%s consumers: %w", StreamShards, err)
	}
	var removed []uint64
	for seq := uint64(1); ; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(RunSubjects(run)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return removed, nil
		}
		if err != nil {
			return removed, fmt.Errorf("%s: %w", StreamShards, err)
		}
		seq = m.Sequence + 1
		class := last(m.Subject)
		upTo, ok := done[ClassFilter(class)]
		if !ok || m.Sequence > upTo {
			continue // its consumer will deliver it (or one created later will)
		}
		if err := s.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return removed, fmt.Errorf("%s: remove message %d: %w", StreamShards, m.Sequence, err)
		}
		removed = append(removed, m.Sequence)
	}
}
