package worker

import (
	"context"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

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
// upon over NFS or FUSE. The answer is kept for the worker's life.
func (w *Worker) outputSync(ctx context.Context, output string) func(string) error {
	w.mu.Lock()
	s, ok := w.outSyncs[output]
	w.mu.Unlock()
	if !ok {
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
	snap, err := w.cfg.Probe.Snapshot(ctx, map[string]string{"output": output})
	if err != nil || len(snap.Storage) == 0 {
		return nil
	}
	pi := snap.Storage[0]
	if pi.Unknown != "" || pi.Locality != probe.Local {
		w.log.Info("output commits fsync file by file", "output", output, "type", pi.Type, "locality", pi.Locality)
		return nil
	}
	f, err := os.Open(filepath.Clean(output))
	if err != nil {
		return nil
	}
	fd := int(f.Fd())
	return &outSync{f: f, g: &stream.Group{Fn: func() error { return unix.Syncfs(fd) }}}
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
