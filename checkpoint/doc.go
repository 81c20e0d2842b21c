// Package checkpoint is the one implementation of durable writes in
// shardpool: atomic directory commits with checksums and a completion marker
// written last, verification, and numbered generations for resumable jobs.
//
// Invariants:
//   - A committed directory holds its files and COMPLETE: the file list
//     (every file with size, mode and xxhash64), the list's checksum,
//     generation, owner, run fingerprint, time. COMPLETE is written after
//     every file is fsynced; the directory is fsynced, then becomes visible
//     under its final name by one rename, after which the parent is
//     fsynced. (Format 1 kept the list in a MANIFEST file beside COMPLETE;
//     it is still read.)
//   - Verify accepts a directory only when COMPLETE parses, its list matches
//     its checksum, and every file matches the list with nothing extra. A
//     file's existence is never proof of success.
//   - Every error path removes the temporary directory; a crash leaves only a
//     ".tmp-" directory that no reader ever consumes. SweepTemps removes
//     those of dead processes (a live commit's is flocked): the next
//     generation commit in a checkpoint directory does, and for outputs the
//     worker (once per output directory) and the coordinator (when a run
//     completes).
//   - A generation that fails verification is never consumed and never
//     deleted: Quarantine moves it aside under "rejected/" with its reason.
package checkpoint
