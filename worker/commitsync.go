package worker

import (
	"context"
	"path/filepath"
	"time"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// syncGather is how long a worker's group of barrier requests waits after
// its first caller for others to join. With none, concurrent commits
// rarely overlapped and 5,000 shards of /bin/true made 12,273 syncfs calls
// (2.45 per shard). Three runs each (bench/pool's job, 4 slots, this
// 2-core VM): no wait 6.16-6.22 s, 1 ms 5.13-5.95 s, 2 ms 4.84-5.09 s,
// 5 ms 4.69-4.82 s. A barrier before a command runs waits this long too.
const syncGather = 2 * time.Millisecond

// outputGather is the most a commit's syncfs of its output's file system
// waits for other commits (and, where the coordinator's store is on the
// same file system in this process, its barriers: stream.FSSync) to share
// it: outputGatherPer times what a syncfs takes there, at least
// syncGather. Commits run after the slot was given back, so the wait
// costs a slot nothing, and each syncfs saved is a flush of the whole
// disk, other users' writes included. 5,000 shards of /bin/true, 3 rounds
// on this VM on a day its disk was slow (syncfs 2.8 ms at the median):
// 9.1-9.8 s with 2 ms, 8.3-8.4 s with 5 ms, 7.4-7.9 s with 10 ms (and the
// coordinator's settle barriers gathered too). Where a flush is cheap the
// wait stays short: waits of 20 and 40 ms filled maxConcluding and slowed
// the run to 11 s, so on a fast host at thousands of shards a second long
// waits would do the same. With 256 attempts allowed to conclude
// (maxConcluding), 12 times at most 60 ms (and the coordinator's
// settleGather raised likewise) cut the syncfs calls from 2,953 to 762
// for 5,000 shards (1.5 and 2.5 ms each, wall) and took 4.5-6.1 s
// against 4.9-6.9 s, five rounds alternating. A commit of the only shard
// in the worker's hands waits for no one, nor, once the queue is dry,
// does the last of those in hand to wait for a flush (nobodyElse):
// nobody else could come.
const (
	outputGather    = 60 * time.Millisecond
	outputGatherPer = 12
)

// outputSync returns the checkpoint.Options.Sync for commits under output:
// one syncfs of its file system, shared by every commit that asks while
// the previous one runs, in place of the four or five fsyncs each commit
// makes on its own. It returns nil, and commits fsync file by file, where
// the output is not on storage the probe calls local: syncfs is not relied
// upon over NFS or FUSE. The answer is kept for the worker's life. The
// first call for an output also removes what commits of dead processes
// left there (checkpoint.SweepTemps): once per output and process.
func (w *Worker) outputSync(ctx context.Context, output string) func(string) error {
	w.mu.Lock()
	s, ok := w.outSyncs[output]
	w.mu.Unlock()
	if !ok {
		if removed, err := checkpoint.SweepTemps(output); err != nil {
			w.log.Warn("sweep temporary directories", "output", output, "err", err)
		} else if len(removed) > 0 {
			w.log.Info("removed what interrupted commits left", "output", output, "dirs", removed)
		}
		s = w.openOutputSync(ctx, output)
		w.mu.Lock()
		if prev, raced := w.outSyncs[output]; raced {
			if s != nil {
				s.Close()
			}
			s = prev
		} else {
			w.outSyncs[output] = s
		}
		w.mu.Unlock()
	}
	if s == nil {
		return nil
	}
	return func(string) error {
		var gather time.Duration
		last, done := w.joinFlush()
		defer done()
		if !last {
			gather = s.Gather(outputGatherPer, syncGather, outputGather)
		}
		return s.Do(context.WithoutCancel(ctx), gather)
	}
}

// openOutputSync opens the syncfs handle of output's file system, which
// the commit's outputRootFor has made.
func (w *Worker) openOutputSync(ctx context.Context, output string) *stream.FSSync {
	pi := w.cfg.Probe.Where(ctx, output)
	if pi.Unknown != "" || pi.Locality != probe.Local {
		w.log.Info("output commits fsync file by file", "output", output, "type", pi.Type, "locality", pi.Locality)
		return nil
	}
	s, err := stream.OpenFSSync(filepath.Clean(output))
	if err != nil {
		return nil
	}
	return s
}

// closeOutputSyncs closes the file systems' handles at exit.
func (w *Worker) closeOutputSyncs() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, s := range w.outSyncs {
		if s != nil {
			s.Close()
		}
		delete(w.outSyncs, k)
	}
}
