package worker

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
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
// could not be made is tried again by the next commit.
func (w *Worker) outputRootFor(ctx context.Context, output string) (string, error) {
	w.mu.Lock()
	known := w.outRoots[output] != nil
	w.mu.Unlock()
	if known {
		return w.outputMoved(ctx, output), nil
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
