package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// An output directory whose file system is full (ENOSPC), or whose
// owner is over a quota there (EDQUOT), fails each commit there after
// its command's whole run. Charged, each of a run's shards then ran its
// command retries+1 times to fail the same, hours each for some jobs,
// and the run ended BLOCKED with every shard left failed, where freeing
// room was all it needed. So a commit that fails for want of room is the
// host's, not the shard's: the attempt is handed back uncharged, the
// worker notes the directory with what the commit needed, and it fetches
// no shard of that class (nor runs a command whose output goes there)
// until a look finds that much room: checkpoint.Room, at most every
// fullLookEvery. The run stays RUNNING and `status` and `run` say why
// its shards wait. A worker cannot tell which run a queued shard is of
// before it fetches it, and each hand-back spends one of the shard's
// deliveries, so the hold is by class, not by run.
//
// An output larger than its whole file system never fits: that commit
// stays charged, as before, and the shard fails with the numbers.

// fullLookEvery is how often a worker holding for a full output
// directory looks whether it has room again.
const fullLookEvery = 5 * time.Second

// fullOutput is what a worker knows of an output directory where a
// commit failed for want of room.
type fullOutput struct {
	since   time.Time       // the first failure
	what    string          // its error
	bytes   int64           // the most a failed commit there needed
	files   int             // and its files and directories
	classes map[string]bool // held for it
	looked  time.Time       // the last look
}

// noteFull remembers output as full after the commit of a's shard there
// failed with err (one that checkpoint.IsNoRoom), and holds class for it.
// It returns "" where the shard is to wait for room (its attempt handed
// back, not charged); otherwise why the output can never fit there,
// which charges it.
func (w *Worker) noteFull(a *attemptState, class, output string, err error) string {
	var re *checkpoint.RoomError
	bytes, files := int64(0), 0
	if errors.As(err, &re) {
		bytes, files = re.Bytes, re.Files
	}
	if st, serr := (probe.SysStatFS{}).Statfs(output); serr == nil && st.Total() > 0 && bytes > st.Total() {
		return fmt.Sprintf("the output needs about %s and the whole file system of %s holds %s: it never fits there; not waiting for room",
			stream.FormatSize(bytes), output, stream.FormatSize(st.Total()))
	}
	w.mu.Lock()
	if w.fullOutputs == nil {
		w.fullOutputs = map[string]*fullOutput{}
	}
	f := w.fullOutputs[output]
	first := f == nil
	if first {
		f = &fullOutput{since: time.Now(), what: err.Error(), classes: map[string]bool{}}
		w.fullOutputs[output] = f
	}
	f.bytes, f.files = max(f.bytes, bytes), max(f.files, files)
	f.classes[class] = true
	f.looked = time.Now() // it was just found full
	w.mu.Unlock()
	if first {
		detail := fmt.Sprintf("%s has no room: %v (the commit needed about %s in %d file(s) and directories); no shard of class %s is fetched until it has",
			output, err, stream.FormatSize(bytes), files, class)
		w.admission(a.m.Run, a.m.ID, class, "output-full", detail)
		w.hostLog(class, "output-full", "run "+a.m.Run+": "+detail)
		w.log.Warn("output directory full: fetching no shard of its classes until it has room", "output", output, "err", err, "needed", bytes)
	}
	w.reportSoon()
	return ""
}

// outputFullHeld says why no shard of class is to be fetched: an output
// directory a commit of the class failed in for want of room has none
// yet. "" where none holds it.
func (w *Worker) outputFullHeld(class string) string {
	var whys []string
	for _, out := range w.fullFor(class) {
		if why := w.roomAt(out, class); why != "" {
			whys = append(whys, why)
		}
	}
	return strings.Join(whys, "; ")
}

// fullFor lists the output directories noted full that hold class.
func (w *Worker) fullFor(class string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var outs []string
	for out, f := range w.fullOutputs {
		if f.classes[class] {
			outs = append(outs, out)
		}
	}
	slices.Sort(outs)
	return outs
}

// roomAt says why output has no room for what failed there, looking
// again where fullLookEvery has passed; "" where it is not noted full,
// or a look finds the room (forgotten then, and the held classes woken).
// A look that fails for another reason (a directory gone, a file system
// refusing writes) forgets the note too: the look before the command and
// the commit say what that is. class, where the output is noted, is held
// from then on: a shard of another class found it full before its
// command.
func (w *Worker) roomAt(output, class string) string {
	w.mu.Lock()
	f := w.fullOutputs[output]
	if f == nil {
		w.mu.Unlock()
		return ""
	}
	f.classes[class] = true
	now := time.Now()
	look := now.Sub(f.looked) >= fullLookEvery
	if look {
		f.looked = now // the others wait for this look's verdict
	}
	bytes, files, since, what := f.bytes, f.files, f.since, f.what
	w.mu.Unlock()
	if look {
		if err := checkpoint.Room(output, bytes, files); !checkpoint.IsNoRoom(err) {
			w.mu.Lock()
			if w.fullOutputs[output] == f {
				delete(w.fullOutputs, output)
			}
			w.mu.Unlock()
			detail := fmt.Sprintf("%s has room again for %s in %d file(s) and directories", output, stream.FormatSize(bytes), files)
			if err != nil {
				detail = fmt.Sprintf("%s: the look for room found %v; no longer held for room", output, err)
			}
			w.hostLog("-", "output-room", detail)
			w.log.Info("output directory has room again", "output", output, "err", err)
			w.wakeAll()
			w.reportSoon()
			return ""
		}
	}
	return fmt.Sprintf("the output directory %s has no room on host %s: a commit there failed at %s (%s) needing about %s in %d file(s) and directories; "+
		"no shard whose output goes there is run until it has (free space or inodes there, or raise the quota); looking again every %s",
		output, w.host, since.UTC().Format(time.RFC3339), what, stream.FormatSize(bytes), files, fullLookEvery)
}

// handBackForRoom hands an attempt back uncharged where its commit
// failed with err for want of room in the output directory: the host's
// fault, not the shard's. The message comes back after a look's period;
// this worker fetches none of the class meanwhile (outputFullHeld).
func (w *Worker) handBackForRoom(ctx context.Context, a *attemptState, l *lease, err error) {
	w.handBackForHost(ctx, a, l, err.Error()+"; the output directory has no room", fullLookEvery)
}
