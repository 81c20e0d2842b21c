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
//   - A slot counts a running command. Once it exits, the attempt concludes
//     (commit, records, ack) without its slot, at most maxConcluding at once;
//     a fetch happens only for a command that can start now.
//   - Under group sync, the running record and lease are on disk before the
//     command starts, the commit claim before the output is published, and
//     the final record before the message is settled; a worker on the
//     coordinator's own boot skips the first two (it dies with it).
//   - A command starts only after the shard's record holds its attempt, so
//     the record says what ran: `retries` counts the record's attempts of the
//     current round (less those interrupted, preempted or discarded), never
//     deliveries. A delivery whose lease the store does not take is held in
//     progress, its slot kept, until the store takes writes again.
//   - Where limits are enforced, a shard's child is in its cgroups before
//     it runs anything (v1: forked by a worker thread that joined them and
//     went back; v2: cloned into it, or a prologue where the kernel
//     cannot), so nothing it forks escapes them. A v1
//     cgroup is used again only once no task is left in it.
//   - Shutdown is two-phase: stop fetching, then SIGTERM children, wait the
//     grace period, SIGKILL, record the interruption and Nak; attempts that
//     are concluding finish first.
//   - Auto-mode workers of one user on one host admit against one budget:
//     each decision reads the others' holds and writes its own under the
//     host ledger's flock, so no two admit into the same room; a record
//     counts only while its process lives.
//
// Locks: Worker.mu guards running counters, the admission log files and the
// output syncs; oomMu the shared OOM-kill baseline; scratchPool.mu its
// pool; cgroups.mu the kept shard cgroups. hostLedger.mu (and with it the
// ledger file's flock) is taken before Worker.mu, never while holding it.
package worker
