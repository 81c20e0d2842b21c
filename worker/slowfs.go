package worker

import (
	"fmt"
	"slices"
	"time"
)

// A file system that stops answering (an NFS server gone on a hard
// mount, a FUSE daemon stopped) blocks every stat and write under it
// until it answers again, and a worker cannot cut such a call short.
// What it can do is say so: an attempt in its commit, or in its looks at
// its destination and the output directory before its command, for
// SlowFS or longer is listed in the worker's report (SlowFS), and
// `status` prints it. A shard whose commit waits stays RUNNING meanwhile
// (its lease is renewed: the attempt is alive, and carries on once the
// file system answers); one that waits in the look at its destination
// has no lease yet, and its message stays with the worker (in progress).

// defaultSlowFS is Config.SlowFS's default: longer than a commit of a
// few GB to a busy NFS server takes.
const defaultSlowFS = 2 * time.Minute

// slowFSListed bounds the report's list.
const slowFSListed = 10

type fsWait struct {
	key   string // the attempt's run.id
	what  string
	since time.Time
}

// fsBegin notes that the attempt key waits on a file system (what: where
// and for what) until the returned function is called. Each note is its
// own: two deliveries of one shard (one awaiting the other's end) wait
// side by side.
func (w *Worker) fsBegin(key, what string) (end func()) {
	w.mu.Lock()
	if w.fsWaits == nil {
		w.fsWaits = map[uint64]fsWait{}
	}
	w.fsSeq++
	id := w.fsSeq
	w.fsWaits[id] = fsWait{key: key, what: what, since: time.Now()}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.fsWaits, id)
		w.mu.Unlock()
	}
}

// slowFS lists, oldest first, the attempts that have waited on a file
// system for SlowFS or longer ("run.id in its commit to DIR for 7m12s"),
// at most slowFSListed, with how many there are. Under mu.
func (w *Worker) slowFS(now time.Time) ([]string, int) {
	return w.fsWaitsOver(now, w.cfg.SlowFS)
}

// FSWaits is slowFS for waits of at least d: a stopping worker's
// (`shardpool worker` and `run` say what their stop waits on).
func (w *Worker) FSWaits(d time.Duration) ([]string, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fsWaitsOver(time.Now(), d)
}

// fsWaitsOver is slowFS for waits of at least d. Under mu.
func (w *Worker) fsWaitsOver(now time.Time, d time.Duration) ([]string, int) {
	var s []fsWait
	for _, f := range w.fsWaits {
		if now.Sub(f.since) >= d {
			s = append(s, f)
		}
	}
	slices.SortFunc(s, func(a, b fsWait) int { return a.since.Compare(b.since) })
	var out []string
	for _, x := range s[:min(len(s), slowFSListed)] {
		out = append(out, fmt.Sprintf("%s %s for %s", x.key, x.what, now.Sub(x.since).Round(time.Second)))
	}
	return out, len(s)
}
