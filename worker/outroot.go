package worker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// An output directory on a network file system (NFS, sshfs) that is
// unmounted while a worker runs leaves the directory it was mounted on
// behind, empty, on the local disk. A commit there would make the output
// directory again and publish into it: each shard recorded validated,
// its output hidden once the file system is mounted back. So a worker
// remembers where each output directory was at its first commit there
// (outputRoot) and, before each command and each commit, looks whether
// it still is: gone, or now on another file system, nothing is made or
// committed there (outputMoved). The first commit makes a missing output
// directory, as a worker on a host that has not seen it yet must.

// A worker on a host where the output's file system is not mounted at
// all meets the same trap at its first commit: the directory is missing,
// and made, it would be on the local disk. The submitter records where it
// saw the output directory (stream.RunRecord's OutputOn,
// OutputStorageOf); a worker that finds the directory missing where
// making it would put it under another mount point makes nothing
// (notMountedHere). A directory that exists is taken as it is: a file
// server's own worker sees its export on a local disk.
//
// Where the submitter saw the output on a local disk of its own, a worker
// on another host that sees the directory, or would make it, on a local
// disk of its own (onAnotherHostsDisk) commits nothing there, whether the
// directory exists or not: each worker's outputs would lie on its own
// disk, none where the run was submitted, and the coordinator's check
// would see only its own host's. One that sees it on network storage
// takes it (the submitter was the file server).

// OutputStorageOf is where dir (or, where it does not exist yet, the
// nearest directory above it) is stored as pr sees it on host (whose
// boot ID is boot), for a run record's OutputOn; nil where the probe
// cannot tell, or where the disk is one of host's own but boot is
// unknown.
func OutputStorageOf(ctx context.Context, pr *probe.Prober, host, boot, dir string) *stream.OutputStorage {
	pi := pr.Where(ctx, dir)
	if pi.Unknown != "" || pi.MountPoint == "" {
		return nil
	}
	on := &stream.OutputStorage{Host: host, Type: pi.FSType(), Source: pi.Source, MountPoint: pi.MountPoint}
	if pi.Locality == probe.Local {
		if !ownDisk(pi) || boot == "" || boot == "unknown" {
			return nil
		}
		on.Local, on.BootID = true, boot
	}
	return on
}

// ownDisk reports whether pi is on a file system that only its own host
// sees: the usual disk file systems. The probe calls every type it does
// not know to be network storage local; a cluster file system it does
// not know (on shared block devices, or a vendor's) is not judged.
func ownDisk(pi probe.PathInfo) bool {
	switch pi.Type {
	case "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "tmpfs", "overlay", "vfat", "exfat", "reiserfs", "jfs", "bcachefs":
		return true
	}
	return false
}

// notMountedHere says why output, missing on this host, is not to be
// made here: the run was submitted where it is on on (not a local disk),
// and here it would be made under another mount point. "" where output
// exists, on is nil, or the probe cannot tell.
func (w *Worker) notMountedHere(ctx context.Context, output string, on *stream.OutputStorage) string {
	if on == nil {
		return ""
	}
	if _, err := os.Lstat(output); !errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	pi := w.cfg.Probe.Where(ctx, output)
	if pi.Unknown != "" || pi.MountPoint == "" || pi.MountPoint == on.MountPoint {
		return ""
	}
	return fmt.Sprintf("the output directory %s does not exist on host %s, which does not mount its file system (%s where the run was submitted; made here it would be on %s): it is not made (if this host is to hold the outputs there, make it: mkdir -p %s)",
		output, w.host, on, pi.Mount(), output)
}

// onAnotherHostsDisk says why output, which the run's submitter saw on a
// local disk of its own (on), is not for this worker: on another boot,
// it sees output (or, missing, the directory it would be made in) on a
// local disk of its own too. "" where that does not hold, or the probe
// cannot tell.
func (w *Worker) onAnotherHostsDisk(ctx context.Context, output string, on *stream.OutputStorage) string {
	if on.BootID == "" || on.BootID == w.boot || w.boot == "unknown" {
		return "" // the submitter's own host (a container on it too), or not known
	}
	pi := w.cfg.Probe.Where(ctx, output)
	if pi.Unknown != "" || pi.Locality != probe.Local || !ownDisk(pi) {
		return "" // network storage here, or not known: perhaps the one the submitter's disk exports
	}
	here := "exists on a disk of its own too (" + pi.Mount() + ")"
	if _, err := os.Lstat(output); errors.Is(err, fs.ErrNotExist) {
		here = "does not exist; made, it would be on a disk of its own (" + pi.Mount() + ")"
	}
	return fmt.Sprintf("the output directory %s is on host %s's own disk, where the run was submitted, not on storage host %s shares: here it %s; outputs committed here would lie apart from the others', so nothing is made or committed here "+
		"(on host %s it is on %s %s mounted at %s; put the output on storage every worker's host mounts, such as NFS or Lustre, and submit again from a host that mounts it, or run this run's workers on host %s)",
		output, on.Host, w.host, here, on.Host, on.Type, on.Source, on.MountPoint, on.Host)
}

// outputRoot is where an output directory was at a worker's first commit
// there: its device, and the mount that held it as the probe saw it.
type outputRoot struct {
	dev   uint64
	mount string
}

// errOutputMoved: the output directory is gone, or on another file
// system than at the worker's first commit there (outputMoved).
var errOutputMoved = errors.New("output not committed")

// outputRootFor is what a commit needs of its output directory: at the
// worker's first commit there, the directory made where it is missing
// and where it is noted; at the later ones, outputMoved's look. It
// returns why nothing may be committed there, or "". A directory that
// could not be made is tried again by the next commit; one that
// outputRefused refuses, by the next commit too.
func (w *Worker) outputRootFor(ctx context.Context, output string, on *stream.OutputStorage) (string, error) {
	if why, known := w.outputRefused(ctx, output, on); why != "" || known {
		return why, nil
	}
	if err := os.MkdirAll(output, 0o755); err != nil {
		return "", err
	}
	var st unix.Stat_t
	if err := unix.Stat(output, &st); err != nil {
		return "", err
	}
	mount := w.cfg.Probe.Where(ctx, output).Mount()
	w.mu.Lock()
	if w.outRoots == nil {
		w.outRoots = map[string]*outputRoot{}
	}
	if w.outRoots[output] == nil {
		w.outRoots[output] = &outputRoot{dev: st.Dev, mount: mount}
	}
	w.mu.Unlock()
	return "", nil
}

// outputMoved says why nothing may be committed to output when it is
// not where it was at this worker's first commit there: gone, or on
// another file system (a new device whose mount is another one; a
// remount of the same one is taken, and its device noted). One stat
// where nothing changed; "" too before a first commit, or where the look
// fails otherwise (the commit then says why).
func (w *Worker) outputMoved(ctx context.Context, output string) string {
	w.mu.Lock()
	r := w.outRoots[output]
	var was outputRoot
	if r != nil {
		was = *r
	}
	w.mu.Unlock()
	if r == nil {
		return ""
	}
	var st unix.Stat_t
	if err := unix.Stat(output, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Sprintf("the output directory %s is gone on host %s, though this worker committed there before, on %s (no longer mounted?); it is not made again here, where what is committed would be hidden once that file system is back (if it was removed on purpose, make it: mkdir -p %s)", output, w.host, was.mount, output)
		}
		return ""
	}
	if st.Dev == was.dev {
		return ""
	}
	now := w.cfg.Probe.Where(ctx, output).Mount()
	if now == was.mount {
		w.mu.Lock()
		r.dev = st.Dev
		w.mu.Unlock()
		return ""
	}
	return fmt.Sprintf("the output directory %s is on %s now on host %s, not on %s as at this worker's first commit there (no longer mounted?); nothing is committed there", output, now, w.host, was.mount)
}

// outputRefused says why nothing may be made or committed in output
// now: where this worker has committed there before (known), that it is
// gone or moved since (outputMoved); before that, that it is missing
// where its file system is not mounted (notMountedHere), or that the
// submitter saw it on a disk of its own, and this host sees it on one of
// its own (onAnotherHostsDisk). "" when none of these.
func (w *Worker) outputRefused(ctx context.Context, output string, on *stream.OutputStorage) (why string, known bool) {
	w.mu.Lock()
	known = w.outRoots[output] != nil
	w.mu.Unlock()
	switch {
	case known:
		return w.outputMoved(ctx, output), true
	case on != nil && on.Local:
		return w.onAnotherHostsDisk(ctx, output, on), false
	}
	return w.notMountedHere(ctx, output, on), false
}
