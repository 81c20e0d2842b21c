package coordinator

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/stream"
)

// watchEvent is a KV watch event made by hand.
type watchEvent struct {
	bucket, key string
	val         []byte
	rev         uint64
	op          jetstream.KeyValueOp
}

func (e watchEvent) Bucket() string                  { return e.bucket }
func (e watchEvent) Key() string                     { return e.key }
func (e watchEvent) Value() []byte                   { return e.val }
func (e watchEvent) Revision() uint64                { return e.rev }
func (e watchEvent) Created() time.Time              { return time.Time{} }
func (e watchEvent) Delta() uint64                   { return 0 }
func (e watchEvent) Operation() jetstream.KeyValueOp { return e.op }

// TestForgottenRunCountsItsNewRecords: a run forgotten and submitted again
// at once. The tracker's two watches (run records, shard records) are not
// ordered between them, so it may see the new run's shard records before
// the old run record's removal, or the old run's records after the new run
// record. Either way it counts what the store holds. Before, the removal
// dropped the new records it had seen, and the run stayed RUNNING with
// shards "pending" that were validated (1 in about 30 runs of
// TestForgetRemovesAFinishedRun on a loaded machine).
func TestForgottenRunCountsItsNewRecords(t *testing.T) {
	c, ctx := startInternal(t)
	b := c.b
	// Not queued: the coordinator's own tracker leaves the records alone.
	putRun := func() jetstream.KeyValueEntry {
		t.Helper()
		data, _ := stream.Encode(&stream.RunRecord{Name: "r", Fingerprint: "f", State: stream.RunRunning, Counts: stream.Counts{Total: 3}})
		if _, err := b.Runs.Put(ctx, "r", data); err != nil {
			t.Fatal(err)
		}
		e, err := b.Runs.Get(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	putShard := func(id string) jetstream.KeyValueEntry {
		t.Helper()
		key := stream.ShardKey("r", id)
		data, _ := stream.Encode(&stream.ShardRecord{Run: "r", ID: id, Fingerprint: "f", Class: "cpu", State: stream.ShardValidated})
		if _, err := b.Shards.Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
		e, err := b.Shards.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	run1 := putRun()
	var old []jetstream.KeyValueEntry
	for i := range 3 {
		old = append(old, putShard(fmt.Sprintf("s%d", i)))
	}
	if _, err := b.PurgeRun(ctx, "r", 0); err != nil {
		t.Fatal(err)
	}
	gone := watchEvent{bucket: stream.BucketRuns, key: "r", rev: run1.Revision() + 1, op: jetstream.KeyValuePurge}
	run2 := putRun()
	// Submitted again: two of its shards are recorded so far.
	new0, new1 := putShard("s0"), putShard("s1")

	validated := func(tr *tracker) int { return tr.runs["r"].n[stream.ShardValidated] }

	// The new records arrive before the old run record's removal.
	tr := newTracker(c)
	tr.onRun(ctx, run1)
	for _, e := range old {
		tr.onShard(e)
	}
	tr.onShard(new0)
	tr.onShard(new1)
	tr.onRun(ctx, gone)
	tr.onRun(ctx, run2)
	if n := validated(tr); n != 2 {
		t.Fatalf("new records before the removal: %d validated, want 2", n)
	}

	// The old run's records arrive after the new run record (its shard
	// watch lagging behind): they were purged, and must not count.
	tr = newTracker(c)
	tr.onRun(ctx, run1)
	tr.onRun(ctx, gone)
	tr.onRun(ctx, run2)
	for _, e := range append(old, new0, new1) {
		tr.onShard(e)
	}
	if n := validated(tr); n != 2 {
		t.Fatalf("old records after the new run record: %d validated, want 2", n)
	}
	// A record written after the read counts.
	tr.onShard(putShard("s2"))
	if n := validated(tr); n != 3 {
		t.Fatalf("after the third record: %d validated, want 3", n)
	}
}
