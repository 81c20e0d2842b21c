package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// preflightWait bounds the snapshot a worker writes to a run's evidence:
// each storage probe has its own 2 s deadline.
const preflightWait = 15 * time.Second

// notePreflight writes, once per run and worker process, the host's
// preflight snapshot to the run's evidence (DESIGN.md, "Evidence"):
// <state>/runs/<run>/preflight/<host>-<time>.json, the whole snapshot
// (other users' load included) with the run's storage probed. It is taken
// aside, on the run's first delivery to this worker: the shard does not
// wait for it. Where the evidence is shared (`shardpool run`), each worker
// process that served the run leaves its own.
func (w *Worker) notePreflight(m *stream.ShardMsg, spec *stream.Spec) {
	w.mu.Lock()
	done := w.preflighted[m.Run]
	w.preflighted[m.Run] = true
	w.mu.Unlock()
	if done {
		return
	}
	paths := map[string]string{"scratch": w.cfg.Scratch, "state": w.cfg.StateDir,
		"output": spec.Output, "checkpoints": filepath.Join(spec.Output, MetaDir)}
	if len(m.Inputs) > 0 {
		paths["inputs"] = filepath.Dir(m.Inputs[0])
	}
	w.bg.Add(1)
	go func() {
		defer w.bg.Done()
		file, err := w.writePreflight(m.Run, paths)
		if err != nil {
			w.log.Warn("preflight snapshot for the run's evidence", "run", m.Run, "err", err)
			return
		}
		w.log.Debug("preflight snapshot", "run", m.Run, "file", file)
	}()
}

func (w *Worker) writePreflight(run string, paths map[string]string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), preflightWait)
	defer cancel()
	probe.Existing(paths)
	snap, err := w.cfg.Probe.Full().Snapshot(ctx, paths)
	if err != nil {
		return "", err
	}
	return SavePreflight(w.evidenceDir(run), snap, w.cfg.Name)
}

// SavePreflight writes snap to the run evidence folder evidence as
// preflight/<host>-<time>.json (DESIGN.md, "Evidence"): what `shardpool
// preflight --spec` and each worker of the run leave. A name already
// taken (two snapshots of one host in one second) gets "-<who>" added.
func SavePreflight(evidence string, snap *probe.Snapshot, who string) (string, error) {
	dir := filepath.Join(evidence, "preflight")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(snap, "", "  ")
	if err != nil {
		return "", err
	}
	base := filepath.Join(dir, fmt.Sprintf("%s-%s", snap.Hostname, snap.Time.Format("20060102T150405Z")))
	file := base + ".json"
	if _, err := os.Stat(file); err == nil {
		file = base + "-" + who + ".json"
	}
	return file, checkpoint.WriteFile(file, append(b, '\n'))
}
