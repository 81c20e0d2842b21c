package worker

import (
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/shardpool/shardpool/checkpoint"
)

// An output directory whose file system refuses writes fails every
// commit there, each after its command's whole run. lookAtOutput's
// access(2) sees a file system mounted read-only, but not every one
// that refuses: since Linux 6.12, ext4's errors=remount-ro (the usual
// setting for a disk's file systems) leaves the mount read-write, as
// access(2) and statfs(2) report it, and fails each write with EROFS
// (the mount lists emergency_ro). So a worker remembers an output
// directory where a commit failed with EROFS and, before each command
// there, refuses it (a start error, as a read-only mount's) until a
// look finds it writable again: a directory made and removed at most
// every readOnlyLookEvery, the first at the next command, so that an
// EROFS that came from somewhere else (a scratch file system on the
// copy's way) costs one look. A scratch directory that refuses writes
// is the scratch's fault (conclude looks at it after a command failed).
// Nothing is kept for output directories that commits write to: the
// usual path pays one map read.

// readOnlyLookEvery is how often a command is let look whether an
// output directory noted read-only can be written again.
const readOnlyLookEvery = 5 * time.Second

// readOnlyOutput is what a worker knows of an output directory where a
// commit failed with EROFS.
type readOnlyOutput struct {
	since  time.Time // the commit's failure
	what   string    // its error
	looked time.Time // the last look; zero: none since the failure
}

// noteReadOnly remembers output as read-only after the commit of a
// shard there failed with err (one that is EROFS); the next command's
// look decides.
func (w *Worker) noteReadOnly(run, shard, class, output string, err error) {
	w.mu.Lock()
	if w.roOutputs == nil {
		w.roOutputs = map[string]*readOnlyOutput{}
	}
	first := w.roOutputs[output] == nil
	w.roOutputs[output] = &readOnlyOutput{since: time.Now(), what: err.Error()}
	w.mu.Unlock()
	if first {
		detail := fmt.Sprintf("%s cannot be written: %v; no command whose output goes there runs until a look finds it writable", output, err)
		w.admission(run, shard, class, "output-read-only", detail)
		w.hostLog("-", "output-read-only", "run "+run+": "+detail)
	}
}

// outputReadOnly says why no command is to run for output: a commit
// there failed with EROFS and it still cannot be written. "" where no
// commit failed so, or a look finds it writable (forgotten then).
func (w *Worker) outputReadOnly(output string) string {
	w.mu.Lock()
	ro := w.roOutputs[output]
	if ro == nil {
		w.mu.Unlock()
		return ""
	}
	now := time.Now()
	look := now.Sub(ro.looked) >= readOnlyLookEvery
	if look {
		ro.looked = now // the others wait for this look's verdict
	}
	since, what := ro.since, ro.what
	w.mu.Unlock()
	if look {
		// Gone (outputMoved's to say) or writable: forgotten. Any other
		// error keeps it: an ext4 in error also answers EUCLEAN or
		// EBADMSG.
		err := checkpoint.Writable(output)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			w.mu.Lock()
			if w.roOutputs[output] == ro {
				delete(w.roOutputs, output)
			}
			w.mu.Unlock()
			w.hostLog("-", "output-writable", fmt.Sprintf("%s can be written again", output))
			return ""
		}
	}
	return fmt.Sprintf("the output directory %s cannot be written on host %s: a commit there failed at %s (%s), and a look since finds it still read-only "+
		"(a file system remounted read-only after an error, as ext4's errors=remount-ro does, lists emergency_ro in /proc/mounts and needs fsck and a mount; the kernel log says why)",
		output, w.host, since.UTC().Format(time.RFC3339), what)
}

// logLost says, at most once a minute, that an attempt's output could
// not be kept in its log (its file not made: the state directory full or
// refusing writes). The attempt's record says so too (log_lost), where it
// would otherwise read as a command that printed nothing.
func (w *Worker) logLost(run, shard, why string) {
	w.mu.Lock()
	w.logsLost++
	n := w.logsLost
	say := time.Since(w.logLostSaid) >= time.Minute
	if say {
		w.logLostSaid = time.Now()
	}
	w.mu.Unlock()
	if say {
		w.log.Warn("a command's output could not be kept in its attempt log (the state directory refuses writes, or is full): its record says log_lost",
			"run", run, "shard", shard, "err", why, "attempts so far", n)
	}
}
