// Package staging copies a shard's inputs from network storage to local
// scratch before its command runs: checksummed, resumable, bounded.
//
// Invariants:
//   - A staged file is used only after its bytes matched the checksum the
//     submitter recorded (Describe); a mismatch re-fetches a bounded number
//     of times and then fails the shard with the reason.
//   - A copy goes to "<name>.part", is fsynced, verified and renamed; an
//     interrupted copy resumes from the longest prefix of whole chunks whose
//     checksums match, never from an unverified byte. A staged file found
//     on disk is verified in full before it is reused, so scratch needs no
//     directory fsyncs to be safe after a crash.
//   - Scratch on network storage (or of unknown locality) is refused.
//   - Space for the inputs plus the shard's declared scratch is reserved
//     before the first byte is copied; staging never fills the disk.
//   - Copies per host are bounded in number and in bytes per second,
//     independently of the worker's slots: for every stager of the
//     user that shares Config.HostDir (host.go), each of whose copies
//     holds a slot there, locked against the others, and copies at its
//     share of the host's bytes per second.
//   - Staged files are content-addressed (checksum, size, name) and shared
//     by the shards that use them; unreferenced ones are kept up to a byte
//     cap, least recently used first out.
//
// Stager.mu guards the cache index, the reservations and the reference
// counts; hostCopies.mu the host slots a stager's copies hold.
package staging
