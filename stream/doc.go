// Package stream owns the JetStream layout of shardpool: the names, subjects,
// schemas and idempotent setup of every stream, consumer and KV bucket, the
// encoding of every message, and the parsing of the run spec and manifest
// that become those messages. It is the only package that knows subjects.
//
// Invariants:
//   - Setup is idempotent: calling it again with the same Layout changes nothing;
//     with a larger retry count or lease TTL it updates the affected config.
//   - Every message and KV value carries a schema version "v"; decoders refuse a
//     version they do not know instead of guessing.
//   - A shard's publish Msg-ID is "<fingerprint>.<shard-id>" (plus a retry suffix
//     for explicit retries), so a resubmission inside the duplicate window is a
//     no-op at the server, and outside it a no-op because the run record says
//     the generation was already queued.
//   - Consumers are per class and shared by runs; their MaxDeliver is the largest
//     retries+1 of any run seen, and the worker enforces each run's own limit.
//   - Under group sync (SyncGroup) an acknowledged write is in the kernel, and
//     on disk once a Barrier that began after the ack has returned; callers of
//     Barrier act on their writes only after it.
//   - The buckets OpenBuckets returns write Create and Update themselves
//     (kvwrite.go) with the library's message and its compare-and-set
//     header; what the server refuses is written again through nats.go,
//     whose errors callers test for, and a write that may have been stored
//     is never written twice.
//   - A Puller (pull.go) asks for exactly the messages its caller asked for,
//     with nats.go's pull request, and reuses an inbox only once the server
//     is done with the request it served; a request the server never ended
//     takes its inbox with it.
package stream
