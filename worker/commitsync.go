package worker

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// syncGather is how long a group sync (output syncfs, coordinator barrier)
// waits after its first caller for others to join. Commits run after the
// slot was given back, so the wait costs throughput nothing while it cuts
// the number of syncs: with none, concurrent commits rarely overlapped and
// 5,000 shards of /bin/true made 12,273 syncfs calls (2.45 per shard).
// Three runs each (bench/pool's job, 4 slots, this 2-core VM): no wait
// 6.16-6.22 s, 1 ms 5.13-5.95 s, 2 ms 4.84-5.09 s, 5 ms 4.69-4.82 s.
const syncGather = 2 * time.Millisecond

// outSync is the group commit of one output directory's file system.
type outSync struct {
	f *os.File
	g *stream.Group
}

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
				s.f.Close()
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
	return func(string) error { return s.g.Do(context.WithoutCancel(ctx)) }
}

func (w *Worker) openOutputSync(ctx context.Context, output string) *outSync {
	if err := os.MkdirAll(output, 0o755); err != nil {
		return nil
	}
	pi := w.cfg.Probe.Where(ctx, output)
	if pi.Unknown != "" || pi.Locality != probe.Local {
		w.log.Info("output commits fsync file by file", "output", output, "type", pi.Type, "locality", pi.Locality)
		return nil
	}
	f, err := os.Open(filepath.Clean(output))
	if err != nil {
		return nil
	}
	fd := int(f.Fd())
	return &outSync{f: f, g: &stream.Group{Fn: func() error { return unix.Syncfs(fd) }, Gather: syncGather}}
}

// closeOutputSyncs closes the file systems' handles at exit.
func (w *Worker) closeOutputSyncs() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, s := range w.outSyncs {
		if s != nil {
			s.f.Close()
		}
		delete(w.outSyncs, k)
	}
}
