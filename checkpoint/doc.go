// Package checkpoint is the one implementation of durable writes in
// shardpool: atomic directory commits with checksums and a completion marker
// written last, verification, and numbered generations for resumable jobs.
//
// Invariants:
//   - A committed directory holds MANIFEST (every file with size and xxhash64)
//     and COMPLETE (the MANIFEST's own checksum, generation, owner, run
//     fingerprint, time). COMPLETE is written after every file and MANIFEST
//     is fsynced; the directory is fsynced, then becomes visible under its
//     final name by one rename, after which the parent is fsynced.
//   - Verify accepts a directory only when COMPLETE parses, MANIFEST matches
//     its checksum, and every file matches MANIFEST with nothing extra. A
//     file's existence is never proof of success.
//   - Every error path removes the temporary directory; a crash leaves only a
//     ".tmp-" directory that no reader ever consumes and the next commit
//     sweeps.
//   - A generation that fails verification is never consumed and never
//     deleted: Quarantine moves it aside under "rejected/" with its reason.
package checkpoint
