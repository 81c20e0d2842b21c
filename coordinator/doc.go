// Package coordinator embeds nats-server with JetStream as shardpool's
// durable queue, creates the layout, accepts runs (Submit), keeps each run's
// state from its shard records, writes the run's evidence, and serves
// GET /status over HTTP.
//
// Invariants:
//   - Durability comes from JetStream's file store. Under the default group
//     sync every acknowledged write is in the kernel before the ack, and on
//     disk once a barrier (shardpool.sync, one shared syncfs) that began
//     after it returned; writers ask for one before acting on their writes.
//     Under --sync always every write is on disk before its ack.
//   - The tracker is the only writer of a run record's state fields (state,
//     counts, reason) and submit the only writer of its spec fields; both
//     write with compare-and-set on the record's revision, so neither loses
//     the other's update.
//   - Counts are maintained by deltas from a watch of the shards bucket, not
//     recounted; after a restart the watch replays every record once, which
//     rebuilds them.
//   - A run is COMPLETE only after every output at the destination verified
//     (when the destination is visible here); otherwise the reason says who
//     verified it.
//   - A message that ran out of deliveries is deleted only after its shard
//     is recorded failed (or found settled): never a shard with neither a
//     message nor a verdict. Its advisory may be lost (core NATS), so the
//     tracker also sweeps the consumers for such messages.
//   - The store's limit only grows while the coordinator runs (nats-server
//     takes an increase live, never a decrease).
//
// One goroutine (the tracker loop) owns all tracker state; no lock guards it.
package coordinator
