// Package probe takes a snapshot of what a host can give shardpool: CPU
// (affinity, cpuset, cgroup quota up every ancestor, load, pressure), memory
// (MemAvailable, swap, the tightest cgroup limit over all ancestors, working
// set, OOM kills, pressure), other users' load, GPUs (behind the GPUs
// interface), storage per named path (filesystem type from statfs and
// mountinfo, space and inodes, under a deadline), a Slurm allocation, the
// user's policy file, and from all of these the effective budget per
// resource with the limit that binds.
//
// Invariants:
//   - Every value is three-state: a number, unlimited, or unknown with a
//     reason; each names its source. Zero never stands for "could not read".
//   - A probe that fails or times out yields unknown; unknown anywhere in a
//     budget's chain makes that budget unknown (never idle, never zero).
//   - Everything is read below Config.Root, so fixtures of other hosts
//     (cgroup v1, v2, hybrid) run anywhere; statfs and GPUs are interfaces.
//   - Storage probes run under a deadline: a path on a dead NFS server
//     yields unknown, and the goroutine blocked in the kernel is left to
//     finish on its own (a blocked syscall cannot be cancelled).
package probe
