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
	s, err := b.js.Stream(ctx, StreamShards)
	if err != nil {
		return f, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(RunSubjects(run)))
	if err != nil {
		return f, fmt.Errorf("%s: %w", StreamShards, err)
	}
	for _, n := range info.State.Subjects {
		f.Queued += n
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

// PurgeRun removes everything the store holds of run: its queued
// messages, its keys in the shards, leases and checkpoints buckets (every
// revision), and last its run record, with a purge marker that watchers
// (the coordinator's tracker, workers) see as the run's deletion. Nothing
// on disk outside the store is touched. It returns what it removed.
func (b *Buckets) PurgeRun(ctx context.Context, run string) (Footprint, error) {
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
	if err := b.Runs.Purge(ctx, run); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return f, fmt.Errorf("purge run record %s: %w", run, err)
	}
	return f, nil
}
