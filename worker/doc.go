// Package worker runs one host's share of shards: it fetches exactly as many
// shards as it has free slots, takes each shard's lease, runs the command as
// a child process in its own process group, heartbeats, commits outputs
// through package checkpoint, records the shard's state and acknowledges.
//
// Invariants:
//   - Safety of ownership comes from the lease bucket: Create to take,
//     Update(revision) to renew, so two live owners cannot both hold a shard;
//     liveness from the bucket TTL, so a dead owner's lease disappears.
//   - A worker that cannot renew its lease kills the child and never commits.
//   - Outputs are committed before the record says validated, and the record
//     says validated before the message is acknowledged (DoubleAck); a crash
//     between any two steps leads to a redelivery that finds the committed,
//     verified output and skips the work.
//   - Shutdown is two-phase: stop fetching, then SIGTERM children, wait the
//     grace period, SIGKILL, record the interruption and Nak.
//
// Locks: Worker.mu guards running counters and the admission log files.
package worker
